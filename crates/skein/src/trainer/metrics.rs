//! A step's line of `metrics.jsonl`: each stage reports its own metrics and this puts them in
//! one record, with the times of the stages.

use super::batch::StepBatch;
use super::config::Estimator;
use super::prepare::PreparedBatch;
use super::rollout::outcomes::equal_groups_carry_signal;
use super::rollout::stats::StepRollout;
use super::update::ranks::Layout;
use super::update::CriticStats;
use super::update::UpdateStats;
use serde_json::{Map, Value};
use skein_report::record;

/// Adds `pairs` to a record (counts stay JSON integers, other figures are numbers).
pub fn extend<K: AsRef<str>, V: Into<Value>>(
    m: &mut Map<String, Value>,
    pairs: impl IntoIterator<Item = (K, V)>,
) {
    for (k, v) in pairs {
        m.insert(k.as_ref().to_string(), v.into());
    }
}

/// Seconds each stage of a step took.
#[derive(Debug, Clone, Copy, Default)]
pub struct StageTimes {
    pub rollout_s: f64,
    pub prepare_s: f64,
    pub update_s: f64,
    pub step_s: f64,
}

/// What one step did, stage by stage.
pub struct StepReport<'a> {
    pub step: usize,
    pub rollout: &'a StepRollout,
    /// Whether a remote engine generated the rollout.
    pub remote: bool,
    pub batch: &'a PreparedBatch,
    pub update: &'a UpdateStats,
    pub critic: Option<&'a CriticStats>,
    /// The spread over ranks, with more than one rank.
    pub layout: Option<Layout>,
    pub policy_version: usize,
    pub times: StageTimes,
    /// Partial rollout's staleness cap as trained tokens can reach it
    /// ([`PartialConfig::reachable_staleness`](crate::trainer::config::PartialConfig)), when
    /// it is on.
    pub staleness_cap: Option<u64>,
    /// The run's advantage estimator: whether the step's equal-reward groups still have an
    /// advantage depends on it.
    pub estimator: Estimator,
}

impl StepReport<'_> {
    /// The step's record. Parts that are switched off log nothing, so no flat zero curves.
    pub fn record(&self) -> Map<String, Value> {
        let t = &self.times;
        let batch: &StepBatch = self.batch.batch();
        let trained = batch.trained_tokens() as f64;
        let mut m = record(self.step, []);
        extend(
            &mut m,
            self.rollout
                .metrics(t.rollout_s, self.remote, self.staleness_cap),
        );
        extend(&mut m, self.update.metrics(self.batch.has_reference()));
        extend(&mut m, [("policy_version", self.policy_version as f64)]);
        extend(&mut m, batch.metrics());
        extend(&mut m, batch.turn_metrics.iter().cloned());
        // Logged only where it holds, so that `batch/equal_reward_group_fraction` is read as
        // groups left without signal (the `no-learning-signal` diagnosis) everywhere else.
        if equal_groups_carry_signal(self.estimator, &self.rollout.trajectories) {
            extend(&mut m, [("batch/equal_reward_groups_carry_signal", 1.0)]);
        }
        extend(
            &mut m,
            [
                // Both over the step's wall time, so they differ only in what they count:
                // loss tokens, or the prompt and response tokens of every real row, a shared
                // prompt once per row (what a framework feeding each row whole computes).
                (
                    "throughput/trained_tokens_per_s",
                    trained / t.step_s.max(1e-9),
                ),
                (
                    "throughput/row_tokens_per_s",
                    batch.row_tokens as f64 / t.step_s.max(1e-9),
                ),
                ("time/rollout_s", t.rollout_s),
                ("time/prepare_s", t.prepare_s),
                ("time/update_s", t.update_s),
                ("time/step_s", t.step_s),
            ],
        );
        // Without partial rollout only `icepop` has tokens to weigh (every token is of the
        // step's version); its masked tokens must show.
        if self.rollout.is_partial() || self.batch.importance.weighs_every_token {
            extend(&mut m, self.batch.importance.metrics());
        }
        if let Some(x) = &self.batch.mismatch {
            extend(&mut m, x.metrics());
        }
        if let Some(c) = self.critic {
            extend(&mut m, c.metrics());
        }
        if let Some(ev) = self.batch.explained_variance {
            extend(&mut m, [("value/explained_variance", ev)]);
        }
        if let Some(l) = &self.layout {
            extend(&mut m, l.metrics(self.update.rank_wait_s));
        }
        m
    }
}
