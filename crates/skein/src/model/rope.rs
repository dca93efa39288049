//! Rotary position embeddings, precomputed as cos/sin tables and gathered by position.

use super::config::{ModelConfig, RopeScaling};
use tch::{Device, Kind, Tensor};

pub struct Rope {
    /// [max_positions, head_dim], each half repeated (the HF "rotate half" layout).
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    pub fn new(cfg: &ModelConfig, scaling: &RopeScaling, device: Device) -> Self {
        let hd = cfg.head_dim();
        let theta = cfg.rope_theta();
        let inv_freq: Vec<f64> = (0..hd / 2)
            .map(|i| 1.0 / theta.powf(2.0 * i as f64 / hd as f64))
            .map(|f| scale_frequency(f, scaling))
            .collect();
        let n = cfg.max_position_embeddings;
        let mut angles = Vec::with_capacity(n * hd);
        for pos in 0..n {
            for _ in 0..2 {
                angles.extend(inv_freq.iter().map(|f| (pos as f64 * f) as f32));
            }
        }
        let angles = Tensor::from_slice(&angles)
            .view([n as i64, hd as i64])
            .to_device(device);
        Rope {
            cos: angles.cos(),
            sin: angles.sin(),
        }
    }

    pub fn max_positions(&self) -> i64 {
        self.cos.size()[0]
    }

    /// The same tables, shared.
    pub fn shared(&self) -> Self {
        Rope {
            cos: self.cos.shallow_clone(),
            sin: self.sin.shallow_clone(),
        }
    }

    /// Tables for `positions` [B, T] as [B, 1, T, head_dim], ready to broadcast over heads.
    pub fn tables(&self, positions: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let (b, t) = positions.size2().expect("positions are [batch, time]");
        let flat = positions.reshape([-1]);
        let gather = |table: &Tensor| {
            table
                .index_select(0, &flat)
                .view([b, 1, t, -1])
                .to_kind(kind)
        };
        (gather(&self.cos), gather(&self.sin))
    }
}

fn scale_frequency(f: f64, scaling: &RopeScaling) -> f64 {
    match *scaling {
        RopeScaling::None => f,
        RopeScaling::Linear { factor } => f / factor,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old,
        } => {
            let wavelen = 2.0 * std::f64::consts::PI / f;
            let (low_wl, high_wl) = (old / low_freq_factor, old / high_freq_factor);
            if wavelen < high_wl {
                f
            } else if wavelen > low_wl {
                f / factor
            } else {
                let smooth =
                    (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                (1.0 - smooth) * f / factor + smooth * f
            }
        }
    }
}

/// `x` is [B, heads, T, head_dim]; cos/sin are [B, 1, T, head_dim].
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = x.size()[3] / 2;
    let x1 = x.narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    let rotated = Tensor::cat(&[-x2, x1], 3);
    x * cos + rotated * sin
}
