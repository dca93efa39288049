//! A row of the step batch: one trajectory's tokens (or one transition's), exactly as sampled,
//! with everything the loss needs per response token. Two stages fill it, in order: the batch
//! (tokens, mask, behavior log-probs, group advantages, loss weight) and `trainer::prepare`
//! (π_old, π_ref, importance weights, values and final advantages); the update only reads it.

/// One row ready for the loss (from the planning core's rows).
#[derive(Debug, Clone, Default)]
pub struct TrainRow {
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Per response token: 1 = sampled by the policy, 0 = inserted text or padding.
    pub loss_mask: Vec<u8>,
    /// Per response token.
    pub behavior_logp: Vec<f32>,
    pub advantages: Vec<f32>,
    /// Per response token, recomputed with the weights of the step's start (PPO's π_old).
    pub old_logp: Vec<f32>,
    /// Per response token under the frozen reference model, when a KL term is on.
    pub ref_logp: Vec<f32>,
    /// Critic path: values at the step's start, and GAE returns, per response token.
    pub old_values: Vec<f32>,
    pub returns: Vec<f32>,
    /// Critic path: per response token, 1 where the value loss trains. Empty: every loss token,
    /// weighted by `loss_weight` (token-level GAE gives every one a target). Turn-level GAE
    /// sets one position per turn, each weighing `value_loss_weight`.
    pub value_mask: Vec<u8>,
    /// The value loss's weight of each position of `value_mask` (global counts included).
    pub value_loss_weight: f64,
    /// Policy version that sampled each response token.
    pub versions: Vec<u64>,
    /// Importance weight of each response token's surrogate against its behavior policy (1
    /// when empty): an off-policy correction, not a weight of the loss's average.
    pub importance_weights: Vec<f32>,
    /// The loss's aggregation weight of each of the row's loss tokens (global counts
    /// included; 0 for padding rows).
    pub loss_weight: f64,
    /// Per response token, the ids a truncated sampler (top-k/top-p) kept; empty when it did
    /// not truncate. The trainer's log-probs are over the same sets, renormalised.
    pub kept: skein_plan::KeptSets,
}

impl TrainRow {
    /// A row of `tokens` whose response (after `prompt_len`) is all loss tokens, with zero
    /// advantages and log-probs and loss weight `weight` (for tests of later stages).
    #[cfg(test)]
    pub fn sampled(tokens: Vec<u32>, prompt_len: usize, weight: f64) -> TrainRow {
        let n = tokens.len() - prompt_len;
        TrainRow {
            tokens,
            prompt_len,
            loss_mask: vec![1; n],
            behavior_logp: vec![0.0; n],
            advantages: vec![0.0; n],
            loss_weight: weight,
            ..Default::default()
        }
    }

    /// A planned row: prompt ++ response ids, each sampled token its turn's advantage, loss
    /// weight 0 until the plan gives it one. A padding row stays inert: mask 0, weight 0.
    pub fn from_plan_row(r: &skein_plan::Row) -> TrainRow {
        TrainRow {
            tokens: r.prompt.iter().chain(&r.response).copied().collect(),
            prompt_len: r.prompt.len(),
            loss_mask: r.loss_mask.clone(),
            behavior_logp: r.logprobs.clone(),
            advantages: r.advantages.iter().map(|&a| a as f32).collect(),
            versions: r.versions.clone(),
            kept: r.kept.clone(),
            loss_weight: 0.0,
            ..Default::default()
        }
    }
}
