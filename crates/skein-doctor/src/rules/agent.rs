//! Environment and agent trouble in multi-turn episodes: environments or external agents that
//! fail or time out, episodes that end at the turn limit, and tool calls the agent writes
//! malformed.

use super::{examples_where, f2, steps_of, values_of, Finding, Rule};
use crate::digest::Outcome;
use crate::history::{step_span, History};

/// Share of the step's episodes that failed in the environment (error, time-out, worker) or,
/// with external agents, in the agent.
pub const MAX_ENV_FAILED_FRACTION: f64 = 0.1;
/// Share of the step's episodes cut off at the turn limit...
pub const MAX_TURN_LIMIT_FRACTION: f64 = 0.5;
/// ...on this many steps in a row.
pub const TURN_LIMIT_STEPS: usize = 2;
/// Malformed tool calls per episode.
pub const MAX_TOOL_CALL_ERRORS: f64 = 0.25;
/// Steps in a row.
pub const TOOL_CALL_STEPS: usize = 2;

/// Episodes a multi-turn environment failed: its own error, a time-out, a worker that died.
const ENV_KEYS: [&str; 3] = [
    "agent/env_errors",
    "agent/env_timeouts",
    "agent/env_worker_failures",
];
/// Rollouts an external agent failed: reported failed (`/fail`), not closed within
/// `agent.rollout_timeout_s`, left open when every agent process had exited, or rewarded
/// without a model call. A step logs these or [`ENV_KEYS`], never both: an external agent
/// runs no environment of skein's.
const EXTERNAL_KEYS: [&str; 4] = [
    "agent/failed_rollouts",
    "agent/timed_out_rollouts",
    "agent/orphaned_rollouts",
    "agent/uncalled_rollouts",
];

pub const ENV_FAILURES: Rule = Rule {
    name: "env-failures",
    title: "environments or agents fail or time out",
    advice: "see the failed episodes' reasons in `skein view`; fix the environment, its \
             worker or the external agent (`agent.command`; its stderr says why it exited), or \
             raise `agent.env_timeout_s` (`agent.rollout_timeout_s` for an external agent) if \
             it is slow",
    check: env_failures,
};

pub const TURN_LIMIT: Rule = Rule {
    name: "turn-limit",
    title: "most episodes end at the turn limit",
    advice: "raise `agent.max_turns` if the task needs more turns; if the agent loops (the \
             same call again and again), read an example episode and make the prompt say \
             when to answer",
    check: turn_limit,
};

pub const TOOL_CALL_ERRORS: Rule = Rule {
    name: "tool-call-errors",
    title: "the agent writes tool calls that do not parse",
    advice: "warm the policy up on demonstrations of the call format (`sft.steps`), show the \
             format in the prompt, or reward well-formed calls",
    check: tool_call_errors,
};

fn env_failures(h: &History) -> Option<Finding> {
    let last = h.last().filter(|s| s.is_rl_step())?;
    let external = EXTERNAL_KEYS.iter().any(|k| last.get(k).is_some());
    let (keys, failed_in): (&[&str], _) = match external {
        true => (&EXTERNAL_KEYS, "rollouts failed in the external agent"),
        false => (&ENV_KEYS, "episodes failed in the environment"),
    };
    let failed: f64 = keys.iter().filter_map(|k| last.get(k)).sum();
    let n = last.get("rollout/trajectories")?.max(1.0);
    if failed / n < MAX_ENV_FAILED_FRACTION {
        return None;
    }
    let parts: Vec<String> = keys
        .iter()
        .filter_map(|k| {
            Some(format!(
                "{} {:.0}",
                k.trim_start_matches("agent/"),
                last.get(k)?
            ))
        })
        .collect();
    Some(Finding {
        evidence: format!(
            "{failed:.0} of {n:.0} {failed_in} at step {} ({})",
            last.step,
            parts.join(", ")
        ),
        steps: vec![last.step],
        examples: examples_where(h, last.step, 2, |d| d.failed()),
    })
}

/// Per-episode shares of `key` over the last `n` steps.
fn per_episode(h: &History, key: &str, n: usize) -> Option<Vec<(usize, f64)>> {
    let counts = h.window(n, key)?;
    let episodes = h.window(n, "rollout/trajectories")?;
    Some(
        counts
            .iter()
            .zip(&episodes)
            .map(|((s, c), (_, e))| (*s, c / e.max(1.0)))
            .collect(),
    )
}

fn turn_limit(h: &History) -> Option<Finding> {
    let w = per_episode(h, "agent/turn_limit", TURN_LIMIT_STEPS)?;
    if w.iter().any(|(_, f)| *f < MAX_TURN_LIMIT_FRACTION) {
        return None;
    }
    let steps = steps_of(&w);
    let last = *steps.last()?;
    Some(Finding {
        evidence: format!(
            "{} of the episodes ended at the turn limit on {} ({}); {} turns per episode at \
             step {last}",
            f2(w.iter().map(|(_, f)| f).sum::<f64>() / w.len() as f64),
            step_span(&steps),
            values_of(&w),
            h.step(last)
                .and_then(|s| s.get("agent/turns_mean"))
                .map_or("?".into(), |t| format!("{t:.1}"))
        ),
        steps,
        examples: examples_where(h, last, 2, |d| {
            d.outcome == Outcome::Truncated
                && d.reason.as_deref().is_some_and(|r| r.contains("turn"))
        }),
    })
}

fn tool_call_errors(h: &History) -> Option<Finding> {
    let w = per_episode(h, "agent/tool_call_errors", TOOL_CALL_STEPS)?;
    if w.iter().any(|(_, f)| *f < MAX_TOOL_CALL_ERRORS) {
        return None;
    }
    let steps = steps_of(&w);
    Some(Finding {
        evidence: format!(
            "{} malformed tool calls per episode on {} ({})",
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
    fn environment_failures_turn_limits_and_malformed_calls_hold() {
        let h = history(
            1,
            |_| json!({"agent/env_errors": 1, "agent/env_timeouts": 2, "rollout/trajectories": 8}),
        );
        let f = env_failures(&h).unwrap();
        assert_eq!(
            f.evidence,
            "3 of 8 episodes failed in the environment at step 1 (env_errors 1, env_timeouts 2)"
        );
        // An external agent whose every process exited: its rollouts were left open.
        let h = history(1, |_| {
            json!({
                "agent/failed_rollouts": 0,
                "agent/timed_out_rollouts": 0,
                "agent/orphaned_rollouts": 4,
                "rollout/trajectories": 4,
            })
        });
        assert_eq!(
            env_failures(&h).unwrap().evidence,
            "4 of 4 rollouts failed in the external agent at step 1 (failed_rollouts 0, \
             timed_out_rollouts 0, orphaned_rollouts 4)"
        );
        // One rollout of 16 reported failed by its agent is below a tenth.
        let h = history(
            1,
            |_| json!({"agent/failed_rollouts": 1, "rollout/trajectories": 16}),
        );
        assert!(env_failures(&h).is_none());
        let h = history(
            2,
            |_| json!({"agent/turn_limit": 6, "agent/turns_mean": 3.0, "rollout/trajectories": 8}),
        );
        assert!(turn_limit(&h)
            .unwrap()
            .evidence
            .starts_with("0.75 of the episodes"));
        let h = history(
            2,
            |s| json!({"agent/turn_limit": 2 * s, "rollout/trajectories": 8}),
        );
        assert!(turn_limit(&h).is_none());
        let h = history(
            2,
            |_| json!({"agent/tool_call_errors": 4, "rollout/trajectories": 8}),
        );
        assert!(tool_call_errors(&h).is_some());
    }
}
