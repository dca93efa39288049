//! Truncation: many responses stop at the token limit or the context, so their endings —
//! usually the answer — are never seen, and their reward says little.

use super::{examples_where, f2, steps_of, values_of, Finding, Rule};
use crate::digest::Outcome;
use crate::history::{step_span, History};

/// Share of the step's trajectories cut off by a token limit.
pub const MIN_TRUNCATED_FRACTION: f64 = 0.2;
/// Steps in a row.
pub const STEPS: usize = 2;

pub const TRUNCATION: Rule = Rule {
    name: "truncation",
    title: "many responses are cut off by the token limit",
    advice: "raise `rollout.sampling.max_new_tokens` (`agent.max_tokens` for episodes) and, if \
             the context is the limit, `model.max_positions`; if the answers are needlessly \
             long, reward shorter ones",
    check,
};

fn check(h: &History) -> Option<Finding> {
    let w = h.window(STEPS, "response/truncated_fraction")?;
    if w.iter().any(|(_, f)| *f < MIN_TRUNCATED_FRACTION) {
        return None;
    }
    let steps = steps_of(&w);
    let last = *steps.last()?;
    let examples = examples_where(h, last, 2, |d| d.outcome == Outcome::Truncated);
    Some(Finding {
        evidence: format!(
            "{} of the trajectories were cut off by a token limit on {} ({}); mean response \
             {} tokens",
            f2(w.iter().map(|(_, f)| f).sum::<f64>() / w.len() as f64),
            step_span(&steps),
            values_of(&w),
            h.step(last)
                .and_then(|s| s.get("response_len/mean"))
                .map_or("?".into(), |l| format!("{l:.1}"))
        ),
        steps,
        examples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::history;
    use serde_json::json;

    #[test]
    fn holds_when_two_steps_in_a_row_truncate_a_fifth() {
        let h = history(
            2,
            |s| json!({"response/truncated_fraction": 0.1 * s as f64}),
        );
        assert!(check(&h).is_none());
        let h = history(
            3,
            |s| json!({"response/truncated_fraction": 0.2 * s as f64}),
        );
        assert_eq!(check(&h).unwrap().steps, vec![2, 3]);
    }
}
