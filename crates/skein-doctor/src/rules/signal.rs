//! No learning signal: groups whose samples all earned one reward have zero advantage, so
//! their tokens train nothing.

use super::{f2, steps_of, values_of, Finding, Rule};
use crate::diagnosis::Example;
use crate::digest::equal_reward_groups;
use crate::history::{step_span, History};

/// Share of the step's groups (drawn, with dynamic sampling) with equal rewards: three
/// quarters of the rollout then trains nothing. GRPO on a task the policy mostly solves sits
/// near half (the default job: 0.31–0.69 per step), which is no failure.
pub const MIN_EQUAL_FRACTION: f64 = 0.75;
/// Steps in a row it must hold for.
pub const STEPS: usize = 3;

pub const NO_LEARNING_SIGNAL: Rule = Rule {
    name: "no-learning-signal",
    title: "most groups have equal rewards, so zero advantage",
    advice: "the prompts are too easy or too hard for the policy: change `task.difficulty` or \
             the data, raise `rollout.samples_per_prompt`, or (unless it is on already) set \
             `rollout.skip_zero_variance_groups = true` to train only on groups with variance \
             (dynamic sampling)",
    check,
};

/// The share of groups without signal at a step: of the groups drawn, those dynamic sampling
/// skipped included (the trainer logs it so). None where the run's settings give every such
/// group an advantage anyway (GAE's critic, REINFORCE++'s batch whitening: the trainer logs
/// `batch/equal_reward_groups_carry_signal`), so equal rewards are no lack of signal there.
fn equal_fraction(s: &crate::StepView) -> Option<f64> {
    if s.get("batch/equal_reward_groups_carry_signal") == Some(1.0) {
        return None;
    }
    s.get("batch/equal_reward_group_fraction")
}

fn check(h: &History) -> Option<Finding> {
    let w: Vec<(usize, f64)> = h
        .recent_rl(STEPS)
        .into_iter()
        .map(|s| Some((s.step, equal_fraction(s)?)))
        .collect::<Option<_>>()?;
    if w.len() < STEPS || !h.last()?.is_rl_step() {
        return None;
    }
    if w.iter().any(|(_, f)| *f < MIN_EQUAL_FRACTION) {
        return None;
    }
    let steps = steps_of(&w);
    let last = *steps.last()?;
    let mut evidence = format!(
        "{} of the groups had one reward for all their samples on {} ({})",
        f2(w.iter().map(|(_, f)| f).sum::<f64>() / w.len() as f64),
        step_span(&steps),
        values_of(&w)
    );
    let newest = h.step(last)?;
    // Dynamic sampling kept only groups with variance: the equal ones are counted, not kept.
    if let (Some(drawn), Some(skipped)) = (
        newest.get("rollout/drawn_groups"),
        newest.get("rollout/skipped_groups"),
    ) {
        evidence.push_str(&format!(
            "; dynamic sampling is on: at step {last} it skipped {skipped} of the {drawn} \
             groups it drew, spending their rollouts for nothing"
        ));
    }
    let equal = equal_reward_groups(&newest.trajectories);
    let right = equal.iter().filter(|(_, c, _)| *c).count();
    // A run that keeps some of a step's trajectories is counted over those.
    let read = newest.trajectories.len();
    let among = match newest.get("rollout/trajectories") {
        Some(all) if (read as f64) < all => {
            format!(" among the {read} kept trajectories (trajectories.keep)")
        }
        _ => String::new(),
    };
    if !equal.is_empty() {
        evidence.push_str(&format!(
            "; at step {last}{among} {right} such groups were all right and {} all wrong",
            equal.len() - right
        ));
    }
    let examples = equal
        .iter()
        .take(2)
        .map(|(_, _, id)| Example {
            step: last,
            id: id.clone(),
        })
        .collect();
    Some(Finding {
        evidence,
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
    fn holds_after_three_steps_of_mostly_equal_groups() {
        let h = history(
            3,
            |s| json!({"batch/equal_reward_group_fraction": if s == 1 { 0.4 } else { 0.9 }}),
        );
        assert!(check(&h).is_none(), "step 1 is below the threshold");
        let h = history(
            4,
            |s| json!({"batch/equal_reward_group_fraction": if s == 1 { 0.4 } else { 0.9 }}),
        );
        let f = check(&h).unwrap();
        assert_eq!(f.steps, vec![2, 3, 4]);
        assert!(
            f.evidence.starts_with("0.90 of the groups"),
            "{}",
            f.evidence
        );
    }

    /// Where the run's settings give equal-reward groups an advantage anyway (GAE,
    /// REINFORCE++), their share is no lack of signal: the trainer says so in each step.
    #[test]
    fn groups_that_carry_signal_are_no_lack_of_it() {
        let h = history(4, |_| {
            json!({"batch/equal_reward_group_fraction": 0.9,
                   "batch/equal_reward_groups_carry_signal": 1.0})
        });
        assert!(check(&h).is_none());
    }

    /// Under dynamic sampling the trainer's share is already of every drawn group (the
    /// skipped ones are the equal ones): it is read as it is, not counted twice.
    #[test]
    fn the_drawn_share_is_read_as_logged() {
        let h = history(3, |_| {
            json!({"batch/equal_reward_group_fraction": 0.8,
                   "rollout/drawn_groups": 32, "rollout/skipped_groups": 24})
        });
        let evidence = check(&h).unwrap().evidence;
        assert!(evidence.starts_with("0.80"), "{evidence}");
        assert!(
            evidence.contains("dynamic sampling is on: at step 3 it skipped 24 of the 32"),
            "{evidence}"
        );
        let h = history(3, |_| {
            json!({"batch/equal_reward_group_fraction": 0.6,
                   "rollout/drawn_groups": 10, "rollout/skipped_groups": 6})
        });
        assert!(check(&h).is_none());
    }
}
