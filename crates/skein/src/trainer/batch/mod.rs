//! From scored trajectories to a planned batch ([`StepBatch`]): advantages on whole groups
//! (before anything is reordered or padded), rows, the mini-batch plan, and each row's loss
//! weight from its mini-batch's global counts. The arithmetic is the planning core's; this
//! only moves token ids into [`TrainRow`]s. The next stage, `trainer/prepare`, fills in what
//! needs the models and makes the advantages final.

mod row;

pub use row::TrainRow;

use crate::trainer::config::{CreditMode, Estimator, TrainConfig};
use anyhow::Result;
use skein_plan as plan;

/// Mini-batches → ranks → indices into the step's rows (padding rows included): the planning
/// core's [`plan::Plan`] over this step's [`TrainRow`]s.
pub type RowPlan = Vec<Vec<Vec<usize>>>;

pub struct StepBatchConfig {
    pub advantage: plan::AdvantageConfig,
    pub dp_size: usize,
    pub num_mini_batches: usize,
    pub unit: plan::Unit,
    pub loss_agg: plan::LossAggMode,
    /// The constant of `seq-mean-token-sum-norm` (the response-length budget).
    pub horizon: usize,
    /// PPO with a critic: the group advantages are placeholders that `trainer::prepare`
    /// replaces by GAE, one step per token (`Trajectory`) or one per turn (`Turn`: each row
    /// then names the one position per turn its value loss trains, and the batch where each
    /// trajectory's turns lie).
    pub critic: Option<CreditMode>,
}

impl StepBatchConfig {
    pub fn from_config(cfg: &TrainConfig, max_new_tokens: usize) -> Self {
        let a = &cfg.algorithm;
        let estimator = match a.estimator {
            Estimator::Grpo => plan::Estimator::Grpo {
                normalize_std: a.normalize_std,
            },
            Estimator::DrGrpo => plan::Estimator::DrGrpo,
            Estimator::Rloo => plan::Estimator::Rloo,
            Estimator::ReinforcePP => plan::Estimator::ReinforcePP {
                group_baseline: false,
            },
            Estimator::ReinforcePPBaseline => plan::Estimator::ReinforcePP {
                group_baseline: true,
            },
            Estimator::Gae => plan::Estimator::Critic,
        };
        StepBatchConfig {
            advantage: plan::AdvantageConfig {
                estimator,
                // With a critic, credit per turn is GAE's, not the group estimators'.
                credit: match a.credit {
                    CreditMode::Turn if !a.estimator.needs_critic() => plan::Credit::Turn {
                        gamma: a.turn_gamma,
                    },
                    _ => plan::Credit::Trajectory,
                },
                step_groups: (a.step_group_weight > 0.0).then_some(plan::StepGroups {
                    weight: a.step_group_weight,
                    gamma: a.turn_gamma,
                }),
                drop_equal_reward_groups: a.drop_equal_reward_groups,
                ..Default::default()
            },
            dp_size: cfg.trainer.dp_size,
            num_mini_batches: cfg.trainer.num_mini_batches,
            unit: cfg.trainer.unit,
            loss_agg: a.loss_agg_mode,
            horizon: max_new_tokens,
            critic: a.estimator.needs_critic().then_some(a.credit),
        }
    }
}

/// A step's rows with group advantages and loss weights, planned into mini-batches. With a
/// critic the advantages are not final yet: `trainer::prepare` replaces them.
pub struct StepBatch {
    pub rows: Vec<TrainRow>,
    /// Where each real row (the first `real_rows` of `rows`) comes from.
    pub origins: Vec<RowOrigin>,
    /// With a critic: each trajectory's turns (indexed like the step's trajectories, in turn
    /// order) where they lie in `rows`, with what each earned; GAE estimates each trajectory
    /// from them, whole. Empty otherwise.
    pub turns: Vec<Vec<plan::TurnPlace>>,
    pub plan: RowPlan,
    pub dropped_groups: usize,
    pub failed_trajectories: usize,
    pub padding_rows: usize,
    pub real_rows: usize,
    /// Prompt and response tokens of the real rows, each counted as if fed alone (a prompt
    /// that a group's rows share once per row): the work as frameworks that feed each row
    /// whole count it (throughput only).
    pub row_tokens: usize,
    /// With per-turn credit: advantages by turn index (with a critic, `trainer::prepare` adds
    /// them once GAE has made them); whenever turns have rewards of their own, their mean.
    pub turn_metrics: Vec<(String, f64)>,
}

/// The trajectory (index into the step's trajectories) and transition a row holds (None: all
/// of the trajectory's transitions, merged into one row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowOrigin {
    pub trajectory: usize,
    pub transition: Option<usize>,
}

pub fn build_step_batch(
    trajectories: &[plan::Trajectory],
    cfg: &StepBatchConfig,
    seed: u64,
) -> Result<StepBatch> {
    let adv = plan::compute_advantages(trajectories, &cfg.advantage);
    let rows = plan::build_turn_rows(trajectories, &adv.per_turn, plan::RowMode::Auto)?;
    let turn_gae = cfg.critic == Some(CreditMode::Turn);
    let per_turn = turn_gae
        || cfg.advantage.step_groups.is_some()
        || matches!(cfg.advantage.credit, plan::Credit::Turn { .. });
    let mut batch = StepBatch {
        rows: Vec::new(),
        origins: Vec::new(),
        turns: if cfg.critic.is_some() {
            plan::turn_places(trajectories, &rows)?
        } else {
            Vec::new()
        },
        plan: Vec::new(),
        dropped_groups: adv.dropped_groups,
        failed_trajectories: adv.failed_trajectories,
        padding_rows: 0,
        real_rows: rows.len(),
        row_tokens: 0,
        turn_metrics: if per_turn {
            turn_metrics(trajectories, &adv, cfg.critic.is_none())
        } else {
            turn_reward_mean(trajectories).into_iter().collect()
        },
    };
    if rows.is_empty() {
        // Nothing to learn from this step (every group dropped or failed): no update, counted.
        return Ok(batch);
    }
    let shapes: Vec<plan::RowShape> = rows.iter().map(|r| r.shape).collect();
    let plan_cfg = plan::PlanConfig {
        dp_size: cfg.dp_size,
        num_mini_batches: cfg.num_mini_batches,
        unit: cfg.unit,
        seed,
        ..Default::default()
    };
    let planned = plan::plan(&shapes, &plan_cfg)?;
    push_real_rows(&mut batch, &rows, turn_gae);
    for mb in &planned.mini_batches {
        let trajectory_tokens = mb.trajectory_loss_tokens(&shapes);
        // Turn-level GAE's value loss: a mean over the mini-batch's turns that have a target.
        let value_targets = value_targets(mb, &batch.rows);
        let mut ranks = Vec::with_capacity(mb.ranks.len());
        for rank in &mb.ranks {
            let mut idx = Vec::with_capacity(rank.len());
            for slot in rank {
                match slot {
                    plan::Slot::Real(i) => {
                        let s = &shapes[*i];
                        batch.rows[*i].loss_weight = plan::row_token_weight(
                            cfg.loss_agg,
                            s.loss_tokens,
                            trajectory_tokens[&s.trajectory],
                            &mb.counts,
                            cfg.horizon,
                        );
                        if value_targets > 0 {
                            batch.rows[*i].value_loss_weight = 1.0 / value_targets as f64;
                        }
                        idx.push(*i);
                    }
                    plan::Slot::Padding(id) => {
                        batch
                            .rows
                            .push(TrainRow::from_plan_row(&plan::Row::padding(*id)));
                        idx.push(batch.rows.len() - 1);
                    }
                }
            }
            ranks.push(idx);
        }
        batch.padding_rows += mb.padding_rows;
        batch.plan.push(ranks);
    }
    batch.row_tokens = batch.rows[..batch.real_rows]
        .iter()
        .map(|r| r.tokens.len())
        .sum();
    Ok(batch)
}

/// The step's real rows in plan order, each with, for turn-level GAE, its value targets.
fn push_real_rows(batch: &mut StepBatch, rows: &[plan::Row], turn_gae: bool) {
    for r in rows {
        let mut row = TrainRow::from_plan_row(r);
        if turn_gae {
            row.value_mask = plan::turn_value_mask(&r.loss_mask, &r.turn_spans);
        }
        batch.rows.push(row);
        batch.origins.push(RowOrigin {
            trajectory: r.shape.trajectory,
            transition: r.shape.transition,
        });
    }
}

/// Positions with a value target in a mini-batch's real rows.
fn value_targets(mb: &plan::MiniBatch, rows: &[TrainRow]) -> usize {
    mb.ranks
        .iter()
        .flatten()
        .filter_map(|slot| match slot {
            plan::Slot::Real(i) => Some(rows[*i].value_mask.iter()),
            plan::Slot::Padding(_) => None,
        })
        .flatten()
        .filter(|&&m| m != 0)
        .count()
}

/// Turn indices whose advantages are logged one by one (later turns are in the totals only).
const LOGGED_TURNS: usize = 8;

/// Per-turn credit at a glance: the advantages by turn index ([`credit_metrics`]; left to
/// `trainer::prepare` with a critic, whose GAE makes them), the mean of the turns' own rewards,
/// and the step groups found.
fn turn_metrics(
    trajectories: &[plan::Trajectory],
    adv: &plan::AdvantageResult,
    advantages: bool,
) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    if advantages {
        out = credit_metrics(adv.per_turn.iter().flatten());
    }
    out.push(("credit/step_groups".into(), adv.step_groups as f64));
    out.push((
        "credit/step_group_turns".into(),
        adv.step_group_turns as f64,
    ));
    out.extend(turn_reward_mean(trajectories));
    out
}

/// `reward/turn_mean`: the mean of the turns' own rewards, over the turns that have one; none
/// when no turn has.
fn turn_reward_mean(trajectories: &[plan::Trajectory]) -> Option<(String, f64)> {
    let own: Vec<f64> = trajectories
        .iter()
        .filter(|t| !t.is_failed())
        .flat_map(|t| t.transitions.iter().filter_map(|x| x.reward))
        .collect();
    (!own.is_empty()).then(|| {
        (
            "reward/turn_mean".into(),
            own.iter().sum::<f64>() / own.len() as f64,
        )
    })
}

/// The advantages of each trajectory's turns by turn index: mean and std per index
/// (`credit/turn1/…`, the first [`LOGGED_TURNS`]), and the share of turns with a positive
/// advantage.
pub fn credit_metrics<'a>(per_turn: impl Iterator<Item = &'a Vec<f64>>) -> Vec<(String, f64)> {
    let mut by_index: Vec<Vec<f64>> = vec![Vec::new(); LOGGED_TURNS];
    let (mut turns, mut positive) = (0usize, 0usize);
    for a in per_turn {
        for (k, &x) in a.iter().enumerate() {
            if let Some(v) = by_index.get_mut(k) {
                v.push(x);
            }
            turns += 1;
            positive += usize::from(x > 0.0);
        }
    }
    let mut out = Vec::new();
    for (k, xs) in by_index.iter().enumerate().filter(|(_, xs)| !xs.is_empty()) {
        let m = plan::Moments::of(xs.iter().copied());
        out.push((format!("credit/turn{}/adv_mean", k + 1), m.mean));
        out.push((format!("credit/turn{}/adv_std", k + 1), m.std));
    }
    out.push((
        "credit/positive_turn_fraction".into(),
        positive as f64 / turns.max(1) as f64,
    ));
    out
}

impl StepBatch {
    /// Loss tokens of the real rows: what the update trains. Failed trajectories and the
    /// groups `drop_equal_reward_groups` dropped have no row.
    pub fn trained_tokens(&self) -> usize {
        self.rows[..self.real_rows]
            .iter()
            .map(|r| r.loss_mask.iter().filter(|&&m| m != 0).count())
            .sum()
    }

    /// The batch's counts for the step's metrics.
    /// (`batch/equal_reward_group_fraction` is the rollout's: it describes what was drawn.)
    pub fn metrics(&self) -> [(&'static str, f64); 5] {
        [
            ("batch/dropped_groups", self.dropped_groups as f64),
            ("batch/failed_trajectories", self.failed_trajectories as f64),
            ("batch/padding_rows", self.padding_rows as f64),
            ("batch/rows", self.real_rows as f64),
            ("tokens/trained", self.trained_tokens() as f64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plan::{Status, Trajectory, Transition};

    fn turn(prompt: Vec<u32>, response: Vec<u32>) -> Transition {
        let n = response.len();
        Transition {
            prompt,
            response,
            loss_mask: vec![1; n],
            logprobs: vec![0.0; n],
            versions: vec![0; n],
            kept: Default::default(),
            reward: None,
            state: None,
        }
    }

    /// A group dropped for equal rewards trains nothing, and its tokens are not counted as
    /// trained; a failed trajectory's neither.
    #[test]
    fn trained_tokens_leave_out_dropped_groups_and_failed_trajectories() {
        let trajectory = |id: &str, group: &str, reward: f64, response: usize| Trajectory {
            id: id.into(),
            group: group.into(),
            transitions: vec![turn(vec![1, 2], vec![3; response])],
            reward,
            status: Status::Finished,
        };
        let mut failed = trajectory("f", "varied", 0.0, 7);
        failed.status = Status::Failed("a tool crashed".into());
        let trajs = [
            trajectory("a", "varied", 1.0, 3),
            trajectory("b", "varied", 0.0, 4),
            failed,
            trajectory("c", "equal", 1.0, 5),
            trajectory("d", "equal", 1.0, 6),
        ];
        let mut cfg = crate::trainer::TrainConfig::default();
        cfg.algorithm.drop_equal_reward_groups = true;
        let batch = build_step_batch(&trajs, &StepBatchConfig::from_config(&cfg, 8), 1).unwrap();
        assert_eq!((batch.dropped_groups, batch.failed_trajectories), (1, 1));
        assert_eq!(batch.trained_tokens(), 3 + 4);
        let trained = batch
            .metrics()
            .into_iter()
            .find(|(k, _)| *k == "tokens/trained");
        assert_eq!(trained, Some(("tokens/trained", 7.0)));
    }

    /// The row tokens that `throughput/row_tokens_per_s` counts are the real rows' prompts and
    /// responses; the rows that pad the ranks of a data-parallel mini-batch are not work.
    #[test]
    fn row_tokens_count_real_rows_only() {
        let trajs: Vec<Trajectory> = [3, 4, 5]
            .iter()
            .enumerate()
            .map(|(i, &response)| Trajectory {
                id: format!("t{i}"),
                group: "g".into(),
                transitions: vec![turn(vec![1, 2], vec![3; response])],
                reward: i as f64,
                status: Status::Finished,
            })
            .collect();
        let cfg = config_with(&["trainer.dp_size=2"]);
        let batch = build_step_batch(&trajs, &StepBatchConfig::from_config(&cfg, 8), 1).unwrap();
        assert!(
            batch.padding_rows > 0,
            "three rows over two ranks are padded"
        );
        assert_eq!(batch.row_tokens, 5 + 6 + 7);
    }

    /// A default config with `sets` applied, as `--set` applies them.
    fn config_with(sets: &[&str]) -> crate::trainer::TrainConfig {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        skein_config::load_with_defaults(None, "test", &sets).unwrap()
    }

    /// The advantage and loss weight of trajectory `t`'s first row.
    fn first_row_of(batch: &StepBatch, t: usize) -> &TrainRow {
        let i = batch.origins.iter().position(|o| o.trajectory == t);
        &batch.rows[i.expect("the trajectory has a row")]
    }

    /// Each `algorithm.estimator` reaches the batch as its own estimator: two groups of
    /// rewards (0, 2, 4) and (3, 3, 6), and the advantage of the reward-4 member by hand
    /// (sample standard deviations: 2 in the first group; REINFORCE++'s over the 21 loss
    /// tokens, each trajectory's reward or group-centred reward once per token).
    #[test]
    fn every_estimator_reaches_the_batch() {
        let rewards = [0.0, 2.0, 4.0, 3.0, 3.0, 6.0];
        let trajs: Vec<Trajectory> = rewards
            .iter()
            .enumerate()
            .map(|(i, &reward)| Trajectory {
                id: format!("t{i}"),
                group: format!("g{}", i / 3),
                transitions: vec![turn(vec![1, 2], vec![3; i + 1])],
                reward,
                status: Status::Finished,
            })
            .collect();
        // REINFORCE++ whitens over loss tokens: trajectory i has i + 1 of them.
        let per_token = |values: &[f64]| -> Vec<f64> {
            let tokens = values.iter().enumerate();
            tokens.flat_map(|(i, &v)| vec![v; i + 1]).collect()
        };
        let moments = |values: &[f64]| skein_plan::Moments::of(per_token(values).into_iter());
        let all = moments(&rewards);
        let centred = moments(&[-2.0, 0.0, 2.0, -1.0, -1.0, 2.0]);
        for (sets, want) in [
            (&["algorithm.estimator=\"grpo\""][..], 2.0 / (2.0 + 1e-6)),
            (
                &[
                    "algorithm.estimator=\"grpo\"",
                    "algorithm.normalize_std=false",
                ][..],
                2.0,
            ),
            (&["algorithm.estimator=\"dr-grpo\""][..], 2.0),
            (&["algorithm.estimator=\"rloo\""][..], 3.0),
            (
                &["algorithm.estimator=\"reinforce++\""][..],
                all.whiten(4.0, 1e-6),
            ),
            (
                &["algorithm.estimator=\"reinforce++-baseline\""][..],
                2.0 / (centred.std + 1e-6),
            ),
        ] {
            let batch_cfg = StepBatchConfig::from_config(&config_with(sets), 8);
            let batch = build_step_batch(&trajs, &batch_cfg, 1).unwrap();
            let got = first_row_of(&batch, 2).advantages[0] as f64;
            assert!((got - want).abs() < 1e-5, "{sets:?}: {got} vs {want}");
        }
    }

    /// Each `algorithm.loss_agg_mode` reaches the batch: a single-turn trajectory of 4 tokens
    /// and a step-wise one of two rows (1 and 2 tokens); 3 rows, 2 trajectories and 7 loss
    /// tokens in one mini-batch, horizon 8. The two first rows' weights by hand.
    #[test]
    fn every_loss_aggregation_reaches_the_batch() {
        let single = Trajectory {
            id: "x".into(),
            group: "g".into(),
            transitions: vec![turn(vec![1, 2], vec![3; 4])],
            reward: 1.0,
            status: Status::Finished,
        };
        let stepwise = Trajectory {
            id: "y".into(),
            transitions: vec![turn(vec![1, 2], vec![6]), turn(vec![7], vec![8, 8])],
            reward: 0.0,
            ..single.clone()
        };
        let trajs = [single, stepwise];
        for (mode, want) in [
            ("token-mean", [1.0 / 7.0, 1.0 / 7.0]),
            ("seq-mean-token-sum", [1.0 / 3.0, 1.0 / 3.0]),
            ("seq-mean-token-mean", [1.0 / 12.0, 1.0 / 3.0]),
            ("seq-mean-token-sum-norm", [1.0 / 24.0, 1.0 / 24.0]),
            ("trajectory-mean", [1.0 / 8.0, 1.0 / 6.0]),
        ] {
            let set = format!("algorithm.loss_agg_mode=\"{mode}\"");
            let batch_cfg = StepBatchConfig::from_config(&config_with(&[&set]), 8);
            let batch = build_step_batch(&trajs, &batch_cfg, 1).unwrap();
            assert_eq!(batch.real_rows, 3, "{mode}");
            let got = [
                first_row_of(&batch, 0).loss_weight,
                first_row_of(&batch, 1).loss_weight,
            ];
            assert!(
                got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-12),
                "{mode}: {got:?} vs {want:?}"
            );
        }
    }

    /// Turn-level GAE: a token-exact episode of two turns (one merged row) and one whose
    /// second prompt does not extend the first (a row per turn). Each row names one value
    /// position per turn, its first sampled token, and the value loss is a mean over the
    /// mini-batch's four turns.
    #[test]
    fn turn_level_gae_marks_one_value_target_per_turn() {
        let merged = Trajectory {
            id: "a".into(),
            group: "g".into(),
            transitions: vec![
                turn(vec![1, 2], vec![3, 4]),
                turn(vec![1, 2, 3, 4, 9], vec![5]),
            ],
            reward: 1.0,
            status: Status::Finished,
        };
        let split = Trajectory {
            id: "b".into(),
            transitions: vec![turn(vec![1, 2], vec![6]), turn(vec![7], vec![8, 8])],
            reward: 0.0,
            ..merged.clone()
        };
        let mut cfg = crate::trainer::TrainConfig::default();
        cfg.algorithm.estimator = Estimator::Gae;
        cfg.algorithm.credit = CreditMode::Turn;
        let batch_cfg = StepBatchConfig::from_config(&cfg, 8);
        assert_eq!(batch_cfg.critic, Some(CreditMode::Turn));
        let trajs = [merged, split];
        let batch = build_step_batch(&trajs, &batch_cfg, 1).unwrap();
        assert_eq!(batch.real_rows, 3);
        let masks: Vec<&[u8]> = batch.rows[..3].iter().map(|r| &r.value_mask[..]).collect();
        assert_eq!(masks, vec![&[1, 0, 0, 1][..], &[1], &[1, 0]]);
        assert!(batch.rows[..3].iter().all(|r| r.value_loss_weight == 0.25));
        assert_eq!(batch.turns.len(), 2);
        let rows_of = |t: usize| batch.turns[t].iter().map(|p| p.row).collect::<Vec<_>>();
        assert_eq!((rows_of(0), rows_of(1)), (vec![0, 0], vec![1, 2]));
        let rewards: Vec<f64> = batch.turns[0].iter().map(|p| p.reward).collect();
        assert_eq!(rewards, vec![0.0, 1.0]);
        // Token-level GAE trains every loss token, and finds the same turns.
        cfg.algorithm.credit = CreditMode::Trajectory;
        let batch = build_step_batch(&trajs, &StepBatchConfig::from_config(&cfg, 8), 1).unwrap();
        assert!(batch.rows.iter().all(|r| r.value_mask.is_empty()));
        assert_eq!((rows_of(0), rows_of(1)), (vec![0, 0], vec![1, 2]));
    }
}
