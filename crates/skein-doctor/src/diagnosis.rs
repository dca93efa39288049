//! A finding as a person reads it ([`Diagnosis`]): one line of `diagnoses.jsonl`, one item of
//! `skein doctor`'s report and of `skein view`'s panel.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// The rule's name, e.g. `entropy-collapse` (docs/diagnoses.md has one section each).
    pub name: String,
    /// What it means, in a few words.
    pub title: String,
    /// The step at which it started to hold.
    pub step: usize,
    /// The last step at which it held (the same as `step` in the live record).
    pub until: usize,
    /// The steps its evidence comes from.
    pub steps: Vec<usize>,
    /// The numbers that made it hold.
    pub evidence: String,
    /// Trajectories that show it, for `skein view`.
    pub examples: Vec<Example>,
    /// What to try, naming config keys.
    pub advice: String,
}

/// A trajectory of a step (`trajectories/step-N.jsonl.zst`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Example {
    pub step: usize,
    pub id: String,
}

impl Diagnosis {
    /// The one line the trainer prints when it starts.
    pub fn line(&self) -> String {
        format!(
            "diagnosis at step {}: {} ({}): {}. Try: {}",
            self.step, self.name, self.title, self.evidence, self.advice
        )
    }
}
