//! The critic's update (PPO with a critic): the clipped value loss, aggregated with the same
//! global-count weights as the policy loss, over the planned mini-batches. Its inputs — values
//! at the step's start and GAE returns — are filled by `trainer::prepare`.

use super::optim::Optimizer;
use super::ranks::Ranks;
use super::tensors::{micro_batches, MicroBatch};
use super::{mini_batch_step, PassKind};
use crate::model::ValueModel;
use crate::trainer::batch::{RowPlan, TrainRow};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use tch::Kind;

/// Settings of the clipped value loss update.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ValueLossConfig {
    /// Values move at most this far from their rollout-time estimate before the loss clips.
    pub clip: f64,
    pub epochs: usize,
    pub micro_batch_tokens: usize,
}

/// What the critic's update did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CriticStats {
    /// Mean value loss over the applied optimizer steps.
    pub loss: f64,
    pub optimizer_steps: usize,
    /// Mini-batches whose loss or gradient was NaN or infinite: not applied.
    pub skipped_updates: usize,
}

impl CriticStats {
    pub fn metrics(&self) -> [(&'static str, f64); 2] {
        [
            ("loss/value", self.loss),
            ("updates/critic_skipped", self.skipped_updates as f64),
        ]
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

/// One rank's share of a mini-batch of the value loss: forward and backward of its rows in
/// token-bounded micro-batches. Returns the rank's loss.
pub fn critic_pass(
    critic: &ValueModel,
    rows: &[TrainRow],
    rank_rows: &[usize],
    cfg: &ValueLossConfig,
) -> f64 {
    let mut total = 0.0;
    for idx in micro_batches(rows, rank_rows, cfg.micro_batch_tokens) {
        let batch: Vec<&TrainRow> = idx.iter().map(|&i| &rows[i]).collect();
        let mb = MicroBatch::new(&batch, critic.vs.device());
        let t = mb.input.size()[1];
        let v = critic.values(&mb.input).narrow(1, 0, t - 1);
        let clipped = &mb.old_values + (&v - &mb.old_values).clamp(-cfg.clip, cfg.clip);
        let l1 = (&v - &mb.returns).pow_tensor_scalar(2);
        let l2 = (clipped - &mb.returns).pow_tensor_scalar(2);
        let loss = (l1.maximum(&l2) * 0.5 * &mb.weights).sum(Kind::Float);
        loss.backward();
        total += loss.double_value(&[]);
    }
    total
}
