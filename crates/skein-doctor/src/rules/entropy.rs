//! Entropy collapse: the policy stops exploring — its entropy falls by most of where it was a
//! few steps before — without the reward to show for it.

use super::{f2, Finding, Rule};
use crate::history::{step_span, History};

/// Steps back the fall is measured over (at most).
pub const WINDOW: usize = 5;
/// Entropy at the newest step below this share of an earlier step's in the window.
pub const MAX_SHARE: f64 = 0.5;
/// The reward rose by less than this over the same steps.
pub const MIN_REWARD_RISE: f64 = 0.05;
/// Entropy (nats per token) below which a policy is already decided: halving it is no
/// collapse (the calculator agent, once solved, moves between 0.001 and 0.003).
pub const MIN_ENTROPY: f64 = 0.05;

pub const ENTROPY_COLLAPSE: Rule = Rule {
    name: "entropy-collapse",
    title: "the policy's entropy fell fast while the reward did not rise",
    advice: "lower `optim.lr`, raise `algorithm.clip_high` (clip-higher: `ppo` and `cispo` \
             already default to 0.28, so e.g. 0.3–0.35), or add an entropy bonus \
             `algorithm.entropy_coef` (e.g. 0.001)",
    check,
};

fn check(h: &History) -> Option<Finding> {
    let last = h.last().filter(|s| s.is_rl_step())?;
    let (e_now, r_now) = (last.get("entropy")?, last.get("reward/mean")?);
    // The earliest step of the window from which the fall holds (the longest evidence).
    for s in h.recent_rl(WINDOW + 1) {
        if s.step == last.step {
            break;
        }
        let (Some(e0), Some(r0)) = (s.get("entropy"), s.get("reward/mean")) else {
            continue;
        };
        if e0 >= MIN_ENTROPY && e_now < MAX_SHARE * e0 && r_now - r0 < MIN_REWARD_RISE {
            let steps = vec![s.step, last.step];
            return Some(Finding {
                evidence: format!(
                    "entropy fell from {} to {} ({:.0}%) over {} while the mean reward went \
                     from {} to {}",
                    f2(e0),
                    f2(e_now),
                    100.0 * (1.0 - e_now / e0),
                    step_span(&steps),
                    f2(r0),
                    f2(r_now)
                ),
                steps,
                examples: Vec::new(),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::history;
    use serde_json::json;

    #[test]
    fn a_fast_fall_without_reward_holds_and_one_with_reward_does_not() {
        let h = history(
            4,
            |s| json!({"entropy": 2.0 / s as f64, "reward/mean": 0.3}),
        );
        let f = check(&h).unwrap();
        assert_eq!(f.steps, vec![1, 4]);
        assert!(
            f.evidence.contains("from 2.00 to 0.50 (75%)"),
            "{}",
            f.evidence
        );
        let h = history(
            4,
            |s| json!({"entropy": 2.0 / s as f64, "reward/mean": 0.1 * s as f64}),
        );
        assert!(check(&h).is_none(), "the reward rose with it");
        // A policy already decided (entropy 0.004 → 0.001) does not collapse.
        let h = history(
            4,
            |s| json!({"entropy": 0.004 / s as f64, "reward/mean": 0.98}),
        );
        assert!(check(&h).is_none());
        // A slow fall over more than the window does not hold.
        let h = history(
            12,
            |s| json!({"entropy": 2.0 - 0.1 * s as f64, "reward/mean": 0.3}),
        );
        assert!(check(&h).is_none());
    }
}
