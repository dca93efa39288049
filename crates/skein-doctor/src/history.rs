//! The steps a doctor has seen ([`History`]): each step's metrics (its `metrics.jsonl` records
//! merged: an evaluation can arrive as a second record of the same step) and the digests of
//! its trajectories, with the lookups the rules share. It keeps a window, not the run: the
//! newest step and the last [`WINDOW`] RL steps, and running summaries of every step before
//! ([`Summaries`]) for the rules that look at the whole run, so its memory does not grow with
//! the run.

use crate::digest::Digest;
use crate::step::StepView;
use crate::summaries::{Summaries, LOOK_BACK};
use skein_report::Record;
use std::collections::VecDeque;

/// The longest look-back of any rule: the most RL steps, the newest included, that a rule
/// reads, and so the RL steps the history keeps before the newest. A plain number, so that the
/// history needs nothing of the rules; `rules` checks at compile time that it is the longest
/// of theirs, so a rule that looks further back does not build until this grows.
pub const WINDOW: usize = 11;

const _: () = assert!(
    LOOK_BACK <= WINDOW,
    "the summaries fold from more RL steps than the window keeps"
);

/// The newest step, the RL steps before it that a rule can still look at, and summaries of
/// the rest. Steps arrive in order (the trainer writes them so, and a resume drops the records
/// after its checkpoint): a step is done, and folded into the summaries, when a record of
/// another step follows it.
#[derive(Debug, Default)]
pub struct History {
    /// The RL steps before the newest, at most [`WINDOW`], then the newest, oldest first.
    /// Only the newest can still change (a second record of its step merges into it), and
    /// only it may be no RL step: the rules read no other.
    steps: VecDeque<StepView>,
    summaries: Summaries,
}

impl History {
    /// Adds a record; one of the step already last merges into it (its trajectories kept).
    pub fn push(&mut self, step: usize, metrics: Record, trajectories: Vec<Digest>) {
        if let Some(last) = self.steps.back_mut().filter(|s| s.step == step) {
            last.metrics.extend(metrics);
            if last.trajectories.is_empty() {
                last.trajectories = trajectories;
            }
            return;
        }
        self.finish_last();
        self.steps.push_back(StepView {
            step,
            metrics,
            trajectories,
        });
        while self.steps.len() > WINDOW + 1 {
            self.steps.pop_front();
        }
    }

    /// Folds the newest step, now done, into the summaries with the RL steps up to it, and
    /// drops it if it is no RL step: no rule looks at one that is not the newest.
    fn finish_last(&mut self) {
        let Some(last) = self.steps.back() else {
            return;
        };
        let rl = last.is_rl_step();
        self.summaries.fold(last, &last_rl(&self.steps, LOOK_BACK));
        if !rl {
            self.steps.pop_back();
        }
    }

    /// Gives the stored step `step` these trajectories if it has none (a replay reads a step
    /// file only when it is needed); false when no such step is stored.
    pub fn attach(&mut self, step: usize, trajectories: Vec<Digest>) -> bool {
        let Some(s) = self.steps.iter_mut().rev().find(|s| s.step == step) else {
            return false;
        };
        if s.trajectories.is_empty() {
            s.trajectories = trajectories;
        }
        true
    }

    pub fn last(&self) -> Option<&StepView> {
        self.steps.back()
    }

    /// The last `n` RL steps (fewer when fewer were seen), oldest first; `n` is at most
    /// [`WINDOW`], all the history keeps.
    pub fn recent_rl(&self, n: usize) -> Vec<&StepView> {
        debug_assert!(n <= WINDOW, "a rule looks back {n} steps, past the window");
        last_rl(&self.steps, n)
    }

    /// The last `n` RL steps if the newest step is one and each has `key`; else None.
    pub fn window(&self, n: usize, key: &str) -> Option<Vec<(usize, f64)>> {
        if !self.last()?.is_rl_step() {
            return None;
        }
        let w = self.recent_rl(n);
        if w.len() < n {
            return None;
        }
        w.iter().map(|s| Some((s.step, s.get(key)?))).collect()
    }

    /// The stored step with number `step` (the newest, or an RL step of the window).
    pub fn step(&self, step: usize) -> Option<&StepView> {
        self.steps.iter().rev().find(|s| s.step == step)
    }

    /// What the rules keep of the steps done so far.
    pub fn summaries(&self) -> &Summaries {
        &self.summaries
    }

    /// The steps stored, the newest included: at most [`WINDOW`] + 1.
    pub fn stored_steps(&self) -> usize {
        self.steps.len()
    }

    /// The stored steps, oldest first.
    pub fn stored(&self) -> impl Iterator<Item = &StepView> {
        self.steps.iter()
    }
}

/// The last `n` RL steps of `steps`, oldest first. A function of the steps alone, so that
/// [`History::finish_last`] can read them while it changes the summaries.
fn last_rl(steps: &VecDeque<StepView>, n: usize) -> Vec<&StepView> {
    let mut out: Vec<&StepView> = steps
        .iter()
        .rev()
        .filter(|s| s.is_rl_step())
        .take(n)
        .collect();
    out.reverse();
    out
}

/// "step 4" or "steps 2–6".
pub fn step_span(steps: &[usize]) -> String {
    match (steps.first(), steps.last()) {
        (Some(a), Some(b)) if a != b => format!("steps {a}–{b}"),
        (Some(a), _) => format!("step {a}"),
        _ => "no step".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub fn rec(v: serde_json::Value) -> Record {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn a_second_record_of_a_step_merges_and_windows_need_every_step() {
        let mut h = History::default();
        h.push(0, rec(json!({"eval/accuracy": 0.5})), vec![]);
        for s in 1..=3 {
            h.push(
                s,
                rec(json!({"reward/mean": s as f64, "entropy": 1.0})),
                vec![],
            );
        }
        h.push(3, rec(json!({"eval/accuracy": 0.7})), vec![]);
        assert_eq!(h.last().unwrap().get("reward/mean"), Some(3.0));
        assert_eq!(h.last().unwrap().get("eval/accuracy"), Some(0.7));
        // Step 0 is done and no RL step: only the summaries keep its evaluation.
        assert_eq!(h.summaries().latest_evaluation(), Some((0, 0.5)));
        assert!(h.step(0).is_none());
        assert_eq!(
            h.window(3, "reward/mean").unwrap(),
            vec![(1, 1.0), (2, 2.0), (3, 3.0)]
        );
        // Step 0 is no RL step: a window of 4 does not reach back into it.
        assert!(h.window(4, "reward/mean").is_none());
        assert!(h.window(2, "clip_frac").is_none());
        assert_eq!(step_span(&[2, 3, 4]), "steps 2–4");
    }

    fn digests(step: usize) -> Vec<Digest> {
        (0..4)
            .map(|k| Digest {
                id: format!("{step}-{k}"),
                group: format!("{step}"),
                reward: 1.0,
                correct: true,
                sampled_tokens: 8,
                outcome: crate::Outcome::Finished,
                reason: None,
            })
            .collect()
    }

    #[test]
    fn a_long_run_keeps_the_window_and_its_trajectories_only() {
        let mut h = History::default();
        for s in 1..=10_000 {
            h.push(
                s,
                rec(json!({"reward/mean": 0.5, "entropy": 1.0})),
                digests(s),
            );
            if s.is_multiple_of(10) {
                // An evaluation of the step as a second record.
                h.push(s, rec(json!({"eval/accuracy": 0.5})), vec![]);
            }
            if s.is_multiple_of(100) {
                // An evaluation that comes first: the next step's record merges into it.
                h.push(s + 1, rec(json!({"eval/accuracy": 0.6})), vec![]);
            }
            assert!(
                h.stored_steps() <= WINDOW + 1,
                "{} at step {s}",
                h.stored_steps()
            );
        }
        // The newest step is 10,001's evaluation, with the last WINDOW RL steps before it.
        assert_eq!(h.stored_steps(), WINDOW + 1);
        let kept: Vec<usize> = h.stored().map(|s| s.step).collect();
        assert_eq!(kept, (10_001 - WINDOW..=10_001).collect::<Vec<_>>());
        let digests: usize = h.stored().map(|s| s.trajectories.len()).sum();
        assert_eq!(digests, 4 * WINDOW);
        assert!(
            h.window(1, "reward/mean").is_none(),
            "the newest is no RL step"
        );
        assert_eq!(h.recent_rl(WINDOW).len(), WINDOW);
        assert_eq!(h.summaries().latest_evaluation(), Some((10_000, 0.5)));
    }
}
