//! Rollout sources: where a step's trajectories come from. Every source is a [`Workload`]; the
//! step loop asks it for one [`StepRollout`] per step and never looks at which one it is.
//!
//! | source | workload | file |
//! | --- | --- | --- |
//! | single-turn prompts of a built-in task or a dataset, with partial rollout or dynamic sampling | [`prompts::Prompts`] | `prompts.rs`, `buffer.rs`, `dynamic.rs` |
//! | multi-turn episodes of a built-in environment, run in this process | [`multi_turn::MultiTurn`] | `multi_turn.rs` (the workload), `episodes.rs` (the agent loop) |
//! | multi-turn episodes of an environment in worker processes, run by the same loop | [`multi_turn::MultiTurn`] | `env_worker/` (the task, its process pool and protocol) |
//! | external agents calling the served policy over HTTP | [`external::External`] | `external.rs` |
//!
//! Around them: `tasks.rs` picks the source from the config, `stats.rs` is what every source
//! returns ([`stats::StepRollout`]) and its metrics, `outcomes.rs` its reward and accuracy
//! figures, `trajectory_info.rs` what the trajectory log shows of each trajectory beyond its
//! tokens, `judge.rs` scores a finished response,
//! `reward.rs` runs configured reward sources, `routes.rs` checks a dataset's data sources
//! against the reward routes, `dataset.rs` reads prompt files.
//!
//! A new source implements [`Workload`] and gets a variant in [`tasks::Tasks`]: the loop, the
//! batch and the update do not change.

pub mod buffer;
pub mod dataset;
pub mod dynamic;
pub mod env_worker;
pub mod episodes;
pub mod external;
pub mod judge;
pub mod multi_turn;
pub mod outcomes;
pub mod prompts;
pub mod reward;
pub mod routes;
pub mod stats;
pub mod tasks;
pub mod trajectory_info;
pub mod truncate;

use crate::engine::{Generator, SamplingParams};
use crate::model::Model;
use crate::trainer::batch::TrainRow;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skein_plan::{Status, Trajectory};
use skein_tasks::{draw_in, splits, Problem, Split, TaskRng};
use skein_text::Tokenizer;
use stats::StepRollout;
use std::collections::HashSet;

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
    /// Called as each episode of a multi-turn evaluation ends (`skein eval`'s progress).
    pub on_episode_end: Option<&'a (dyn Fn() + Sync)>,
}

impl<'a> StepContext<'a> {
    /// The context of an evaluation (version 0, step 0); [`StepContext::at`] sets both.
    pub fn new(
        engine: &'a Generator,
        policy: &'a Model,
        tokenizer: &'a Tokenizer,
        sampling: &'a SamplingParams,
    ) -> Self {
        StepContext {
            engine,
            policy,
            version: 0,
            step: 0,
            tokenizer,
            sampling,
            on_episode_end: None,
        }
    }

    /// This context, calling `f` as each episode of a multi-turn evaluation ends.
    pub fn counting_episodes(self, f: &'a (dyn Fn() + Sync)) -> Self {
        StepContext {
            on_episode_end: Some(f),
            ..self
        }
    }

    pub fn at(self, version: u64, step: usize) -> Self {
        StepContext {
            version,
            step,
            ..self
        }
    }

    /// The first stop token: what ends a demonstrated answer.
    pub fn stop_token(sampling: &SamplingParams) -> Result<u32> {
        sampling
            .stop_token_ids
            .first()
            .copied()
            .context("the sampling settings have no stop token")
    }
}

/// Held-out greedy evaluation: the fraction judged correct and the mean reward.
#[derive(Debug, Clone, Copy, Default)]
pub struct EvalResult {
    /// Over every problem evaluated: an answer whose trajectory failed is not correct.
    pub accuracy: f64,
    /// Over the answers whose trajectory did not fail (NaN when every one failed): a reward
    /// that could not be had is not a reward of 0.
    pub mean_reward: f64,
    /// Answers whose trajectory failed (a reward, environment or tool that failed, a
    /// response that did not decode), `eval/failed`.
    pub failed: usize,
    /// Distinct problems evaluated (`eval/problems`): `eval.problems`, or all of a smaller
    /// held-out split; 0 where not measured here (a resumed run's evaluation before RL). An
    /// environment worker's are distinct seeds: skein cannot see onto which of its problems
    /// a seed maps, so two may be the same problem.
    pub problems: usize,
    /// How the greedy agent went about it, for multi-turn tasks.
    pub agent: Option<AgentEval>,
}

/// How many turns and tool calls the greedy agent's episodes took.
#[derive(Debug, Clone, Copy, Default)]
pub struct AgentEval {
    pub turns_mean: f64,
    /// Turns of the episodes it solved (NaN when it solved none): an agent that learns finds
    /// the answer sooner, which the mean over all episodes hides behind the failed ones.
    pub solved_turns_mean: f64,
    /// Tool calls per episode.
    pub tool_calls_mean: f64,
}

/// Why an evaluated answer failed: its trajectory failed (a reward call that did not answer),
/// or its reward is one training would fail it for ([`Trajectory::reward_problem`]: beyond
/// ±1e38 or not finite), which would otherwise swamp `eval/reward`.
pub fn eval_failure(t: &Trajectory) -> Option<String> {
    match &t.status {
        Status::Failed(why) => Some(why.clone()),
        _ => t.reward_problem(),
    }
}

impl EvalResult {
    /// What to say beside the accuracy when answers failed: an accuracy of 0 because every
    /// answer failed is a broken reward or environment, not a policy that knows nothing.
    pub fn failures_note(&self) -> String {
        match (self.failed, self.problems) {
            (0, _) => String::new(),
            (n, 0) => format!(" ({n} answers failed)"),
            (n, of) => format!(" ({n} of {of} answers failed)"),
        }
    }

    /// Accuracy, mean reward and failures of one greedy answer per problem; a failed answer
    /// ([`eval_failure`]) is neither correct nor in the mean reward.
    pub fn of<'a>(answers: impl Iterator<Item = (&'a Trajectory, bool)>) -> EvalResult {
        let (mut problems, mut correct, mut failed, mut reward) = (0, 0, 0, 0.0);
        for (t, is_correct) in answers {
            problems += 1;
            if eval_failure(t).is_some() {
                failed += 1;
            } else {
                correct += usize::from(is_correct);
                reward += t.reward;
            }
        }
        let kept = problems - failed;
        EvalResult {
            accuracy: correct as f64 / problems.max(1) as f64,
            mean_reward: if kept == 0 {
                f64::NAN
            } else {
                reward / kept as f64
            },
            failed,
            problems,
            agent: None,
        }
    }

    /// [`EvalResult::metrics`] without `eval/problems`: a `skein eval` line states its
    /// problems itself.
    pub fn scores(&self) -> Vec<(&'static str, f64)> {
        let mut m = self.metrics();
        m.retain(|(key, _)| *key != "eval/problems");
        m
    }

    /// The `eval/…` metrics of this evaluation (no `eval/reward` where every answer failed).
    pub fn metrics(&self) -> Vec<(&'static str, f64)> {
        let mut m = vec![("eval/accuracy", self.accuracy)];
        if self.mean_reward.is_finite() {
            m.push(("eval/reward", self.mean_reward));
        }
        m.extend([
            ("eval/problems", self.problems as f64),
            ("eval/failed", self.failed as f64),
        ]);
        if let Some(a) = &self.agent {
            m.push(("eval/turns_mean", a.turns_mean));
            if a.solved_turns_mean.is_finite() {
                m.push(("eval/solved_turns_mean", a.solved_turns_mean));
            }
            m.push(("eval/tool_calls_mean", a.tool_calls_mean));
        }
        m
    }
}

/// An evaluation's `eval/…` metrics with `eval/held_out`: 1 when its problems are held out,
/// 0 when they can be trained on (a task without a held-out split), so that what reads the
/// log (the `overfitting` diagnosis) knows which it was.
pub fn eval_metrics(e: &EvalResult, held_out: bool) -> Vec<(&'static str, f64)> {
    let mut m = e.metrics();
    m.push(("eval/held_out", f64::from(u8::from(held_out))));
    m
}

/// What the evaluation measured: `held-out`, or `train-set` when its problems can be trained on.
pub fn eval_kind(held_out: bool) -> &'static str {
    if held_out {
        "held-out"
    } else {
        "train-set"
    }
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
    /// A supervised row of a demonstrated solution, for the warm-up; with probability
    /// `direct_share` one that answers at once, without tools (a multi-turn task with tools;
    /// the config refuses a share for any other, see `Tasks::from_config`).
    fn demonstration(
        &mut self,
        tokenizer: &Tokenizer,
        sampling: &SamplingParams,
        direct_share: f64,
    ) -> Result<TrainRow>;
    /// What a checkpoint must keep to continue exactly.
    fn state(&self) -> WorkloadState;
    /// Metrics of the data itself: counts from loading (`first`), else per step (the epoch;
    /// with dynamic sampling, the groups the step drew and skipped: `dynamic.rs`).
    fn data_metrics(&self, first: bool) -> Vec<(&'static str, Value)>;
    /// Whether evaluation is on problems training never sees (else on training problems:
    /// the task is too small to split, or a dataset has no validation files).
    fn held_out(&self) -> bool;
    /// The problems an evaluation answers (or plays, one episode each).
    fn eval_problems(&self) -> usize;
    /// The longest prompt in tokens that the start-up check knows of (0: none to check).
    fn longest_prompt(&self) -> usize {
        0
    }
}

/// A problem from `sample`: of `split` when the task is split into training and held-out
/// problems, any problem when it is not.
pub fn draw(
    task: &str,
    split: Option<Split>,
    rng: &mut TaskRng,
    mut sample: impl FnMut(&mut TaskRng) -> Problem,
) -> Result<Problem> {
    match split {
        None => Ok(sample(rng)),
        Some(s) => draw_in(s, rng, sample).with_context(|| {
            format!("task `{task}` drew no {s:?} problem in a row of tries: its split is broken")
        }),
    }
}

/// Draws in a row that bring no new problem before [`evaluation_problems`] takes the split as
/// exhausted: at least [`MIN_REPEATED_DRAWS`], and [`REPEATED_DRAWS_PER_PROBLEM`] for each
/// problem found. With k problems found and one of the split still unseen, that one is
/// missed with probability about (1 − 1/k)^(20k) ≈ e^−20 (2e-9) whatever the split's size; a
/// fixed 2000 would miss one of a 2000-problem split a third of the time. The floor keeps
/// small splits (arithmetic's held-out ones hold 12–126) at below 1e-6.
const MIN_REPEATED_DRAWS: usize = 2000;
const REPEATED_DRAWS_PER_PROBLEM: usize = 20;

/// A built-in task's evaluation problems, drawn from `seed`: `n` distinct ones, or every one
/// of the split when it holds fewer (the caller says how many it got). Held-out problems when
/// the task's space of `problem_count` problems is split (the flag is true), else any.
/// Training, `skein eval` and every source draw them here, so they evaluate the same ones.
/// Distinct, because a problem drawn twice counts twice in the accuracy without adding to
/// what it measures: 256 draws from a held-out split of 126 problems are about 113 problems.
pub fn evaluation_problems(
    task: &str,
    problem_count: Option<u64>,
    n: usize,
    seed: u64,
    mut sample: impl FnMut(&mut TaskRng) -> Problem,
) -> Result<(Vec<Problem>, bool)> {
    let split = splits(problem_count);
    let held = split.then_some(Split::HeldOut);
    let mut rng = TaskRng::new(seed);
    let mut seen = HashSet::new();
    let mut problems = Vec::new();
    let mut repeated = 0;
    let patience = |found: usize| MIN_REPEATED_DRAWS.max(REPEATED_DRAWS_PER_PROBLEM * found);
    while problems.len() < n && repeated < patience(problems.len()) {
        let p = draw(task, held, &mut rng, &mut sample)?;
        let key = (
            p.data_source.clone(),
            p.prompt.clone(),
            p.ground_truth.clone(),
        );
        if seen.insert(key) {
            problems.push(p);
            repeated = 0;
        } else {
            repeated += 1;
        }
    }
    Ok((problems, split))
}

#[cfg(test)]
mod tests {
    use super::dataset::eval_seed;
    use super::*;

    /// A failed answer is not correct, and its reward (none was had) is no 0 in the mean;
    /// where every answer failed there is no mean reward to log.
    #[test]
    fn an_evaluation_counts_failed_answers_apart() {
        let answer = |reward: f64, status: skein_plan::Status| Trajectory {
            id: "t".into(),
            group: "g".into(),
            transitions: Vec::new(),
            reward,
            status,
        };
        let failed = || {
            answer(
                0.0,
                skein_plan::Status::Failed("the reward service timed out".into()),
            )
        };
        let answers = [
            answer(1.0, skein_plan::Status::Finished),
            answer(0.5, skein_plan::Status::Truncated),
            failed(),
        ];
        let r = EvalResult::of(answers.iter().zip([true, false, true]));
        assert_eq!((r.problems, r.failed), (3, 1));
        assert_eq!((r.accuracy, r.mean_reward), (1.0 / 3.0, 0.75));
        let m = r.metrics();
        assert!(m.contains(&("eval/failed", 1.0)) && m.contains(&("eval/reward", 0.75)));
        let none = [failed(), failed()];
        let r = EvalResult::of(none.iter().zip([false, false]));
        assert_eq!((r.accuracy, r.failed), (0.0, 2));
        assert!(r.metrics().iter().all(|(k, _)| *k != "eval/reward"));
        // A reward training would fail (beyond ±1e38, or NaN) fails the answer here too,
        // rather than making the mean reward 3e299.
        let huge = [
            answer(1e300, skein_plan::Status::Finished),
            answer(f64::NAN, skein_plan::Status::Finished),
            answer(0.5, skein_plan::Status::Finished),
        ];
        let r = EvalResult::of(huge.iter().zip([true, true, true]));
        assert_eq!((r.failed, r.accuracy, r.mean_reward), (2, 1.0 / 3.0, 0.5));
        assert!(eval_failure(&huge[0]).unwrap().contains("outside"));
    }
    use skein_tasks::{split_of, task_by_name};

    /// Problems of `task` at `difficulty` as training evaluates them.
    fn evaluated(task: &str, difficulty: u32, n: usize, seed: u64) -> (Vec<Problem>, bool) {
        let t = task_by_name(task, difficulty).unwrap();
        evaluation_problems(t.name(), t.problem_count(), n, seed, |r| t.sample(r)).unwrap()
    }

    fn distinct(problems: &[Problem]) -> usize {
        let keys: HashSet<(&str, &str)> = problems
            .iter()
            .map(|p| (p.prompt.as_str(), p.ground_truth.as_str()))
            .collect();
        keys.len()
    }

    /// Arithmetic at difficulty 2 holds out 126 problems: asked for 256, every seed evaluates
    /// all 126 once each (drawing 256 with replacement gave about 113, some five times).
    #[test]
    fn a_held_out_split_smaller_than_asked_is_evaluated_whole_and_once() {
        for seed in [eval_seed(0), eval_seed(1), eval_seed(2)] {
            let (problems, split) = evaluated("arithmetic", 2, 256, seed);
            assert!(split);
            assert_eq!(problems.len(), 126, "seed {seed}");
            assert_eq!(distinct(&problems), problems.len(), "seed {seed}");
            assert!(problems.iter().all(|p| split_of(p) == Split::HeldOut));
        }
        // The same set, in another order, whatever the seed.
        let key = |ps: Vec<Problem>| -> Vec<String> {
            let mut k: Vec<String> = ps.into_iter().map(|p| p.prompt).collect();
            k.sort();
            k
        };
        assert_eq!(
            key(evaluated("arithmetic", 2, 256, 1).0),
            key(evaluated("arithmetic", 2, 256, 2).0)
        );
    }

    /// A held-out split of about 2,000 problems, asked for more than it has, is evaluated
    /// whole: drawing stops only when a new problem has become vanishingly unlikely.
    #[test]
    fn a_large_split_smaller_than_asked_is_evaluated_whole() {
        let space = 16_000;
        let problem = |i: u64| Problem {
            prompt: format!("{i}?"),
            ground_truth: i.to_string(),
            data_source: "d".into(),
            meta: serde_json::Value::Null,
        };
        let held_out = (0..space)
            .filter(|&i| split_of(&problem(i)) == Split::HeldOut)
            .count();
        assert!(held_out > 1_800, "{held_out}");
        for seed in 0..3 {
            let (problems, split) =
                evaluation_problems("d", Some(space), 100_000, seed, |r| problem(r.below(space)))
                    .unwrap();
            assert!(split);
            assert_eq!(problems.len(), held_out, "seed {seed}");
        }
    }

    /// A split larger than asked gives exactly `n` distinct problems.
    #[test]
    fn a_large_split_gives_n_distinct_problems() {
        let (problems, split) = evaluated("arithmetic", 3, 256, eval_seed(0));
        assert!(split);
        assert_eq!((problems.len(), distinct(&problems)), (256, 256));
        let (problems, _) = evaluated("reverse", 2, 100, eval_seed(0));
        assert_eq!((problems.len(), distinct(&problems)), (100, 100));
    }
}
