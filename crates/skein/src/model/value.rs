//! A critic: the same decoder with a scalar head per position (the HF
//! `*ForTokenClassification` layout with one label: `score.weight`).

use super::config::ModelConfig;
use super::io::Model;
use super::transformer::{positions_like, AttnMode, Transformer};
use anyhow::Result;
use tch::nn::{self, Module};
use tch::{Device, Tensor};

pub struct ValueModel {
    pub vs: nn::VarStore,
    pub net: Transformer,
    head: nn::Linear,
}

impl ValueModel {
    /// A critic whose body starts from `init`'s weights (as PPO critics customarily do) and whose
    /// head starts at zero, so its first values are 0 rather than noise.
    pub fn from_policy(init: &Model, device: Device) -> Result<Self> {
        let critic = ValueModel::new(&init.net.config, device)?;
        let src = init.vs.variables();
        tch::no_grad(|| {
            for (name, mut var) in critic.vs.variables() {
                if let Some(t) = src.get(&name) {
                    var.copy_(t);
                }
            }
        });
        Ok(critic)
    }

    /// A critic of the given shape with a random body and a zero head.
    pub fn new(cfg: &ModelConfig, device: Device) -> Result<Self> {
        let vs = nn::VarStore::new(device);
        let net = Transformer::new(&vs.root(), cfg)?;
        let head = nn::linear(
            vs.root() / "score",
            cfg.hidden_size as i64,
            1,
            nn::LinearConfig {
                bias: false,
                ws_init: nn::Init::Const(0.0),
                ..Default::default()
            },
        );
        Ok(ValueModel { vs, net, head })
    }

    /// Values [B, T] of every position of a right-padded batch.
    pub fn values(&self, input_ids: &Tensor) -> Tensor {
        self.values_at(input_ids, &positions_like(input_ids), AttnMode::Causal)
    }

    /// Values [B, T] of every position, with explicit positions and attention (packed lines).
    pub fn values_at(&self, input_ids: &Tensor, positions: &Tensor, mode: AttnMode) -> Tensor {
        self.score(&self.net.hidden(input_ids, positions, mode))
    }

    /// Values [B, T] of final hidden states [B, T, hidden] (from any forward of `net`).
    pub fn score(&self, hidden: &Tensor) -> Tensor {
        self.head.forward(hidden).squeeze_dim(-1)
    }
}
