//! Metric reductions that skip padding. Outcome metrics (reward, accuracy, lengths) are over
//! real trajectories and rows only; failed trajectories are counted, never averaged in as 0.
//! Throughput counts that include padding say so in their names.

use crate::data::{Status, Trajectory};
use crate::planner::{Plan, Slot};
use crate::rows::{Row, RowShape};

/// count, mean, min and max of a set of values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub count: usize,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    /// None for an empty set: there is no mean of nothing, and 0 would be a made-up value.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Stats> {
        let mut s = Stats {
            count: 0,
            mean: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        };
        let mut sum = 0.0;
        for v in values {
            s.count += 1;
            sum += v;
            s.min = s.min.min(v);
            s.max = s.max.max(v);
        }
        (s.count > 0).then(|| Stats {
            mean: sum / s.count as f64,
            ..s
        })
    }
}

/// Outcome metrics of a step's trajectories.
#[derive(Debug, Clone, PartialEq)]
pub struct TrajectoryMetrics {
    /// Over finished and truncated trajectories.
    pub reward: Option<Stats>,
    /// Fraction of finished and truncated trajectories whose reward reaches the threshold.
    pub accuracy: Option<f64>,
    /// Model-generated (loss-masked) tokens per trajectory.
    pub generated_tokens: Option<Stats>,
    /// Policy calls per trajectory.
    pub turns: Option<Stats>,
    pub truncated: usize,
    pub failed: usize,
}

/// Metrics over the real trajectories of a step; `correct_at` is the reward from which a
/// trajectory counts as correct.
pub fn trajectory_metrics(trajs: &[Trajectory], correct_at: f64) -> TrajectoryMetrics {
    let real: Vec<&Trajectory> = trajs.iter().filter(|t| !t.is_failed()).collect();
    let correct = real.iter().filter(|t| t.reward >= correct_at).count();
    TrajectoryMetrics {
        reward: Stats::of(real.iter().map(|t| t.reward)),
        accuracy: (!real.is_empty()).then(|| correct as f64 / real.len() as f64),
        generated_tokens: Stats::of(real.iter().map(|t| {
            t.transitions
                .iter()
                .map(|tr| tr.loss_tokens())
                .sum::<usize>() as f64
        })),
        turns: Stats::of(real.iter().map(|t| t.transitions.len() as f64)),
        truncated: real
            .iter()
            .filter(|t| t.status == Status::Truncated)
            .count(),
        failed: trajs.len() - real.len(),
    }
}

/// Shape and throughput metrics of rows that may include padding rows.
#[derive(Debug, Clone, PartialEq)]
pub struct RowMetrics {
    /// Response tokens per real row.
    pub response_length: Option<Stats>,
    /// Prompt tokens per real row.
    pub prompt_length: Option<Stats>,
    pub real_rows: usize,
    pub padding_rows: usize,
    /// Loss tokens of real rows (the only rows that have any).
    pub loss_tokens: usize,
    /// Every token the ranks process, padding included: for throughput only.
    pub tokens_including_padding: usize,
}

/// Row metrics of materialised rows (real and padding).
pub fn row_metrics(rows: &[Row]) -> RowMetrics {
    let real = || rows.iter().filter(|r| !r.is_padding());
    RowMetrics {
        response_length: Stats::of(real().map(|r| r.response.len() as f64)),
        prompt_length: Stats::of(real().map(|r| r.prompt.len() as f64)),
        real_rows: real().count(),
        padding_rows: rows.len() - real().count(),
        loss_tokens: real().map(|r| r.shape.loss_tokens).sum(),
        tokens_including_padding: rows.iter().map(|r| r.prompt.len() + r.response.len()).sum(),
    }
}

/// Row metrics of a plan over `rows` (the shapes it was planned from), plus its worst rank
/// imbalance (max/mean rank cost over its mini-batches).
pub fn plan_metrics(plan: &Plan, rows: &[RowShape]) -> (RowMetrics, f64) {
    let real = || {
        plan.mini_batches
            .iter()
            .flat_map(|m| m.ranks.iter().flatten())
            .filter_map(|s| match s {
                Slot::Real(i) => rows.get(*i),
                Slot::Padding(_) => None,
            })
    };
    let padding_rows: usize = plan.mini_batches.iter().map(|m| m.padding_rows).sum();
    let metrics = RowMetrics {
        response_length: Stats::of(real().map(|r| r.response_len as f64)),
        prompt_length: Stats::of(real().map(|r| r.prompt_len as f64)),
        real_rows: real().count(),
        padding_rows,
        loss_tokens: real().map(|r| r.loss_tokens).sum(),
        tokens_including_padding: plan.mini_batches.iter().flat_map(|m| &m.rank_tokens).sum(),
    };
    let imbalance = plan
        .mini_batches
        .iter()
        .map(|m| m.imbalance())
        .fold(1.0, f64::max);
    (metrics, imbalance)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Transition;
    use crate::padding::PaddingIds;
    use crate::planner::{plan, PlanConfig};
    use crate::rows::{build_rows, RowMode};

    fn traj(id: &str, reward: f64, status: Status, response: usize) -> Trajectory {
        Trajectory {
            id: id.into(),
            group: "g".into(),
            transitions: vec![Transition {
                prompt: vec![1, 2, 3],
                response: vec![5; response],
                loss_mask: vec![1; response],
                logprobs: vec![0.0; response],
                versions: vec![0; response],
                kept: Default::default(),
                reward: None,
                state: None,
            }],
            reward,
            status,
        }
    }

    #[test]
    fn failed_trajectories_are_counted_not_scored_zero() {
        let ts = vec![
            traj("a", 1.0, Status::Finished, 4),
            traj("b", 0.5, Status::Truncated, 8),
            traj("c", 0.0, Status::Failed("timeout".into()), 100),
        ];
        let m = trajectory_metrics(&ts, 1.0);
        let r = m.reward.unwrap();
        assert_eq!((r.count, r.mean, r.min, r.max), (2, 0.75, 0.5, 1.0));
        assert_eq!(m.accuracy, Some(0.5));
        assert_eq!(m.generated_tokens.unwrap().max, 8.0);
        assert_eq!((m.failed, m.truncated), (1, 1));
        let none = trajectory_metrics(&ts[2..], 1.0);
        assert_eq!((none.reward, none.accuracy), (None, None));
    }

    #[test]
    fn padding_rows_change_no_outcome_metric() {
        let ts = vec![
            traj("a", 1.0, Status::Finished, 4),
            traj("b", 0.0, Status::Finished, 9),
        ];
        let mut rows = build_rows(&ts, &[Some(0.5), Some(-0.5)], RowMode::Transition).unwrap();
        let before = row_metrics(&rows);
        let mut ids = PaddingIds::default();
        rows.extend((0..5).map(|_| Row::padding(ids.next_id())));
        let after = row_metrics(&rows);
        assert_eq!(after.response_length, before.response_length);
        assert_eq!(after.prompt_length, before.prompt_length);
        assert_eq!(after.loss_tokens, before.loss_tokens);
        assert_eq!((after.real_rows, after.padding_rows), (2, 5));
        assert_eq!(
            after.tokens_including_padding,
            before.tokens_including_padding + 10
        );

        let shapes: Vec<RowShape> = rows[..2].iter().map(|r| r.shape).collect();
        let cfg = PlanConfig {
            dp_size: 8,
            ..Default::default()
        };
        let (pm, imbalance) = plan_metrics(&plan(&shapes, &cfg).unwrap(), &shapes);
        assert_eq!(pm.response_length, before.response_length);
        assert_eq!((pm.real_rows, pm.padding_rows), (2, 6));
        assert_eq!(pm.tokens_including_padding, 7 + 12 + 6 * 2);
        assert!(imbalance > 1.0);
    }
}
