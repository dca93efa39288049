//! `skein plan`: a JSON batch in (trajectories described by their lengths), the plan out.

use crate::advantage::{compute_advantages, AdvantageConfig, Estimator};
use crate::data::{Status, Trajectory};
use crate::error::PlanError;
use crate::loss::LossAggMode;
use crate::padding::padding_multiple;
use crate::planner::{plan, CostModel, PlanConfig, Slot, Unit};
use crate::rows::RowShape;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::{HashMap, HashSet};

/// The longest prompt or response a transition may give, far past any model's context: the
/// lengths of a whole step then add up in an `i64` without overflowing.
const MAX_TOKENS: i64 = u32::MAX as i64;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    dp_size: i64,
    #[serde(default)]
    num_mini_batches: Option<i64>,
    #[serde(default)]
    units_per_mini_batch: Option<i64>,
    #[serde(default = "default_unit")]
    unit: String,
    #[serde(default = "default_row")]
    row: String,
    #[serde(default)]
    cost: Option<CostIn>,
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
struct CostIn {
    linear: f64,
    quadratic: f64,
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
fn default_row() -> String {
    "transition".into()
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

/// Most ranks, and most mini-batches: every rank of every mini-batch gets at least a padding
/// row, so these sizes are what the plan allocates, whatever the input's size.
const MAX_SLOTS: i64 = 1 << 16;

/// [`positive`], and at most [`MAX_SLOTS`].
fn slots(v: i64, field: &str) -> Result<usize, PlanError> {
    if v > MAX_SLOTS {
        return Err(bad(format!(
            "`{field}` must be at most {MAX_SLOTS} (got {v}): every one of them gets rows"
        )));
    }
    positive(v, field)
}

fn choice<T: Copy>(field: &str, value: &str, allowed: &[(&str, T)]) -> Result<T, PlanError> {
    allowed
        .iter()
        .find(|(name, _)| *name == value)
        .map(|&(_, v)| v)
        .ok_or_else(|| {
            let names: Vec<&str> = allowed.iter().map(|(n, _)| *n).collect();
            bad(format!(
                "`{field}`: unknown value `{value}` (allowed: {})",
                names.join(", ")
            ))
        })
}

/// Plans the batch in `input` (JSON) and returns the plan as JSON, or one error naming the
/// field. Nothing is returned on error: no partial plan.
pub fn plan_json(input: &str) -> Result<String, PlanError> {
    let de = &mut serde_json::Deserializer::from_str(input);
    let inp: Input = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let msg = e.inner().to_string();
        if path == "." {
            bad(format!("invalid input: {msg}"))
        } else {
            bad(format!("invalid input at `{path}`: {msg}"))
        }
    })?;
    let cfg = plan_config(&inp)?;
    let mode: LossAggMode = inp
        .loss_agg_mode
        .parse()
        .map_err(|e| bad(format!("`loss_agg_mode`: {e}")))?;
    let estimator = estimator(&inp.estimator)?;
    let merge = choice(
        "row",
        &inp.row,
        &[("transition", false), ("trajectory", true)],
    )?;
    let trajs = trajectories(&inp.trajectories)?;
    let adv = compute_advantages(
        &trajs,
        &AdvantageConfig {
            estimator,
            drop_equal_reward_groups: inp.drop_equal_reward_groups,
            ..Default::default()
        },
    );
    let rows = row_shapes(&inp.trajectories, &adv.per_trajectory, merge)?;
    let p = plan(&rows, &cfg)?;
    let slot = |s: &Slot| match s {
        Slot::Real(i) => {
            let r = &rows[*i];
            let id = &inp.trajectories[r.trajectory].id;
            match r.transition {
                Some(k) => json!({"trajectory": id, "transition": k}),
                None => json!({"trajectory": id}),
            }
        }
        Slot::Padding(id) => json!({"padding": id.name()}),
    };
    let mini_batches: Vec<Value> = p
        .mini_batches
        .iter()
        .map(|mb| {
            let ranks: Vec<Vec<Value>> = mb
                .ranks
                .iter()
                .map(|r| r.iter().map(slot).collect())
                .collect();
            json!({
                "ranks": ranks,
                "global_rows": mb.counts.rows,
                "global_trajectories": mb.counts.trajectories,
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

/// The advantage estimator `name` selects (`skein train`'s names).
fn estimator(name: &str) -> Result<Estimator, PlanError> {
    choice(
        "estimator",
        name,
        &[
            (
                "grpo",
                Estimator::Grpo {
                    normalize_std: true,
                },
            ),
            ("dr-grpo", Estimator::DrGrpo),
            ("rloo", Estimator::Rloo),
            (
                "reinforce++",
                Estimator::ReinforcePP {
                    group_baseline: false,
                },
            ),
            (
                "reinforce++-baseline",
                Estimator::ReinforcePP {
                    group_baseline: true,
                },
            ),
        ],
    )
}

fn plan_config(inp: &Input) -> Result<PlanConfig, PlanError> {
    let dp = slots(inp.dp_size, "dp_size")?;
    let (num_mini_batches, units_per_mini_batch) =
        match (inp.num_mini_batches, inp.units_per_mini_batch) {
            (Some(n), None) => (slots(n, "num_mini_batches")?, None),
            (None, Some(u)) => (1, Some(positive(u, "units_per_mini_batch")?)),
            (None, None) => {
                return Err(bad(
                    "missing field `num_mini_batches` (or give `units_per_mini_batch`)".into(),
                ))
            }
            (Some(_), Some(_)) => {
                return Err(bad(
                    "`num_mini_batches` and `units_per_mini_batch` exclude each other: give one"
                        .into(),
                ))
            }
        };
    if dp * num_mini_batches > (MAX_SLOTS as usize) * 16 {
        return Err(bad(format!(
            "`dp_size` × `num_mini_batches` must be at most {} (got {dp} × {num_mini_batches})",
            MAX_SLOTS * 16
        )));
    }
    let unit = choice(
        "unit",
        &inp.unit,
        &[("trajectory", Unit::Trajectory), ("group", Unit::Group)],
    )?;
    let actor = inp
        .actor_mini_batch_size
        .map(|a| slots(a, "actor_mini_batch_size"))
        .transpose()?;
    let critic = inp
        .critic_mini_batch_size
        .map(|c| slots(c, "critic_mini_batch_size"))
        .transpose()?;
    let pad_multiple = (actor.is_some() || critic.is_some())
        .then(|| padding_multiple(dp, actor.unwrap_or(1), critic));
    if let Some(m) = pad_multiple.filter(|&m| m > (MAX_SLOTS as usize) * 16) {
        return Err(bad(format!(
            "the rows would be padded to a multiple of {m} (the least common multiple of \
             `dp_size` and the mini-batch sizes), more than {}: choose sizes that share factors",
            MAX_SLOTS * 16
        )));
    }
    let mut cost = CostModel::default();
    if let Some(c) = &inp.cost {
        for (name, v) in [("linear", c.linear), ("quadratic", c.quadratic)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(format!("`cost.{name}` must be a number ≥ 0 (got {v})")));
            }
        }
        cost = CostModel {
            linear: c.linear,
            quadratic: c.quadratic,
        };
    }
    Ok(PlanConfig {
        dp_size: dp,
        num_mini_batches,
        units_per_mini_batch,
        unit,
        equal_minibatch_rows: inp.equal_minibatch_rows,
        token_balanced: inp.token_balanced,
        cost,
        seed: inp.seed,
        pad_multiple,
    })
}

/// Validates the described trajectories and returns them as token-free trajectories (enough
/// for advantages, which need only ids, groups, rewards and statuses).
fn trajectories(input: &[TrajectoryIn]) -> Result<Vec<Trajectory>, PlanError> {
    let mut seen = HashSet::new();
    let mut trajs = Vec::with_capacity(input.len());
    for (i, t) in input.iter().enumerate() {
        let at = format!("trajectories[{i}]");
        if !seen.insert(t.id.as_str()) {
            return Err(bad(format!(
                "`{at}.id`: duplicate trajectory id `{}`",
                t.id
            )));
        }
        for (name, v) in [("id", &t.id), ("group", &t.group)] {
            if v.starts_with("pad-") {
                return Err(bad(format!(
                    "`{at}.{name}`: `{v}`: ids starting with `pad-` are reserved for padding rows"
                )));
            }
        }
        let failed = choice(
            &format!("{at}.status"),
            &t.status,
            &[("finished", false), ("truncated", false), ("failed", true)],
        )?;
        let status = match (failed, t.status.as_str()) {
            (true, _) => Status::Failed("reported failed".into()),
            (false, "truncated") => Status::Truncated,
            (false, _) => Status::Finished,
        };
        if !failed && !crate::data::reward_in_range(t.reward) {
            return Err(bad(format!(
                "`{at}.reward`: {:e} is outside ±{:e}, the range whose differences the f32 \
                 advantages can hold",
                t.reward,
                crate::data::MAX_REWARD
            )));
        }
        if t.transitions.is_empty() && !failed {
            return Err(bad(format!(
                "`{at}.transitions`: a {} trajectory needs at least one transition",
                t.status
            )));
        }
        for (k, tr) in t.transitions.iter().enumerate() {
            let tat = format!("{at}.transitions[{k}]");
            for (name, v, min) in [
                ("prompt_len", tr.prompt_len, 1),
                ("response_len", tr.response_len, 0),
                ("loss_tokens", tr.loss_tokens, 0),
            ] {
                if v < min {
                    return Err(bad(format!("`{tat}.{name}` must be ≥ {min} (got {v})")));
                }
                if v > MAX_TOKENS {
                    return Err(bad(format!(
                        "`{tat}.{name}` must be at most {MAX_TOKENS} tokens (got {v})"
                    )));
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
    Ok(trajs)
}

/// Row shapes of the trajectories that have an advantage. Merged rows need each prompt to be
/// at least as long as the context before it; with lengths only, that is all that can be
/// checked (`build_rows` checks the tokens themselves).
fn row_shapes(
    input: &[TrajectoryIn],
    advantages: &[Option<f64>],
    merge: bool,
) -> Result<Vec<RowShape>, PlanError> {
    let mut groups = HashMap::new();
    let mut rows = Vec::new();
    for (ti, t) in input.iter().enumerate() {
        let next = groups.len();
        let group = *groups.entry(t.group.as_str()).or_insert(next);
        if advantages[ti].is_none() {
            continue;
        }
        let len = |v: i64| v as usize; // validated ≥ 0 in `trajectories`
        if !merge {
            rows.extend(t.transitions.iter().enumerate().map(|(k, tr)| RowShape {
                trajectory: ti,
                transition: Some(k),
                group,
                prompt_len: len(tr.prompt_len),
                response_len: len(tr.response_len),
                loss_tokens: len(tr.loss_tokens),
            }));
            continue;
        }
        let mut context = 0;
        for (k, tr) in t.transitions.iter().enumerate() {
            if len(tr.prompt_len) < context {
                return Err(bad(format!(
                    "`trajectories[{ti}]`: trajectory `{}`, transition {k}: prompt_len {} is shorter than the context before it ({context}), so it cannot extend it; use \"row\": \"transition\"",
                    t.id, tr.prompt_len
                )));
            }
            context = len(tr.prompt_len) + len(tr.response_len);
        }
        let (first, last) = (&t.transitions[0], &t.transitions[t.transitions.len() - 1]);
        rows.push(RowShape {
            trajectory: ti,
            transition: None,
            group,
            prompt_len: len(first.prompt_len),
            response_len: len(last.prompt_len + last.response_len - first.prompt_len),
            loss_tokens: t.transitions.iter().map(|tr| len(tr.loss_tokens)).sum(),
        });
    }
    Ok(rows)
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
                OK.replace("\"dp_size\": 2", "\"dp_size\": 1000000000"),
                "`dp_size` must be at most 65536",
            ),
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
            (
                OK.replace(
                    "\"prompt_len\": 10, \"response_len\": 9",
                    "\"prompt_len\": 9223372036854775807, \"response_len\": 9",
                ),
                "`trajectories[1].transitions[0].prompt_len` must be at most 4294967295",
            ),
            (OK.replace("\"reward\": 1.0,", ""), "reward"),
            (
                OK.replace("\"reward\": 1.0,", "\"reward\": 1e308,"),
                "`trajectories[0].reward`: 1e308 is outside ±1e38",
            ),
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

    #[test]
    fn more_bad_input_names_the_field_and_lists_allowed_values() {
        let cases = [
            (
                OK.replace("\"seed\": 1,", "\"seed\": 1, \"unit\": \"batch\","),
                vec!["`unit`", "trajectory, group"],
            ),
            (
                OK.replace("\"seed\": 1,", "\"seed\": 1, \"estimator\": \"ppo\","),
                vec!["`estimator`", "rloo"],
            ),
            (
                OK.replace("\"status\": \"failed\"", "\"status\": \"crashed\""),
                vec!["trajectories[2].status", "finished, truncated, failed"],
            ),
            (
                OK.replace("\"seed\": 1,", "\"seed\": 1, \"dp\": 3,"),
                vec!["unknown field `dp`"],
            ),
            (
                OK.replace("\"group\": \"g1\"", "\"grp\": \"g1\""),
                vec!["trajectories[2]", "grp"],
            ),
            (
                OK.replace("\"num_mini_batches\": 2, ", ""),
                vec!["num_mini_batches"],
            ),
            (
                OK.replace(
                    "\"num_mini_batches\": 2,",
                    "\"num_mini_batches\": 2, \"units_per_mini_batch\": 1,",
                ),
                vec!["exclude each other"],
            ),
            (
                OK.replace("\"status\": \"failed\", ", ""),
                vec!["trajectories[2].transitions"],
            ),
            (
                OK.replace(
                    "\"prompt_len\": 10, \"response_len\": 9",
                    "\"prompt_len\": 0, \"response_len\": 9",
                ),
                vec!["trajectories[1].transitions[0].prompt_len"],
            ),
            (
                OK.replace(
                    "\"dp_size\": 2,",
                    "\"dp_size\": 2, \"critic_mini_batch_size\": -4,",
                ),
                vec!["critic_mini_batch_size"],
            ),
            (
                OK.replace("\"group\": \"g0\"", "\"group\": \"pad-3\""),
                vec!["trajectories[0].group", "reserved"],
            ),
            (
                OK.replace(
                    "\"seed\": 1,",
                    "\"seed\": 1, \"cost\": {\"linear\": -1, \"quadratic\": 0},",
                ),
                vec!["cost.linear"],
            ),
            (
                OK.replace("\"dp_size\": 2", "\"dp_size\": \"two\""),
                vec!["dp_size"],
            ),
            ("not json".to_string(), vec!["invalid input"]),
        ];
        for (input, needles) in cases {
            let e = plan_json(&input).unwrap_err().to_string();
            for needle in needles {
                assert!(e.contains(needle), "{needle}: {e}");
            }
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    fn padded_total(input: &str) -> u64 {
        let out: Value = serde_json::from_str(&plan_json(input).unwrap()).unwrap();
        out["mini_batches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                m["ranks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_array().unwrap().len() as u64)
                    .sum::<u64>()
            })
            .sum()
    }

    #[test]
    fn mini_batch_sizes_pad_to_the_lcm_even_for_the_critic_alone() {
        let with = |extra: &str| OK.replace("\"seed\": 1,", &format!("\"seed\": 1, {extra}"));
        assert_eq!(padded_total(&with("\"actor_mini_batch_size\": 3,")), 6);
        assert_eq!(padded_total(&with("\"critic_mini_batch_size\": 5,")), 10);
        assert_eq!(
            padded_total(&with(
                "\"actor_mini_batch_size\": 3, \"critic_mini_batch_size\": 4,"
            )),
            12
        );
    }

    #[test]
    fn merged_rows_are_one_per_trajectory_and_check_the_prefix_by_length() {
        let merged = OK.replace("\"seed\": 1,", "\"seed\": 1, \"row\": \"trajectory\",");
        let out: Value = serde_json::from_str(&plan_json(&merged).unwrap()).unwrap();
        let mbs = out["mini_batches"].as_array().unwrap();
        let rows: u64 = mbs.iter().map(|m| m["global_rows"].as_u64().unwrap()).sum();
        let loss: u64 = mbs
            .iter()
            .map(|m| m["global_loss_tokens"].as_u64().unwrap())
            .sum();
        let tokens: u64 = mbs
            .iter()
            .map(|m| m["global_tokens"].as_u64().unwrap())
            .sum();
        assert_eq!(rows, 2, "t0's two turns merge into one row");
        assert_eq!(loss, 4 + 3 + 9);
        // t0: prompt 10, then everything up to the end of turn 2 (20 + 4); t1: 10 + 9.
        assert_eq!(tokens, 24 + 19);
        assert!(!out.to_string().contains("\"transition\""));
        let broken = merged.replace("\"prompt_len\": 20", "\"prompt_len\": 12");
        let e = plan_json(&broken).unwrap_err().to_string();
        assert!(e.contains("`t0`, transition 1"), "{e}");
    }

    #[test]
    fn units_per_mini_batch_and_group_units() {
        let input = OK
            .replace("\"num_mini_batches\": 2", "\"units_per_mini_batch\": 1")
            .replace("\"seed\": 1,", "\"seed\": 1, \"unit\": \"group\",");
        let out: Value = serde_json::from_str(&plan_json(&input).unwrap()).unwrap();
        // One live group (g1 has only a failed trajectory): one mini-batch with all 3 rows.
        let mbs = out["mini_batches"].as_array().unwrap();
        assert_eq!(mbs.len(), 1);
        assert_eq!(mbs[0]["global_rows"], 3);
        assert_eq!(mbs[0]["global_trajectories"], 2);
    }
}
