//! The update of one step: for each epoch and each planned mini-batch, run every rank's rows
//! in token-bounded micro-batches, sum the gradients, and take one optimizer step — for the
//! policy ([`ppo_update`]) and, with a critic, for the value model ([`critic_update`]).
//! Each token's loss weight already holds the mini-batch's global counts, so the sum does not
//! depend on the rank or micro-batch split.
//!
//! | file | job |
//! | --- | --- |
//! | `pack.rs` | where rows sit in a micro-batch: padded, packed, or sharing a prompt |
//! | `tensors.rs` | rows → the tensors of a micro-batch |
//! | `head.rs` | per-token log-probs and entropies of the targets, the LM head in chunks |
//! | `kept.rs` | a truncated sampler's kept ids, laid out for the head |
//! | `policy_loss.rs` | each policy loss's term, KL and entropy terms per token |
//! | `critic.rs` | the clipped value loss and the critic's update |
//! | `optim.rs` | AdamW with clipping, schedules and non-finite skips |
//! | `optim_ops.rs` | the optimizer's libtorch calls that tch lacks: AdamW on tensor groups |
//! | `ranks/` | data-parallel ranks: threads or MPI processes, one optimizer, exact replicas |

pub mod critic;
pub mod head;
pub mod kept;
pub mod optim;
pub mod optim_ops;
pub mod pack;
pub mod policy_loss;
pub mod ranks;
pub mod tensors;

use self::critic::{critic_pass, ValueLossConfig};
use self::head::{logprobs_of_hidden, Entropy};
use self::optim::{Optimizer, StepStats};
use self::pack::micro_batches;
use self::policy_loss::{policy_loss, LossConfig, PolicyLoss, TokenBatch};
use self::ranks::{Job, PassSums, Ranks, RanksOut, Replica};
use self::tensors::{MicroBatch, PolicyInputs};
use crate::model::{Model, ValueModel};
use crate::trainer::batch::{RowPlan, TrainRow};
use crate::trainer::config::Batching;
use crate::trainer::prepare::PreparedBatch;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Clone)]
pub struct UpdateStats {
    pub loss: f64,
    /// Drift of the policy within the update, over the tokens of mini-batches that come after
    /// an applied optimizer step of this update ([`UpdateStats::drift_tokens`]): the share
    /// whose ratio to π_old was clipped, and the k2 estimate of KL(π_old‖π), the mean of
    /// ½(log π − log π_old)². A mini-batch before any step has π = π_old exactly (its π_old is
    /// its own forward's, or a pass with the same weights), so it would only dilute them.
    pub clip_frac: f64,
    /// The name `clip_frac` is logged under, by what the loss clips
    /// ([`PolicyLoss::clip_metric`]); None: the loss has no clip (SAPO) and none is logged.
    pub clip_metric: Option<&'static str>,
    pub approx_kl: f64,
    pub entropy: f64,
    pub ref_kl: f64,
    pub grad_norm: f64,
    pub lr: f64,
    pub optimizer_steps: usize,
    /// Loss tokens the passes computed π on, over every epoch: the denominator of `entropy`
    /// and `kl_ref` (`clip_frac` and `approx_kl` are over `drift_tokens`).
    pub loss_tokens: f64,
    /// Loss tokens of the mini-batches after an applied optimizer step of this update: where
    /// the policy had moved from π_old. 0 with one mini-batch and one epoch: the one step's
    /// drift is not seen by any pass (the next step samples with the new weights).
    pub drift_tokens: f64,
    pub micro_batches: usize,
    /// Token slots one epoch's forwards computed, padding and prompts included (against the
    /// loss's tokens, `tokens/trained`: what packing and shared prompts save). Every epoch
    /// computes the same plan, so more epochs do not read as more waste.
    pub computed_tokens: usize,
    /// Mini-batches whose loss or gradient was NaN or infinite: not applied.
    pub skipped_updates: usize,
    /// Where the skipped mini-batches fell among the applied ones.
    pub skip_runs: SkipRuns,
    /// Seconds ranks spent waiting for the slowest one at the all-reduce: per mini-batch the
    /// slowest rank's compute time minus the fastest's (the cost of imbalance), summed.
    pub rank_wait_s: f64,
}

/// Where an update's skipped optimizer steps fell among its applied ones, in order: what a run
/// of skips across updates needs (`trainer.max_consecutive_skips`), which the counts alone
/// do not say.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct SkipRuns {
    /// Skips before the first applied step (all of them when none was applied).
    leading: usize,
    /// Skips after the last applied step.
    trailing: usize,
    /// The longest run of skips after an applied step.
    longest_after_applied: usize,
    applied: bool,
}

impl SkipRuns {
    /// The next optimizer step, applied or skipped.
    pub fn record(&mut self, applied: bool) {
        match (applied, self.applied) {
            (true, _) => {
                self.applied = true;
                self.trailing = 0;
            }
            (false, false) => self.leading += 1,
            (false, true) => {
                self.trailing += 1;
                self.longest_after_applied = self.longest_after_applied.max(self.trailing);
            }
        }
    }

    /// The run of skips carried in (`streak`, from the updates before) continued through this
    /// update: the longest run it holds, and the run it leaves to the next.
    /// A run carried in that this update does not extend (its first step applied) ended
    /// before it, where it was already counted: it is not counted again.
    pub fn continue_streak(&self, streak: usize) -> (usize, usize) {
        let carried = match self.leading {
            0 => 0,
            n => streak + n,
        };
        if self.applied {
            (carried.max(self.longest_after_applied), self.trailing)
        } else {
            (carried, streak + self.leading)
        }
    }
}

impl UpdateStats {
    /// The policy update's metrics (`kl_ref` only when a reference model is on). A figure
    /// of nothing is not logged: without a loss token there is no entropy or drift to
    /// average, and without an applied optimizer step no loss, gradient norm or learning rate
    /// (a step that trains nothing would otherwise log zeros, which read as an entropy
    /// collapse). The counts are always logged.
    pub fn metrics(&self, reference_on: bool) -> Vec<(&'static str, f64)> {
        let mut m = vec![
            ("updates/applied", self.optimizer_steps as f64),
            ("updates/skipped", self.skipped_updates as f64),
            // Against tokens/trained: what padding and repeated prompts cost.
            ("tokens/computed", self.computed_tokens as f64),
        ];
        if self.optimizer_steps > 0 {
            m.extend([
                ("loss/policy", self.loss),
                ("grad_norm", self.grad_norm),
                ("lr", self.lr),
            ]);
        }
        if self.drift_tokens > 0.0 {
            m.push(("approx_kl", self.approx_kl));
            if let Some(name) = self.clip_metric {
                m.push((name, self.clip_frac));
            }
        }
        if self.loss_tokens > 0.0 {
            m.push(("entropy", self.entropy));
            if reference_on {
                m.push(("kl_ref", self.ref_kl));
            }
        }
        m
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpdateConfig {
    pub loss: LossConfig,
    pub epochs: usize,
    pub batching: Batching,
    pub temperature: f64,
    /// Keep only each layer's input in the forward and run the layers again in the backward
    /// (`trainer.activation_checkpointing`).
    pub activation_checkpointing: bool,
}

/// The per-rank pass of an update, with its settings: what the other ranks of an MPI job are
/// told to run (see [`serve_rank`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum PassKind {
    /// The clipped policy loss ([`rank_pass`]).
    Policy {
        reference_on: bool,
        cfg: UpdateConfig,
    },
    /// The clipped value loss ([`critic_pass`]).
    Critic(ValueLossConfig),
}

impl PassKind {
    /// The job the ranks get: the pass, encoded for other processes, with the rows and plan.
    fn job<'a>(&self, rows: &'a [TrainRow], plan: &'a RowPlan) -> Result<Job<'a>> {
        let pass = serde_json::to_vec(self).context("encoding the update's settings")?;
        Ok(Job { rows, plan, pass })
    }
}

/// PPO epochs over the planned mini-batches; one optimizer step per mini-batch.
///
/// `ranks` runs each mini-batch's rank lists (one after another on `policy` for dp 1; on
/// replicas or other processes beyond that, see [`ranks`]) and sums their gradients into
/// `policy`'s before the step.
pub fn ppo_update<R: Ranks<Model>>(
    policy: &Model,
    ranks: &mut R,
    opt: &mut Optimizer,
    batch: &PreparedBatch,
    cfg: &UpdateConfig,
) -> Result<UpdateStats> {
    let (rows, plan) = (batch.rows(), batch.plan());
    let reference_on = batch.has_reference();
    let pass = PassKind::Policy {
        reference_on,
        cfg: cfg.clone(),
    };
    ranks.begin(policy, &pass.job(rows, plan)?)?;
    let mut stats = UpdateStats {
        clip_metric: cfg.loss.kind.clip_metric(),
        ..Default::default()
    };
    let mut sums = PassSums::default();
    // The same sums over the mini-batches after an applied step: where drift exists.
    let mut drift = PassSums::default();
    let mut grad_norm = 0.0;
    for _ in 0..cfg.epochs {
        for mini_batch in plan {
            let (out, step) = mini_batch_step(policy, ranks, opt, mini_batch, |model, r, s| {
                rank_pass(model, reference_on, rows, r, cfg, s)
            })?;
            stats.rank_wait_s += out.wait_s;
            for s in &out.sums {
                sums.add(s);
                if stats.optimizer_steps > 0 {
                    drift.add(s);
                }
            }
            stats.skip_runs.record(step.is_some());
            match step {
                Some(step) => {
                    grad_norm += step.grad_norm;
                    stats.lr = step.lr;
                    stats.loss += out.loss;
                    stats.optimizer_steps += 1;
                }
                None => stats.skipped_updates += 1,
            }
        }
    }
    ranks.finish(policy)?;
    let n = stats.optimizer_steps.max(1) as f64;
    let t = if sums.tokens > 0.0 { sums.tokens } else { 1.0 };
    let d = if drift.tokens > 0.0 {
        drift.tokens
    } else {
        1.0
    };
    stats.micro_batches = sums.micro_batches;
    stats.loss_tokens = sums.tokens;
    stats.drift_tokens = drift.tokens;
    stats.computed_tokens = (sums.computed_tokens / cfg.epochs.max(1) as f64) as usize;
    stats.loss /= n;
    stats.grad_norm = grad_norm / n;
    stats.clip_frac = drift.clipped / d;
    stats.approx_kl = drift.kl / d;
    stats.entropy = sums.entropy / t;
    stats.ref_kl = sums.ref_kl / t;
    Ok(stats)
}

/// What the critic's update did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CriticStats {
    /// Mean value loss over the applied optimizer steps.
    pub loss: f64,
    pub optimizer_steps: usize,
    /// Mini-batches whose loss or gradient was NaN or infinite: not applied.
    pub skipped_updates: usize,
    /// Where those fell among the applied steps, for the run's streak of skips.
    pub skip_runs: SkipRuns,
}

impl CriticStats {
    /// `loss/value` only after an applied optimizer step (see [`UpdateStats::metrics`]).
    pub fn metrics(&self) -> Vec<(&'static str, f64)> {
        let mut m = vec![("updates/critic_skipped", self.skipped_updates as f64)];
        if self.optimizer_steps > 0 {
            m.push(("loss/value", self.loss));
        }
        m
    }
}

/// Epochs of the clipped value loss over the planned mini-batches (one optimizer step each),
/// each mini-batch's rank lists run by `ranks` as the policy's are. A mini-batch with a NaN
/// or infinite loss or gradient is skipped and counted, exactly as the policy's.
pub fn critic_update<R: Ranks<ValueModel>>(
    critic: &ValueModel,
    ranks: &mut R,
    opt: &mut Optimizer,
    rows: &[TrainRow],
    plan: &RowPlan,
    cfg: &ValueLossConfig,
) -> Result<CriticStats> {
    let pass = PassKind::Critic(cfg.clone());
    ranks.begin(critic, &pass.job(rows, plan)?)?;
    let mut stats = CriticStats::default();
    for _ in 0..cfg.epochs {
        for mini_batch in plan {
            let (out, step) = mini_batch_step(critic, ranks, opt, mini_batch, |m, r, _| {
                critic_pass(m, rows, r, cfg)
            })?;
            stats.skip_runs.record(step.is_some());
            match step {
                Some(_) => {
                    stats.loss += out.loss;
                    stats.optimizer_steps += 1;
                }
                None => stats.skipped_updates += 1,
            }
        }
    }
    ranks.finish(critic)?;
    stats.loss /= stats.optimizer_steps.max(1) as f64;
    Ok(stats)
}

/// One mini-batch of any model: zero the gradients, run every rank's rows, step the optimizer
/// unless the loss or the gradient is NaN or infinite (then nothing changes), and give every
/// rank rank 0's weights. Returns the ranks' output and the applied step (None: skipped).
pub fn mini_batch_step<M, R, F>(
    model: &M,
    ranks: &mut R,
    opt: &mut Optimizer,
    mini_batch: &[Vec<usize>],
    pass: F,
) -> Result<(RanksOut, Option<StepStats>)>
where
    M: Replica,
    R: Ranks<M>,
    F: Fn(&M, &[usize], &mut PassSums) -> f64 + Sync,
{
    opt.zero_grad();
    let out = ranks.run(model, mini_batch, pass)?;
    let step = if out.loss.is_finite() {
        Some(opt.step())
    } else {
        opt.zero_grad();
        None
    };
    // Every rank leaves this mini-batch with the weights rank 0 now has (whether or not the
    // step was applied), so the next one starts from identical parameters.
    ranks.sync(model)?;
    Ok((out, step.filter(|s| !s.skipped)))
}

/// One rank's share of a mini-batch: forward and backward of its rows in token-bounded
/// micro-batches, gradients accumulating on `model`. Returns the rank's loss.
pub fn rank_pass(
    model: &Model,
    reference_on: bool,
    rows: &[TrainRow],
    rank_rows: &[usize],
    cfg: &UpdateConfig,
    sums: &mut PassSums,
) -> f64 {
    let device = model.vs.device();
    let entropy = match cfg.loss.entropy_coef {
        0.0 => Entropy::Metric,
        _ => Entropy::Loss,
    };
    let mut loss = 0.0;
    for plan in micro_batches(rows, rank_rows, &cfg.batching) {
        let mb = MicroBatch::new(rows, &plan, device);
        let inputs = PolicyInputs::new(&mb, rows, reference_on);
        let (hidden, recompute) = mb.train_hidden(&model.net, cfg.activation_checkpointing);
        let lp = logprobs_of_hidden(&model.net, &mb, &hidden, cfg.temperature, entropy);
        let sequences = (cfg.loss.kind == PolicyLoss::Gspo).then(|| mb.sequence_index());
        let out = policy_loss(
            &TokenBatch {
                logp: &lp.logp,
                old_logp: &inputs.old_logp_or(&lp.logp),
                ref_logp: inputs.ref_logp.as_ref(),
                entropy: lp.entropy.as_ref(),
                advantages: &inputs.advantages,
                importance_weights: &inputs.importance_weights,
                loss_weights: &inputs.loss_weights,
                mask: &mb.mask,
                sequences: sequences.as_ref().map(|(index, n)| (index, *n)),
            },
            &cfg.loss,
        );
        out.loss.backward();
        lp.backward();
        if let Some(recompute) = recompute {
            recompute.backward();
        }
        loss += out.loss.double_value(&[]);
        sums.tokens += out.tokens;
        sums.clipped += out.clipped_tokens;
        sums.kl += out.approx_kl_sum;
        sums.entropy += out.entropy_sum;
        sums.ref_kl += out.ref_kl_sum;
        sums.micro_batches += 1;
        sums.computed_tokens += plan.computed_tokens() as f64;
    }
    loss
}

/// In an MPI job, a rank other than 0 serves rank 0's updates until rank 0 stops it, on the
/// GPU of its rank among its machine's processes (`device` is rank 0's, the first of each
/// machine's); nothing to do for thread ranks.
pub fn serve_other_rank(dp: &ranks::DataParallel, device: tch::Device) -> Result<()> {
    match dp {
        ranks::DataParallel::Threads { .. } => {
            let _ = device;
            Ok(())
        }
        #[cfg(feature = "mpi")]
        ranks::DataParallel::Mpi(group) => {
            let device = ranks::rank_device(device, group.local_rank());
            let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                serve_rank(group, device)
            }));
            let rank = group.rank();
            match served {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => {
                    eprintln!("skein: error on rank {rank}: {e:#}; stopping every rank");
                    group.abort()
                }
                Err(_) => {
                    eprintln!("skein: rank {rank} panicked (above); stopping every rank");
                    group.abort()
                }
            }
        }
    }
}

/// A rank other than 0 of an MPI job: holds the models rank 0 announces and runs its rows of
/// each update until rank 0 stops it.
#[cfg(feature = "mpi")]
fn serve_rank(group: &ranks::mpi::MpiGroup, device: tch::Device) -> Result<()> {
    use ranks::mpi::Command;
    use ranks::wire::decode_rows;
    let rank = group.rank();
    let mut models: Option<(Model, Option<ValueModel>)> = None;
    loop {
        let (command, payload) = group.receive_command()?;
        match command {
            Command::Stop => return Ok(()),
            Command::Models {
                config,
                options,
                critic,
            } => {
                let policy = Model::random_with(&config, &options, device, 0)
                    .with_context(|| format!("rank {rank}: building the policy"))?;
                let critic = critic
                    .then(|| ValueModel::new(&config, device))
                    .transpose()
                    .with_context(|| format!("rank {rank}: building the critic"))?;
                models = Some((policy, critic));
            }
            Command::Update { pass, plan } => {
                let rows = decode_rows(&payload).context("decoding the rows from rank 0")?;
                let pass: PassKind =
                    serde_json::from_slice(&pass).context("decoding the update from rank 0")?;
                let (policy, critic) = models
                    .as_ref()
                    .context("rank 0 sent an update before the models")?;
                match &pass {
                    PassKind::Policy { reference_on, cfg } => {
                        group.serve_update(policy, &plan, cfg.epochs, |m, r, s| {
                            rank_pass(m, *reference_on, &rows, r, cfg, s)
                        })?
                    }
                    PassKind::Critic(cfg) => {
                        let critic = critic
                            .as_ref()
                            .context("rank 0 sent a critic update but announced no critic")?;
                        group.serve_update(critic, &plan, cfg.epochs, |m, r, _| {
                            critic_pass(m, &rows, r, cfg)
                        })?
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelConfig;
    use optim::OptimConfig;
    use ranks::{fingerprint, Replicas};
    use tch::Device;

    /// An update that ran no pass and applied no step logs its counts and nothing else: a 0
    /// entropy, drift or learning rate would read as a collapse or a schedule at its end.
    #[test]
    fn an_update_of_nothing_logs_counts_not_zeros() {
        let keys = |s: &UpdateStats| -> Vec<&str> {
            s.metrics(true).into_iter().map(|(k, _)| k).collect()
        };
        let empty = UpdateStats::default();
        assert_eq!(
            keys(&empty),
            ["updates/applied", "updates/skipped", "tokens/computed"]
        );
        let trained = UpdateStats {
            optimizer_steps: 2,
            loss_tokens: 10.0,
            drift_tokens: 5.0,
            clip_metric: Some("clip_frac"),
            ..Default::default()
        };
        for key in [
            "loss/policy",
            "lr",
            "entropy",
            "approx_kl",
            "clip_frac",
            "kl_ref",
        ] {
            assert!(keys(&trained).contains(&key), "{key}");
        }
        let names =
            |s: CriticStats| -> Vec<&str> { s.metrics().into_iter().map(|(k, _)| k).collect() };
        assert_eq!(names(CriticStats::default()), ["updates/critic_skipped"]);
    }

    fn row(returns: f32) -> TrainRow {
        TrainRow {
            tokens: vec![1, 2, 3, 4],
            prompt_len: 2,
            loss_mask: vec![1, 1],
            behavior_logp: vec![0.0; 2],
            advantages: vec![0.0; 2],
            old_values: vec![0.0; 2],
            returns: vec![returns; 2],
            loss_weight: 0.25,
            ..Default::default()
        }
    }

    /// Rows of two prompts, three continuations each, of several lengths, with advantages.
    fn group_rows() -> Vec<TrainRow> {
        let mut rows = Vec::new();
        for g in 0..2u32 {
            let prompt: Vec<u32> = (0..5 + g).map(|i| 1 + (i * 7 + g) % 15).collect();
            for s in 0..3u32 {
                let n = 2 + (s * 5 + g) as usize % 6;
                let mut tokens = prompt.clone();
                tokens.extend((0..n as u32).map(|i| 1 + (i * 3 + s + g) % 15));
                rows.push(TrainRow {
                    tokens,
                    prompt_len: prompt.len(),
                    loss_mask: vec![1; n],
                    behavior_logp: vec![0.0; n],
                    advantages: vec![s as f32 - 1.0 + 0.1 * g as f32; n],
                    old_values: vec![0.0; n],
                    returns: vec![0.5 - g as f32; n],
                    loss_weight: 0.05,
                    ..Default::default()
                });
            }
        }
        rows
    }

    /// Every trainable parameter's gradient after `pass` from zero, flattened in name order
    /// (none for a parameter the pass does not use: the critic's LM head).
    fn gradients<F: FnOnce()>(vs: &tch::nn::VarStore, pass: F) -> Vec<f32> {
        for mut v in vs.trainable_variables() {
            v.zero_grad();
        }
        pass();
        crate::model::sorted_trainable(vs)
            .iter()
            .map(|(_, v)| v.grad())
            .filter(|g| g.defined())
            .flat_map(|g| Vec::<f32>::try_from(g.view([-1])).unwrap())
            .collect()
    }

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let size = want.iter().map(|g| g.abs()).fold(0f32, f32::max);
        assert!(
            size > 1e-4 && worst <= 1e-5 * size,
            "{what}: {worst} of {size}"
        );
    }

    /// The policy's and the critic's passes give the same gradients with activation
    /// checkpointing as without, padded and packed with shared prompts, with the embedding
    /// tied to the LM head (its gradient from both the head and the layers' recomputation)
    /// and untied.
    #[test]
    fn activation_checkpointing_keeps_the_gradients() {
        let rows = group_rows();
        let all: Vec<usize> = (0..rows.len()).collect();
        for tied in [true, false] {
            let mut cfg = ModelConfig::tiny_qwen2(16, 32, 2, 4, 2, 64, 64);
            cfg.tie_word_embeddings = tied;
            let policy = Model::random(&cfg, Device::Cpu, 9).unwrap();
            let critic = ValueModel::from_policy(&policy, Device::Cpu).unwrap();
            // A non-zero head, so the critic's gradient reaches its layers.
            let mut head = critic.vs.variables()["score.weight"].shallow_clone();
            let _ = tch::no_grad(|| head.fill_(0.1));
            for batching in [
                Batching::padded(4096),
                Batching {
                    micro_batch_tokens: 4096,
                    packing: true,
                    shared_prefix: true,
                },
            ] {
                let policy_grads = |checkpoint| {
                    let cfg = UpdateConfig {
                        loss: policy_loss::LossConfig {
                            kind: policy_loss::PolicyLoss::Ppo,
                            entropy_coef: 0.01,
                            ..Default::default()
                        },
                        epochs: 1,
                        batching,
                        temperature: 0.9,
                        activation_checkpointing: checkpoint,
                    };
                    gradients(&policy.vs, || {
                        rank_pass(&policy, false, &rows, &all, &cfg, &mut PassSums::default());
                    })
                };
                let what = format!("policy, tied {tied}, {batching:?}");
                assert_close(&policy_grads(true), &policy_grads(false), &what);
                let critic_grads = |checkpoint| {
                    let cfg = ValueLossConfig {
                        clip: 10.0,
                        epochs: 1,
                        batching,
                        activation_checkpointing: checkpoint,
                    };
                    gradients(&critic.vs, || {
                        critic_pass(&critic, &rows, &all, &cfg);
                    })
                };
                let what = format!("critic, tied {tied}, {batching:?}");
                assert_close(&critic_grads(true), &critic_grads(false), &what);
            }
        }
    }

    /// A critic mini-batch whose loss is not finite changes nothing and is counted, as the
    /// policy's are; a finite one is applied.
    /// A run of skips is counted in order, across updates: the skips before an applied step
    /// end the run carried in, the ones after it start the next.
    #[test]
    fn skips_are_counted_in_the_order_they_fell() {
        let runs = |outcomes: &[bool]| {
            let mut r = SkipRuns::default();
            outcomes.iter().for_each(|&applied| r.record(applied));
            r
        };
        // Three skips, then an applied step: a run of 3, and none carried on.
        assert_eq!(
            runs(&[false, false, false, true]).continue_streak(0),
            (3, 0)
        );
        // One skip before an applied step ends a run of 2 carried in at 3.
        assert_eq!(runs(&[false, true]).continue_streak(2), (3, 0));
        // Two skips after an applied step carry on, and the next update's first skip makes 3.
        let (_, carried) = runs(&[true, false, false]).continue_streak(5);
        assert_eq!(carried, 2);
        assert_eq!(runs(&[false, true]).continue_streak(carried), (3, 0));
        // A run in the middle counts on its own.
        assert_eq!(
            runs(&[true, false, false, true, false]).continue_streak(1),
            (2, 1)
        );
        // Nothing applied: the whole update adds to the run.
        assert_eq!(runs(&[false, false]).continue_streak(1), (3, 3));
        // An update that starts with an applied step ends the run carried in (a resume after
        // a stop for skips, with a lower rate): it counts none of it again.
        assert_eq!(runs(&[true, true]).continue_streak(3), (0, 0));
        assert_eq!(SkipRuns::default().continue_streak(3), (0, 3));
    }

    #[test]
    fn a_non_finite_critic_loss_is_skipped_and_counted() {
        let cfg = ModelConfig::tiny_qwen2(16, 32, 1, 2, 2, 64, 32);
        let policy = Model::random(&cfg, Device::Cpu, 3).unwrap();
        let critic = ValueModel::from_policy(&policy, Device::Cpu).unwrap();
        let mut opt = Optimizer::new(&critic.vs, &OptimConfig::default(), 10).unwrap();
        let mut ranks = Replicas::new(&critic, 1).unwrap();
        let value_cfg = ValueLossConfig {
            clip: 10.0,
            epochs: 1,
            batching: Batching::padded(1024),
            activation_checkpointing: false,
        };
        let plan: RowPlan = vec![vec![vec![0, 1]]];
        let before = fingerprint(&critic.vs);
        let rows = [row(f32::NAN), row(1.0)];
        let s = critic_update(&critic, &mut ranks, &mut opt, &rows, &plan, &value_cfg).unwrap();
        assert_eq!((s.skipped_updates, s.optimizer_steps), (1, 0), "{s:?}");
        assert_eq!(s.loss, 0.0, "a skipped mini-batch adds no loss");
        assert_eq!(fingerprint(&critic.vs), before, "weights changed");
        assert_eq!(opt.steps_done, 0);

        let rows = [row(-1.0), row(1.0)];
        let s = critic_update(&critic, &mut ranks, &mut opt, &rows, &plan, &value_cfg).unwrap();
        assert_eq!((s.skipped_updates, s.optimizer_steps), (0, 1), "{s:?}");
        assert!(s.loss.is_finite() && s.loss > 0.0, "{s:?}");
        assert_ne!(fingerprint(&critic.vs), before);
    }
}
