//! Runs every rule after each step ([`Doctor::observe`]) and keeps which diagnoses hold: a
//! diagnosis is announced once, when it starts, and extended while it keeps holding; one that
//! stops holding and starts again later is a new one.

use crate::diagnosis::Diagnosis;
use crate::digest::Digest;
use crate::history::History;
use crate::rules::RULES;
use skein_report::Record;
use std::collections::HashMap;

#[derive(Debug, Default)]
pub struct Doctor {
    history: History,
    /// Rule name → index in `found` of its diagnosis that holds now.
    open: HashMap<&'static str, usize>,
    found: Vec<Diagnosis>,
}

impl Doctor {
    /// Takes a `metrics.jsonl` record (with its `step`) and the digests of that step's
    /// trajectories (empty for a record that has none); returns the diagnoses that start here.
    /// A record without a step is ignored.
    pub fn observe(&mut self, record: Record, trajectories: Vec<Digest>) -> Vec<Diagnosis> {
        let Some(step) = record.get("step").and_then(|s| s.as_u64()) else {
            return Vec::new();
        };
        let step = step as usize;
        self.history.push(step, record, trajectories);
        let mut started = Vec::new();
        for rule in RULES {
            match ((rule.check)(&self.history), self.open.get(rule.name)) {
                (Some(_), Some(&i)) => self.found[i].until = step,
                (Some(f), None) => {
                    let d = Diagnosis {
                        name: rule.name.into(),
                        title: rule.title.into(),
                        step,
                        until: step,
                        steps: f.steps,
                        evidence: f.evidence,
                        examples: f.examples,
                        advice: rule.advice.into(),
                    };
                    self.open.insert(rule.name, self.found.len());
                    self.found.push(d.clone());
                    started.push(d);
                }
                (None, _) => {
                    self.open.remove(rule.name);
                }
            }
        }
        started
    }

    /// Every diagnosis so far, in the order they started.
    pub fn found(&self) -> &[Diagnosis] {
        &self.found
    }

    pub fn into_found(self) -> Vec<Diagnosis> {
        self.found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(step: usize, trunc: f64) -> Record {
        json!({"step": step, "reward/mean": 0.5, "response/truncated_fraction": trunc})
            .as_object()
            .cloned()
            .unwrap()
    }

    #[test]
    fn a_diagnosis_is_announced_once_extended_while_it_holds_and_new_after_a_gap() {
        let mut d = Doctor::default();
        let trunc = [0.5, 0.5, 0.5, 0.0, 0.5, 0.5];
        let started: Vec<Vec<String>> = trunc
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                d.observe(rec(i + 1, t), vec![])
                    .into_iter()
                    .map(|x| x.name)
                    .collect()
            })
            .collect();
        let truncation = vec!["truncation".to_string()];
        assert_eq!(started[1], truncation);
        assert!(started[2].is_empty() && started[3].is_empty());
        assert_eq!(started[5], truncation);
        let spans: Vec<(usize, usize)> = d.found().iter().map(|x| (x.step, x.until)).collect();
        assert_eq!(spans, vec![(2, 3), (6, 6)]);
    }
}
