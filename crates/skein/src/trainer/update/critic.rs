//! The critic's loss (PPO with a critic): the clipped value loss of one rank's rows, at the
//! positions that have a value target — every loss token with token-level GAE, aggregated with
//! the same global-count weights as the policy loss; one position per turn with turn-level GAE
//! ([`TrainRow::value_mask`], a mean over the mini-batch's turns). Its inputs — values at the
//! step's start and GAE returns — are filled by `trainer::prepare`; `super::critic_update` runs
//! it over the planned mini-batches.

use super::pack::micro_batches;
use super::tensors::{CriticInputs, MicroBatch};
use crate::model::ValueModel;
use crate::trainer::batch::TrainRow;
use crate::trainer::config::Batching;
use serde::{Deserialize, Serialize};
use tch::Kind;

/// Settings of the clipped value loss update.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ValueLossConfig {
    /// Values move at most this far from their rollout-time estimate before the loss clips.
    pub clip: f64,
    pub epochs: usize,
    pub batching: Batching,
    /// Keep only each layer's input in the forward and run the layers again in the backward
    /// (`trainer.activation_checkpointing`).
    pub activation_checkpointing: bool,
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
    for plan in micro_batches(rows, rank_rows, &cfg.batching) {
        let mb = MicroBatch::new(rows, &plan, critic.vs.device());
        let c = CriticInputs::new(&mb, rows);
        let (v, recompute) = mb.train_values(critic, cfg.activation_checkpointing);
        let clipped = &c.old_values + (&v - &c.old_values).clamp(-cfg.clip, cfg.clip);
        let l1 = (&v - &c.returns).pow_tensor_scalar(2);
        let l2 = (clipped - &c.returns).pow_tensor_scalar(2);
        let loss = (l1.maximum(&l2) * 0.5 * &c.value_loss_weights).sum(Kind::Float);
        loss.backward();
        if let Some(recompute) = recompute {
            recompute.backward();
        }
        total += loss.double_value(&[]);
    }
    total
}
