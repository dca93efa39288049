//! Rotary position embeddings, precomputed as cos/sin tables and gathered by position.

use super::config::{ModelConfig, RopeScaling};
use tch::{Device, Kind, Tensor};

pub struct Rope {
    /// [max_positions, head_dim], each half repeated (the HF "rotate half" layout).
    cos: Tensor,
    /// The same for sin, its first half negated: "rotate half" negates the second half of
    /// the input and moves it first, and with the sign in the table [`apply`] only moves it
    /// (one kernel less per call, the same numbers: a negation is exact).
    signed_sin: Tensor,
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
        let sin = angles.sin();
        let half = hd as i64 / 2;
        let signed_sin = Tensor::cat(&[-sin.narrow(1, 0, half), sin.narrow(1, half, half)], 1);
        Rope {
            cos: angles.cos(),
            signed_sin,
        }
    }

    pub fn max_positions(&self) -> i64 {
        self.cos.size()[0]
    }

    /// The same tables, shared.
    pub fn shared(&self) -> Self {
        Rope {
            cos: self.cos.shallow_clone(),
            signed_sin: self.signed_sin.shallow_clone(),
        }
    }

    /// Tables for `positions` [B, T] as [B, 1, T, head_dim], ready to broadcast over heads:
    /// cos, and sin with its first half negated (what [`apply`] takes).
    pub fn tables(&self, positions: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let (b, t) = positions.size2().expect("positions are [batch, time]");
        let flat = positions.reshape([-1]);
        let gather = |table: &Tensor| {
            table
                .index_select(0, &flat)
                .view([b, 1, t, -1])
                .to_kind(kind)
        };
        (gather(&self.cos), gather(&self.signed_sin))
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

/// `x` is [B, heads, T, head_dim]; `cos` and `signed_sin` are [B, 1, T, head_dim], from
/// [`Rope::tables`] (or, all three with dimensions 1 and 2 swapped, [B, T, heads, head_dim]
/// and [B, T, 1, head_dim]). Rotates each half pair: x·cos + (−x₂, x₁)·sin, computed as
/// x·cos + (x₂, x₁)·signed_sin, which is the same to the bit. (A fused multiply-add for the
/// last two kernels saves one more, but it rounds once where they round twice, which would
/// change every trained number a little: only the fused decoding form takes it,
/// [`apply_fused`].)
pub fn apply(x: &Tensor, cos: &Tensor, signed_sin: &Tensor) -> Tensor {
    x * cos + swapped(x) * signed_sin
}

/// [`apply`] with its last product and sum as one fused multiply-add: a kernel less, and a
/// rounding less, so it differs from [`apply`] by round-off (a fused decoding copy's form).
pub fn apply_fused(x: &Tensor, cos: &Tensor, signed_sin: &Tensor) -> Tensor {
    (x * cos).addcmul(&swapped(x), signed_sin)
}

/// The halves of each head's vector swapped: (x₂, x₁), as a roll by half a head. The same
/// values as concatenating the two halves, but its gradient is one roll back, where the
/// concatenation's is a zeroed tensor, a copy and a sum for each half (ten kernels a layer
/// in training).
fn swapped(x: &Tensor) -> Tensor {
    let half = x.size()[3] / 2;
    x.roll([half], [3])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signed table gives Hugging Face's rotate-half rotation: x·cos + (−x₂, x₁)·sin.
    #[test]
    fn apply_is_the_rotate_half_rotation() {
        let cfg = ModelConfig::tiny_qwen2(40, 32, 1, 4, 2, 64, 16);
        let rope = Rope::new(&cfg, &RopeScaling::None, Device::Cpu);
        let hd = cfg.head_dim() as i64;
        tch::manual_seed(2);
        let x = Tensor::randn([2, 4, 5, hd], (Kind::Float, Device::Cpu));
        let positions = Tensor::from_slice(&[0i64, 3, 7, 8, 15, 1, 2, 4, 9, 11]).view([2, 5]);
        let (cos, signed_sin) = rope.tables(&positions, Kind::Float);
        // The plain tables, computed here: position / θ^(2i/d) for i in each half.
        let half = hd / 2;
        let (pos, theta) = (
            Vec::<i64>::try_from(positions.reshape([-1])).unwrap(),
            cfg.rope_theta(),
        );
        let angles: Vec<f32> = pos
            .iter()
            .flat_map(|&p| {
                (0..hd).map(move |j| {
                    let f = 1.0 / theta.powf(2.0 * (j % half) as f64 / hd as f64);
                    (p as f64 * f) as f32
                })
            })
            .collect();
        let angles = Tensor::from_slice(&angles).view([2, 1, 5, hd]);
        let (plain_cos, sin) = (angles.cos(), angles.sin());
        assert!((&cos - plain_cos).abs().max().double_value(&[]) < 1e-6);
        let rotated = Tensor::cat(&[-x.narrow(3, half, half), x.narrow(3, 0, half)], 3);
        let want = &x * &cos + rotated * &sin;
        let diff = (apply(&x, &cos, &signed_sin) - want)
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 1e-6, "{diff}");
        // With the tables' own sin, the same to the bit as negating the input's half.
        let unsigned = Tensor::cat(
            &[
                -signed_sin.narrow(3, 0, half),
                signed_sin.narrow(3, half, half),
            ],
            3,
        );
        let negated = &x * &cos
            + Tensor::cat(&[-x.narrow(3, half, half), x.narrow(3, 0, half)], 3) * unsigned;
        assert!(apply(&x, &cos, &signed_sin).equal(&negated));
        // The fused multiply-add computes the same to round-off.
        let fused = (apply_fused(&x, &cos, &signed_sin) - apply(&x, &cos, &signed_sin))
            .abs()
            .max()
            .double_value(&[]);
        assert!(fused < 1e-6, "{fused}");
        // Position 0 leaves x as it is.
        let at0 = apply(&x, &cos, &signed_sin).narrow(2, 0, 1) - x.narrow(2, 0, 1);
        assert!(at0.narrow(0, 0, 1).abs().max().double_value(&[]) < 1e-6);
    }
}
