//! What the rules keep of the steps that are done ([`Summaries`]): running summaries for the
//! rules that look at the whole run, a few numbers however long it is. The history folds each
//! step in when it is done, handing over the step and the RL steps up to it, so this module
//! needs nothing of the history or the rules, and both can read it.

use crate::step::StepView;

/// Steps whose mean training reward stands for "at" an evaluation.
pub const REWARD_STEPS: usize = 3;

/// The RL steps up to a done step (it included, when it is one) that the summaries fold
/// from: the history's window holds at least these.
pub const LOOK_BACK: usize = REWARD_STEPS;

/// What the rules keep of the steps that are done (a later step has started).
#[derive(Debug, Clone, Default)]
pub struct Summaries {
    pub(crate) reward: RewardSummary,
}

impl Summaries {
    /// Folds in `done`, the newest step, which is done: no later record changes it.
    /// `recent_rl` holds the last [`LOOK_BACK`] RL steps up to it (fewer when fewer were
    /// seen), oldest first, `done` last when it is one.
    pub(crate) fn fold(&mut self, done: &StepView, recent_rl: &[&StepView]) {
        self.reward.fold(done, recent_rl);
    }

    /// The newest evaluation done: its step and held-out accuracy.
    pub fn latest_evaluation(&self) -> Option<(usize, f64)> {
        self.reward.latest.map(|e| (e.step, e.accuracy))
    }
}

/// What the reward rules keep of the steps that are done: the reward range, the first RL
/// steps' mean rewards, and of the evaluations the newest and the best. The reward around
/// an evaluation is taken when its step is done, since the steps up to it are all in the
/// window then and none of them changes after.
#[derive(Debug, Clone, Default)]
pub(crate) struct RewardSummary {
    /// RL steps done that logged a reward range, and the range over them (lowest, highest).
    pub(crate) range_steps: usize,
    pub(crate) range: Option<(f64, f64)>,
    /// The mean reward of each of the run's first `REWARD_STEPS` RL steps done.
    first_rewards: Vec<Option<f64>>,
    /// Evaluations done, the newest, and the best of all of them and of all but the newest.
    pub(crate) evaluations: usize,
    pub(crate) latest: Option<Evaluation>,
    pub(crate) best: Option<Evaluation>,
    pub(crate) best_before_latest: Option<Evaluation>,
    /// Whether an evaluation of the run said its problems can be trained on
    /// (`eval/held_out` 0: a task without a held-out split).
    pub(crate) train_set: bool,
}

impl RewardSummary {
    fn fold(&mut self, done: &StepView, recent_rl: &[&StepView]) {
        if done.is_rl_step() {
            if let (Some(min), Some(max)) = (done.get("reward/min"), done.get("reward/max")) {
                self.range_steps += 1;
                let (lo, hi) = self.range.unwrap_or((f64::INFINITY, f64::NEG_INFINITY));
                self.range = Some((lo.min(min), hi.max(max)));
            }
            if self.first_rewards.len() < REWARD_STEPS {
                self.first_rewards.push(done.get("reward/mean"));
            }
        }
        self.train_set |= done.get("eval/held_out") == Some(0.0);
        if let Some(accuracy) = done.get("eval/accuracy") {
            self.add_evaluation(Evaluation {
                step: done.step,
                accuracy,
                reward: Around::up_to(recent_rl),
            });
        }
    }

    fn add_evaluation(&mut self, e: Evaluation) {
        self.evaluations += 1;
        self.best_before_latest = self.best;
        if self.best.is_none_or(|b| e.accuracy > b.accuracy) {
            self.best = Some(e);
        }
        self.latest = Some(e);
    }

    /// The mean reward of the run's first `REWARD_STEPS` RL steps: those done, and `newest`
    /// (the step not done yet) while it is one of them.
    pub(crate) fn first_steps_reward(&self, newest: Option<&StepView>) -> Option<f64> {
        let done = &self.first_rewards;
        let newest = newest
            .filter(|s| s.is_rl_step() && done.len() < REWARD_STEPS)
            .map(|s| s.get("reward/mean"));
        mean(done.iter().copied().chain(newest).flatten())
    }
}

/// An evaluation of held-out accuracy at a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Evaluation {
    pub(crate) step: usize,
    pub(crate) accuracy: f64,
    pub(crate) reward: Around,
}

/// The training reward "at" an evaluation: the mean over the `REWARD_STEPS` RL steps up to
/// it, or over the run's first RL steps for an evaluation before RL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Around {
    /// The mean over the steps up to it (None when none logged a finite one).
    Mean(Option<f64>),
    /// No RL step came before it: the run's first ones stand for it, however many there
    /// are so far.
    FirstSteps,
}

impl Around {
    /// The reward around an evaluation at the newest step, from the RL steps up to it (the
    /// window's last), oldest first: the mean over the last `REWARD_STEPS` of them.
    pub(crate) fn up_to(recent_rl: &[&StepView]) -> Around {
        let w = &recent_rl[recent_rl.len().saturating_sub(REWARD_STEPS)..];
        if w.is_empty() {
            return Around::FirstSteps;
        }
        Around::Mean(mean(w.iter().filter_map(|s| s.get("reward/mean"))))
    }
}

/// The mean of `v`, summed as `Iterator::sum` does (in order, from its own start value).
fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let mut n = 0usize;
    let sum: f64 = v.inspect(|_| n += 1).sum();
    (n > 0).then(|| sum / n as f64)
}
