//! How a model's weights are held: their dtype, and whether LoRA adapters train on a frozen
//! base. Replicas of a model (data-parallel ranks) are built with the same options.

use super::lora::LoraConfig;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind};

/// `model.dtype`: the dtype of the weights and of the forward. What trains stays float32:
/// LoRA's adapters, or with every weight trained, the optimizer's master copy of each weight
/// (`trainer::update::optim`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[default]
    Float32,
    Bfloat16,
    Float16,
}

impl Dtype {
    pub fn kind(self) -> Kind {
        match self {
            Dtype::Float32 => Kind::Float,
            Dtype::Bfloat16 => Kind::BFloat16,
            Dtype::Float16 => Kind::Half,
        }
    }

    pub fn bytes(self) -> f64 {
        match self {
            Dtype::Float32 => 4.0,
            Dtype::Bfloat16 | Dtype::Float16 => 2.0,
        }
    }

    /// The largest mean |behavior − recomputed| log-prob (nats) that float round-off explains
    /// when the engine and the trainer run the same weights in this dtype: the engine's cached
    /// decode and the trainer's full forward add in different orders. Beyond it the engine
    /// computes another policy (`logprob-mismatch`).
    /// - float32: 1e-3, far above what is measured (the default job: at most 3.6e-7; a 358M
    ///   body on an H200: 2–4e-6).
    /// - bfloat16: 0.05. A 358M body, LoRA 64 on an H200 measured a mean of 0.013–0.014 in
    ///   every attention layout (docs/speed.md); its 8-bit mantissa rounds every product.
    /// - float16: 0.01, bfloat16's scaled by their mantissas (3 bits more, 8× finer); not
    ///   measured.
    pub fn logp_round_off(self) -> f64 {
        match self {
            Dtype::Float32 => 1e-3,
            Dtype::Bfloat16 => 0.05,
            Dtype::Float16 => 0.01,
        }
    }
}

/// The options a model is built with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelOptions {
    pub dtype: Dtype,
    pub lora: LoraConfig,
}

impl ModelOptions {
    /// Every weight trains in a dtype below float32: the optimizer then keeps float32 master
    /// copies of them (`trainer::update::optim`).
    pub fn master_weights(&self) -> bool {
        !self.lora.enabled() && self.dtype != Dtype::Float32
    }

    /// An error naming the key for a combination that cannot train: one that cannot load
    /// ([`check_loadable`](Self::check_loadable)), or float16 weights trained in full.
    pub fn check(&self, device: Device) -> Result<()> {
        self.lora.check()?;
        if self.dtype == Dtype::Float16 && !self.lora.enabled() {
            bail!(
                "`model.dtype = \"float16\"` with every weight trained needs loss scaling \
                 (float16's gradients underflow), which skein does not do: use \"bfloat16\" \
                 (float32's range), or set `lora.rank` (e.g. 16) to train adapters on a \
                 float16 base"
            );
        }
        self.check_loadable(device)
    }

    /// An error for a combination no model can be built with on `device`. Serving and
    /// evaluating never train, so float16 without adapters is fine there.
    pub fn check_loadable(&self, device: Device) -> Result<()> {
        self.lora.check()?;
        if self.dtype == Dtype::Float16 && device == Device::Cpu {
            bail!(
                "float16 (`model.dtype`, `--dtype`) needs a CUDA device (`run.device`, \
                 `--device`): the CPU has no fast float16 kernels; use \"bfloat16\" on the CPU"
            );
        }
        Ok(())
    }
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Float32 => "float32",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Float16 => "float16",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// float16 with every weight is refused for training but loads for serving and
    /// evaluation on a CUDA device; on the CPU it loads nowhere.
    #[test]
    fn full_float16_loads_on_cuda_but_does_not_train() {
        let full = ModelOptions {
            dtype: Dtype::Float16,
            lora: LoraConfig::default(),
        };
        let cuda = Device::Cuda(0);
        assert!(full.check_loadable(cuda).is_ok());
        let e = full.check(cuda).unwrap_err().to_string();
        assert!(e.contains("loss scaling"), "{e}");
        let e = full.check_loadable(Device::Cpu).unwrap_err().to_string();
        assert!(e.contains("CUDA"), "{e}");
        let adapters = ModelOptions {
            lora: LoraConfig {
                rank: 8,
                ..LoraConfig::default()
            },
            ..full
        };
        assert!(adapters.check(cuda).is_ok());
    }
}
