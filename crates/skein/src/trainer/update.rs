//! The PPO update of one step: recompute π_old (and π_ref) log-probs, then for each epoch and
//! each planned mini-batch, run every rank's rows in token-bounded micro-batches, accumulate
//! gradients, and take one optimizer step. Each token's loss weight already holds the
//! mini-batch's global counts, so the sum does not depend on the rank or micro-batch split.

use super::loss::{policy_loss, LossConfig, TokenBatch};
use super::microbatch::{micro_batches, response_values, token_logprobs, MicroBatch, TrainRow};
use super::optim::Optimizer;
use crate::model::Model;

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
}

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
pub fn ppo_update(
    policy: &Model,
    reference_on: bool,
    opt: &mut Optimizer,
    rows: &[TrainRow],
    plan: &Plan,
    cfg: &UpdateConfig,
) -> UpdateStats {
    let device = policy.vs.device();
    let mut stats = UpdateStats::default();
    let (mut tokens, mut clipped, mut kl, mut ent, mut rkl, mut grad_norm) =
        (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for _ in 0..cfg.epochs {
        for mini_batch in plan {
            opt.zero_grad();
            let mut mb_loss = 0.0;
            for rank_rows in mini_batch {
                for idx in micro_batches(rows, rank_rows, cfg.micro_batch_tokens) {
                    let batch: Vec<&TrainRow> = idx.iter().map(|&i| &rows[i]).collect();
                    let mb = MicroBatch::new(&batch, device);
                    let (logp, entropy) = token_logprobs(&policy.net, &mb, cfg.temperature, true);
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
                    mb_loss += out.loss.double_value(&[]);
                    tokens += out.tokens;
                    clipped += out.clipped_tokens;
                    kl += out.approx_kl_sum;
                    ent += out.entropy_sum;
                    rkl += out.ref_kl_sum;
                    stats.micro_batches += 1;
                }
            }
            if !mb_loss.is_finite() {
                opt.zero_grad();
                stats.skipped_updates += 1;
                continue;
            }
            let step = opt.step();
            if step.skipped {
                stats.skipped_updates += 1;
                continue;
            }
            grad_norm += step.grad_norm;
            stats.lr = step.lr;
            stats.loss += mb_loss;
            stats.optimizer_steps += 1;
        }
    }
    let n = stats.optimizer_steps.max(1) as f64;
    let t = if tokens > 0.0 { tokens } else { 1.0 };
    stats.loss /= n;
    stats.grad_norm = grad_norm / n;
    stats.clip_frac = clipped / t;
    stats.approx_kl = kl / t;
    stats.entropy = ent / t;
    stats.ref_kl = rkl / t;
    stats
}
