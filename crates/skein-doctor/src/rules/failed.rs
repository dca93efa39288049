//! Trajectories that fail, whatever failed them: a reward call, an environment, an external
//! agent, a remote engine, a reward beyond ±1e38, a row longer than the context. A failed
//! trajectory trains nothing, so a step that loses most of its trajectories spends its rollout
//! for little, and one that loses all of them trains nothing at all, while its metrics (no
//! reward, no loss) look like a quiet step.

use super::{examples_where, f2, Finding, Rule};
use crate::history::History;
use crate::step::StepView;

/// Share of the step's trajectories that failed: from half on, the step trained on at most
/// half of what it generated. A cause with a counter of its own is named from a tenth by its
/// own rule (`reward-failures`, `env-failures`); this one holds whatever the cause, counter or
/// none, once the step has lost half of its trajectories or more.
pub const MAX_FAILED_FRACTION: f64 = 0.5;
/// Most characters of a failure's reason quoted in the evidence: a worker's reason can carry
/// its stderr, and the evidence is one line.
const MAX_REASON_CHARS: usize = 200;

/// The step's counters of failures with a known cause, as the trainer logs them: reward calls
/// that failed or timed out; episodes a multi-turn environment failed (its error, a time-out,
/// a worker that died); rollouts an external agent failed, left open past
/// `agent.rollout_timeout_s`, left open when every agent process had exited, or rewarded
/// without a model call; and requests a remote engine failed.
const CAUSES: [&str; 9] = [
    "reward/step_failed",
    "agent/env_errors",
    "agent/env_timeouts",
    "agent/env_worker_failures",
    "agent/failed_rollouts",
    "agent/timed_out_rollouts",
    "agent/orphaned_rollouts",
    "agent/uncalled_rollouts",
    "rollout/engine_failed",
];

pub const FAILED_TRAJECTORIES: Rule = Rule {
    name: "failed-trajectories",
    title: "half or more of a step's trajectories failed",
    advice: "read the failed trajectories' reasons (`skein view`, \
             `trajectories/step-N.jsonl.zst`) and the run's stderr; run the command of the \
             reward worker (`reward.sources`), environment worker or external agent \
             (`agent.command`) by hand to see that it starts, and check that a remote engine \
             (`rollout.remote.url`) answers; a run stops after 3 steps in a row that train \
             nothing",
    check,
};

/// What the step's failures are a share of: its trajectories, or its reward calls where those
/// are more. With dynamic sampling a step keeps every failed trajectory of the groups it
/// skipped but none of their others, so its own trajectories would overstate the failures'
/// share of what it drew; its reward calls count every draw round.
fn drawn(s: &StepView) -> f64 {
    let own = s.get("rollout/trajectories").unwrap_or(0.0);
    let calls = s.get("reward/step_calls").unwrap_or(0.0);
    own.max(calls).max(1.0)
}

fn check(h: &History) -> Option<Finding> {
    let last = h.last().filter(|s| s.is_rl_step())?;
    let failed = last.get("batch/failed_trajectories")?;
    let n = drawn(last);
    // A step with no trajectory at all (dynamic sampling found no group to keep) lost nothing
    // to failures: `drawn` makes it 0 of 1.
    if failed / n < MAX_FAILED_FRACTION {
        return None;
    }
    let counted: Vec<String> = CAUSES
        .iter()
        .filter_map(|k| {
            let v = last.get(k).filter(|v| *v > 0.0)?;
            // The reward's time-outs are counted over the run only; they tell a slow source
            // from a broken one.
            let timeouts = last
                .get("reward/timeouts")
                .filter(|t| *k == "reward/step_failed" && *t > 0.0)
                .map(|t| format!(" (reward/timeouts {t:.0} in the run so far)"))
                .unwrap_or_default();
            Some(format!("{k} {v:.0}{timeouts}"))
        })
        .collect();
    let causes = match counted.is_empty() {
        true => "no failure counter of the step names a cause".to_string(),
        false => format!("counted as {}", counted.join(", ")),
    };
    // A trajectory's reason says why, which no counter does (the worker's own error, the
    // reward that was out of range); only where the step's trajectories were read.
    let reason = h
        .step(last.step)
        .and_then(|s| {
            s.trajectories
                .iter()
                .filter(|d| d.failed())
                .find_map(|d| d.reason.as_deref())
        })
        .map(|r| format!("; one failed for: {}", one_line(r)))
        .unwrap_or_default();
    Some(Finding {
        evidence: format!(
            "{} of the trajectories failed at step {} ({failed:.0} of {n:.0}); {causes}{reason}",
            f2(failed / n),
            last.step,
        ),
        steps: vec![last.step],
        examples: examples_where(h, last.step, 2, |d| d.failed()),
    })
}

/// A reason as one line of at most [`MAX_REASON_CHARS`] characters.
fn one_line(reason: &str) -> String {
    let flat = reason.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(MAX_REASON_CHARS) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::{Digest, Outcome};
    use crate::rules::testing::{history, push};
    use serde_json::json;

    fn digest(k: usize, reason: Option<&str>) -> Digest {
        Digest {
            id: format!("t{k}"),
            group: "g".into(),
            reward: 0.0,
            correct: false,
            sampled_tokens: 4,
            outcome: match reason {
                Some(_) => Outcome::Failed,
                None => Outcome::Finished,
            },
            reason: reason.map(str::to_string),
        }
    }

    /// An external agent that exits at once: every rollout is left open when its
    /// process exits, so every trajectory fails and the step logs no reward and no update.
    #[test]
    fn a_step_whose_every_trajectory_failed_holds_naming_the_counters() {
        let agent = json!({
            "rollout/trajectories": 4,
            "batch/failed_trajectories": 4,
            "agent/failed_rollouts": 0,
            "agent/timed_out_rollouts": 0,
            "agent/orphaned_rollouts": 4,
            "updates/applied": 0,
        });
        let mut h = crate::History::default();
        push(&mut h, 1, agent.clone(), vec![]);
        let why = "every agent process had exited (the last: exit status 2)\npython: can't \
                   open file 'scripts/exampel_agent.py'";
        let trajectories = (0..4).map(|k| digest(k, Some(why))).collect();
        push(&mut h, 2, agent, trajectories);
        let f = check(&h).unwrap();
        assert_eq!(
            f.evidence,
            "1.00 of the trajectories failed at step 2 (4 of 4); counted as agent/orphaned_rollouts 4; \
             one failed for: every agent process had exited (the last: exit status 2) python: \
             can't open file 'scripts/exampel_agent.py'"
        );
        assert_eq!(f.steps, vec![2]);
        assert_eq!(f.examples.len(), 2);

        // A reward worker whose command does not exist: every reward call fails.
        let h = history(1, |_| {
            json!({
                "rollout/trajectories": 16,
                "batch/failed_trajectories": 16,
                "reward/step_calls": 16,
                "reward/step_failed": 16,
                "reward/timeouts": 0,
            })
        });
        assert_eq!(
            check(&h).unwrap().evidence,
            "1.00 of the trajectories failed at step 1 (16 of 16); counted as reward/step_failed 16"
        );
    }

    #[test]
    fn half_fails_with_or_without_a_counter_of_its_own() {
        // A remote engine failing half the requests, reward time-outs named beside it.
        let h = history(1, |_| {
            json!({
                "rollout/trajectories": 8,
                "batch/failed_trajectories": 4,
                "rollout/engine_failed": 3,
                "reward/step_failed": 1,
                "reward/timeouts": 5,
            })
        });
        assert_eq!(
            check(&h).unwrap().evidence,
            "0.50 of the trajectories failed at step 1 (4 of 8); counted as reward/step_failed 1 \
             (reward/timeouts 5 in the run so far), rollout/engine_failed 3"
        );
        // Rewards out of range fail their trajectories with no counter but the reasons.
        let h = history(
            1,
            |_| json!({"rollout/trajectories": 8, "batch/failed_trajectories": 6}),
        );
        assert_eq!(
            check(&h).unwrap().evidence,
            "0.75 of the trajectories failed at step 1 (6 of 8); no failure counter of the step \
             names a cause"
        );
    }

    #[test]
    fn a_few_failures_or_none_are_no_diagnosis() {
        for (failed, n) in [(3, 8), (0, 8), (0, 0)] {
            let h = history(
                2,
                |_| json!({"rollout/trajectories": n, "batch/failed_trajectories": failed}),
            );
            assert!(check(&h).is_none(), "{failed} of {n}");
        }
        // Only the newest step counts: earlier failures are the diagnosis they started.
        let mut h = history(
            1,
            |_| json!({"rollout/trajectories": 8, "batch/failed_trajectories": 8}),
        );
        push(
            &mut h,
            2,
            json!({"reward/mean": 0.5, "rollout/trajectories": 8, "batch/failed_trajectories": 1}),
            vec![],
        );
        assert!(check(&h).is_none());
    }

    /// With dynamic sampling the step keeps the failed trajectories of skipped groups but none
    /// of their others: 6 failed of 40 drawn is not half, though the step holds 10.
    #[test]
    fn with_dynamic_sampling_failures_are_a_share_of_every_draw() {
        let h = history(1, |_| {
            json!({
                "rollout/trajectories": 10,
                "batch/failed_trajectories": 6,
                "reward/step_calls": 40,
                "reward/step_failed": 6,
            })
        });
        assert!(check(&h).is_none());
    }

    #[test]
    fn a_long_reason_is_cut_on_a_character() {
        let r = one_line(&"é".repeat(MAX_REASON_CHARS + 5));
        assert_eq!(r.chars().count(), MAX_REASON_CHARS + 1);
        assert!(r.ends_with('…'));
        assert_eq!(one_line(" a\n\tb "), "a b");
    }
}
