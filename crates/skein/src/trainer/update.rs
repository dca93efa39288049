//! The PPO update of one step: recompute π_old (and π_ref) log-probs, then for each epoch and
//! each planned mini-batch, run every rank's rows in token-bounded micro-batches, accumulate
//! gradients, and take one optimizer step. Each token's loss weight already holds the
//! mini-batch's global counts, so the sum does not depend on the rank or micro-batch split.

use super::loss::{policy_loss, LossConfig, TokenBatch};
use super::microbatch::{micro_batches, response_values, token_logprobs, MicroBatch, TrainRow};
use super::optim::Optimizer;
use super::ranks::{Job, PassKind, Ranks};
use crate::model::Model;
use anyhow::Result;
use serde::{Deserialize, Serialize};

/// Mini-batches → ranks → indices into the step's rows (padding rows included).
pub type Plan = Vec<Vec<Vec<usize>>>;

#[derive(Debug, Default, Clone)]
pub struct UpdateStats {
    pub loss: f64,
    pub clip_frac: f64,
    pub approx_kl: f64,
    pub entropy: f64,
    pub ref_kl: f64,
    pub grad_norm: f64,
    pub lr: f64,
    pub optimizer_steps: usize,
    pub micro_batches: usize,
    /// Mini-batches whose loss or gradient was NaN or infinite: not applied.
    pub skipped_updates: usize,
    /// Seconds ranks spent waiting for the slowest one at the all-reduce: per mini-batch the
    /// slowest rank's compute time minus the fastest's (the cost of imbalance), summed.
    pub rank_wait_s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpdateConfig {
    pub loss: LossConfig,
    pub epochs: usize,
    pub micro_batch_tokens: usize,
    pub temperature: f64,
}

/// Fills `old_logp` (and `ref_logp` when a reference is given) of every row with the current
/// weights, without gradients.
pub fn recompute_logprobs(
    policy: &Model,
    reference: Option<&Model>,
    rows: &mut [TrainRow],
    cfg: &UpdateConfig,
) {
    let all: Vec<usize> = (0..rows.len()).collect();
    let device = policy.vs.device();
    tch::no_grad(|| {
        for idx in micro_batches(rows, &all, cfg.micro_batch_tokens) {
            let batch: Vec<&TrainRow> = idx.iter().map(|&i| &rows[i]).collect();
            let mb = MicroBatch::new(&batch, device);
            let (old, _) = token_logprobs(&policy.net, &mb, cfg.temperature, false);
            let old = response_values(&old, &batch);
            let refs = reference.map(|m| {
                response_values(
                    &token_logprobs(&m.net, &mb, cfg.temperature, false).0,
                    &batch,
                )
            });
            for (k, &i) in idx.iter().enumerate() {
                rows[i].old_logp = old[k].clone();
                if let Some(r) = &refs {
                    rows[i].ref_logp = r[k].clone();
                }
            }
        }
    });
}

/// PPO epochs over the planned mini-batches; one optimizer step per mini-batch.
///
/// `ranks` runs each mini-batch's rank lists (one after another on `policy` for dp 1; on
/// replicas or other processes beyond that, see [`super::ranks`]) and sums their gradients
/// into `policy`'s before the step.
pub fn ppo_update<R: Ranks<Model>>(
    policy: &Model,
    ranks: &mut R,
    reference_on: bool,
    opt: &mut Optimizer,
    rows: &[TrainRow],
    plan: &Plan,
    cfg: &UpdateConfig,
) -> Result<UpdateStats> {
    let pass = PassKind::Policy {
        reference_on,
        cfg: cfg.clone(),
    };
    ranks.begin(policy, &Job { rows, plan, pass })?;
    let mut stats = UpdateStats::default();
    let mut sums = PassSums::default();
    let mut grad_norm = 0.0;
    for _ in 0..cfg.epochs {
        for mini_batch in plan {
            opt.zero_grad();
            let out = ranks.run(policy, mini_batch, |model, rank_rows, sums| {
                rank_pass(model, reference_on, rows, rank_rows, cfg, sums)
            })?;
            stats.rank_wait_s += out.wait_s;
            for s in &out.sums {
                sums.add(s);
            }
            let step = if out.loss.is_finite() {
                Some(opt.step())
            } else {
                opt.zero_grad();
                None
            };
            // Every rank leaves this mini-batch with the weights rank 0 now has (whether or
            // not the step was applied), so the next one starts from identical parameters.
            ranks.sync(policy)?;
            match step {
                Some(step) if !step.skipped => {
                    grad_norm += step.grad_norm;
                    stats.lr = step.lr;
                    stats.loss += out.loss;
                    stats.optimizer_steps += 1;
                }
                _ => stats.skipped_updates += 1,
            }
        }
    }
    ranks.finish(policy)?;
    let n = stats.optimizer_steps.max(1) as f64;
    let t = if sums.tokens > 0.0 { sums.tokens } else { 1.0 };
    stats.micro_batches = sums.micro_batches;
    stats.loss /= n;
    stats.grad_norm = grad_norm / n;
    stats.clip_frac = sums.clipped / t;
    stats.approx_kl = sums.kl / t;
    stats.entropy = sums.entropy / t;
    stats.ref_kl = sums.ref_kl / t;
    Ok(stats)
}

/// Metric sums over masked tokens, accumulated micro-batch by micro-batch.
#[derive(Debug, Default, Clone)]
pub struct PassSums {
    pub tokens: f64,
    pub clipped: f64,
    pub kl: f64,
    pub entropy: f64,
    pub ref_kl: f64,
    pub micro_batches: usize,
}

impl PassSums {
    pub fn add(&mut self, o: &PassSums) {
        self.tokens += o.tokens;
        self.clipped += o.clipped;
        self.kl += o.kl;
        self.entropy += o.entropy;
        self.ref_kl += o.ref_kl;
        self.micro_batches += o.micro_batches;
    }
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
    let mut loss = 0.0;
    for idx in micro_batches(rows, rank_rows, cfg.micro_batch_tokens) {
        let batch: Vec<&TrainRow> = idx.iter().map(|&i| &rows[i]).collect();
        let mb = MicroBatch::new(&batch, device);
        let (logp, entropy) = token_logprobs(&model.net, &mb, cfg.temperature, true);
        let out = policy_loss(
            &TokenBatch {
                logp: &logp,
                old_logp: &mb.old_logp,
                ref_logp: reference_on.then_some(&mb.ref_logp),
                entropy: entropy.as_ref(),
                advantages: &mb.advantages,
                is_weight: &mb.is_weight,
                weights: &mb.weights,
                mask: &mb.mask,
            },
            &cfg.loss,
        );
        out.loss.backward();
        loss += out.loss.double_value(&[]);
        sums.tokens += out.tokens;
        sums.clipped += out.clipped_tokens;
        sums.kl += out.approx_kl_sum;
        sums.entropy += out.entropy_sum;
        sums.ref_kl += out.ref_kl_sum;
        sums.micro_batches += 1;
    }
    loss
}
