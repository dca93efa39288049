//! `BatchScorer`: anything that scores a batch of requests at once. Reward models, worker pools,
//! remote services and the built-in functions all implement it, so the executor can batch any
//! of them.

use crate::{RewardError, RewardOutput, RewardRequest};
use std::sync::Arc;

pub trait BatchScorer: Send + Sync {
    /// One result per request, in order. A failed request fails alone: the others still count.
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>>;

    /// What one request costs a batch, for the executor's token budget and length buckets.
    /// Default: prompt plus response tokens.
    fn cost(&self, req: &RewardRequest) -> usize {
        req.tokens()
    }

    /// Counters of the scorer's own (restarts, timeouts, retries), merged into the metrics.
    fn counters(&self) -> Vec<(&'static str, f64)> {
        Vec::new()
    }
}

impl<T: BatchScorer + ?Sized> BatchScorer for Arc<T> {
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        (**self).score_batch(batch)
    }

    fn cost(&self, req: &RewardRequest) -> usize {
        (**self).cost(req)
    }

    fn counters(&self) -> Vec<(&'static str, f64)> {
        (**self).counters()
    }
}
