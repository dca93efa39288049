//! Projections that read the same input, kept in one storage: attention's q, k and v, and the
//! MLP's gate and up.
//!
//! Training computes them one by one, each weight a variable with a gradient of its own. A
//! decode step on a GPU costs what its kernel launches cost (docs/speed.md), so decoding on
//! CUDA computes each group with one matrix product instead ([`Fused`]). The separate weights
//! are views into their group's [`Storage`], so the fused product needs no copy of the
//! weights: a copy would hold a second model's worth of memory through every rollout.
//!
//! A cast or a move of the whole var store gives every variable storage of its own again;
//! [`Storage::holds`] tells, and a group that is no longer shared decodes one projection at a
//! time, as before.

use super::lora::{low_rank_add, Projection};
use tch::{Kind, Tensor};

/// The weights (and biases) of a group of projections, end to end along the output: each
/// projection's weight is a view of its rows.
pub struct Storage {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Storage {
    /// Moves the weights of `group` into one storage and points each variable at its rows:
    /// the same values in the same variables, which train as before. `None` (nothing moved)
    /// when the group cannot share: weights of different dtypes or devices, or biases on some
    /// and not on others.
    pub fn share(group: &mut [&mut Projection]) -> Option<Storage> {
        let first = group.first()?.base();
        let (kind, device) = (first.ws.kind(), first.ws.device());
        let with_bias = first.bs.is_some();
        let alike = group.iter().all(|p| {
            let base = p.base();
            base.ws.kind() == kind && base.ws.device() == device && base.bs.is_some() == with_bias
        });
        if !alike {
            return None;
        }
        tch::no_grad(|| {
            let weights: Vec<&Tensor> = group.iter().map(|p| &p.base().ws).collect();
            let weight = Tensor::cat(&weights, 0);
            let bias = with_bias.then(|| {
                let biases: Vec<&Tensor> =
                    group.iter().filter_map(|p| p.base().bs.as_ref()).collect();
                Tensor::cat(&biases, 0)
            });
            let mut row = 0;
            for p in group.iter_mut() {
                let base = p.base_mut();
                let rows = base.ws.size()[0];
                base.ws.set_data(&weight.narrow(0, row, rows));
                if let (Some(b), Some(all)) = (base.bs.as_mut(), bias.as_ref()) {
                    b.set_data(&all.narrow(0, row, rows));
                }
                row += rows;
            }
            Some(Storage { weight, bias })
        })
    }

    /// Whether every weight and bias of `group` is still the view [`share`](Self::share) made
    /// of this storage, in its order.
    pub fn holds(&self, group: &[&Projection]) -> bool {
        let at = |t: &Tensor, all: &Tensor, row: i64, width: i64| {
            let offset = (row * width * all.kind().elt_size_in_bytes() as i64) as usize;
            t.kind() == all.kind()
                && t.device() == all.device()
                && t.is_contiguous()
                && t.data_ptr() as usize == all.data_ptr() as usize + offset
        };
        let width = self.weight.size()[1];
        let mut row = 0;
        for p in group {
            let base = p.base();
            let rows = base.ws.size()[0];
            let weight_held =
                base.ws.size() == [rows, width] && at(&base.ws, &self.weight, row, width);
            let bias_held = match (&base.bs, &self.bias) {
                (None, None) => true,
                (Some(b), Some(all)) => at(b, all, row, 1),
                _ => false,
            };
            if !(weight_held && bias_held) {
                return false;
            }
            row += rows;
        }
        row == self.weight.size()[0]
    }

    /// The same storage, shared.
    pub fn shared(&self) -> Storage {
        Storage {
            weight: self.weight.shallow_clone(),
            bias: self.bias.as_ref().map(Tensor::shallow_clone),
        }
    }
}

/// A group of projections as one: the base's product from the group's storage, and every
/// adapter of the group in two products more (all `A`s side by side, then all `B`s as one
/// block-diagonal matrix), where one at a time takes two per adapter.
pub struct Fused {
    weight: Tensor,
    bias: Option<Tensor>,
    adapters: Option<LowRank>,
}

/// `Aᵀ` of every adapter side by side [in, Σ rank], and their `(scale · B)ᵀ` as a block
/// diagonal [Σ rank, Σ out] (zero where an adapter meets another's outputs, or a projection
/// without an adapter).
struct LowRank {
    a_t: Tensor,
    b_t: Tensor,
}

impl Fused {
    /// The group `group` (decoding copies, whose bases `storage` holds) as one projection.
    /// `None` when the storage no longer holds the bases, or an adapter's dtype is not the
    /// base's (the CPU's float32 adapters on a low-precision base).
    pub fn new(storage: &Storage, group: &[&Projection]) -> Option<Fused> {
        if !storage.holds(group) {
            return None;
        }
        let kind = storage.weight.kind();
        let adapters: Vec<Option<(&Tensor, &Tensor)>> =
            group.iter().map(|p| p.decoding_products()).collect();
        if adapters.iter().flatten().any(|(a_t, _)| a_t.kind() != kind)
            || group.iter().any(|p| p.has_trainable_adapter())
        {
            return None;
        }
        let adapters =
            (adapters.iter().any(Option::is_some)).then(|| block_diagonal(group, &adapters, kind));
        Some(Fused {
            weight: storage.weight.shallow_clone(),
            bias: storage.bias.as_ref().map(Tensor::shallow_clone),
            adapters,
        })
    }

    /// The group's outputs end to end along the last dimension, in the storage's order.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let y = x.linear(&self.weight, self.bias.as_ref());
        match &self.adapters {
            None => y,
            Some(lr) => low_rank_add(&y, x, &lr.a_t, &lr.b_t),
        }
    }
}

fn block_diagonal(
    group: &[&Projection],
    adapters: &[Option<(&Tensor, &Tensor)>],
    kind: Kind,
) -> LowRank {
    let device = group[0].base().ws.device();
    let outputs: Vec<i64> = group.iter().map(|p| p.base().ws.size()[0]).collect();
    let ranks: Vec<i64> = adapters
        .iter()
        .map(|ad| ad.map_or(0, |(a_t, _)| a_t.size()[1]))
        .collect();
    let a_ts: Vec<&Tensor> = adapters.iter().flatten().map(|(a_t, _)| *a_t).collect();
    let a_t = Tensor::cat(&a_ts, 1);
    let b_t = Tensor::zeros(
        [ranks.iter().sum::<i64>(), outputs.iter().sum::<i64>()],
        (kind, device),
    );
    let (mut rank_at, mut output_at) = (0, 0);
    for ((ad, rank), output) in adapters.iter().zip(&ranks).zip(&outputs) {
        if let Some((_, scaled_b_t)) = ad {
            b_t.narrow(0, rank_at, *rank)
                .narrow(1, output_at, *output)
                .copy_(scaled_b_t);
        }
        rank_at += rank;
        output_at += output;
    }
    LowRank { a_t, b_t }
}

#[cfg(test)]
mod tests {
    use crate::model::{DecodeForm, Dtype, LoraConfig, Model, ModelConfig, ModelOptions};
    use tch::{Device, Kind, Tensor};

    fn ids() -> Tensor {
        Tensor::from_slice(&[3i64, 7, 1, 9, 22, 5, 30, 2]).view([2, 4])
    }

    fn logp(net: &crate::model::Transformer) -> Tensor {
        tch::no_grad(|| net.forward(&ids()).to_kind(Kind::Float)).log_softmax(-1, Kind::Float)
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    fn calls(net: &crate::model::Transformer) -> u64 {
        crate::op_count::count(|| tch::no_grad(|| net.forward(&ids())))
            .1
            .computing_total()
    }

    /// Qwen2 (q/k/v biases), Qwen3 (q/k norms, no biases) and Llama (neither), 2 layers.
    fn configs() -> Vec<ModelConfig> {
        let qwen2 = ModelConfig::tiny_qwen2(40, 32, 2, 4, 2, 64, 32);
        let qwen3 = ModelConfig {
            model_type: "qwen3".into(),
            ..qwen2.clone()
        };
        let llama = ModelConfig {
            model_type: "llama".into(),
            ..qwen2.clone()
        };
        vec![qwen2, qwen3, llama]
    }

    fn adapted(dtype: Dtype, rank: usize) -> ModelOptions {
        ModelOptions {
            dtype,
            lora: LoraConfig {
                rank,
                ..Default::default()
            },
        }
    }

    /// Gives every weight new random values in place (a trained model's, not an initial one
    /// with zero adapters).
    fn perturb(model: &Model) {
        tch::no_grad(|| {
            for (_, mut t) in model.vs.variables() {
                t.copy_(&(t.randn_like() * 0.1));
            }
        });
    }

    /// The fused decoding copy computes the model's log-probs (float32: to round-off;
    /// bfloat16: within the dtype's rounding) with fewer calls, per layer: two products fewer
    /// for q/k/v, one for gate/up, the two residual adds, and five element-wise calls of the
    /// rotation (two with q/k norms, whose queries and keys rotate apart); with adapters on
    /// every projection, six more.
    #[test]
    fn the_fused_decoding_copy_computes_the_model_in_fewer_calls() {
        for cfg in configs() {
            for (dtype, rank, tolerance) in [
                (Dtype::Float32, 0, 1e-5),
                (Dtype::Float32, 4, 1e-5),
                (Dtype::Bfloat16, 4, 0.1),
            ] {
                let model = Model::random_with(&cfg, &adapted(dtype, rank), Device::Cpu, 3)
                    .expect("a tiny model");
                perturb(&model);
                let case = format!("{} {dtype:?} rank {rank}", cfg.model_type);
                let fused = model.net.for_decoding_as(DecodeForm::Fused);
                let diff = max_diff(&logp(&fused), &logp(&model.net));
                assert!(diff < tolerance, "{case}: {diff}");
                let separate = model.net.for_decoding_in(model.net.kind());
                let saved = calls(&separate) as i64 - calls(&fused) as i64;
                let rotation = if cfg.qk_norm() { 2 } else { 5 };
                let adapters = if rank > 0 { 6 } else { 0 };
                assert_eq!(saved, 2 * (3 + rotation + 2 + adapters), "{case}");
            }
        }
        // Adapters on some projections of a group: the others' blocks are zero.
        let mut options = adapted(Dtype::Float32, 4);
        options.lora.targets = vec!["q_proj".into(), "v_proj".into(), "up_proj".into()];
        let model =
            Model::random_with(&configs()[0], &options, Device::Cpu, 6).expect("a tiny model");
        perturb(&model);
        let fused = model.net.for_decoding_as(DecodeForm::Fused);
        assert!(max_diff(&logp(&fused), &logp(&model.net)) < 1e-5);
        let separate = model.net.for_decoding_in(Kind::Float);
        // q and v's adapters take two calls where they took four; up's takes two either way.
        let saved = calls(&separate) as i64 - calls(&fused) as i64;
        assert_eq!(saved, 2 * (3 + 5 + 2 + 2));
    }

    /// Each weight of a group is a view of the group's storage, in every model built: the
    /// variables keep their names, values and gradients, an update in place reaches the fused
    /// product, and after a cast of the var store (which gives each weight storage of its own)
    /// the fused form falls back to separate products until the storage is shared again.
    #[test]
    fn the_weights_of_a_group_share_one_storage_and_train_as_before() {
        let cfg = &configs()[0];
        let model = Model::random(cfg, Device::Cpu, 4).expect("a tiny model");
        assert!(model.net.shares_storage());
        let variables = model.vs.variables();
        let q = &variables["model.layers.1.self_attn.q_proj.weight"];
        assert_eq!(q.size(), [32, 32]);
        assert!(q.requires_grad());

        // A gradient of its own for each weight of the group.
        model.net.forward(&ids()).sum(Kind::Float).backward();
        for name in ["q_proj", "k_proj", "v_proj"] {
            let w = &variables[&format!("model.layers.0.self_attn.{name}.weight")];
            assert_eq!(w.grad().size(), w.size(), "{name}");
        }
        perturb(&model);
        let fused = model.net.for_decoding_as(DecodeForm::Fused);
        assert!(max_diff(&logp(&fused), &logp(&model.net)) < 1e-5);

        let mut cast = Model::random(cfg, Device::Cpu, 4).expect("a tiny model");
        tch::no_grad(|| cast.vs.set_kind(Kind::Double));
        assert!(!cast.net.shares_storage());
        let fallback = cast.net.for_decoding_as(DecodeForm::Fused);
        assert_eq!(
            calls(&fallback),
            calls(&cast.net.for_decoding_in(Kind::Double))
        );
        assert!(max_diff(&logp(&fallback), &logp(&cast.net)) == 0.0);
        cast.net.share_storage();
        assert!(cast.net.shares_storage());

        // A full model going on with LoRA in bfloat16 is cast, and shares again.
        let mut warmed = Model::random(cfg, Device::Cpu, 4).expect("a tiny model");
        warmed
            .adapt(&adapted(Dtype::Bfloat16, 4))
            .expect("LoRA on a full model");
        assert!(warmed.net.shares_storage());
    }
}
