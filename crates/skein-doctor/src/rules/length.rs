//! Length exploitation: responses grow while accuracy does not (a reward that pays for length,
//! or a loss that favours long wrong answers), or wrong responses grow faster than right ones
//! (the length bias Dr. GRPO describes in GRPO's per-response token mean).

use super::{examples_where, Finding, Rule};
use crate::history::{step_span, History};

/// Steps compared: the first and last `THIRD` of the last `WINDOW` RL steps.
pub const WINDOW: usize = 8;
pub const THIRD: usize = 3;
/// Mean response length grew by this factor, and by at least `MIN_GROWTH_TOKENS` tokens...
pub const MIN_GROWTH: f64 = 1.3;
pub const MIN_GROWTH_TOKENS: f64 = 2.0;
/// ...while accuracy rose by less than this.
pub const MIN_ACCURACY_RISE: f64 = 0.02;
/// Or wrong responses' growth factor exceeds right ones' by this much.
pub const MIN_GROWTH_GAP: f64 = 0.3;

pub const LENGTH_EXPLOITATION: Rule = Rule {
    name: "length-exploitation",
    title: "responses grow longer without getting more right",
    advice: "check that the reward does not pay for length (add a length penalty if it should \
             not); with GRPO use `algorithm.loss_agg_mode = \"seq-mean-token-sum-norm\"`, \
             alone or with `algorithm.estimator = \"dr-grpo\"`, which do not favour long wrong \
             answers",
    check,
};

/// Mean of `key` over the first and over the last `THIRD` steps of `w`.
fn ends(w: &[&crate::StepView], key: &str) -> Option<(f64, f64)> {
    let mean = |part: &[&crate::StepView]| -> Option<f64> {
        let v: Vec<f64> = part.iter().filter_map(|s| s.get(key)).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    Some((mean(&w[..THIRD])?, mean(&w[w.len() - THIRD..])?))
}

fn check(h: &History) -> Option<Finding> {
    let last = h.last().filter(|s| s.is_rl_step())?;
    let w = h.recent_rl(WINDOW);
    if w.len() < 2 * THIRD {
        return None;
    }
    let steps = vec![w[0].step, last.step];
    let span = step_span(&steps);
    let longest_wrong = |h: &History| {
        let s = h.step(last.step)?;
        let longest = s
            .trajectories
            .iter()
            .filter(|d| !d.correct && !d.failed())
            .map(|d| d.sampled_tokens)
            .max()?;
        Some(examples_where(h, last.step, 1, |d| {
            !d.correct && !d.failed() && d.sampled_tokens == longest
        }))
    };
    let (l0, l1) = ends(&w, "response_len/mean")?;
    let (a0, a1) = ends(&w, "reward/accuracy").unwrap_or((0.0, 0.0));
    if l1 >= MIN_GROWTH * l0 && l1 - l0 >= MIN_GROWTH_TOKENS && a1 - a0 < MIN_ACCURACY_RISE {
        let (r0, r1) = ends(&w, "reward/mean").unwrap_or((f64::NAN, f64::NAN));
        return Some(Finding {
            evidence: format!(
                "mean response length grew from {l0:.1} to {l1:.1} tokens over {span} while \
                 accuracy went from {a0:.2} to {a1:.2} (reward {r0:.2} to {r1:.2})"
            ),
            steps,
            examples: longest_wrong(h).unwrap_or_default(),
        });
    }
    let (c0, c1) = ends(&w, "response_len/correct_mean")?;
    let (i0, i1) = ends(&w, "response_len/incorrect_mean")?;
    if c0 > 0.0 && i0 > 0.0 && i1 / i0 - c1 / c0 >= MIN_GROWTH_GAP && i1 > c1 {
        return Some(Finding {
            evidence: format!(
                "wrong responses grew from {i0:.1} to {i1:.1} tokens over {span}, right ones \
                 from {c0:.1} to {c1:.1}"
            ),
            steps,
            examples: longest_wrong(h).unwrap_or_default(),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::history;
    use serde_json::json;

    #[test]
    fn growth_without_accuracy_holds_growth_with_it_does_not() {
        let h = history(
            8,
            |s| json!({"response_len/mean": 4.0 + s as f64, "reward/accuracy": 0.2}),
        );
        let f = check(&h).unwrap();
        assert!(
            f.evidence
                .contains("from 6.0 to 11.0 tokens over steps 1–8"),
            "{}",
            f.evidence
        );
        let h = history(
            8,
            |s| json!({"response_len/mean": 4.0 + s as f64, "reward/accuracy": 0.1 * s as f64}),
        );
        assert!(check(&h).is_none());
        let h = history(
            5,
            |s| json!({"response_len/mean": 4.0 + s as f64, "reward/accuracy": 0.2}),
        );
        assert!(check(&h).is_none(), "too few steps to tell");
    }

    #[test]
    fn wrong_answers_outgrowing_right_ones_hold() {
        let h = history(6, |s| {
            json!({"response_len/mean": 10.0, "reward/accuracy": 0.1 * s as f64,
                   "response_len/correct_mean": 10.0, "response_len/incorrect_mean": 10.0 + 2.0 * s as f64})
        });
        assert!(check(&h)
            .unwrap()
            .evidence
            .starts_with("wrong responses grew from 14.0 to 20.0"));
    }
}
