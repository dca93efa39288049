//! LoRA: a trainable low-rank update `scale · B·A` beside a frozen projection `W`, so a
//! model trains `rank · (in + out)` numbers per projection instead of `in · out`, and needs
//! gradients and optimizer moments for those alone.
//!
//! Names follow PEFT: the adapter of `model.layers.0.self_attn.q_proj` is
//! `model.layers.0.self_attn.q_proj.lora_A.weight` [rank, in] and `….lora_B.weight`
//! [out, rank], with `scale = alpha / rank`. `B` starts at zero, so a fresh adapter leaves the
//! model exactly as it was; the base alone (adapters off) is the KL reference.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

/// The projections LoRA can adapt, by their Hugging Face names.
pub const TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// `[lora]`: which projections get adapters, and their shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// Rank of each adapter; 0 trains every weight instead (full fine-tuning).
    pub rank: usize,
    /// The update is scaled by `alpha / rank`.
    pub alpha: f64,
    /// Dropout on an adapter's input during training (PEFT's `lora_dropout`).
    pub dropout: f64,
    /// Projections that get an adapter, among q/k/v/o_proj and gate/up/down_proj.
    pub targets: Vec<String>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 0,
            alpha: 16.0,
            dropout: 0.0,
            targets: TARGETS.iter().map(|t| t.to_string()).collect(),
        }
    }
}

impl LoraConfig {
    pub fn enabled(&self) -> bool {
        self.rank > 0
    }

    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// An error naming the key for values LoRA cannot use.
    pub fn check(&self) -> Result<()> {
        if let Some(t) = self.targets.iter().find(|t| !TARGETS.contains(&t.as_str())) {
            bail!(
                "`lora.targets` has `{t}`: allowed are {}",
                TARGETS.join(", ")
            );
        }
        if self.enabled() && self.targets.is_empty() {
            bail!(
                "`lora.targets` is empty: name at least one of {}",
                TARGETS.join(", ")
            );
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            bail!("`lora.alpha` must be a positive number, not {}", self.alpha);
        }
        if !(0.0..1.0).contains(&self.dropout) {
            bail!("`lora.dropout` must be in [0, 1), not {}", self.dropout);
        }
        Ok(())
    }
}

/// What a projection adds to its base output.
enum Adapter {
    /// The trainable pair, in float32 whatever the base's dtype.
    Trainable(Trainable),
    /// A frozen copy of it for decoding ([`Projection::for_decoding`]).
    Frozen(Frozen),
}

struct Trainable {
    a: Tensor,
    b: Tensor,
    scale: f64,
    dropout: f64,
}

impl Trainable {
    /// The adapter's input: `x` with dropout in a training pass (a loaded model's supervised
    /// warm-up, which records gradients); sampling and the warm-up's evaluations run under
    /// `no_grad` and see the whole adapter, as PEFT's eval mode does. RL's passes come after
    /// `stop_dropout`.
    fn input(&self, x: Tensor) -> Tensor {
        if self.dropout > 0.0 && grad_mode_enabled() {
            x.dropout(self.dropout, true)
        } else {
            x
        }
    }

    /// The CPU's form: float32 products on a float32 copy of the input, the update cast to the
    /// base's dtype and added. The CPU's float32 products are faster than its bfloat16 ones.
    fn add_in_float32(&self, y: Tensor, x: &Tensor) -> Tensor {
        let xf = self.input(x.to_kind(Kind::Float));
        let delta = xf.matmul(&self.a.tr()).matmul(&self.b.tr()) * self.scale;
        let kind = y.kind();
        y + delta.to_kind(kind)
    }

    /// CUDA's form: the float32 weights cast to the base's dtype, and the products in it, as
    /// mixed precision computes (the weights, their gradients and the optimizer's moments stay
    /// float32). In float32 a GPU's products run without its tensor cores (libtorch leaves
    /// TF32 off), at a fraction of their speed, so float32 products on a bfloat16 base cost
    /// more than the base's own; and the adapter keeps no float32 copy of its input for the
    /// backward. It computes what the decoding copy in the base's dtype computes, from the
    /// same values.
    fn add_in_base_dtype(&self, y: Tensor, x: &Tensor) -> Tensor {
        let (a_t, scaled_b_t) = self.products_in(y.kind());
        low_rank_add(&y, &self.input(x.shallow_clone()), &a_t, &scaled_b_t)
    }

    /// `Aᵀ` and `(scale · B)ᵀ` in `kind`, as the products take them.
    fn products_in(&self, kind: Kind) -> (Tensor, Tensor) {
        (
            self.a.tr().to_kind(kind),
            (&self.b * self.scale).tr().to_kind(kind),
        )
    }
}

/// `y + (x · a_t) · scaled_b_t`, the second product adding onto `y` in the same kernel.
pub(super) fn low_rank_add(y: &Tensor, x: &Tensor, a_t: &Tensor, scaled_b_t: &Tensor) -> Tensor {
    let shape = y.size();
    let low = x.matmul(a_t);
    let rank = a_t.size()[1];
    y.reshape([-1, *shape.last().expect("outputs have a last dimension")])
        .addmm(&low.reshape([-1, rank]), scaled_b_t)
        .view(shape.as_slice())
}

/// An adapter as decoding uses it: `Aᵀ` and `(scale · B)ᵀ`, made once per engine run. In
/// the base's dtype, a pass costs two matrix products, the second adding onto the base's
/// output, instead of a cast in, two products, a scale, a cast out and an add; in another
/// (float32 on a low-precision base), the input is cast in and the product out.
struct Frozen {
    a_t: Tensor,
    scaled_b_t: Tensor,
}

/// A linear projection of the decoder, with an optional adapter.
pub struct Projection {
    base: nn::Linear,
    adapter: Option<Adapter>,
}

impl Projection {
    /// `nn::linear` under `p` (same names and initialisation), no adapter yet.
    pub fn new(p: nn::Path, input: i64, output: i64, bias: bool) -> Self {
        let c = nn::LinearConfig {
            bias,
            ..Default::default()
        };
        Projection {
            base: nn::linear(p, input, output, c),
            adapter: None,
        }
    }

    /// Gives the projection an adapter under `p` (the projection's own path): `A` drawn as
    /// PEFT draws it (Kaiming-uniform, bound 1/√in), `B` zero.
    pub fn attach(&mut self, p: nn::Path, cfg: &LoraConfig) {
        let (output, input) = self.base.ws.size2().expect("a projection weight is 2-d");
        let (rank, device) = (cfg.rank as i64, p.device());
        let bound = 1.0 / (input as f64).sqrt();
        let a = Tensor::zeros([rank, input], (Kind::Float, device)).uniform_(-bound, bound);
        let b = Tensor::zeros([output, rank], (Kind::Float, device));
        self.adapter = Some(Adapter::Trainable(Trainable {
            a: (&p / "lora_A").add("weight", a, true),
            b: (&p / "lora_B").add("weight", b, true),
            scale: cfg.scale(),
            dropout: cfg.dropout,
        }));
    }

    /// Gives the projection, under `p`, a frozen copy of `of`'s trainable adapter (its values
    /// now, dropout off; nothing drawn from the random generator): with the same base, the
    /// projection computes what `of` computes now, as `of` computes it, and never follows
    /// `of`'s later updates.
    pub fn attach_frozen_copy(&mut self, p: nn::Path, of: &Projection) {
        let Some(Adapter::Trainable(src)) = &of.adapter else {
            return;
        };
        let (a, b) = tch::no_grad(|| (src.a.copy(), src.b.copy()));
        self.adapter = Some(Adapter::Trainable(Trainable {
            a: (&p / "lora_A").add("weight", a, false),
            b: (&p / "lora_B").add("weight", b, false),
            scale: src.scale,
            dropout: 0.0,
        }));
    }

    /// The base's output plus the adapter's. A trainable adapter computes its products on
    /// CUDA in the base's dtype ([`Trainable::add_in_base_dtype`]) and elsewhere in float32
    /// ([`Trainable::add_in_float32`]); a decoding copy as it was made.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.add_adapter(self.base.forward(x), x)
    }

    /// `y`, the base's output for `x`, plus the adapter's output for `x`.
    fn add_adapter(&self, y: Tensor, x: &Tensor) -> Tensor {
        match &self.adapter {
            None => y,
            Some(Adapter::Trainable(ad)) if x.device().is_cuda() => ad.add_in_base_dtype(y, x),
            Some(Adapter::Trainable(ad)) => ad.add_in_float32(y, x),
            Some(Adapter::Frozen(ad)) if ad.a_t.kind() == x.kind() => {
                low_rank_add(&y, x, &ad.a_t, &ad.scaled_b_t)
            }
            Some(Adapter::Frozen(ad)) => {
                let delta = x
                    .to_kind(ad.a_t.kind())
                    .matmul(&ad.a_t)
                    .matmul(&ad.scaled_b_t);
                let kind = y.kind();
                y + delta.to_kind(kind)
            }
        }
    }

    /// `residual` plus the projection of `x`, the base's product adding the residual itself
    /// (one kernel where a product and an add take two), as a fused decoding copy computes
    /// it; a base with a bias runs the product and the add apart. Folded, the sum may round
    /// once where the two round twice.
    pub fn forward_onto(&self, x: &Tensor, residual: &Tensor) -> Tensor {
        if self.base.bs.is_some() {
            return residual + self.forward(x);
        }
        let shape = residual.size();
        let (output, input) = self.base.ws.size2().expect("a projection weight is 2-d");
        let y = residual
            .reshape([-1, output])
            .addmm(&x.reshape([-1, input]), &self.base.ws.tr())
            .view(shape.as_slice());
        self.add_adapter(y, x)
    }

    /// The same frozen weights (shared, not copied) without the adapter.
    pub fn base_only(&self) -> Self {
        Projection {
            base: self.shared_base(),
            adapter: None,
        }
    }

    /// The same weights for decoding: the base shared, the adapter copied as [`Frozen`] in
    /// `kind`. It computes what the trainable adapter computes to round-off (the scale is
    /// applied to `B` before the product, and a low-precision adapter's products round as the
    /// base's do), and it does not see later updates: make a new one after each.
    pub fn for_decoding(&self, kind: Kind) -> Self {
        let adapter = self.adapter.as_ref().map(|ad| match ad {
            Adapter::Trainable(t) => tch::no_grad(|| {
                let (a_t, scaled_b_t) = t.products_in(kind);
                Adapter::Frozen(Frozen {
                    a_t: a_t.contiguous(),
                    scaled_b_t: scaled_b_t.contiguous(),
                })
            }),
            Adapter::Frozen(f) => Adapter::Frozen(Frozen {
                a_t: f.a_t.shallow_clone(),
                scaled_b_t: f.scaled_b_t.shallow_clone(),
            }),
        });
        Projection {
            base: self.shared_base(),
            adapter,
        }
    }

    /// The base projection (its weight and bias).
    pub(super) fn base(&self) -> &nn::Linear {
        &self.base
    }

    /// The base projection, to point its variables elsewhere ([`super::fused::Storage`]).
    pub(super) fn base_mut(&mut self) -> &mut nn::Linear {
        &mut self.base
    }

    /// A decoding copy's adapter as its two products take it: `Aᵀ` and `(scale · B)ᵀ`.
    pub(super) fn decoding_products(&self) -> Option<(&Tensor, &Tensor)> {
        match &self.adapter {
            Some(Adapter::Frozen(f)) => Some((&f.a_t, &f.scaled_b_t)),
            _ => None,
        }
    }

    /// Whether the adapter is a trainable one (not a decoding copy).
    pub(super) fn has_trainable_adapter(&self) -> bool {
        matches!(self.adapter, Some(Adapter::Trainable(_)))
    }

    fn shared_base(&self) -> nn::Linear {
        nn::Linear {
            ws: self.base.ws.shallow_clone(),
            bs: self.base.bs.as_ref().map(Tensor::shallow_clone),
        }
    }

    /// Turns the adapter's dropout off for good. RL's passes run without it: the update's
    /// π_old is the training forward's own detached log-prob on the first mini-batch and a
    /// separate forward on the others, so a random mask would make the ratio 1 on some rows
    /// and noise on others. Dropout is for the supervised warm-up.
    pub fn stop_dropout(&mut self) {
        if let Some(Adapter::Trainable(ad)) = &mut self.adapter {
            ad.dropout = 0.0;
        }
    }

    /// The dropout probability the adapter runs with now (0 without a trainable adapter).
    pub fn dropout(&self) -> f64 {
        match &self.adapter {
            Some(Adapter::Trainable(ad)) => ad.dropout,
            _ => 0.0,
        }
    }

    /// Folds the trainable adapter into the base weight (`W += scale · B·A`, rounded to `W`'s
    /// dtype) and starts the adapter again from zero, so the model computes what it did
    /// before.
    pub fn merge(&mut self) {
        let Some(Adapter::Trainable(ad)) = &mut self.adapter else {
            return;
        };
        tch::no_grad(|| {
            let delta = ad.b.matmul(&ad.a) * ad.scale;
            let _ = self.base.ws.g_add_(&delta.to_kind(self.base.ws.kind()));
            let _ = ad.b.zero_();
        });
    }
}

/// Whether this thread's passes record gradients (libtorch's thread-local grad mode, which
/// `tch::no_grad` turns off). Read by setting it and putting it back: tch has no getter.
fn grad_mode_enabled() -> bool {
    // SAFETY: `at_grad_set_enabled` sets the calling thread's grad mode and returns the previous
    // one; the second call restores it, so nothing else observes the change.
    unsafe {
        let was = torch_sys::at_grad_set_enabled(1);
        torch_sys::at_grad_set_enabled(was);
        was != 0
    }
}

/// Whether a variable name is an adapter's (`….lora_A.weight`, `….lora_B.weight`).
pub fn is_adapter(name: &str) -> bool {
    name.contains(".lora_A.") || name.contains(".lora_B.")
}

/// The adapter variables of a projection weight `….q_proj.weight`: (`lora_A`, `lora_B`).
pub fn adapter_names(weight: &str) -> Option<(String, String)> {
    let projection = weight.strip_suffix(".weight")?;
    Some((
        format!("{projection}.lora_A.weight"),
        format!("{projection}.lora_B.weight"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Dtype, Model, ModelConfig, ModelOptions};
    use tch::Device;

    fn lora(rank: usize) -> ModelOptions {
        ModelOptions {
            lora: LoraConfig {
                rank,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn config() -> ModelConfig {
        ModelConfig::tiny_qwen2(40, 32, 2, 4, 2, 64, 32)
    }

    fn ids() -> Tensor {
        Tensor::from_slice(&[3i64, 7, 1, 9, 22, 5, 30, 2]).view([2, 4])
    }

    /// Gives every adapter's `B` random values, so adapters change the output.
    /// Non-zero `lora_B`s, the same on every run: a draw from torch's global generator would
    /// depend on the tests running beside this one, and with it the margins checked.
    fn perturb(model: &Model) {
        tch::no_grad(|| {
            for (name, mut t) in model.vs.variables() {
                if name.contains(".lora_B.") {
                    let n = t.numel() as i64;
                    let wave = (Tensor::arange(n, (Kind::Float, t.device())) * 1.7 + 0.3).sin();
                    t.copy_(&(wave * 0.08).reshape(t.size()).to_kind(t.kind()));
                }
            }
        });
    }

    /// A LoRA model on a bfloat16 base, its adapters [`perturb`]ed and `B` scaled by
    /// `factor`: an update far below bfloat16's spacing at these weights.
    fn small_update_on_bfloat16(seed: i64, factor: f64) -> Model {
        let bf16 = ModelOptions {
            dtype: Dtype::Bfloat16,
            ..lora(4)
        };
        let model = Model::random_with(&config(), &bf16, Device::Cpu, seed).unwrap();
        perturb(&model);
        tch::no_grad(|| {
            for (name, mut t) in model.vs.variables() {
                if name.contains(".lora_B.") {
                    t.copy_(&(&t * factor));
                }
            }
        });
        model
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    #[test]
    fn only_adapters_train_and_fresh_ones_change_nothing() {
        let adapted = Model::random_with(&config(), &lora(4), Device::Cpu, 1).unwrap();
        // Copied, not drawn from the same seed: tests share libtorch's generator.
        let mut plain = Model::random(&config(), Device::Cpu, 1).unwrap();
        plain.vs.copy(&adapted.vs).unwrap();
        let trainable = crate::model::sorted_trainable(&adapted.vs);
        // 2 layers × 7 projections × (A, B).
        assert_eq!(trainable.len(), 28);
        assert!(
            trainable.iter().all(|(n, _)| is_adapter(n)),
            "{trainable:?}"
        );
        let x = ids();
        assert!(max_diff(&plain.net.forward(&x), &adapted.net.forward(&x)) == 0.0);

        perturb(&adapted);
        adapted.net.forward(&x).sum(Kind::Float).backward();
        for (name, t) in adapted.vs.variables() {
            assert_eq!(t.grad().defined(), is_adapter(&name), "{name}");
        }
    }

    #[test]
    fn adapter_dropout_applies_until_it_is_stopped() {
        let options = ModelOptions {
            lora: LoraConfig {
                rank: 4,
                dropout: 0.5,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut model = Model::random_with(&config(), &options, Device::Cpu, 4).unwrap();
        perturb(&model);
        let x = ids();
        let sampled = || tch::no_grad(|| model.net.forward(&x));
        // On, a training pass draws a new mask every time; sampling and evaluation (passes
        // without gradients) run the whole adapter.
        let trained = || model.net.forward(&x);
        assert!(max_diff(&trained(), &trained()) > 1e-4, "dropout while on");
        assert!(
            max_diff(&sampled(), &sampled()) == 0.0,
            "none when sampling"
        );
        model.net.stop_adapter_dropout();
        let (trained, sampled) = (
            model.net.forward(&x),
            tch::no_grad(|| model.net.forward(&x)),
        );
        // Off, a training pass and a sampling pass are one function, as RL's ratio needs.
        assert!(max_diff(&trained, &sampled) < 1e-6, "none after it stops");
    }

    #[test]
    fn the_base_view_is_the_model_without_adapters_and_shares_its_weights() {
        let adapted = Model::random_with(&config(), &lora(4), Device::Cpu, 2).unwrap();
        let before = adapted.net.forward(&ids());
        perturb(&adapted);
        let base = adapted.base_only();
        assert!(max_diff(&base.net.forward(&ids()), &before) == 0.0);
        assert!(max_diff(&adapted.net.forward(&ids()), &before) > 1e-4);
        assert!(base.vs.variables().is_empty(), "nothing is copied");
    }

    /// The decoding copy computes the adapted model (float32: to round-off; bfloat16: within
    /// the dtype's rounding of the adapter's products), with fewer operator calls, and keeps
    /// the adapter as it was when made.
    #[test]
    fn the_decoding_copy_computes_the_adapted_model_in_fewer_calls() {
        // The calls a trainable adapter makes beyond the decoding copy's two products: a
        // scale and an add in float32, and two casts more on a bfloat16 base.
        for (dtype, tolerance, saved) in [(Dtype::Float32, 1e-5, 2), (Dtype::Bfloat16, 0.05, 4)] {
            let options = ModelOptions { dtype, ..lora(4) };
            let adapted = Model::random_with(&config(), &options, Device::Cpu, 5).unwrap();
            perturb(&adapted);
            let logp = |net: &crate::model::Transformer| {
                tch::no_grad(|| net.forward(&ids()).to_kind(Kind::Float))
                    .log_softmax(-1, Kind::Float)
            };
            let (want, base) = (logp(&adapted.net), logp(&adapted.base_only().net));
            let decoding = adapted.net.for_decoding();
            // The adapters in the base's dtype, as CUDA decodes with them.
            let in_base_dtype = adapted.net.for_decoding_in(dtype.kind());
            let got = logp(&decoding);
            let (diff, base_dtype_diff) = (
                max_diff(&got, &want),
                max_diff(&logp(&in_base_dtype), &want),
            );
            let effect = max_diff(&base, &want);
            println!(
                "{dtype:?}: decoding copy vs trainable adapters, max |Δ log p| {diff:.2e} \
                 (adapters in the base dtype: {base_dtype_diff:.2e}); the adapters move it \
                 {effect:.2e}"
            );
            for d in [diff, base_dtype_diff] {
                assert!(d < tolerance, "{dtype:?}: {d}");
                // The adapters' effect is far larger than the difference: it is not lost.
                // (The random base still comes from torch's global generator, which tests
                // beside this one draw from too: the margin leaves room for that.)
                assert!(effect > 10.0 * d, "{dtype:?}: {effect} vs {d}");
            }
            let calls = |net: &crate::model::Transformer| {
                crate::op_count::count(|| tch::no_grad(|| net.forward(&ids())))
                    .1
                    .computing_total()
            };
            let trainable = calls(&adapted.net);
            let (frozen, frozen_in_base) = (calls(&decoding), calls(&in_base_dtype));
            assert!(frozen < trainable, "{dtype:?}: {frozen} vs {trainable}");
            // Per projection of 2 layers × 7.
            assert_eq!(trainable - frozen_in_base, 2 * 7 * saved, "{dtype:?}");
            perturb(&adapted);
            assert!(
                max_diff(&logp(&decoding), &got) == 0.0,
                "a copy, not a view"
            );
        }
    }

    /// CUDA's form of a trainable adapter (products in the base's dtype) computes the CPU's
    /// (float32 products) to the base dtype's rounding, values and gradients alike, and the
    /// decoding copy in the base's dtype computes exactly it: on CUDA the engine's and the
    /// trainer's adapters agree to the bit.
    #[test]
    fn products_in_the_base_dtype_match_float32_and_the_decoding_copy() {
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = LoraConfig {
            rank: 4,
            ..Default::default()
        };
        let mut proj = Projection::new(vs.root() / "q", 32, 24, true);
        proj.attach(vs.root() / "q", &cfg);
        tch::manual_seed(8);
        tch::no_grad(|| {
            proj.base.ws = (proj.base.ws.randn_like() * 0.2).to_kind(Kind::BFloat16);
            proj.base.bs = proj.base.bs.as_ref().map(|b| b.to_kind(Kind::BFloat16));
            if let Some(Adapter::Trainable(ad)) = &proj.adapter {
                ad.b.shallow_clone().copy_(&(ad.b.randn_like() * 0.3));
            }
        });
        let Some(Adapter::Trainable(ad)) = &proj.adapter else {
            unreachable!("attached above")
        };
        let x = Tensor::randn([3, 5, 32], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
        let y = || tch::no_grad(|| proj.base.forward(&x));
        let f32 = |t: &Tensor| t.to_kind(Kind::Float);
        let grads = |out: Tensor| {
            for t in [&ad.a, &ad.b] {
                t.shallow_clone().zero_grad();
            }
            (f32(&out) * Tensor::arange(24, (Kind::Float, Device::Cpu)))
                .sum(Kind::Float)
                .backward();
            (ad.a.grad().copy(), ad.b.grad().copy())
        };
        let (float32, base_dtype) = (ad.add_in_float32(y(), &x), ad.add_in_base_dtype(y(), &x));
        let effect = (f32(&float32) - f32(&y())).abs().max().double_value(&[]);
        let diff = (f32(&float32) - f32(&base_dtype))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < effect / 20.0, "{diff} vs the adapter's {effect}");
        let ((ga, gb), (ga_b, gb_b)) = (grads(float32), grads(base_dtype.shallow_clone()));
        for (g, h) in [(ga, ga_b), (gb, gb_b)] {
            let rel = (&g - &h).norm().double_value(&[]) / g.norm().double_value(&[]);
            assert!(rel < 0.02, "gradients differ by {rel} of their norm");
        }
        let decoding = proj.for_decoding(Kind::BFloat16);
        let copied = tch::no_grad(|| decoding.forward(&x));
        assert!(
            copied.equal(&base_dtype.detach()),
            "the decoding copy computes the same"
        );
    }

    #[test]
    fn merged_files_and_peft_adapters_reproduce_the_adapted_model() {
        let dir = std::env::temp_dir().join(format!("skein-lora-{}", std::process::id()));
        let mut adapted = Model::random_with(&config(), &lora(4), Device::Cpu, 3).unwrap();
        perturb(&adapted);
        let want = adapted.net.forward(&ids());

        adapted.save_dir(&dir.join("merged")).unwrap();
        let merged = Model::load_dir(&dir.join("merged"), Device::Cpu).unwrap();
        assert!(max_diff(&merged.net.forward(&ids()), &want) < 1e-5);

        adapted.save_base_dir(&dir.join("base")).unwrap();
        adapted.save_adapter(&dir.join("adapter"), "base").unwrap();
        let again = Model::load_dir_with(&dir.join("base"), &lora(4), Device::Cpu).unwrap();
        again.load_adapter(&dir.join("adapter")).unwrap();
        assert!(max_diff(&again.net.forward(&ids()), &want) == 0.0);
        let wrong = Model::load_dir_with(&dir.join("base"), &lora(8), Device::Cpu).unwrap();
        let err = wrong.load_adapter(&dir.join("adapter")).unwrap_err();
        assert!(err.to_string().contains("rank 4"), "{err}");
        // A tensor beside the adapters (PEFT's trainable token rows) is refused by name, not
        // dropped.
        let file = dir.join("adapter/adapter_model.safetensors");
        let mut named = Tensor::read_safetensors(&file).unwrap();
        let extra = "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta";
        named.push((
            extra.to_string(),
            Tensor::zeros([2, 4], (Kind::Float, Device::Cpu)),
        ));
        Tensor::write_safetensors(&named, &file).unwrap();
        let err = again.load_adapter(&dir.join("adapter")).unwrap_err();
        assert!(err.to_string().contains("trainable_tokens_delta"), "{err}");

        adapted.merge_adapters();
        assert!(max_diff(&adapted.net.forward(&ids()), &want) < 1e-5);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A frozen copy of a bfloat16 model's adapters computes what the model computes, bit for
    /// bit, and keeps doing so after the model's adapters change; saved and loaded, it is the
    /// same again. (Folded into the bfloat16 base instead, a small update rounds away.)
    #[test]
    fn a_frozen_copy_keeps_the_adapters_as_they_were() {
        let dir = std::env::temp_dir().join(format!("skein-frozen-{}", std::process::id()));
        let model = small_update_on_bfloat16(6, 1e-3);
        let bf16 = model.options.clone();
        let want = model.net.forward(&ids());
        let frozen = model.frozen_copy();
        assert!(frozen.net.forward(&ids()).equal(&want));
        assert!(frozen.vs.trainable_variables().is_empty());
        assert!(max_diff(&model.base_only().net.forward(&ids()), &want) > 0.0);
        let mut merged = Model::random_with(&config(), &bf16, Device::Cpu, 6).unwrap();
        tch::no_grad(|| merged.vs.copy(&model.vs)).unwrap();
        merged.merge_adapters();
        assert!(
            !merged.net.forward(&ids()).equal(&want),
            "folding into bfloat16 should have rounded the update"
        );

        perturb(&model);
        assert!(!model.net.forward(&ids()).equal(&want));
        assert!(frozen.net.forward(&ids()).equal(&want));

        frozen.save_adapter(&dir, "base").unwrap();
        let again = model.frozen_copy();
        again.load_adapter(&dir).unwrap();
        assert!(again.net.forward(&ids()).equal(&want));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// bfloat16 weights hold half the bytes and keep float32 adapters; the log-probs they give
    /// stay close to float32's (printed: the agreement the README quotes).
    #[test]
    fn a_bfloat16_base_keeps_float32_adapters_and_close_log_probs() {
        let f32_model = Model::random_with(&config(), &lora(4), Device::Cpu, 4).unwrap();
        perturb(&f32_model);
        let bf16 = ModelOptions {
            dtype: Dtype::Bfloat16,
            ..lora(4)
        };
        let mut bf16_model = Model::random_with(&config(), &bf16, Device::Cpu, 9).unwrap();
        tch::no_grad(|| bf16_model.vs.copy(&f32_model.vs)).unwrap();
        for (name, t) in bf16_model.vs.variables() {
            let want = if is_adapter(&name) {
                Kind::Float
            } else {
                Kind::BFloat16
            };
            assert_eq!(t.kind(), want, "{name}");
        }
        let logp = |m: &Model| {
            m.net
                .forward(&ids())
                .to_kind(Kind::Float)
                .log_softmax(-1, Kind::Float)
        };
        let d = (logp(&bf16_model) - logp(&f32_model)).abs();
        let (max, mean) = (
            d.max().double_value(&[]),
            d.mean(Kind::Float).double_value(&[]),
        );
        println!("bfloat16 vs float32 log-probs: max |Δ| {max:.4}, mean |Δ| {mean:.5}");
        assert!(max < 0.1 && mean < 0.02, "max {max}, mean {mean}");
    }

    /// A bfloat16 base's merged weights keep an adapter's update too small for bfloat16's
    /// digits: written in float32, they are the base plus B·A exactly.
    #[test]
    fn merged_weights_of_a_bfloat16_base_keep_small_updates() {
        let model = small_update_on_bfloat16(5, 1e-4);
        let dir = std::env::temp_dir().join(format!("skein-bf16-merge-{}", std::process::id()));
        model.save_dir(&dir).unwrap();
        // The config tells loaders the weights' dtype, not the bfloat16 base's: transformers
        // would round them back to bfloat16 as it loads them.
        let dtype_of = |dir: &std::path::Path| {
            let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
            let config: serde_json::Value = serde_json::from_str(&text).unwrap();
            config["torch_dtype"].as_str().unwrap().to_string()
        };
        assert_eq!(dtype_of(&dir), "float32");
        let base = dir.join("base");
        model.save_base_dir(&base).unwrap();
        assert_eq!(dtype_of(&base), "bfloat16");
        let saved: std::collections::HashMap<String, Tensor> =
            Tensor::read_safetensors(dir.join("model.safetensors"))
                .unwrap()
                .into_iter()
                .collect();
        std::fs::remove_dir_all(&dir).ok();
        let vars = model.vs.variables();
        let name = "model.layers.0.self_attn.q_proj.weight";
        let (a, b) = adapter_names(name).unwrap();
        let want = vars[name].to_kind(Kind::Float)
            + vars[&b].matmul(&vars[&a]) * model.options.lora.scale();
        let got = &saved[name];
        assert_eq!(got.kind(), Kind::Float);
        assert!(max_diff(got, &want) == 0.0);
        // The update is there, though rounding to bfloat16 would have lost most of it.
        assert!(max_diff(got, &vars[name].to_kind(Kind::Float)) > 0.0);
    }

    #[test]
    fn bad_settings_name_their_key() {
        let mut cfg = LoraConfig {
            rank: 8,
            targets: vec!["q_proj".into(), "lm_head".into()],
            ..Default::default()
        };
        assert!(cfg
            .check()
            .unwrap_err()
            .to_string()
            .contains("`lora.targets` has `lm_head`"));
        cfg.targets = vec![];
        assert!(cfg
            .check()
            .unwrap_err()
            .to_string()
            .contains("`lora.targets` is empty"));
        let bf16_full = ModelOptions {
            dtype: Dtype::Bfloat16,
            ..Default::default()
        };
        bf16_full.check(Device::Cpu).unwrap();
        let f16_full = ModelOptions {
            dtype: Dtype::Float16,
            ..Default::default()
        };
        let err = f16_full.check(Device::Cuda(0)).unwrap_err().to_string();
        assert!(
            err.contains("loss scaling") && err.contains("`lora.rank`"),
            "{err}"
        );
    }
}
