//! The rules, one file per family of failure. A rule is a pure function of the history that
//! returns a [`Finding`] when it holds at the newest step; its name, title, thresholds and
//! advice are documented in docs/diagnoses.md, the same words as here.
//!
//! A rule reads at most the last [`WINDOW`] RL steps, and what it needs of the run before
//! them from the history's running summaries ([`Summaries`]): that is all the history
//! keeps. The window's length is the history's own constant, so the history needs nothing of
//! the rules; [`LONGEST_LOOK_BACK`] checks it against the rules' at compile time. Whether a
//! rule holds depends on the metrics alone; the newest step's trajectories only supply its
//! examples and detail of its evidence, so a replay reads a step's trajectories only where a
//! diagnosis starts.
//!
//! [`Summaries`]: crate::summaries::Summaries

mod agent;
mod drift;
mod entropy;
mod failed;
mod length;
mod partial;
mod reward;
mod signal;
mod stability;
mod truncation;

use crate::diagnosis::Example;
use crate::history::{History, WINDOW};
use crate::summaries;

/// What a rule saw when it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub evidence: String,
    pub steps: Vec<usize>,
    pub examples: Vec<Example>,
}

pub struct Rule {
    pub name: &'static str,
    pub title: &'static str,
    pub advice: &'static str,
    /// Whether the rule holds at the newest step, from the last [`WINDOW`] RL steps and the
    /// running summaries; the same with or without the newest step's trajectories.
    pub check: fn(&History) -> Option<Finding>,
}

/// The most RL steps (the newest included) any rule looks back over, or the summaries fold
/// from. A rule that looks further back must be listed here.
pub const LONGEST_LOOK_BACK: usize = max_of(&[
    signal::STEPS,
    entropy::WINDOW + 1,
    drift::WINDOW,
    truncation::STEPS,
    length::WINDOW,
    stability::BASELINE + 1,
    stability::CRITIC_STEPS,
    reward::REWARD_STEPS,
    partial::STEPS,
    agent::TURN_LIMIT_STEPS,
    agent::TOOL_CALL_STEPS,
    summaries::LOOK_BACK,
]);

// The history keeps exactly what the rules read: a rule that looks further back than its
// window does not build, and neither does a window longer than any rule needs.
const _: () = assert!(
    LONGEST_LOOK_BACK == WINDOW,
    "history::WINDOW must be the longest look-back of any rule (rules::LONGEST_LOOK_BACK)"
);

const fn max_of(v: &[usize]) -> usize {
    let mut max = 0;
    let mut i = 0;
    while i < v.len() {
        if v[i] > max {
            max = v[i];
        }
        i += 1;
    }
    max
}

/// Every rule, in the order a report lists them.
pub const RULES: &[Rule] = &[
    signal::NO_LEARNING_SIGNAL,
    entropy::ENTROPY_COLLAPSE,
    drift::POLICY_DRIFT,
    drift::LOGPROB_MISMATCH,
    truncation::TRUNCATION,
    length::LENGTH_EXPLOITATION,
    failed::FAILED_TRAJECTORIES,
    reward::REWARD_FAILURES,
    reward::REWARD_OUT_OF_RANGE,
    reward::OVERFITTING,
    stability::UNSTABLE_UPDATES,
    stability::CRITIC_NOT_LEARNING,
    partial::STALE_PARTIAL_ROLLOUT,
    agent::ENV_FAILURES,
    agent::TURN_LIMIT,
    agent::TOOL_CALL_ERRORS,
];

pub fn rule(name: &str) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.name == name)
}

/// A fraction as "0.81".
fn f2(v: f64) -> String {
    format!("{v:.2}")
}

/// A value as a person reads it: plain when it is of ordinary size, else in e-notation.
fn num(v: f64) -> String {
    if v != 0.0 && !(1e-3..1e5).contains(&v.abs()) {
        format!("{v:.3e}")
    } else {
        format!("{v}")
    }
}

/// The steps of a window.
fn steps_of(w: &[(usize, f64)]) -> Vec<usize> {
    w.iter().map(|(s, _)| *s).collect()
}

/// The window's values, "0.50, 0.62, 0.81".
fn values_of(w: &[(usize, f64)]) -> String {
    w.iter().map(|(_, v)| f2(*v)).collect::<Vec<_>>().join(", ")
}

/// Up to `n` trajectories of step `step` for which `pick` holds.
fn examples_where(
    h: &History,
    step: usize,
    n: usize,
    pick: impl Fn(&crate::Digest) -> bool,
) -> Vec<Example> {
    h.step(step)
        .map(|s| {
            s.trajectories
                .iter()
                .filter(|d| pick(d))
                .take(n)
                .map(|d| Example {
                    step,
                    id: d.id.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod testing {
    use crate::history::History;
    use crate::Digest;
    use serde_json::Value;

    /// A history of RL steps 1..=n, each record made by `f(step)`.
    pub fn history(n: usize, f: impl Fn(usize) -> Value) -> History {
        let mut h = History::default();
        for s in 1..=n {
            let mut m = f(s).as_object().cloned().unwrap();
            m.entry("reward/mean").or_insert(Value::from(0.5));
            h.push(s, m, vec![]);
        }
        h
    }

    pub fn push(h: &mut History, step: usize, v: Value, t: Vec<Digest>) {
        h.push(step, v.as_object().cloned().unwrap(), t);
    }

    #[test]
    fn rule_names_are_unique_and_documented() {
        let docs = include_str!("../../../../docs/diagnoses.md");
        let mut names: Vec<&str> = super::RULES.iter().map(|r| r.name).collect();
        for n in &names {
            assert!(
                docs.contains(&format!("`{n}`")),
                "{n} is not in docs/diagnoses.md"
            );
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), super::RULES.len());
    }
}
