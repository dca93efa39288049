//! Runs every rule after each step ([`Doctor::observe`]) and keeps which diagnoses hold: a
//! diagnosis is announced once, when it starts, and extended while it keeps holding — also
//! across a pause of up to [`QUIET_STEPS`] steps, so a rule that flickers (a bound exceeded
//! every other step) is one diagnosis, not a line every other step. One that holds again after
//! a longer pause is a new one.

use crate::diagnosis::Diagnosis;
use crate::digest::Digest;
use crate::history::History;
use crate::rules::RULES;
use skein_report::Record;
use std::collections::HashMap;

/// Steps a rule may stop holding and still continue its diagnosis when it holds again.
pub const QUIET_STEPS: usize = 5;

#[derive(Debug, Default)]
pub struct Doctor {
    history: History,
    /// Rule name → index in `found` of its latest diagnosis.
    latest: HashMap<&'static str, usize>,
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
            let Some(f) = (rule.check)(&self.history) else {
                continue;
            };
            let going_on = self
                .latest
                .get(rule.name)
                .filter(|&&i| self.found[i].until + QUIET_STEPS >= step);
            match going_on {
                Some(&i) => self.found[i].until = step,
                None => {
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
                    self.latest.insert(rule.name, self.found.len());
                    self.found.push(d.clone());
                    started.push(d);
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
    fn a_diagnosis_is_announced_once_extended_across_short_pauses_and_new_after_long_ones() {
        let mut d = Doctor::default();
        // Holds at steps 2–3 and 6 (a pause of 2 steps: the same diagnosis), then at 14.
        let trunc = [
            0.5, 0.5, 0.5, 0.0, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5,
        ];
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
        let announced: Vec<usize> = (0..trunc.len())
            .filter(|&i| !started[i].is_empty())
            .collect();
        assert_eq!(announced, vec![1, 13], "steps 2 and 14");
        assert_eq!(started[13], truncation);
        let spans: Vec<(usize, usize)> = d.found().iter().map(|x| (x.step, x.until)).collect();
        assert_eq!(spans, vec![(2, 6), (14, 14)]);
    }
}
