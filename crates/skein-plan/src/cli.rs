//! `skein plan`: a JSON batch in (trajectories described by their lengths), the plan out.

use crate::advantage::{compute_advantages, AdvantageConfig, Estimator};
use crate::data::{Status, Trajectory};
use crate::error::PlanError;
use crate::loss::LossAggMode;
use crate::padding::padding_multiple;
use crate::planner::{plan, PlanConfig, Slot, Unit};
use crate::rows::RowShape;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::HashSet;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    dp_size: i64,
    num_mini_batches: i64,
    #[serde(default = "default_unit")]
    unit: String,
    #[serde(default)]
    equal_minibatch_rows: bool,
    #[serde(default)]
    token_balanced: bool,
    #[serde(default = "default_mode")]
    loss_agg_mode: String,
    #[serde(default)]
    seed: u64,
    #[serde(default = "default_estimator")]
    estimator: String,
    #[serde(default)]
    drop_equal_reward_groups: bool,
    #[serde(default)]
    actor_mini_batch_size: Option<i64>,
    #[serde(default)]
    critic_mini_batch_size: Option<i64>,
    trajectories: Vec<TrajectoryIn>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TrajectoryIn {
    id: String,
    group: String,
    reward: f64,
    #[serde(default = "default_status")]
    status: String,
    transitions: Vec<TransitionIn>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TransitionIn {
    prompt_len: i64,
    response_len: i64,
    loss_tokens: i64,
}

fn default_unit() -> String {
    "trajectory".into()
}
fn default_mode() -> String {
    "token-mean".into()
}
fn default_estimator() -> String {
    "grpo".into()
}
fn default_status() -> String {
    "finished".into()
}

fn bad(msg: String) -> PlanError {
    PlanError(msg)
}

fn positive(v: i64, field: &str) -> Result<usize, PlanError> {
    if v < 1 {
        return Err(bad(format!("`{field}` must be at least 1 (got {v})")));
    }
    Ok(v as usize)
}

/// Plans the batch in `input` (JSON) and returns the plan as JSON, or one error naming the field.
pub fn plan_json(input: &str) -> Result<String, PlanError> {
    let de = &mut serde_json::Deserializer::from_str(input);
    let inp: Input = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let msg = e.inner().to_string();
        bad(format!("invalid input at `{path}`: {msg}"))
    })?;
    let dp = positive(inp.dp_size, "dp_size")?;
    let num_mb = positive(inp.num_mini_batches, "num_mini_batches")?;
    let unit = match inp.unit.as_str() {
        "trajectory" => Unit::Trajectory,
        "group" => Unit::Group,
        other => {
            return Err(bad(format!(
                "`unit`: unknown value `{other}` (allowed: trajectory, group)"
            )))
        }
    };
    let mode: LossAggMode = inp
        .loss_agg_mode
        .parse()
        .map_err(|e| bad(format!("`loss_agg_mode`: {e}")))?;
    let estimator = match inp.estimator.as_str() {
        "grpo" => Estimator::Grpo { normalize_std: true },
        "dr-grpo" => Estimator::DrGrpo,
        "rloo" => Estimator::Rloo,
        "reinforce++" => Estimator::ReinforcePP { group_baseline: false },
        "reinforce++-baseline" => Estimator::ReinforcePP { group_baseline: true },
        other => return Err(bad(format!("`estimator`: unknown value `{other}` (allowed: grpo, dr-grpo, rloo, reinforce++, reinforce++-baseline)"))),
    };
    let mut seen = HashSet::new();
    let mut trajs = Vec::new();
    for (i, t) in inp.trajectories.iter().enumerate() {
        let at = format!("trajectories[{i}]");
        if !seen.insert(t.id.as_str()) {
            return Err(bad(format!(
                "`{at}.id`: duplicate trajectory id `{}`",
                t.id
            )));
        }
        if t.id.starts_with("pad-") || t.group.starts_with("pad-") {
            return Err(bad(format!(
                "`{at}`: ids starting with `pad-` are reserved for padding rows"
            )));
        }
        let status = match t.status.as_str() {
            "finished" => Status::Finished,
            "truncated" => Status::Truncated,
            "failed" => Status::Failed("reported failed".into()),
            other => {
                return Err(bad(format!(
                    "`{at}.status`: unknown value `{other}` (allowed: finished, truncated, failed)"
                )))
            }
        };
        if !t.reward.is_finite() {
            return Err(bad(format!("`{at}.reward` must be a finite number")));
        }
        for (k, tr) in t.transitions.iter().enumerate() {
            let tat = format!("{at}.transitions[{k}]");
            for (name, v) in [
                ("prompt_len", tr.prompt_len),
                ("response_len", tr.response_len),
                ("loss_tokens", tr.loss_tokens),
            ] {
                if v < 0 {
                    return Err(bad(format!("`{tat}.{name}` must be ≥ 0 (got {v})")));
                }
            }
            if tr.loss_tokens > tr.response_len {
                return Err(bad(format!(
                    "`{tat}.loss_tokens` ({}) exceeds response_len ({})",
                    tr.loss_tokens, tr.response_len
                )));
            }
        }
        trajs.push(Trajectory {
            id: t.id.clone(),
            group: t.group.clone(),
            transitions: Vec::new(),
            reward: t.reward,
            status,
        });
    }
    let adv = compute_advantages(
        &trajs,
        &AdvantageConfig {
            estimator,
            drop_equal_reward_groups: inp.drop_equal_reward_groups,
            eps: 1e-6,
        },
    );
    let mut groups = std::collections::HashMap::new();
    let mut rows = Vec::new();
    for (ti, t) in inp.trajectories.iter().enumerate() {
        let next = groups.len();
        let group = *groups.entry(t.group.as_str()).or_insert(next);
        if adv.per_trajectory[ti].is_none() {
            continue;
        }
        for (k, tr) in t.transitions.iter().enumerate() {
            rows.push(RowShape {
                trajectory: ti,
                transition: Some(k),
                group,
                prompt_len: tr.prompt_len as usize,
                response_len: tr.response_len as usize,
                loss_tokens: tr.loss_tokens as usize,
            });
        }
    }
    let pad_multiple = match inp.actor_mini_batch_size {
        Some(a) => Some(padding_multiple(
            dp,
            positive(a, "actor_mini_batch_size")?,
            inp.critic_mini_batch_size
                .map(|c| positive(c, "critic_mini_batch_size"))
                .transpose()?,
        )),
        None => None,
    };
    let cfg = PlanConfig {
        dp_size: dp,
        num_mini_batches: num_mb,
        unit,
        equal_minibatch_rows: inp.equal_minibatch_rows,
        token_balanced: inp.token_balanced,
        seed: inp.seed,
        pad_multiple,
        ..Default::default()
    };
    let p = plan(&rows, &cfg)?;
    let mini_batches: Vec<Value> = p
        .mini_batches
        .iter()
        .map(|mb| {
            let ranks: Vec<Value> = mb
                .ranks
                .iter()
                .map(|r| {
                    Value::Array(
                        r.iter()
                            .map(|s| match s {
                                Slot::Real(i) => json!({"trajectory": inp.trajectories[rows[*i].trajectory].id, "transition": rows[*i].transition}),
                                Slot::Padding(id) => json!({"padding": id.name()}),
                            })
                            .collect(),
                    )
                })
                .collect();
            json!({
                "ranks": ranks,
                "global_rows": mb.counts.rows,
                "global_sequences": mb.counts.sequences,
                "global_loss_tokens": mb.counts.loss_tokens,
                "global_tokens": mb.counts.tokens,
                "padding_rows": mb.padding_rows,
                "rank_tokens": mb.rank_tokens,
            })
        })
        .collect();
    let mut advantages = Map::new();
    for (t, a) in inp.trajectories.iter().zip(&adv.per_trajectory) {
        if let Some(a) = a {
            advantages.insert(t.id.clone(), json!(a));
        }
    }
    let out = json!({
        "mini_batches": mini_batches,
        "advantages": advantages,
        "loss_agg_mode": mode.as_str(),
        "dropped_groups": adv.dropped_groups,
        "failed_trajectories": adv.failed_trajectories,
    });
    serde_json::to_string(&out).map_err(|e| bad(format!("serializing the plan: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"{"dp_size": 2, "num_mini_batches": 2, "seed": 1,
      "trajectories": [
        {"id": "t0", "group": "g0", "reward": 1.0, "transitions": [{"prompt_len": 10, "response_len": 4, "loss_tokens": 4}, {"prompt_len": 20, "response_len": 4, "loss_tokens": 3}]},
        {"id": "t1", "group": "g0", "reward": 0.0, "transitions": [{"prompt_len": 10, "response_len": 9, "loss_tokens": 9}]},
        {"id": "t2", "group": "g1", "reward": 0.0, "status": "failed", "transitions": []}]}"#;

    #[test]
    fn plans_and_reports_counts() {
        let out: Value = serde_json::from_str(&plan_json(OK).unwrap()).unwrap();
        assert_eq!(out["failed_trajectories"], 1);
        let mbs = out["mini_batches"].as_array().unwrap();
        assert_eq!(mbs.len(), 2);
        let rows: u64 = mbs.iter().map(|m| m["global_rows"].as_u64().unwrap()).sum();
        assert_eq!(rows, 3);
        for m in mbs {
            let ranks = m["ranks"].as_array().unwrap();
            assert_eq!(
                ranks[0].as_array().unwrap().len(),
                ranks[1].as_array().unwrap().len()
            );
        }
        assert!(out["advantages"]["t0"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn bad_input_names_the_field() {
        let cases = [
            (OK.replace("\"dp_size\": 2", "\"dp_size\": 0"), "dp_size"),
            (
                OK.replace(
                    "\"prompt_len\": 10, \"response_len\": 9",
                    "\"prompt_len\": -1, \"response_len\": 9",
                ),
                "trajectories[1].transitions[0].prompt_len",
            ),
            (
                OK.replace("\"seed\": 1,", "\"seed\": 1, \"loss_agg_mode\": \"mean\","),
                "seq-mean-token-mean",
            ),
            (OK.replace("\"reward\": 1.0,", ""), "reward"),
            (OK.replace("\"id\": \"t1\"", "\"id\": \"t0\""), "duplicate"),
            (
                OK.replace("\"loss_tokens\": 9", "\"loss_tokens\": 10"),
                "exceeds",
            ),
        ];
        for (input, needle) in cases {
            let e = plan_json(&input).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
        let all_failed = r#"{"dp_size": 1, "num_mini_batches": 1, "trajectories": [{"id": "a", "group": "g", "reward": 0, "status": "failed", "transitions": []}]}"#;
        assert!(plan_json(all_failed)
            .unwrap_err()
            .to_string()
            .contains("no real row"));
    }
}
