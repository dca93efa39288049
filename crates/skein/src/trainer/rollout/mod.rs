//! Rollout sources: where a step's trajectories come from. Every source is a [`Workload`]; the
//! step loop asks it for one [`StepRollout`] per step and never looks at which one it is.
//!
//! | source | workload | file |
//! | --- | --- | --- |
//! | single-turn prompts of a built-in task or a dataset, with partial rollout | [`prompts::Prompts`] | `prompts.rs`, `buffer.rs` |
//! | multi-turn episodes of a built-in environment, run in this process | [`agents::Episodes`] | `agents.rs`, `episodes.rs` |
//! | external agents calling the served policy over HTTP | [`external::External`] | `external.rs` |
//!
//! Around them: `tasks.rs` picks the source from the config, `judge.rs` scores a finished
//! response, `reward.rs` runs configured reward sources, `dataset.rs` reads prompt files.
//!
//! A new source implements [`Workload`] and gets a variant in [`tasks::Tasks`]: the loop, the
//! batch and the update do not change.

pub mod agents;
pub mod buffer;
pub mod dataset;
pub mod episodes;
pub mod external;
pub mod judge;
pub mod prompts;
pub mod reward;
pub mod tasks;

use crate::engine::{EngineStats, Generator, SamplingParams};
use crate::model::Model;
use crate::trainer::batch::TrainRow;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use skein_plan::Trajectory;
use skein_text::Tokenizer;

pub use tasks::Tasks;

/// What every source gets for one step's rollout (or an evaluation).
pub struct StepContext<'a> {
    pub engine: &'a Generator,
    pub policy: &'a Model,
    /// The policy version the rollout samples with (optimizer steps taken).
    pub version: u64,
    pub step: usize,
    pub tokenizer: &'a Tokenizer,
    /// The run's sampling settings, stop tokens included.
    pub sampling: &'a SamplingParams,
}

/// Held-out greedy evaluation: the fraction judged correct and the mean reward.
#[derive(Debug, Clone, Copy, Default)]
pub struct EvalResult {
    pub accuracy: f64,
    pub mean_reward: f64,
}

/// What a source carries from step to step: saved in every checkpoint and restored on resume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadState {
    /// State of the task's problem sampler.
    pub task_rng: u64,
    /// Rows drawn from the training dataset (`[data]`), where its sampler continues.
    #[serde(default)]
    pub data_position: u64,
    /// Groups of partial rollout still in flight.
    pub buffer: buffer::GroupBuffer,
}

/// A rollout source.
pub trait Workload {
    /// One step's trajectories: whole groups, each trajectory scored.
    fn rollout(&mut self, ctx: &StepContext) -> Result<StepRollout>;
    /// Greedy answers to the held-out problems (drawn once, at start-up).
    fn evaluate(&self, ctx: &StepContext) -> EvalResult;
    /// A supervised row of a demonstrated solution, for the warm-up.
    fn demonstration(
        &mut self,
        tokenizer: &Tokenizer,
        sampling: &SamplingParams,
    ) -> Result<TrainRow>;
    /// What a checkpoint must keep to continue exactly.
    fn state(&self) -> WorkloadState;
    /// Metrics of the data itself: counts from loading (`first`), else per step.
    fn data_metrics(&self, first: bool) -> Vec<(&'static str, f64)>;
}

/// The step's complete groups, flattened (groups in order, samples in order), and what it took
/// to produce them.
pub struct StepRollout {
    pub trajectories: Vec<Trajectory>,
    /// Parallel to `trajectories`: whether the task judged the answer correct.
    pub correct: Vec<bool>,
    pub engine: EngineStats,
    pub stats: RolloutStats,
}

/// Figures of one step's rollout: the ones every source has, and its own.
#[derive(Debug, Clone, Default)]
pub struct RolloutStats {
    /// Loss tokens of the trajectories that train (failed ones excluded).
    pub trained_tokens: usize,
    /// Versions between each trained token and the policy at the step's start.
    pub staleness_mean: f64,
    pub staleness_max: u64,
    pub source: SourceStats,
}

/// What only one kind of source counts.
#[derive(Debug, Clone)]
pub enum SourceStats {
    /// Prompts: partial rollout's counters (when it is on) and the reward sources' figures
    /// (when `[reward]` is configured).
    Prompts {
        partial: Option<buffer::PartialStats>,
        rewards: Option<Vec<(String, f64)>>,
    },
    Episodes(episodes::AgentStats),
    External(external::ExternalStats),
}

impl Default for SourceStats {
    fn default() -> Self {
        SourceStats::Prompts {
            partial: None,
            rewards: None,
        }
    }
}

impl StepRollout {
    /// Counts the trained tokens and their staleness against `version` once, for every source.
    pub fn new(
        trajectories: Vec<Trajectory>,
        correct: Vec<bool>,
        engine: EngineStats,
        version: u64,
        source: SourceStats,
    ) -> Self {
        let mut stats = RolloutStats {
            source,
            ..RolloutStats::default()
        };
        let (mut stale_sum, mut stale_n) = (0u64, 0usize);
        for t in trajectories.iter().filter(|t| !t.is_failed()) {
            for x in &t.transitions {
                stats.trained_tokens += x.loss_tokens();
                for &v in &x.versions {
                    let behind = version.saturating_sub(v);
                    stale_sum += behind;
                    stale_n += 1;
                    stats.staleness_max = stats.staleness_max.max(behind);
                }
            }
        }
        stats.staleness_mean = stale_sum as f64 / stale_n.max(1) as f64;
        StepRollout {
            trajectories,
            correct,
            engine,
            stats,
        }
    }

    pub fn reward_mean(&self) -> f64 {
        let n = self.trajectories.len().max(1) as f64;
        self.trajectories.iter().map(|t| t.reward).sum::<f64>() / n
    }

    pub fn accuracy(&self) -> f64 {
        let n = self.trajectories.len().max(1) as f64;
        self.correct.iter().filter(|&&c| c).count() as f64 / n
    }

    /// Whether partial rollout produced this step (its off-policy figures are worth logging).
    pub fn is_partial(&self) -> bool {
        matches!(
            self.stats.source,
            SourceStats::Prompts {
                partial: Some(_),
                ..
            }
        )
    }

    /// The rollout's metrics; `rollout_s` is the time it took, `remote` whether a remote
    /// engine generated it. Parts that are switched off log nothing, so no flat zero curves.
    pub fn metrics(&self, rollout_s: f64, remote: bool) -> Vec<(String, f64)> {
        let n = self.trajectories.len().max(1) as f64;
        let response_len = self
            .trajectories
            .iter()
            .map(|t| {
                t.transitions
                    .iter()
                    .map(|x| x.response.len())
                    .sum::<usize>() as f64
            })
            .sum::<f64>()
            / n;
        let s = &self.stats;
        let mut m: Vec<(String, f64)> = [
            ("reward/mean", self.reward_mean()),
            ("reward/accuracy", self.accuracy()),
            ("response_len/mean", response_len),
            ("tokens/generated", self.engine.generated_tokens as f64),
            ("tokens/trained", s.trained_tokens as f64),
            (
                "throughput/generated_tokens_per_s",
                self.engine.generated_tokens as f64 / rollout_s.max(1e-9),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let mut add = |pairs: &[(&str, f64)]| {
            m.extend(pairs.iter().map(|(k, v)| (k.to_string(), *v)));
        };
        if remote {
            add(&[("rollout/engine_failed", self.engine.failed as f64)]);
        }
        match &s.source {
            SourceStats::Prompts { partial, rewards } => {
                if let Some(p) = partial {
                    add(&[
                        ("partial/paused", p.paused as f64),
                        ("partial/resumed", p.resumed as f64),
                        ("partial/dropped_stale", p.dropped_stale as f64),
                        ("partial/budget_hit_fraction", p.budget_hit_fraction()),
                        ("partial/waiting_groups", p.waiting_groups as f64),
                        ("partial/rounds", p.rounds as f64),
                        ("staleness/mean", s.staleness_mean),
                        ("staleness/max", s.staleness_max as f64),
                    ]);
                }
                m.extend(rewards.iter().flatten().cloned());
            }
            SourceStats::Episodes(a) => {
                add(&a.metrics());
                add(&[
                    ("agent/prefill_tokens", self.engine.prefill_tokens as f64),
                    (
                        "agent/reused_prefix_tokens",
                        self.engine.reused_tokens as f64,
                    ),
                ]);
            }
            SourceStats::External(e) => add(&e.metrics(self.trajectories.len())),
        }
        m
    }
}
