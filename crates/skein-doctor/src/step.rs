//! One step as the rules see it ([`StepView`]): its metrics and the digests of its
//! trajectories. Its own module, below both the history that stores steps and the summaries
//! that fold them, so neither needs the other to name a step.

use crate::digest::Digest;
use skein_report::Record;

/// One step as the rules see it.
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// evaluation at step 0) and evaluation-only records have no rollout. Every rollout logs
    /// `rollout/trajectories`; `reward/mean` is absent from a step whose every trajectory
    /// failed, so it alone would miss the steps `reward-failures` is about.
    pub fn is_rl_step(&self) -> bool {
        self.step > 0
            && (self.metrics.contains_key("rollout/trajectories")
                || self.metrics.contains_key("reward/mean"))
    }
}
