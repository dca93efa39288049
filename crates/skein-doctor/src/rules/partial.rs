//! Partial rollout under strain: most carried-over tokens sit at the staleness cap, or many
//! samples are dropped as too stale — the token budget is too small for the responses.

use super::{f2, steps_of, values_of, Finding, Rule};
use crate::history::{step_span, History};

/// Share of carried-over (off-policy) tokens whose staleness equals the cap.
pub const MAX_AT_CAP_FRACTION: f64 = 0.5;
/// Steps in a row.
pub const STEPS: usize = 2;
/// Share of the step's trajectories dropped for staleness.
pub const MAX_DROPPED_FRACTION: f64 = 0.1;

pub const STALE_PARTIAL_ROLLOUT: Rule = Rule {
    name: "stale-partial-rollout",
    title: "partial rollout's carried samples hit the staleness cap",
    advice: "raise `rollout.partial.token_budget` so fewer samples are carried over, raise \
             `rollout.partial.max_staleness` if off-policy tokens are acceptable, or lower \
             `rollout.sampling.max_new_tokens`",
    check,
};

fn check(h: &History) -> Option<Finding> {
    let last = h.last().filter(|s| s.is_rl_step())?;
    if let (Some(dropped), Some(n)) = (
        last.get("partial/dropped_stale"),
        last.get("rollout/trajectories"),
    ) {
        if dropped > 0.0 && dropped / (dropped + n) >= MAX_DROPPED_FRACTION {
            return Some(Finding {
                evidence: format!(
                    "{dropped:.0} samples were dropped as too stale at step {} beside {n:.0} \
                     that trained",
                    last.step
                ),
                steps: vec![last.step],
                examples: Vec::new(),
            });
        }
    }
    let w = h.window(STEPS, "staleness/at_cap_fraction")?;
    if w.iter().any(|(_, f)| *f < MAX_AT_CAP_FRACTION) {
        return None;
    }
    let steps = steps_of(&w);
    let cap = last
        .get("staleness/max")
        .map(|m| format!(" (staleness {m:.0})"))
        .unwrap_or_default();
    Some(Finding {
        evidence: format!(
            "{} of the carried-over tokens were at the staleness cap{cap} on {} ({})",
            f2(w.iter().map(|(_, f)| f).sum::<f64>() / w.len() as f64),
            step_span(&steps),
            values_of(&w)
        ),
        steps,
        examples: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::history;
    use serde_json::json;

    #[test]
    fn tokens_at_the_cap_or_stale_drops_hold() {
        let h = history(
            2,
            |_| json!({"staleness/at_cap_fraction": 0.8, "staleness/max": 1}),
        );
        assert!(check(&h).unwrap().evidence.contains("(staleness 1)"));
        let h = history(2, |s| json!({"staleness/at_cap_fraction": 0.3 * s as f64}));
        assert!(check(&h).is_none());
        let h = history(
            1,
            |_| json!({"partial/dropped_stale": 4, "rollout/trajectories": 16}),
        );
        assert!(check(&h)
            .unwrap()
            .evidence
            .starts_with("4 samples were dropped"));
    }
}
