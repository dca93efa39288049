//! Unstable updates: mini-batches skipped for a NaN or infinite loss or gradient, a gradient
//! norm far above its recent run, or a critic that explains none of the returns.

use super::{f2, steps_of, values_of, Finding, Rule};
use crate::history::{step_span, History};

/// A gradient norm this many times the median of the steps before it is a spike...
pub const SPIKE_FACTOR: f64 = 10.0;
/// ...over at least `MIN_BASELINE` and at most `BASELINE` earlier steps.
pub const MIN_BASELINE: usize = 3;
pub const BASELINE: usize = 10;
/// Steps in a row the critic's explained variance stays at or below 0.
pub const CRITIC_STEPS: usize = 5;

pub const UNSTABLE_UPDATES: Rule = Rule {
    name: "unstable-updates",
    title: "non-finite updates were skipped, or the gradient norm spiked",
    advice: "lower `optim.lr`, clip gradients harder (`optim.grad_clip`), warm the learning \
             rate up (`optim.warmup_steps`), and check the rewards' scale; a run stops after \
             `trainer.max_consecutive_skips` skipped updates in a row",
    check: unstable,
};

pub const CRITIC_NOT_LEARNING: Rule = Rule {
    name: "critic-not-learning",
    title: "the critic's values explain none of the returns",
    advice: "the value model is no better than a constant: raise `algorithm.critic_lr`, loosen \
             `algorithm.value_clip`, train it longer before trusting GAE, or use a group \
             estimator that needs no critic (`algorithm.estimator = \"grpo\"`)",
    check: critic,
};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn unstable(h: &History) -> Option<Finding> {
    let last = h.last().filter(|s| s.is_rl_step())?;
    let skipped = last.get("updates/skipped").unwrap_or(0.0)
        + last.get("updates/critic_skipped").unwrap_or(0.0);
    if skipped > 0.0 {
        return Some(Finding {
            evidence: format!(
                "{skipped:.0} update(s) skipped for a NaN or infinite loss or gradient at step {}",
                last.step
            ),
            steps: vec![last.step],
            examples: Vec::new(),
        });
    }
    let now = last.get("grad_norm")?;
    let before: Vec<(usize, f64)> = h
        .recent_rl(BASELINE + 1)
        .iter()
        .filter(|s| s.step < last.step)
        .filter_map(|s| Some((s.step, s.get("grad_norm")?)))
        .collect();
    if before.len() < MIN_BASELINE {
        return None;
    }
    let base = median(before.iter().map(|b| b.1).collect());
    if base <= 0.0 || now < SPIKE_FACTOR * base {
        return None;
    }
    let steps = vec![before[0].0, last.step];
    Some(Finding {
        evidence: format!(
            "the gradient norm was {now:.3e} at step {}, {:.0}× the median {base:.3e} of {}",
            last.step,
            now / base,
            step_span(&[before[0].0, before[before.len() - 1].0])
        ),
        steps,
        examples: Vec::new(),
    })
}

fn critic(h: &History) -> Option<Finding> {
    let w = h.window(CRITIC_STEPS, "value/explained_variance")?;
    if w.iter().any(|(_, ev)| *ev > 0.0) {
        return None;
    }
    let steps = steps_of(&w);
    Some(Finding {
        evidence: format!(
            "explained variance of the returns stayed at or below 0 on {} ({}); the last is {}",
            step_span(&steps),
            values_of(&w),
            f2(w[w.len() - 1].1)
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
    fn skipped_updates_and_spikes_hold() {
        let h = history(2, |s| json!({"updates/skipped": s - 1, "grad_norm": 1.0}));
        assert!(unstable(&h)
            .unwrap()
            .evidence
            .starts_with("1 update(s) skipped"));
        let h = history(
            5,
            |s| json!({"grad_norm": if s == 5 { 50.0 } else { 1.0 + 0.1 * s as f64 }}),
        );
        let f = unstable(&h).unwrap();
        assert_eq!(f.steps, vec![1, 5]);
        let h = history(5, |s| json!({"grad_norm": if s == 5 { 5.0 } else { 1.0 }}));
        assert!(unstable(&h).is_none());
        let h = history(3, |s| json!({"grad_norm": if s == 3 { 50.0 } else { 1.0 }}));
        assert!(unstable(&h).is_none(), "too short a baseline");
    }

    #[test]
    fn a_critic_at_or_below_zero_for_five_steps_holds() {
        let h = history(5, |s| json!({"value/explained_variance": -0.1 * s as f64}));
        assert_eq!(critic(&h).unwrap().steps, vec![1, 2, 3, 4, 5]);
        let h = history(
            5,
            |s| json!({"value/explained_variance": if s == 3 { 0.2 } else { -0.1 }}),
        );
        assert!(critic(&h).is_none());
    }
}
