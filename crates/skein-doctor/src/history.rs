//! The steps a doctor has seen ([`History`]): each step's metrics (its `metrics.jsonl` records
//! merged: an evaluation can arrive as a second record of the same step) and the digests of
//! its trajectories, with the lookups the rules share.

use crate::digest::Digest;
use skein_report::Record;

/// One step as the rules see it.
#[derive(Debug, Clone, Default)]
pub struct StepView {
    pub step: usize,
    pub metrics: Record,
    /// Empty when the step's trajectories were not kept.
    pub trajectories: Vec<Digest>,
}

impl StepView {
    /// A finite number under `key`, if the step logged one.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.metrics
            .get(key)
            .and_then(|v| v.as_f64())
            .filter(|v| v.is_finite())
    }

    /// Whether this is an RL step (it trained, or tried to): records before RL (the warm-up's
    /// evaluation at step 0) and evaluation-only records have no rollout.
    pub fn is_rl_step(&self) -> bool {
        self.step > 0 && self.metrics.contains_key("reward/mean")
    }
}

/// Every step seen so far, in order.
#[derive(Debug, Default)]
pub struct History {
    steps: Vec<StepView>,
}

impl History {
    /// Adds a record; one of the step already last merges into it (its trajectories kept).
    pub fn push(&mut self, step: usize, metrics: Record, trajectories: Vec<Digest>) {
        if let Some(last) = self.steps.last_mut().filter(|s| s.step == step) {
            last.metrics.extend(metrics);
            if last.trajectories.is_empty() {
                last.trajectories = trajectories;
            }
            return;
        }
        self.steps.push(StepView {
            step,
            metrics,
            trajectories,
        });
    }

    pub fn last(&self) -> Option<&StepView> {
        self.steps.last()
    }

    /// The last `n` RL steps (fewer when fewer were seen), oldest first.
    pub fn recent_rl(&self, n: usize) -> Vec<&StepView> {
        let mut out: Vec<&StepView> = self
            .steps
            .iter()
            .rev()
            .filter(|s| s.is_rl_step())
            .take(n)
            .collect();
        out.reverse();
        out
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

    /// Every step that logged `key`, with its value, oldest first.
    pub fn series(&self, key: &str) -> Vec<(usize, f64)> {
        self.steps
            .iter()
            .filter_map(|s| Some((s.step, s.get(key)?)))
            .collect()
    }

    /// The RL step with number `step`.
    pub fn step(&self, step: usize) -> Option<&StepView> {
        self.steps.iter().rev().find(|s| s.step == step)
    }

    /// The mean of `key` over RL steps in `from..=to` that logged it.
    pub fn mean_between(&self, key: &str, from: usize, to: usize) -> Option<f64> {
        let v: Vec<f64> = self
            .steps
            .iter()
            .filter(|s| s.is_rl_step() && (from..=to).contains(&s.step))
            .filter_map(|s| s.get(key))
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
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
        assert_eq!(h.series("eval/accuracy"), vec![(0, 0.5), (3, 0.7)]);
        assert_eq!(
            h.window(3, "reward/mean").unwrap(),
            vec![(1, 1.0), (2, 2.0), (3, 3.0)]
        );
        // Step 0 is no RL step: a window of 4 does not reach back into it.
        assert!(h.window(4, "reward/mean").is_none());
        assert!(h.window(2, "clip_frac").is_none());
        assert_eq!(h.mean_between("reward/mean", 2, 3), Some(2.5));
        assert_eq!(step_span(&[2, 3, 4]), "steps 2–4");
    }
}
