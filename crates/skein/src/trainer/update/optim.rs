//! AdamW with a learning-rate schedule (linear warm-up, then constant or cosine) and
//! gradient-norm clipping. Its arithmetic runs over a group of tensors at a time, through
//! libtorch's multi-tensor ops (`optim_ops.rs`): on a GPU a few launches per op for the whole
//! model instead of one per tensor.

use super::optim_ops::{self, AdamwForm, AdamwGroup, AdamwScalars};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tch::nn;
use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    Constant,
    Cosine,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimConfig {
    pub lr: f64,
    /// AdamW's decoupled weight decay, on every trainable tensor: norm gains and biases too,
    /// where transformers' Trainer leaves them out (with LoRA only the adapters train).
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Steps of linear warm-up; in `skein train` the schedule (warm-up and cosine) counts RL
    /// steps, whatever number of optimizer steps each takes.
    pub warmup_steps: usize,
    pub schedule: Schedule,
    /// Lowest learning rate of the cosine schedule, as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// Gradients are rescaled to at most this global L2 norm; 0 disables.
    pub grad_clip: f64,
}

impl Default for OptimConfig {
    fn default() -> Self {
        // On the default task, 5e-4 lowered the training reward over 60 steps (0.43 → 0.39);
        // 2e-4 raises it (0.48 → 0.56).
        OptimConfig {
            lr: 2e-4,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            warmup_steps: 0,
            schedule: Schedule::Constant,
            min_lr_ratio: 0.1,
            grad_clip: 1.0,
        }
    }
}

impl OptimConfig {
    /// Learning rate at optimizer step `step` (0-based) of `total`.
    pub fn lr_at(&self, step: usize, total: usize) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::Cosine => {
                let span = total.saturating_sub(self.warmup_steps).max(1) as f64;
                let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
                let min = self.lr * self.min_lr_ratio;
                min + (self.lr - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

/// AdamW (decoupled weight decay, bias-corrected moments) over a var store's trainable
/// variables. Written out rather than taken from libtorch so its moments can be saved in a
/// checkpoint and a resumed run continues exactly.
///
/// A variable held in bfloat16 or float16 (every weight trained in `model.dtype` below
/// float32) trains through a float32 master copy, as mixed precision does: the step reads its
/// gradient in float32, updates the master and the moments there, and the variable becomes the
/// master rounded. Updated in the low precision itself, a step smaller than half the weight's
/// last digit would be lost, and most of a fine-tuning run's are.
pub struct Optimizer {
    /// Trainable variables by name (sorted), with their first and second moments.
    params: Vec<(String, Tensor)>,
    /// The float32 master copy of each variable held in lower precision ([`needs_master`]).
    masters: Vec<Option<Tensor>>,
    /// How a step computes (by the variables' device).
    form: AdamwForm,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    cfg: OptimConfig,
    total_steps: usize,
    pub steps_done: usize,
    /// Where the learning-rate schedule stands, when it is set from outside
    /// ([`Optimizer::schedule_at`]); else the optimizer steps taken.
    schedule_step: Option<usize>,
}

pub struct StepStats {
    pub grad_norm: f64,
    pub lr: f64,
    /// The gradient was not finite: no update was applied and the schedule did not advance.
    pub skipped: bool,
}

impl Optimizer {
    pub fn new(vs: &nn::VarStore, cfg: &OptimConfig, total_steps: usize) -> Result<Self> {
        let params = crate::model::sorted_trainable(vs);
        let masters: Vec<Option<Tensor>> = tch::no_grad(|| {
            params
                .iter()
                .map(|(_, p)| needs_master(p.kind()).then(|| p.detach().to_kind(Kind::Float)))
                .collect()
        });
        // The moments are float32 wherever the weight the step updates is.
        let zeros = || -> Vec<Tensor> {
            params
                .iter()
                .zip(&masters)
                .map(|((_, p), master)| master.as_ref().unwrap_or(p).zeros_like())
                .collect()
        };
        Ok(Optimizer {
            m: zeros(),
            v: zeros(),
            form: AdamwForm::for_device(vs.device()),
            params,
            masters,
            cfg: cfg.clone(),
            total_steps,
            steps_done: 0,
            schedule_step: None,
        })
    }

    /// Puts the schedule at `step` of the `total_steps` given to [`Optimizer::new`], for every
    /// optimizer step until the next call. RL schedules by its own steps: how many optimizer
    /// steps an RL step takes depends on the batch (mini-batches are capped by the units in
    /// it, and skipped updates take none), so a horizon counted in optimizer steps would end
    /// the schedule early or late.
    pub fn schedule_at(&mut self, step: usize) {
        self.schedule_step = Some(step);
    }

    /// Computes every later step in `form` instead of the device's (a bench measures the other
    /// form this way).
    pub fn set_form(&mut self, form: AdamwForm) {
        self.form = form;
    }

    pub fn form(&self) -> AdamwForm {
        self.form
    }

    fn lr(&self) -> f64 {
        let step = self.schedule_step.unwrap_or(self.steps_done);
        self.cfg.lr_at(step, self.total_steps)
    }

    /// Drops every parameter's gradient (PyTorch's `zero_grad(set_to_none=True)`): the next
    /// backward writes them instead of adding to zeros.
    pub fn zero_grad(&mut self) {
        let params: Vec<&Tensor> = self.params.iter().map(|(_, p)| p).collect();
        optim_ops::forget_grads(&params);
    }

    /// Clips the accumulated gradients, applies one update, and advances the schedule; with a
    /// NaN or infinite gradient it changes nothing and reports the step as skipped. A parameter
    /// that got no gradient since [`Optimizer::zero_grad`] is left as it is, moments and all.
    pub fn step(&mut self) -> StepStats {
        let grads: Vec<Tensor> = self.params.iter().map(|(_, p)| p.grad()).collect();
        let grad_norm = tch::no_grad(|| {
            // One device-to-host read for the whole norm, not one per parameter.
            let defined: Vec<&Tensor> = grads.iter().filter(|g| g.defined()).collect();
            if defined.is_empty() {
                return 0.0;
            }
            optim_ops::square_sums(&defined)
                .sum(Kind::Double)
                .double_value(&[])
                .sqrt()
        });
        if !grad_norm.is_finite() {
            self.zero_grad();
            return StepStats {
                grad_norm,
                lr: self.lr(),
                skipped: true,
            };
        }
        let clip = if self.cfg.grad_clip > 0.0 && grad_norm > self.cfg.grad_clip {
            self.cfg.grad_clip / (grad_norm + 1e-6)
        } else {
            1.0
        };
        let lr = self.lr();
        let scalars = self.scalars(clip, lr);
        tch::no_grad(|| self.apply(&grads, &scalars));
        self.steps_done += 1;
        StepStats {
            grad_norm,
            lr,
            skipped: false,
        }
    }

    /// The scalars of the next step, at learning rate `lr` with gradients scaled by `clip`.
    fn scalars(&self, clip: f64, lr: f64) -> AdamwScalars {
        let c = &self.cfg;
        let step = (self.steps_done + 1) as i32;
        AdamwScalars::new(clip, lr, c.weight_decay, c.beta1, c.beta2, c.eps, step)
    }

    /// One AdamW step of every parameter with a gradient, a group of them at a time
    /// ([`group_elements`]). A group's low-precision gradients are copied to float32 for the
    /// step, which updates their masters, and the masters are copied back rounded: two
    /// multi-tensor copies a group.
    fn apply(&mut self, grads: &[Tensor], scalars: &AdamwScalars) {
        let with_grads: Vec<usize> = (0..grads.len()).filter(|&k| grads[k].defined()).collect();
        let sizes: Vec<i64> = with_grads
            .iter()
            .map(|&k| grads[k].numel() as i64)
            .collect();
        let largest = sizes.iter().copied().max().unwrap_or(0);
        let budget = group_elements(largest as f64, sizes.iter().sum::<i64>() as f64);
        for range in groups(&sizes, budget as i64) {
            let ks = &with_grads[range];
            let cast: Vec<Option<Tensor>> = ks
                .iter()
                .map(|&k| self.masters[k].as_ref().map(Tensor::empty_like))
                .collect();
            let (to, from): (Vec<&Tensor>, Vec<&Tensor>) = ks
                .iter()
                .zip(&cast)
                .filter_map(|(&k, c)| c.as_ref().map(|c| (c, &grads[k])))
                .unzip();
            optim_ops::copy_lists(&to, &from);
            let step_grads: Vec<&Tensor> = ks
                .iter()
                .zip(&cast)
                .map(|(&k, c)| c.as_ref().unwrap_or(&grads[k]))
                .collect();
            let stepped: Vec<&Tensor> = ks.iter().map(|&k| self.stepped(k)).collect();
            let group = AdamwGroup {
                params: &stepped,
                grads: &step_grads,
                m: &pick(&self.m, ks),
                v: &pick(&self.v, ks),
            };
            if let Err(why) = optim_ops::adamw_step(&group, scalars, self.form) {
                // The same step was taken op by op; later steps go straight there.
                eprintln!(
                    "skein: libtorch's fused AdamW refused a group of tensors ({why}); the \
                     optimizer steps op by op from now on, with the same arithmetic"
                );
                self.form = AdamwForm::OpByOp;
            }
            let (low, masters): (Vec<&Tensor>, Vec<&Tensor>) = ks
                .iter()
                .filter_map(|&k| self.masters[k].as_ref().map(|w| (&self.params[k].1, w)))
                .unzip();
            optim_ops::copy_lists(&low, &masters);
        }
    }

    /// The tensor the step updates for parameter `k`: its master, or the parameter itself.
    fn stepped(&self, k: usize) -> &Tensor {
        self.masters[k].as_ref().unwrap_or(&self.params[k].1)
    }

    /// The moments, named `m.<variable>` and `v.<variable>`, and the float32 masters,
    /// `w.<variable>`, for a checkpoint.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(3 * self.params.len());
        for (k, (name, _)) in self.params.iter().enumerate() {
            out.push((format!("m.{name}"), self.m[k].shallow_clone()));
            out.push((format!("v.{name}"), self.v[k].shallow_clone()));
            if let Some(w) = &self.masters[k] {
                out.push((format!("w.{name}"), w.shallow_clone()));
            }
        }
        out
    }

    /// Restores moments (and masters) saved by `state` and the number of steps taken.
    pub fn restore(&mut self, state: &[(String, Tensor)], steps_done: usize) -> Result<()> {
        let saved: std::collections::HashMap<&str, &Tensor> =
            state.iter().map(|(n, t)| (n.as_str(), t)).collect();
        tch::no_grad(|| -> Result<()> {
            for (k, (name, p)) in self.params.iter().enumerate() {
                let mut slots = vec![("m", &mut self.m[k]), ("v", &mut self.v[k])];
                if let Some(w) = self.masters[k].as_mut() {
                    slots.push(("w", w));
                }
                for (prefix, slot) in slots {
                    let key = format!("{prefix}.{name}");
                    let t = saved.get(key.as_str()).with_context(|| {
                        format!(
                            "the optimizer state has no `{key}` ({})",
                            state_name(prefix)
                        )
                    })?;
                    if t.size() != p.size() {
                        bail!(
                            "optimizer state `{key}` has shape {:?}, the model {:?}",
                            t.size(),
                            p.size()
                        );
                    }
                    slot.copy_(&t.to_kind(slot.kind()).to_device(slot.device()));
                }
            }
            Ok(())
        })?;
        self.steps_done = steps_done;
        Ok(())
    }
}

/// Whether a parameter held in `kind` trains through a float32 master copy: the 16-bit
/// floats, whose 8 (bfloat16) or 11 (float16) bits of mantissa lose small steps.
fn needs_master(kind: Kind) -> bool {
    matches!(kind, Kind::BFloat16 | Kind::Half)
}

/// What an optimizer state's entry of `prefix` holds, for an error naming a missing one.
fn state_name(prefix: &str) -> &'static str {
    match prefix {
        "m" => "a first moment",
        "v" => "a second moment",
        _ => {
            "a float32 master weight: the checkpoint was saved by a run in another \
              `model.dtype`"
        }
    }
}

/// The elements an AdamW group may hold beyond its largest tensor: 256 MiB of float32.
const GROUP_ELEMENTS: f64 = (1u64 << 26) as f64;

/// The most elements one AdamW group holds, for trainable tensors of `total` elements, the
/// largest of them `largest`: that tensor, or up to [`GROUP_ELEMENTS`] of the smaller ones
/// together. A group's step holds two float32 temporaries of its size (the denominator and the
/// update; the preflight counts them). On a GPU each op of a group is one launch per few dozen
/// tensors or 20M elements, so a model's few hundred tensors take a few launches per op. The
/// same on every device, so the CPU counts the GPU's calls (`skein bench`).
pub fn group_elements(largest: f64, total: f64) -> f64 {
    largest.max(total.min(GROUP_ELEMENTS))
}

/// The tensors of `list` at `ks`.
fn pick<'a>(list: &'a [Tensor], ks: &[usize]) -> Vec<&'a Tensor> {
    ks.iter().map(|&k| &list[k]).collect()
}

/// Consecutive runs of tensors whose sizes sum to at most `budget` elements each (a tensor
/// larger than the budget is a group alone), in order.
fn groups(sizes: &[i64], budget: i64) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut held) = (0, 0);
    for (k, &n) in sizes.iter().enumerate() {
        if k > start && held + n > budget {
            out.push(start..k);
            (start, held) = (k, 0);
        }
        held += n;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::OptimizerConfig;

    /// A small least-squares problem: one linear layer, fixed data.
    fn problem(seed: i64) -> (nn::VarStore, nn::Linear, Tensor, Tensor) {
        tch::manual_seed(seed);
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let lin = nn::linear(vs.root() / "lin", 6, 3, Default::default());
        (
            vs,
            lin,
            Tensor::randn([16, 6], tch::kind::FLOAT_CPU),
            Tensor::randn([16, 3], tch::kind::FLOAT_CPU),
        )
    }

    fn loss(lin: &nn::Linear, x: &Tensor, y: &Tensor) -> Tensor {
        use tch::nn::Module;
        (lin.forward(x) - y).square().mean(Kind::Float)
    }

    fn cfg() -> OptimConfig {
        OptimConfig {
            lr: 0.05,
            weight_decay: 0.1,
            grad_clip: 0.0,
            ..Default::default()
        }
    }

    /// A schedule over 4 RL steps gives every RL step the same learning rate, whether the
    /// steps took one optimizer step each or three.
    #[test]
    fn a_schedule_set_by_rl_step_ends_on_time_whatever_the_mini_batches() {
        let (vs, lin, x, y) = problem(3);
        let cfg = OptimConfig {
            warmup_steps: 1,
            schedule: Schedule::Cosine,
            ..cfg()
        };
        for per_step in [1, 3] {
            let mut opt = Optimizer::new(&vs, &cfg, 4).unwrap();
            let mut lrs = Vec::new();
            for step in 0..4 {
                opt.schedule_at(step);
                for _ in 0..per_step {
                    opt.zero_grad();
                    loss(&lin, &x, &y).backward();
                    lrs.push(opt.step().lr);
                }
            }
            let want: Vec<f64> = (0..4)
                .flat_map(|s| std::iter::repeat_n(cfg.lr_at(s, 4), per_step))
                .collect();
            assert_eq!(lrs, want, "{per_step} optimizer steps per RL step");
            assert_eq!(opt.steps_done, 4 * per_step);
        }
    }

    /// A var store of one trainable tensor per shape, with fixed values rather than the
    /// global generator's (tests on other threads reseed it).
    fn fixed_vars(shapes: &[&[i64]]) -> nn::VarStore {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        for (k, shape) in shapes.iter().enumerate() {
            let n: i64 = shape.iter().product();
            let values = (Tensor::arange(n, (Kind::Float, tch::Device::Cpu)) * 0.7 + k as f64)
                .sin()
                .view(*shape);
            let _ = vs.root().var_copy(&format!("w{k}"), &values);
        }
        vs
    }

    /// AdamW tensor by tensor and op by op, as the optimizer once computed it: the reference
    /// the fused step must meet to round-off.
    fn per_tensor_step(
        ps: &mut [Tensor],
        ms: &mut [Tensor],
        vs: &mut [Tensor],
        c: &OptimConfig,
        t: i32,
    ) {
        let grads: Vec<Tensor> = ps.iter().map(Tensor::grad).collect();
        let squares: Vec<Tensor> = grads
            .iter()
            .map(|g| g.to_kind(Kind::Float).square().sum(Kind::Float))
            .collect();
        let norm = Tensor::stack(&squares, 0)
            .sum(Kind::Double)
            .double_value(&[])
            .sqrt();
        let clip = if norm > c.grad_clip {
            c.grad_clip / (norm + 1e-6)
        } else {
            1.0
        };
        let (b1, b2) = (c.beta1, c.beta2);
        let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        tch::no_grad(|| {
            for (k, g) in grads.iter().enumerate() {
                let g = g * clip;
                let _ = ps[k].g_mul_scalar_(1.0 - c.lr * c.weight_decay);
                let _ = ms[k].g_mul_scalar_(b1).g_add_(&(&g * (1.0 - b1)));
                let _ = vs[k].g_mul_scalar_(b2).g_add_(&(&g * &g * (1.0 - b2)));
                let denom = (vs[k].sqrt() / bc2.sqrt()) + c.eps;
                let _ = ps[k].g_sub_(&(&ms[k] / denom * (c.lr / bc1)));
            }
        });
    }

    /// Six steps of `form` (three with the gradients clipped, three not, weights decayed)
    /// against the per-tensor reference: `agree` holds for the weights and both moments after
    /// each.
    fn against_per_tensor(form: AdamwForm, agree: impl Fn(&Tensor, &Tensor) -> bool) {
        let vs = fixed_vars(&[&[7, 5], &[3], &[11, 2], &[4, 4]]);
        let mut theirs: Vec<Tensor> = crate::model::sorted_trainable(&vs)
            .iter()
            .map(|(_, p)| p.detach().copy().set_requires_grad(true))
            .collect();
        let (mut m, mut v): (Vec<Tensor>, Vec<Tensor>) = theirs
            .iter()
            .map(|p| (p.zeros_like(), p.zeros_like()))
            .unzip();
        for clip in [1e-3, 1e3] {
            let c = OptimConfig {
                grad_clip: clip,
                ..cfg()
            };
            let mut ours = Optimizer::new(&vs, &c, 4).unwrap();
            ours.form = form;
            for t in 1..=3 {
                let ps = crate::model::sorted_trainable(&vs);
                ours.zero_grad();
                for p in &mut theirs {
                    p.zero_grad();
                }
                let loss = |ws: Vec<&Tensor>| {
                    ws.iter()
                        .map(|w| (w.sin() * *w).sum(Kind::Float))
                        .fold(Tensor::from(0f32), |a, b| a + b)
                };
                loss(ps.iter().map(|(_, p)| p).collect()).backward();
                loss(theirs.iter().collect()).backward();
                ours.step();
                per_tensor_step(&mut theirs, &mut m, &mut v, &c, t);
                for (k, (name, p)) in ps.iter().enumerate() {
                    assert!(agree(p, &theirs[k]), "{name} at step {t}, clip {clip}");
                    assert!(
                        agree(&ours.m[k], &m[k]) && agree(&ours.v[k], &v[k]),
                        "{name}'s moments"
                    );
                }
            }
            m.iter_mut().chain(v.iter_mut()).for_each(|t| {
                let _ = t.zero_();
            });
        }
    }

    /// The op-by-op multi-tensor step (the CPU's) computes the per-tensor one's weights and
    /// moments to the bit, gradients clipped or not.
    #[test]
    fn the_op_by_op_step_is_the_per_tensor_step_on_the_cpu() {
        against_per_tensor(AdamwForm::OpByOp, |a, b| a.equal(b));
    }

    /// The fused step (a GPU's) computes them to round-off: within a few float32 roundings
    /// of each value.
    #[test]
    fn the_fused_step_is_the_per_tensor_step_to_round_off() {
        against_per_tensor(AdamwForm::Fused, |a, b| {
            let gap = (a - b).abs() - b.abs() * 1e-5;
            gap.max().double_value(&[]) <= 1e-8
        });
    }

    /// A group the fused op refuses (here gradients of another dtype than the weights') is
    /// stepped op by op instead, with the refusal's reason: the same numbers as asking for the
    /// op-by-op form.
    #[test]
    fn a_group_the_fused_op_refuses_is_stepped_op_by_op() {
        let fresh = || {
            let w = Tensor::from_slice(&[0.5f32, -1.0, 2.0]);
            let g = Tensor::from_slice(&[0.1f64, 0.2, -0.3]);
            (
                w,
                g,
                Tensor::zeros([3], tch::kind::FLOAT_CPU),
                Tensor::zeros([3], tch::kind::FLOAT_CPU),
            )
        };
        let scalars = AdamwScalars::new(1.0, 1e-2, 0.1, 0.9, 0.99, 1e-8, 1);
        let step = |form: AdamwForm| {
            let (w, g, m, v) = fresh();
            let group = AdamwGroup {
                params: &[&w],
                grads: &[&g],
                m: &[&m],
                v: &[&v],
            };
            (optim_ops::adamw_step(&group, &scalars, form), w, m, v)
        };
        let (refused, w, m, v) = step(AdamwForm::Fused);
        let why = refused.unwrap_err();
        assert!(why.contains("Double"), "{why}");
        let (done, w2, m2, v2) = step(AdamwForm::OpByOp);
        done.unwrap();
        assert!(w.equal(&w2) && m.equal(&m2) && v.equal(&v2));
        assert!(!w.equal(&fresh().0), "the weights moved");
    }

    /// `zero_grad` drops the gradients, and the next backward writes them afresh.
    #[test]
    fn zero_grad_drops_the_gradients() {
        let vs = fixed_vars(&[&[3, 2], &[4]]);
        let backward = || {
            let ws = vs.trainable_variables();
            ws.iter()
                .map(|w| (w.sin() * w).sum(Kind::Float))
                .fold(Tensor::from(0f32), |a, b| a + b)
                .backward()
        };
        let mut opt = Optimizer::new(&vs, &cfg(), 10).unwrap();
        backward();
        let first: Vec<Tensor> = vs
            .trainable_variables()
            .iter()
            .map(|t| t.grad().copy())
            .collect();
        backward();
        opt.zero_grad();
        assert!(vs.trainable_variables().iter().all(|t| !t.grad().defined()));
        backward();
        for (t, g) in vs.trainable_variables().iter().zip(&first) {
            assert!(t.grad().equal(g), "not added to the dropped gradient");
        }
    }

    /// Groups are consecutive, hold at most the budget (a larger tensor alone), and cover
    /// every tensor once; the budget is the largest tensor or up to 2^26 elements together.
    #[test]
    fn groups_are_bounded_consecutive_runs() {
        assert_eq!(groups(&[5, 3, 3, 10, 1], 8), [0..2, 2..3, 3..4, 4..5]);
        assert_eq!(groups(&[1, 1, 1], 8), vec![0..3]);
        assert!(groups(&[], 8).is_empty());
        assert_eq!(group_elements(10.0, 18.0), 18.0);
        assert_eq!(group_elements(2f64.powi(27), 2f64.powi(28)), 2f64.powi(27));
        assert_eq!(
            group_elements(2f64.powi(20), 100.0 * 2f64.powi(20)),
            2f64.powi(26)
        );
    }

    #[test]
    fn matches_libtorch_adamw() {
        let (vs_a, lin_a, x, y) = problem(1);
        // Same starting weights (copied: other tests share libtorch's global seed).
        let (mut vs_b, lin_b, _, _) = problem(1);
        vs_b.copy(&vs_a).unwrap();
        let mut ours = Optimizer::new(&vs_a, &cfg(), 10).unwrap();
        let c = cfg();
        let mut theirs = nn::AdamW {
            beta1: c.beta1,
            beta2: c.beta2,
            wd: c.weight_decay,
            eps: c.eps,
            amsgrad: false,
        }
        .build(&vs_b, c.lr)
        .unwrap();
        for _ in 0..10 {
            ours.zero_grad();
            loss(&lin_a, &x, &y).backward();
            ours.step();
            theirs.zero_grad();
            loss(&lin_b, &x, &y).backward();
            theirs.step();
        }
        let (a, b) = (vs_a.variables(), vs_b.variables());
        for (name, t) in &a {
            let d = (t - &b[name]).abs().max().double_value(&[]);
            assert!(d < 1e-6, "{name}: {d}");
        }
    }

    #[test]
    fn a_non_finite_gradient_is_skipped_without_touching_anything() {
        let (vs, lin, x, y) = problem(4);
        let mut opt = Optimizer::new(&vs, &cfg(), 10).unwrap();
        let before: Vec<Tensor> = vs.trainable_variables().iter().map(|t| t.copy()).collect();
        opt.zero_grad();
        (loss(&lin, &x, &y) * f64::NAN).backward();
        let s = opt.step();
        assert!(s.skipped && s.grad_norm.is_nan());
        assert_eq!(opt.steps_done, 0);
        for (a, b) in vs.trainable_variables().iter().zip(&before) {
            assert!(a.equal(b));
        }
        assert!(opt
            .state()
            .iter()
            .all(|(_, m)| m.abs().sum(Kind::Float).double_value(&[]) == 0.0));
        // The next finite step proceeds normally.
        opt.zero_grad();
        loss(&lin, &x, &y).backward();
        assert!(!opt.step().skipped);
        assert_eq!(opt.steps_done, 1);
    }

    #[test]
    fn restored_moments_continue_bitwise() {
        let (vs_a, lin_a, x, y) = problem(2);
        let mut a = Optimizer::new(&vs_a, &cfg(), 10).unwrap();
        for _ in 0..3 {
            a.zero_grad();
            loss(&lin_a, &x, &y).backward();
            a.step();
        }
        // A second model starts from a copy of the first's weights and state.
        let (mut vs_b, lin_b, _, _) = problem(3);
        vs_b.copy(&vs_a).unwrap();
        let mut b = Optimizer::new(&vs_b, &cfg(), 10).unwrap();
        let state: Vec<(String, Tensor)> =
            a.state().into_iter().map(|(n, t)| (n, t.copy())).collect();
        b.restore(&state, a.steps_done).unwrap();
        for _ in 0..3 {
            for (opt, lin) in [(&mut a, &lin_a), (&mut b, &lin_b)] {
                opt.zero_grad();
                loss(lin, &x, &y).backward();
                opt.step();
            }
        }
        let (wa, wb) = (vs_a.variables(), vs_b.variables());
        for (name, t) in &wa {
            assert!(t.equal(&wb[name]), "{name} differs after restore");
        }
        assert!(
            b.restore(&state[1..], 3).is_err(),
            "a missing moment is an error"
        );
    }

    /// A var store of one bfloat16 variable `w` near 1, where bfloat16's spacing (2⁻⁷) is
    /// far wider than a step of learning rate 1e-4.
    fn bfloat16_weights() -> (nn::VarStore, Tensor) {
        let mut vs = nn::VarStore::new(tch::Device::Cpu);
        let _ = vs
            .root()
            .var_copy("w", &Tensor::from_slice(&[1.0f32, -1.0, 0.5, 2.0]));
        tch::no_grad(|| vs.set_kind(Kind::BFloat16));
        let w = vs.variables()["w"].shallow_clone();
        (vs, w)
    }

    /// A constant gradient of ±1 per weight, in bfloat16 as the forward makes it.
    fn push(opt: &mut Optimizer, w: &Tensor) {
        opt.zero_grad();
        let signs = Tensor::from_slice(&[1.0f32, -1.0, 1.0, -1.0]).to_kind(Kind::BFloat16);
        (w * signs).sum(Kind::Float).backward();
        assert!(!opt.step().skipped);
    }

    fn small_steps() -> OptimConfig {
        OptimConfig {
            lr: 1e-4,
            weight_decay: 0.0,
            ..cfg()
        }
    }

    /// A bfloat16 weight trains through a float32 master: the master takes every step, the
    /// weight is the master rounded, and so it moves, where each step taken in bfloat16 would
    /// round back to where it started.
    #[test]
    fn a_bfloat16_weight_trains_through_a_float32_master() {
        let (vs, w) = bfloat16_weights();
        let start = w.to_kind(Kind::Float);
        let mut opt = Optimizer::new(&vs, &small_steps(), 100).unwrap();
        for _ in 0..100 {
            push(&mut opt, &w);
        }
        let state: std::collections::HashMap<String, Tensor> = opt.state().into_iter().collect();
        let master = &state["w.w"];
        assert_eq!(master.kind(), Kind::Float);
        assert_eq!(state["m.w"].kind(), Kind::Float);
        // A hundred Adam steps of about 1e-4 each, against the gradient's sign.
        let moved = Vec::<f32>::try_from(master - &start).unwrap();
        for (k, d) in moved.iter().enumerate() {
            let want = if k % 2 == 0 { -0.01 } else { 0.01 };
            assert!((d - want).abs() < 1e-3, "weight {k} moved {d}");
        }
        assert!(w.equal(&master.to_kind(Kind::BFloat16)));
        assert!(!w.to_kind(Kind::Float).equal(&start), "the weight moved");
        // In bfloat16 itself a step of 1e-4 is lost: 1 - 1e-4 rounds to 1.
        let one = Tensor::from_slice(&[1.0f32]).to_kind(Kind::BFloat16);
        assert!((&one - 1e-4).equal(&one));
    }

    /// The masters are saved with the moments: a restored optimizer continues to the bit, and
    /// a state without them (a float32 run's) is refused by name.
    #[test]
    fn restored_masters_continue_bitwise() {
        let (vs_a, w_a) = bfloat16_weights();
        let mut a = Optimizer::new(&vs_a, &small_steps(), 100).unwrap();
        for _ in 0..30 {
            push(&mut a, &w_a);
        }
        let (mut vs_b, w_b) = bfloat16_weights();
        vs_b.copy(&vs_a).unwrap();
        let mut b = Optimizer::new(&vs_b, &small_steps(), 100).unwrap();
        let state: Vec<(String, Tensor)> =
            a.state().into_iter().map(|(n, t)| (n, t.copy())).collect();
        b.restore(&state, a.steps_done).unwrap();
        for _ in 0..30 {
            push(&mut a, &w_a);
            push(&mut b, &w_b);
        }
        assert!(w_a.equal(&w_b));
        let (sa, sb) = (a.state(), b.state());
        for ((name, x), (_, y)) in sa.iter().zip(&sb) {
            assert!(x.equal(y), "{name} differs after restore");
        }
        let without: Vec<(String, Tensor)> = state
            .into_iter()
            .filter(|(n, _)| !n.starts_with("w."))
            .collect();
        let err = b.restore(&without, 30).unwrap_err().to_string();
        assert!(
            err.contains("`w.w`") && err.contains("master weight"),
            "{err}"
        );
    }

    #[test]
    fn warmup_then_cosine_decays_to_the_floor() {
        let cfg = OptimConfig {
            lr: 1.0,
            warmup_steps: 4,
            schedule: Schedule::Cosine,
            min_lr_ratio: 0.1,
            ..Default::default()
        };
        assert!((cfg.lr_at(0, 14) - 0.25).abs() < 1e-12);
        assert!((cfg.lr_at(3, 14) - 1.0).abs() < 1e-12);
        assert!((cfg.lr_at(4, 14) - 1.0).abs() < 1e-12);
        assert!((cfg.lr_at(14, 14) - 0.1).abs() < 1e-12);
        assert!(cfg.lr_at(9, 14) < 1.0 && cfg.lr_at(9, 14) > 0.1);
    }
}
