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
    /// PPO with a critic: sequence advantages are replaced by GAE later.
    pub critic: bool,
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
            // Groups still matter for failure accounting; the values come from GAE.
            Estimator::Gae => plan::Estimator::DrGrpo,
        };
        StepBatchConfig {
            advantage: plan::AdvantageConfig {
                estimator,
                credit: match a.credit {
                    CreditMode::Trajectory => plan::Credit::Trajectory,
                    CreditMode::Turn => plan::Credit::Turn {
                        gamma: a.turn_gamma,
                    },
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
            critic: a.estimator.needs_critic(),
        }
    }
}

/// A step's rows with group advantages and loss weights, planned into mini-batches. With a
/// critic the advantages are not final yet: `trainer::prepare` replaces them.
pub struct StepBatch {
    pub rows: Vec<TrainRow>,
    /// Where each real row (the first `real_rows` of `rows`) comes from.
    pub origins: Vec<RowOrigin>,
    /// Reward of each row's trajectory on its last transition, 0 elsewhere (GAE input).
    pub row_rewards: Vec<f64>,
    pub plan: RowPlan,
    pub dropped_groups: usize,
    pub failed_trajectories: usize,
    pub padding_rows: usize,
    pub real_rows: usize,
    /// Tokens of all rows, padding included (throughput only).
    pub total_tokens: usize,
    /// With per-turn credit: advantages by turn index and the turns' own rewards.
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
    let mut batch = StepBatch {
        rows: Vec::new(),
        origins: Vec::new(),
        row_rewards: Vec::new(),
        plan: Vec::new(),
        dropped_groups: adv.dropped_groups,
        failed_trajectories: adv.failed_trajectories,
        padding_rows: 0,
        real_rows: rows.len(),
        total_tokens: 0,
        turn_metrics: match (cfg.advantage.credit, cfg.advantage.step_groups) {
            (plan::Credit::Trajectory, None) => Vec::new(),
            _ => turn_metrics(trajectories, &adv),
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
    for r in &rows {
        let t = &trajectories[r.shape.trajectory];
        let last = r
            .shape
            .transition
            .is_none_or(|k| k + 1 == t.transitions.len());
        let own = r
            .shape
            .transition
            .and_then(|k| t.transitions[k].reward)
            .unwrap_or(0.0);
        batch
            .row_rewards
            .push(if last { t.reward + own } else { own });
        batch.rows.push(TrainRow::from_plan_row(r));
        batch.origins.push(RowOrigin {
            trajectory: r.shape.trajectory,
            transition: r.shape.transition,
        });
    }
    for mb in &planned.mini_batches {
        let trajectory_tokens = mb.trajectory_loss_tokens(&shapes);
        let mut ranks = Vec::with_capacity(mb.ranks.len());
        for rank in &mb.ranks {
            let mut idx = Vec::with_capacity(rank.len());
            for slot in rank {
                match slot {
                    plan::Slot::Real(i) => {
                        let s = &shapes[*i];
                        batch.rows[*i].weight = plan::row_token_weight(
                            cfg.loss_agg,
                            s.loss_tokens,
                            trajectory_tokens[&s.trajectory],
                            &mb.counts,
                            cfg.horizon,
                        );
                        idx.push(*i);
                    }
                    plan::Slot::Padding(id) => {
                        batch
                            .rows
                            .push(TrainRow::from_plan_row(&plan::Row::padding(*id)));
                        batch.row_rewards.push(0.0);
                        idx.push(batch.rows.len() - 1);
                    }
                }
            }
            ranks.push(idx);
        }
        batch.padding_rows += mb.padding_rows;
        batch.plan.push(ranks);
    }
    batch.total_tokens = batch.rows.iter().map(|r| r.tokens.len()).sum();
    Ok(batch)
}

/// Turn indices whose advantages are logged one by one (later turns are in the totals only).
const LOGGED_TURNS: usize = 8;

/// Per-turn credit at a glance: advantage mean and std per turn index (`credit/turn1/…`), the
/// share of turns with a positive advantage, the mean of the turns' own rewards, and the step
/// groups found.
fn turn_metrics(
    trajectories: &[plan::Trajectory],
    adv: &plan::AdvantageResult,
) -> Vec<(String, f64)> {
    let per_turn = &adv.per_turn;
    let mut by_index: Vec<Vec<f64>> = vec![Vec::new(); LOGGED_TURNS];
    let (mut turns, mut positive) = (0usize, 0usize);
    for a in per_turn.iter().flatten() {
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
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        out.push((format!("credit/turn{}/adv_mean", k + 1), mean));
        out.push((format!("credit/turn{}/adv_std", k + 1), var.sqrt()));
    }
    out.push((
        "credit/positive_turn_fraction".into(),
        positive as f64 / turns.max(1) as f64,
    ));
    out.push(("credit/step_groups".into(), adv.step_groups as f64));
    out.push((
        "credit/step_group_turns".into(),
        adv.step_group_turns as f64,
    ));
    let own: Vec<f64> = trajectories
        .iter()
        .filter(|t| !t.is_failed())
        .flat_map(|t| t.transitions.iter().filter_map(|x| x.reward))
        .collect();
    if !own.is_empty() {
        out.push((
            "reward/turn_mean".into(),
            own.iter().sum::<f64>() / own.len() as f64,
        ));
    }
    out
}

impl StepBatch {
    /// The batch's counts for the step's metrics.
    pub fn metrics(&self) -> [(&'static str, f64); 4] {
        [
            ("batch/dropped_groups", self.dropped_groups as f64),
            ("batch/failed_trajectories", self.failed_trajectories as f64),
            ("batch/padding_rows", self.padding_rows as f64),
            ("batch/rows", self.real_rows as f64),
        ]
    }
}
