//! Reward trouble: a reward source that fails, a reward far outside what the run has seen (a
//! reward function's bug or an exploit), and a training reward that rises while held-out
//! accuracy falls (overfitting).

use super::{examples_where, f2, num, Finding, Rule};
use crate::history::{step_span, History};

/// Share of the step's trajectories whose reward call failed or timed out.
pub const MAX_FAILED_FRACTION: f64 = 0.1;
/// RL steps seen before a range exists to fall outside of.
pub const MIN_RANGE_STEPS: usize = 3;
/// A reward beyond the range seen by more than the range's width (at least this).
pub const MIN_RANGE_WIDTH: f64 = 1.0;
/// Held-out accuracy below its best by this much...
pub const MIN_ACCURACY_DROP: f64 = 0.05;
/// ...while the training reward rose by this much since the best.
pub const MIN_REWARD_RISE: f64 = 0.05;
/// Steps whose mean training reward stands for "at" an evaluation.
pub const REWARD_STEPS: usize = 3;

pub const REWARD_FAILURES: Rule = Rule {
    name: "reward-failures",
    title: "reward calls fail or time out",
    advice: "see the failed trajectories' reasons in `skein view`; check the reward worker or \
             service (`reward.sources`), raise its `timeout_ms` if it is slow, or give it more \
             workers",
    check: failures,
};

pub const REWARD_OUT_OF_RANGE: Rule = Rule {
    name: "reward-out-of-range",
    title: "a reward far outside the range seen so far",
    advice: "read the example trajectory: a reward function's bug or an exploit of it shifts \
             every advantage of its group; fix or clip the reward (`skein_plan::MAX_REWARD` \
             bounds what is accepted at all)",
    check: out_of_range,
};

pub const OVERFITTING: Rule = Rule {
    name: "overfitting",
    title: "training reward rises while held-out accuracy falls",
    advice: "train on more or more varied prompts (`data.train_files`, `task.difficulty`), \
             fewer steps (`trainer.steps`), a lower `optim.lr` or a KL term \
             `algorithm.kl_coef`; keep checkpoints (`trainer.checkpoint_every`) to return to \
             the best held-out step",
    check: overfitting,
};

fn failures(h: &History) -> Option<Finding> {
    let last = h.last().filter(|s| s.is_rl_step())?;
    let failed = last.get("reward/step_failed")?;
    let n = last.get("rollout/trajectories")?.max(1.0);
    if failed / n < MAX_FAILED_FRACTION {
        return None;
    }
    let examples = examples_where(h, last.step, 2, |d| {
        d.failed() && d.reason.as_deref().is_some_and(|r| r.contains("reward"))
    });
    let timeouts = last
        .get("reward/timeouts")
        .map(|t| format!(" ({t:.0} timed out so far in the run)"))
        .unwrap_or_default();
    Some(Finding {
        evidence: format!(
            "{failed:.0} of {n:.0} reward calls failed at step {}{timeouts}",
            last.step
        ),
        steps: vec![last.step],
        examples,
    })
}

fn out_of_range(h: &History) -> Option<Finding> {
    let last = h.last().filter(|s| s.is_rl_step())?;
    let before: Vec<(f64, f64)> = h
        .recent_rl(usize::MAX)
        .iter()
        .filter(|s| s.step < last.step)
        .filter_map(|s| Some((s.get("reward/min")?, s.get("reward/max")?)))
        .collect();
    if before.len() < MIN_RANGE_STEPS {
        return None;
    }
    let lo = before.iter().map(|b| b.0).fold(f64::INFINITY, f64::min);
    let hi = before.iter().map(|b| b.1).fold(f64::NEG_INFINITY, f64::max);
    let width = (hi - lo).max(MIN_RANGE_WIDTH);
    let (min, max) = (last.get("reward/min")?, last.get("reward/max")?);
    let beyond = if max > hi + width {
        max
    } else if min < lo - width {
        min
    } else {
        return None;
    };
    Some(Finding {
        evidence: format!(
            "a reward of {} at step {} after {} steps within {}–{}",
            num(beyond),
            last.step,
            before.len(),
            num(lo),
            num(hi)
        ),
        steps: vec![last.step],
        examples: examples_where(h, last.step, 1, |d| d.reward == beyond && !d.failed()),
    })
}

fn overfitting(h: &History) -> Option<Finding> {
    let evals = h.series("eval/accuracy");
    let (&(now_step, now), earlier) = evals.split_last()?;
    if earlier.len() < 2 {
        return None;
    }
    let &(best_step, best) = earlier
        .iter()
        .fold(&earlier[0], |b, e| if e.1 > b.1 { e } else { b });
    if now > best - MIN_ACCURACY_DROP {
        return None;
    }
    // The training reward around each evaluation: the steps up to it (the first RL steps
    // for the evaluation before RL).
    let rl: Vec<usize> = h.recent_rl(usize::MAX).iter().map(|s| s.step).collect();
    let around = |step: usize| {
        let upto: Vec<usize> = rl.iter().copied().filter(|&s| s <= step).collect();
        let (from, to) = match upto.len() {
            0 => (*rl.first()?, *rl.get(REWARD_STEPS - 1).or(rl.last())?),
            n => (upto[n.saturating_sub(REWARD_STEPS)], upto[n - 1]),
        };
        h.mean_between("reward/mean", from, to)
    };
    let (r_best, r_now) = (around(best_step)?, around(now_step)?);
    if r_now - r_best < MIN_REWARD_RISE {
        return None;
    }
    let steps = vec![best_step, now_step];
    Some(Finding {
        evidence: format!(
            "held-out accuracy fell from {} to {} over {} while the training reward rose \
             from {} to {}",
            f2(best),
            f2(now),
            step_span(&steps),
            f2(r_best),
            f2(r_now)
        ),
        steps,
        examples: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::{history, push};
    use crate::{Digest, Outcome};
    use serde_json::json;

    #[test]
    fn failures_above_a_tenth_hold_with_a_failed_example() {
        let h = history(
            1,
            |_| json!({"reward/step_failed": 1, "rollout/trajectories": 16}),
        );
        assert!(failures(&h).is_none());
        let mut h = history(1, |_| json!({}));
        let d = Digest {
            id: "t3".into(),
            group: "g".into(),
            reward: 0.0,
            correct: false,
            sampled_tokens: 3,
            outcome: Outcome::Failed,
            reason: Some("reward worker crashed".into()),
        };
        push(
            &mut h,
            2,
            json!({"reward/mean": 0.0, "reward/step_failed": 4, "rollout/trajectories": 16}),
            vec![d],
        );
        let f = failures(&h).unwrap();
        assert_eq!(f.evidence, "4 of 16 reward calls failed at step 2");
        assert_eq!(f.examples[0].id, "t3");
    }

    #[test]
    fn a_reward_beyond_the_range_seen_holds() {
        let h = history(
            4,
            |s| json!({"reward/min": 0.0, "reward/max": if s == 4 { 1.8 } else { 1.0 }}),
        );
        assert!(out_of_range(&h).is_none(), "within one width of 0–1");
        let h = history(
            4,
            |s| json!({"reward/min": 0.0, "reward/max": if s == 4 { 100.0 } else { 1.0 }}),
        );
        assert!(out_of_range(&h)
            .unwrap()
            .evidence
            .starts_with("a reward of 100 at step 4"));
        let h = history(
            3,
            |s| json!({"reward/min": 0.0, "reward/max": 50.0 * s as f64}),
        );
        assert!(out_of_range(&h).is_none(), "too few steps for a range");
    }

    #[test]
    fn rising_reward_with_falling_held_out_accuracy_is_overfitting() {
        let mut h = History::default();
        push(&mut h, 0, json!({"eval/accuracy": 0.5}), vec![]);
        for s in 1..=9 {
            let mut r = json!({"reward/mean": 0.3 + 0.05 * s as f64});
            if s % 3 == 0 {
                r["eval/accuracy"] = json!([0.0, 0.0, 0.0, 0.6, 0.0, 0.0, 0.55, 0.0, 0.0, 0.5][s]);
            }
            push(&mut h, s, r, vec![]);
        }
        let f = overfitting(&h).unwrap();
        assert_eq!(f.steps, vec![3, 9]);
        assert!(f.evidence.contains("from 0.60 to 0.50"), "{}", f.evidence);
        // The same accuracies with a flat training reward: no overfitting.
        let mut flat = History::default();
        for (s, a) in [(0, 0.5), (3, 0.6), (6, 0.55), (9, 0.5)] {
            push(
                &mut flat,
                s,
                json!({"eval/accuracy": a, "reward/mean": 0.4}),
                vec![],
            );
        }
        assert!(overfitting(&flat).is_none());
    }
}
