//! Runs every rule after each step ([`Doctor::observe`]) and keeps which diagnoses hold: a
//! diagnosis is announced once, when it starts, and extended while it keeps holding — also
//! across a pause of up to [`QUIET_STEPS`] steps, so a rule that flickers (a bound exceeded
//! every other step) is one diagnosis, not a line every other step. One that holds again after
//! a longer pause is a new one.

use crate::diagnosis::Diagnosis;
use crate::digest::Digest;
use crate::history::History;
use crate::rules::{Finding, Rule, RULES};
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
        let Some(step) = step_of(&record) else {
            return Vec::new();
        };
        self.history.push(step, record, trajectories);
        let held = self.check();
        self.record(step, held)
    }

    /// As [`Doctor::observe`], with the step's trajectories asked of `load` only if a
    /// diagnosis starts here: whether a rule holds depends on the metrics alone, and the
    /// trajectories only supply a starting diagnosis's examples and evidence, so this finds
    /// what `observe` given them would. `load` gives the digests of the record's step (empty
    /// when there are none to add).
    pub fn observe_with(
        &mut self,
        record: Record,
        load: impl FnOnce() -> Vec<Digest>,
    ) -> Vec<Diagnosis> {
        let Some(step) = step_of(&record) else {
            return Vec::new();
        };
        self.history.push(step, record, Vec::new());
        let mut held = self.check();
        if held
            .iter()
            .any(|(rule, _)| self.going_on(rule, step).is_none())
        {
            let trajectories = load();
            if !trajectories.is_empty() {
                self.history.attach(step, trajectories);
                held = self.check();
            }
        }
        self.record(step, held)
    }

    /// The rules that hold at the newest step, with what each saw.
    fn check(&self) -> Vec<(&'static Rule, Finding)> {
        RULES
            .iter()
            .filter_map(|rule| Some((rule, (rule.check)(&self.history)?)))
            .collect()
    }

    /// The index in `found` of `rule`'s diagnosis if one held recently enough that holding at
    /// `step` continues it.
    fn going_on(&self, rule: &Rule, step: usize) -> Option<usize> {
        self.latest
            .get(rule.name)
            .copied()
            .filter(|&i| step.saturating_sub(self.found[i].until) <= QUIET_STEPS + 1)
    }

    /// Extends the diagnoses of rules that held recently, starts the others; returns those.
    fn record(&mut self, step: usize, held: Vec<(&'static Rule, Finding)>) -> Vec<Diagnosis> {
        let mut started = Vec::new();
        for (rule, f) in held {
            if let Some(i) = self.going_on(rule, step) {
                self.found[i].until = step;
                continue;
            }
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
        started
    }

    /// Every diagnosis so far, in the order they started.
    pub fn found(&self) -> &[Diagnosis] {
        &self.found
    }

    pub fn into_found(self) -> Vec<Diagnosis> {
        self.found
    }

    /// The steps the rules can still read.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Gives the stored step `step` its trajectories if it has none yet (see
    /// [`History::attach`]); false when the step is no longer stored.
    pub fn attach(&mut self, step: usize, trajectories: Vec<Digest>) -> bool {
        self.history.attach(step, trajectories)
    }
}

fn step_of(record: &Record) -> Option<usize> {
    record
        .get("step")
        .and_then(|s| s.as_u64())
        .map(|s| s as usize)
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

    /// A pause of exactly `QUIET_STEPS` steps continues the diagnosis; one step more starts
    /// a new one.
    #[test]
    fn a_pause_of_quiet_steps_is_the_longest_one_diagnosis_spans() {
        for (quiet, spans) in [
            (QUIET_STEPS, vec![(2, QUIET_STEPS + 3)]),
            (
                QUIET_STEPS + 1,
                vec![(2, 2), (QUIET_STEPS + 4, QUIET_STEPS + 4)],
            ),
        ] {
            // Holds at step 2, then not for `quiet` steps, then again (two high steps in a
            // row: the rule's window).
            let mut trunc = vec![0.5, 0.5];
            trunc.extend(std::iter::repeat_n(0.0, quiet - 1));
            trunc.extend([0.5, 0.5]);
            let mut d = Doctor::default();
            for (i, &t) in trunc.iter().enumerate() {
                d.observe(rec(i + 1, t), vec![]);
            }
            let got: Vec<(usize, usize)> = d.found().iter().map(|x| (x.step, x.until)).collect();
            assert_eq!(got, spans, "a pause of {quiet} steps");
        }
    }
}
