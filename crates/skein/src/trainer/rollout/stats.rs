//! What every rollout source returns for a step ([`StepRollout`]): whole groups of scored
//! trajectories, and the figures of producing them — the ones every source has (trained
//! tokens, staleness), counted once here, and each source's own ([`SourceStats`]) — with the
//! metrics they make.

use super::buffer::PartialStats;
use super::episodes::{AgentStats, Cutoff};
use super::outcomes::{Drawn, EqualGroups, Outcomes};
use super::trajectory_info::TrajectoryInfo;
use crate::engine::EngineStats;
use serde_json::Value;
use skein_plan::{Status, Trajectory};

/// The step's complete groups, flattened (groups in order, samples in order), and what it took
/// to produce them.
pub struct StepRollout {
    pub trajectories: Vec<Trajectory>,
    /// Parallel to `trajectories`: whether the task judged the answer correct.
    pub correct: Vec<bool>,
    /// Parallel to `trajectories`: what the trajectory log shows of each beyond its tokens.
    pub info: Vec<TrajectoryInfo>,
    pub engine: EngineStats,
    pub stats: RolloutStats,
    /// Under dynamic sampling, every group the step drew, skipped ones included.
    pub drawn: Option<Drawn>,
}

/// Figures of one step's rollout: the ones every source has, and its own.
#[derive(Debug, Clone, Default)]
pub struct RolloutStats {
    /// Loss tokens of the trajectories that did not fail: what the step has to train (its
    /// `tokens/trained` is the batch's, without the groups it drops for equal rewards).
    pub trained_tokens: usize,
    /// Versions between each trained token and the policy at the step's start.
    pub staleness_mean: f64,
    pub staleness_max: u64,
    /// Trained tokens by how many versions they are behind (stale ones only).
    pub stale_tokens: std::collections::BTreeMap<u64, usize>,
    pub source: SourceStats,
}

/// What only one kind of source counts.
#[derive(Debug, Clone)]
pub enum SourceStats {
    /// Prompts: partial rollout's counters (when it is on) and the reward sources' figures
    /// (when `[reward]` is configured).
    Prompts {
        partial: Option<PartialStats>,
        rewards: Option<Vec<(String, Value)>>,
    },
    Episodes(AgentStats),
    External(ExternalStats),
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
    /// A failed trajectory is not correct, whatever its judge said before it failed.
    pub fn new(
        trajectories: Vec<Trajectory>,
        mut correct: Vec<bool>,
        engine: EngineStats,
        version: u64,
        source: SourceStats,
    ) -> Self {
        let mut stats = RolloutStats {
            source,
            ..RolloutStats::default()
        };
        for (c, t) in correct.iter_mut().zip(&trajectories) {
            *c &= !t.is_failed();
        }
        let (mut stale_sum, mut stale_n) = (0u64, 0usize);
        for t in trajectories.iter().filter(|t| !t.is_failed()) {
            for x in &t.transitions {
                stats.trained_tokens += x.loss_tokens();
                for &v in &x.versions {
                    let behind = version.saturating_sub(v);
                    stale_sum += behind;
                    stale_n += 1;
                    stats.staleness_max = stats.staleness_max.max(behind);
                    if behind > 0 {
                        *stats.stale_tokens.entry(behind).or_default() += 1;
                    }
                }
            }
        }
        stats.staleness_mean = stale_sum as f64 / stale_n.max(1) as f64;
        StepRollout {
            info: trajectories.iter().map(TrajectoryInfo::of).collect(),
            trajectories,
            correct,
            engine,
            stats,
            drawn: None,
        }
    }

    /// The step's groups were kept from more that were drawn (dynamic sampling): its reward
    /// figures describe those.
    pub fn with_drawn(mut self, drawn: Drawn) -> Self {
        self.drawn = Some(drawn);
        self
    }

    /// Replaces what the tokens alone tell of each trajectory with what its source knows.
    pub fn with_info(mut self, info: Vec<TrajectoryInfo>) -> Self {
        debug_assert_eq!(info.len(), self.trajectories.len());
        self.info = info;
        self
    }

    /// Fails every trajectory with a row longer than the model's context: it cannot be
    /// trained on, so it is counted with the failed trajectories rather than crash the update.
    /// Returns how many.
    ///
    /// A row of n tokens takes n − 1 positions: its last token is predicted, never read
    /// (`update::pack::input_len`). So a sample the engine ended at a full context, whose
    /// last position still predicted one more token, trains: it has one token more than the
    /// model has positions.
    pub fn fail_longer_than(&mut self, max_positions: usize) -> usize {
        self.fail_each(|t| {
            let longest = t
                .transitions
                .iter()
                .map(|x| x.prompt.len() + x.response.len())
                .max()
                .unwrap_or(0);
            (longest > max_positions + 1).then(|| {
                format!(
                    "{longest} tokens, which take {} positions, more than the model's \
                     {max_positions} (model.max_positions)",
                    longest - 1
                )
            })
        })
    }

    /// Fails every trajectory whose reward, or a turn's, is non-finite or beyond
    /// ±[`skein_plan::MAX_REWARD`], or whose turns' rewards sum beyond it (a reward
    /// function's bug: its group's advantages would overflow;
    /// [`Trajectory::reward_problem`]): counted with the failed trajectories, the value in the
    /// reason, its reward taken out of the step's mean. Returns how many.
    pub fn fail_rewards_out_of_range(&mut self) -> usize {
        let failed = self.fail_each(|t| {
            let why = t.reward_problem()?;
            Some(format!(
                "{why} (a reward function's bug: advantages are f32)"
            ))
        });
        for t in self.trajectories.iter_mut().filter(|t| t.is_failed()) {
            if !skein_plan::reward_in_range(t.reward) {
                t.reward = 0.0;
            }
        }
        failed
    }

    /// Fails every trajectory not failed yet for which `why` gives a reason; its tokens no
    /// longer count as trained, and it is no longer correct (nor, for an episode, solved, cut
    /// off or trained as a row: [`AgentStats::forget_trained`]). Returns how many.
    fn fail_each(&mut self, why: impl Fn(&Trajectory) -> Option<String>) -> usize {
        let mut failed = 0;
        for (i, t) in self.trajectories.iter_mut().enumerate() {
            if t.is_failed() {
                continue;
            }
            if let Some(reason) = why(t) {
                let solved = self.correct.get(i).copied().unwrap_or(false);
                if let SourceStats::Episodes(agent) = &mut self.stats.source {
                    let cut_by_tokens = self.info.get(i).and_then(|x| x.cutoff.as_deref())
                        == Some(Cutoff::Tokens.describe());
                    agent.forget_trained(t, solved, cut_by_tokens);
                }
                if let Some(correct) = self.correct.get_mut(i) {
                    *correct = false;
                }
                let tokens: usize = t.transitions.iter().map(|x| x.loss_tokens()).sum();
                self.stats.trained_tokens = self.stats.trained_tokens.saturating_sub(tokens);
                t.status = Status::Failed(reason);
                failed += 1;
            }
        }
        failed
    }

    /// The outcomes of the trajectories the step trains on (failed ones left out).
    fn kept(&self) -> Outcomes {
        Outcomes::of(&self.trajectories, &self.correct)
    }

    /// The step's training reward: the mean over what the policy was drawn to answer (every
    /// drawn group under dynamic sampling), failed trajectories left out; None when nothing
    /// was answered.
    pub fn reward_mean(&self) -> Option<f64> {
        match &self.drawn {
            Some(d) => d.outcomes.reward_mean(),
            None => self.kept().reward_mean(),
        }
    }

    /// The share judged correct, over the same trajectories as [`StepRollout::reward_mean`].
    pub fn accuracy(&self) -> Option<f64> {
        match &self.drawn {
            Some(d) => d.outcomes.accuracy(),
            None => self.kept().accuracy(),
        }
    }

    /// Trajectories cut off by a token limit (an episode's turn limit is counted apart).
    fn truncated(&self) -> usize {
        match &self.stats.source {
            SourceStats::Episodes(a) => a.truncated,
            _ => self
                .trajectories
                .iter()
                .filter(|t| t.status == Status::Truncated)
                .count(),
        }
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
    /// engine generated it, `staleness_cap` partial rollout's cap when it is on. Parts that are
    /// switched off log nothing, so no flat zero curves.
    pub fn metrics(
        &self,
        rollout_s: f64,
        remote: bool,
        staleness_cap: Option<u64>,
    ) -> Vec<(String, Value)> {
        let s = &self.stats;
        let mut m: Vec<(String, Value)> = [
            ("rollout/trajectories", self.trajectories.len() as f64),
            ("tokens/generated", self.engine.generated_tokens as f64),
            (
                "throughput/generated_tokens_per_s",
                self.engine.generated_tokens as f64 / rollout_s.max(1e-9),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into()))
        .collect();
        let floats = |pairs: &[(&str, f64)]| -> Vec<(String, Value)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), (*v).into()))
                .collect()
        };
        // Of the trajectories that have a response to judge: a failed one (an environment or
        // reward that failed) was neither cut off nor not, and counting it would dilute the
        // fraction the `truncation` diagnosis reads. Under dynamic sampling, of every group
        // drawn: the skipped ones are often those cut off whole.
        let answered = self.trajectories.iter().filter(|t| !t.is_failed()).count();
        let truncated = match &self.drawn {
            Some(d) => d.outcomes.truncated_fraction(),
            None => (answered > 0).then(|| self.truncated() as f64 / answered as f64),
        };
        if let Some(fraction) = truncated {
            m.extend(floats(&[("response/truncated_fraction", fraction)]));
        }
        m.extend(self.outcome_metrics());
        if let Some(kept) = self.kept_ids_mean() {
            m.push(("sampling/kept_ids_mean".into(), kept.into()));
        }
        if remote {
            m.push(("rollout/engine_failed".into(), self.engine.failed.into()));
        }
        if let Some(replayed) = self.engine.graph_replayed_fraction() {
            m.extend(floats(&[
                ("rollout/graph_replayed_fraction", replayed),
                ("rollout/graph_captures", self.engine.graph_captures as f64),
            ]));
        }
        match &s.source {
            SourceStats::Prompts { partial, rewards } => {
                // Prompts a group's samples share count once; a resumed sample's context
                // (prompt and the ids it had) is prefilled again under the current weights.
                m.push((
                    "rollout/prefill_tokens".into(),
                    self.engine.prefill_tokens.into(),
                ));
                if let Some(p) = partial {
                    m.extend(floats(&[
                        ("partial/paused", p.paused as f64),
                        ("partial/resumed", p.resumed as f64),
                        ("partial/dropped_stale", p.dropped_stale as f64),
                        ("partial/budget_hit_fraction", p.budget_hit_fraction()),
                        ("partial/waiting_groups", p.waiting_groups as f64),
                        ("partial/rounds", p.rounds as f64),
                        ("partial/filled_groups", p.filled_groups as f64),
                        ("staleness/mean", s.staleness_mean),
                        ("staleness/max", s.staleness_max as f64),
                    ]));
                    if let Some(cap) = staleness_cap {
                        m.extend(floats(&[("staleness/at_cap_fraction", s.at_cap(cap))]));
                    }
                }
                m.extend(rewards.iter().flatten().cloned());
            }
            SourceStats::Episodes(a) => {
                m.extend(floats(&a.metrics()));
                let e = &self.engine;
                m.push(("agent/prefill_tokens".into(), e.prefill_tokens.into()));
                m.push(("agent/reused_prefix_tokens".into(), e.reused_tokens.into()));
            }
            SourceStats::External(e) => m.extend(floats(&e.metrics(self.trajectories.len()))),
        }
        m
    }
}

impl StepRollout {
    /// Under top-k/top-p sampling, the mean number of ids the truncation kept per sampled
    /// token: how much of the vocabulary the policy was drawn from (None without truncation).
    fn kept_ids_mean(&self) -> Option<f64> {
        let (mut ids, mut tokens) = (0usize, 0usize);
        for tr in self.trajectories.iter().flat_map(|t| &t.transitions) {
            for k in (0..tr.kept.len()).filter(|&k| tr.loss_mask[k] != 0) {
                ids += tr.kept.get(k).len();
                tokens += 1;
            }
        }
        (tokens > 0).then(|| ids as f64 / tokens as f64)
    }

    /// Reward, accuracy and response lengths ([`Outcomes::metrics`]) and the share of groups
    /// with equal rewards: of what was drawn, and under dynamic sampling the kept groups'
    /// figures beside them (`kept/…`; their equal share is 0 by construction).
    fn outcome_metrics(&self) -> Vec<(String, Value)> {
        let (mut m, groups) = match &self.drawn {
            None => (self.kept().metrics(), EqualGroups::of(&self.trajectories)),
            Some(d) => {
                let mut m = d.outcomes.metrics();
                m.extend(self.kept().kept_metrics());
                (m, d.groups)
            }
        };
        if let Some(f) = groups.fraction() {
            m.push(("batch/equal_reward_group_fraction".into(), f.into()));
        }
        m
    }
}

impl RolloutStats {
    /// The share of stale trained tokens that are `cap` or more versions behind.
    pub fn at_cap(&self, cap: u64) -> f64 {
        let stale: usize = self.stale_tokens.values().sum();
        let at: usize = self.stale_tokens.range(cap.max(1)..).map(|(_, n)| n).sum();
        at as f64 / stale.max(1) as f64
    }
}

/// Steps in a row that train no token before a run stops: enough to ride out a worker that
/// restarts, few enough not to spend a run on an environment or reward that never works.
pub const MAX_UNTRAINED_STEPS: usize = 3;

/// Steps in a row whose rollout had no token to train (every trajectory failed), each said
/// loudly, since its metrics alone look like a quiet run.
#[derive(Debug, Default)]
pub struct UntrainedSteps {
    streak: usize,
    /// The last such step's failure, for the error that stops the run.
    last_failure: Option<String>,
}

impl UntrainedSteps {
    /// A resumed run's count: `streak` steps in a row before it trained nothing.
    pub fn resumed(streak: usize) -> Self {
        UntrainedSteps {
            streak,
            last_failure: None,
        }
    }

    /// Steps in a row, up to the last counted, that trained nothing.
    pub fn streak(&self) -> usize {
        self.streak
    }

    /// Counts the step's rollout, warning when it trains nothing.
    pub fn count(&mut self, step: usize, rollout: &StepRollout) {
        if rollout.stats.trained_tokens > 0 {
            *self = Self::default();
            return;
        }
        self.streak += 1;
        let failed: Vec<&str> = rollout
            .trajectories
            .iter()
            .filter_map(|t| match &t.status {
                Status::Failed(why) => Some(why.as_str()),
                _ => None,
            })
            .collect();
        if rollout.trajectories.is_empty() {
            // Nothing failed: the step had no group to train (dynamic sampling found none with
            // reward variance; partial rollout runs groups to their end rather than train none).
            let why = "the step had no complete group to train (dynamic sampling found none with \
                       reward variance within rollout.max_draws_per_step)";
            eprintln!(
                "skein: warning: step {step} trained nothing: {why}; the run stops after \
                 {MAX_UNTRAINED_STEPS} such steps in a row"
            );
            self.last_failure = Some(why.into());
            return;
        }
        self.last_failure = failed.first().map(|why| why.to_string());
        let example = self
            .last_failure
            .as_deref()
            .map(|why| format!(" (one failed: {why})"))
            .unwrap_or_default();
        eprintln!(
            "skein: warning: step {step} trained nothing: {} of {} trajectories failed{example}; \
             the run stops after {MAX_UNTRAINED_STEPS} such steps in a row",
            failed.len(),
            rollout.trajectories.len()
        );
    }

    /// An error once [`MAX_UNTRAINED_STEPS`] steps in a row trained nothing.
    pub fn check(&self, step: usize) -> anyhow::Result<()> {
        if self.streak < MAX_UNTRAINED_STEPS {
            return Ok(());
        }
        let why = self
            .last_failure
            .as_deref()
            .unwrap_or("none failed, none had a token");
        anyhow::bail!(
            "stopping at step {step}: {} steps in a row had no token to train (the last: \
             {why}). `batch/failed_trajectories` in metrics.jsonl counts failures per step; fix \
             the environment, reward or prompts and run again",
            self.streak
        )
    }
}

/// What one step's external rollouts did.
#[derive(Debug, Clone, Default)]
pub struct ExternalStats {
    pub calls: usize,
    /// Rollouts the agents reported as failed.
    pub agent_failures: usize,
    /// Rollouts not closed within `agent.rollout_timeout_s`.
    pub timeouts: usize,
    /// Rollouts left open when every agent process the trainer started had exited.
    pub orphaned: usize,
    /// Rollouts an agent rewarded without a model call: nothing the policy wrote to train on.
    pub uncalled: usize,
    /// Agent processes started again at the step's start, having exited since the last.
    pub restarted_workers: usize,
    /// Trained rollouts (failed ones train no row) whose every call's prompt extends the
    /// previous call's prompt and completion (one merged row; a rollout of one call counts
    /// here).
    pub merged: usize,
    /// Rollouts with a call that does not (a history rendered afresh): one row per call.
    pub stepwise: usize,
}

impl ExternalStats {
    /// Counts a recorded rollout's calls and how it becomes rows.
    pub fn add(&mut self, t: &Trajectory) {
        self.calls += t.transitions.len();
        match (t.is_failed(), skein_plan::extends_token_for_token(t)) {
            // A failed rollout trains no row, merged or not.
            (true, _) => {}
            (false, true) => self.merged += 1,
            (false, false) => self.stepwise += 1,
        }
    }

    pub fn metrics(&self, rollouts: usize) -> [(&'static str, f64); 8] {
        [
            (
                "agent/calls_mean",
                self.calls as f64 / rollouts.max(1) as f64,
            ),
            ("agent/failed_rollouts", self.agent_failures as f64),
            ("agent/timed_out_rollouts", self.timeouts as f64),
            ("agent/orphaned_rollouts", self.orphaned as f64),
            ("agent/uncalled_rollouts", self.uncalled as f64),
            ("agent/restarted_workers", self.restarted_workers as f64),
            ("agent/merged_trajectories", self.merged as f64),
            ("agent/stepwise_trajectories", self.stepwise as f64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skein_plan::Transition;

    fn trajectory(prompt: usize, response: usize) -> Trajectory {
        Trajectory {
            id: format!("t{prompt}-{response}"),
            group: "g".into(),
            transitions: vec![Transition {
                prompt: vec![1; prompt],
                response: vec![2; response],
                loss_mask: vec![1; response],
                logprobs: vec![0.0; response],
                versions: vec![0; response],
                kept: Default::default(),
                reward: None,
                state: None,
            }],
            reward: 1.0,
            status: Status::Finished,
        }
    }

    fn rollout(trajectories: Vec<Trajectory>) -> StepRollout {
        let correct = vec![false; trajectories.len()];
        StepRollout::new(
            trajectories,
            correct,
            EngineStats::default(),
            0,
            SourceStats::default(),
        )
    }

    fn failed(why: &str) -> Trajectory {
        Trajectory {
            status: Status::Failed(why.into()),
            ..trajectory(4, 2)
        }
    }

    /// The truncated fraction is of the trajectories that did not fail: half of a step failing
    /// does not halve it.
    #[test]
    fn the_truncated_fraction_leaves_failed_trajectories_out() {
        let mut cut = trajectory(4, 2);
        cut.status = Status::Truncated;
        let r = rollout(vec![
            cut,
            trajectory(4, 2),
            failed("reward service down"),
            failed("x"),
        ]);
        let m = r.metrics(1.0, false, None);
        let fraction = m.iter().find(|(k, _)| k == "response/truncated_fraction");
        assert_eq!(fraction.and_then(|(_, v)| v.as_f64()), Some(0.5), "{m:?}");
        let none = rollout(vec![failed("x")]).metrics(1.0, false, None);
        assert!(none.iter().all(|(k, _)| k != "response/truncated_fraction"));
        // Episodes: of three stopped at a token limit two failed there, and only the third is
        // a response cut off.
        let agent = super::super::episodes::AgentStats {
            token_limit: 3,
            truncated: 1,
            ..Default::default()
        };
        let episodes = StepRollout::new(
            vec![trajectory(4, 2), trajectory(4, 2), failed("x"), failed("y")],
            vec![false; 4],
            EngineStats::default(),
            0,
            SourceStats::Episodes(agent),
        );
        let m = episodes.metrics(1.0, false, None);
        let fraction = m.iter().find(|(k, _)| k == "response/truncated_fraction");
        assert_eq!(fraction.and_then(|(_, v)| v.as_f64()), Some(0.5), "{m:?}");
    }

    /// Steps whose every trajectory failed stop the run at the limit with the last reason; a
    /// step that trains anything starts the count again.
    #[test]
    fn steps_that_train_nothing_stop_the_run_after_the_limit() {
        let mut untrained = UntrainedSteps::default();
        let all_failed = || rollout(vec![failed("worker crashed"), failed("env timed out")]);
        for step in 1..MAX_UNTRAINED_STEPS {
            untrained.count(step, &all_failed());
            assert!(untrained.check(step).is_ok(), "step {step}");
        }
        untrained.count(
            MAX_UNTRAINED_STEPS,
            &rollout(vec![failed("x"), trajectory(4, 2)]),
        );
        assert!(
            untrained.check(MAX_UNTRAINED_STEPS).is_ok(),
            "one trained: reset"
        );
        for step in 1..=MAX_UNTRAINED_STEPS {
            untrained.count(step, &all_failed());
        }
        let err = untrained.check(9).unwrap_err().to_string();
        assert!(err.contains("stopping at step 9"), "{err}");
        assert!(err.contains("worker crashed"), "{err}");
        assert!(err.contains("batch/failed_trajectories"), "{err}");
    }

    #[test]
    fn rows_longer_than_the_context_fail_their_trajectory_and_train_nothing() {
        // 65 tokens read 64 positions: a sample the engine ended at a full context trains.
        let mut r = StepRollout::new(
            vec![trajectory(60, 5), trajectory(60, 6)],
            vec![true, true],
            EngineStats::default(),
            0,
            SourceStats::default(),
        );
        assert_eq!(r.stats.trained_tokens, 11);
        assert_eq!(r.fail_longer_than(64), 1);
        assert!(!r.trajectories[0].is_failed());
        assert!(r.trajectories[1].is_failed());
        assert_eq!(r.stats.trained_tokens, 5);
        assert_eq!(
            r.fail_longer_than(64),
            0,
            "a failed trajectory is not counted twice"
        );
    }

    /// A reward of 1e308 (finite, but its group's differences overflow) or NaN, on the
    /// trajectory or on a turn, fails that trajectory with the value in its reason and leaves
    /// the step's mean reward finite; the others are untouched.
    #[test]
    fn rewards_beyond_the_bound_fail_their_trajectory() {
        let mut huge = trajectory(4, 2);
        huge.reward = 1e308;
        let mut nan_turn = trajectory(5, 2);
        nan_turn.transitions[0].reward = Some(f64::NAN);
        let mut r = StepRollout::new(
            vec![trajectory(3, 2), huge, nan_turn],
            vec![true, true, true],
            EngineStats::default(),
            0,
            SourceStats::default(),
        );
        assert_eq!(r.fail_rewards_out_of_range(), 2);
        assert!(!r.trajectories[0].is_failed());
        match &r.trajectories[1].status {
            Status::Failed(why) => assert!(why.contains("1e308") && why.contains("1e38"), "{why}"),
            s => panic!("{s:?}"),
        }
        assert!(r.trajectories[2].is_failed());
        assert_eq!(r.stats.trained_tokens, 2);
        assert_eq!(r.reward_mean(), Some(1.0), "the two failed are left out");
        assert_eq!(
            r.correct,
            [true, false, false],
            "the failed are not correct"
        );
    }

    /// Episodes failed after they ended (a reward out of range) leave the figures of trained
    /// episodes: a solved one is no longer among the solved, a cut-off one no longer among
    /// the responses cut off, and neither trains a row. Counting them at the episodes' end
    /// would log a truncated fraction of 1/1 and 2 solved turns on average here.
    #[test]
    fn episodes_failed_after_they_ended_leave_the_agent_figures() {
        let mut solved_then_failed = trajectory(4, 2);
        solved_then_failed.reward = 1e308;
        solved_then_failed
            .transitions
            .push(solved_then_failed.transitions[0].clone());
        let mut cut_then_failed = trajectory(5, 2);
        cut_then_failed.status = Status::Truncated;
        cut_then_failed.reward = f64::NAN;
        let agent = super::super::episodes::AgentStats {
            episodes: 3,
            solved: 2,
            solved_turns: 3,
            token_limit: 1,
            truncated: 1,
            // The two-turn one re-renders its first prompt: a row per turn.
            merged: 2,
            stepwise: 1,
            ..Default::default()
        };
        let cut_info = TrajectoryInfo {
            cutoff: Some(Cutoff::Tokens.describe().to_string()),
            ..TrajectoryInfo::default()
        };
        let mut r = StepRollout::new(
            vec![trajectory(3, 2), solved_then_failed, cut_then_failed],
            vec![true, true, false],
            EngineStats::default(),
            0,
            SourceStats::Episodes(agent),
        )
        .with_info(vec![
            TrajectoryInfo::default(),
            TrajectoryInfo::default(),
            cut_info,
        ]);
        assert_eq!(r.fail_rewards_out_of_range(), 2);
        let m: std::collections::HashMap<String, Value> =
            r.metrics(1.0, false, None).into_iter().collect();
        assert_eq!(m["response/truncated_fraction"], Value::from(0.0), "{m:?}");
        assert_eq!(m["agent/solved_turns_mean"], Value::from(1.0), "{m:?}");
        assert_eq!(m["agent/merged_trajectories"], Value::from(1.0), "{m:?}");
        assert_eq!(m["agent/stepwise_trajectories"], Value::from(0.0), "{m:?}");
        assert_eq!(
            m["agent/token_limit"],
            Value::from(1.0),
            "it was still stopped there"
        );
    }

    /// A trajectory that failed after its judge found it correct (its reward source timed
    /// out) is recorded as not correct, as the judge's own failures are.
    #[test]
    fn a_failed_trajectory_is_not_correct() {
        let mut timed_out = trajectory(4, 2);
        timed_out.status = Status::Failed("reward source timed out".into());
        let r = StepRollout::new(
            vec![trajectory(3, 2), timed_out],
            vec![true, true],
            EngineStats::default(),
            0,
            SourceStats::default(),
        );
        assert_eq!(r.correct, [true, false]);
    }

    /// A rollout built without verdicts (dynamic sampling's round check) still fails what
    /// it must: the verdicts are cleared only where there are some.
    #[test]
    fn a_rollout_without_verdicts_still_fails_bad_rewards() {
        let mut huge = trajectory(4, 2);
        huge.reward = 1e308;
        let mut r = StepRollout::new(
            vec![trajectory(3, 2), huge],
            Vec::new(),
            EngineStats::default(),
            0,
            SourceStats::default(),
        );
        assert_eq!(r.fail_rewards_out_of_range(), 1);
        assert!(r.trajectories[1].is_failed());
        assert!(r.correct.is_empty());
    }

    /// Turn rewards each within the bound whose sum is not (a return could reach it) fail
    /// their trajectory too, and a reward of 0 is kept on it, which it already had.
    #[test]
    fn turn_rewards_that_sum_beyond_the_bound_fail_their_trajectory() {
        let mut summed = trajectory(4, 2);
        summed.reward = 0.0;
        summed.transitions.push(summed.transitions[0].clone());
        summed.transitions[0].reward = Some(-9e37);
        summed.transitions[1].reward = Some(2e37);
        let mut r = StepRollout::new(
            vec![trajectory(3, 2), summed],
            vec![true, true],
            EngineStats::default(),
            0,
            SourceStats::default(),
        );
        assert_eq!(r.fail_rewards_out_of_range(), 1);
        match &r.trajectories[1].status {
            Status::Failed(why) => assert!(why.contains("sum to 1.100e38"), "{why}"),
            s => panic!("{s:?}"),
        }
        assert!(!r.trajectories[0].is_failed());
    }
}
