//! The mini-batch planner: whole units (trajectories or groups) are dealt into PPO
//! mini-batches; inside each mini-batch, rows are balanced over the data-parallel ranks by
//! Karmarkar–Karp, with padding rows so every rank has the same number of rows. Each
//! mini-batch carries the global counts every rank needs to scale its loss.

use crate::balance::equal_size_partitions;
use crate::error::{err, PlanError};
use crate::padding::{PaddingId, PaddingIds, PADDING_ROW_TOKENS};
use crate::rng::SplitMix64;
use crate::rows::RowShape;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    Trajectory,
    Group,
}

/// Cost of a row for rank balancing: `linear * tokens + quadratic * tokens²` (attention).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub linear: f64,
    pub quadratic: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            linear: 1.0,
            quadratic: 1.0 / 2048.0,
        }
    }
}

impl CostModel {
    /// Integer cost (sixteenths) of a row of `tokens` tokens.
    pub fn cost(&self, tokens: usize) -> u64 {
        let t = tokens as f64;
        ((self.linear * t + self.quadratic * t * t) * 16.0)
            .round()
            .max(0.0) as u64
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlanConfig {
    pub dp_size: usize,
    /// PPO mini-batches per step (fewer when there are fewer units than this).
    pub num_mini_batches: usize,
    /// Instead of `num_mini_batches`: units per mini-batch; the step then has
    /// ceil(units / n) mini-batches.
    pub units_per_mini_batch: Option<usize>,
    pub unit: Unit,
    /// Every mini-batch gets the same row count (verl's fixed-size mode).
    pub equal_minibatch_rows: bool,
    /// Deal units by cost (longest first to the lightest mini-batch) instead of by count.
    pub token_balanced: bool,
    pub cost: CostModel,
    pub seed: u64,
    /// The total row count is padded to a multiple of this (e.g. `padding_multiple(...)`).
    pub pad_multiple: Option<usize>,
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig {
            dp_size: 1,
            num_mini_batches: 1,
            units_per_mini_batch: None,
            unit: Unit::Trajectory,
            equal_minibatch_rows: false,
            token_balanced: false,
            cost: CostModel::default(),
            seed: 0,
            pad_multiple: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// Index into the planned rows.
    Real(usize),
    Padding(PaddingId),
}

/// Counts over the REAL rows of one mini-batch: the denominators of the loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GlobalCounts {
    pub rows: usize,
    /// Distinct trajectories.
    pub trajectories: usize,
    pub loss_tokens: usize,
    pub tokens: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MiniBatch {
    pub ranks: Vec<Vec<Slot>>,
    pub counts: GlobalCounts,
    pub padding_rows: usize,
    /// Tokens per rank, padding included (throughput and balance only).
    pub rank_tokens: Vec<usize>,
    /// Cost-model load per rank, padding included: what Karmarkar–Karp balances.
    pub rank_costs: Vec<u64>,
}

impl MiniBatch {
    /// Loss tokens of each trajectory within this mini-batch (for `trajectory-mean`).
    pub fn trajectory_loss_tokens(&self, rows: &[RowShape]) -> HashMap<usize, usize> {
        let mut m = HashMap::new();
        for slot in self.ranks.iter().flatten() {
            if let Slot::Real(i) = slot {
                *m.entry(rows[*i].trajectory).or_insert(0) += rows[*i].loss_tokens;
            }
        }
        m
    }

    /// max/mean of the rank costs: 1.0 is perfect balance.
    pub fn imbalance(&self) -> f64 {
        let max = self.rank_costs.iter().copied().max().unwrap_or(0) as f64;
        let sum: f64 = self.rank_costs.iter().map(|&c| c as f64).sum();
        let mean = sum / self.rank_costs.len().max(1) as f64;
        if mean > 0.0 {
            max / mean
        } else {
            1.0
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub mini_batches: Vec<MiniBatch>,
}

/// Plans one training step. Padding ids start at 1; use [`plan_with_ids`] to keep them unique
/// across steps.
pub fn plan(rows: &[RowShape], cfg: &PlanConfig) -> Result<Plan, PlanError> {
    plan_with_ids(rows, cfg, &mut PaddingIds::default())
}

/// [`plan`], drawing padding ids from `ids`.
pub fn plan_with_ids(
    rows: &[RowShape],
    cfg: &PlanConfig,
    ids: &mut PaddingIds,
) -> Result<Plan, PlanError> {
    if cfg.dp_size == 0 {
        return err("dp_size must be at least 1");
    }
    if cfg.num_mini_batches == 0 {
        return err("num_mini_batches must be at least 1");
    }
    if matches!(cfg.units_per_mini_batch, Some(0)) {
        return err("units_per_mini_batch must be at least 1");
    }
    if matches!(cfg.pad_multiple, Some(0)) {
        return err("pad_multiple must be at least 1");
    }
    if rows.is_empty() {
        // An all-invalid batch is an upstream problem: fail fast rather than fabricate one.
        return err(
            "the batch has no real row to train on (every trajectory failed or was dropped)",
        );
    }
    let row_cost: Vec<u64> = rows.iter().map(|r| cfg.cost.cost(r.tokens())).collect();
    let units = units(rows, cfg.unit);
    let mut order: Vec<usize> = (0..units.len()).collect();
    SplitMix64::new(cfg.seed).shuffle(&mut order);
    let wanted = match cfg.units_per_mini_batch {
        Some(n) => units.len().div_ceil(n),
        None => cfg.num_mini_batches,
    };
    // Never an empty mini-batch: at most one per unit.
    let m = wanted.min(units.len());
    let mut assigned: Vec<Vec<usize>> = vec![Vec::new(); m];
    if cfg.token_balanced {
        // Longest-processing-time first: heaviest unit to the lightest mini-batch. The shuffle
        // above breaks ties between equal costs by seed.
        let unit_cost: Vec<u64> = units
            .iter()
            .map(|u| u.iter().map(|&i| row_cost[i]).fold(0, u64::saturating_add))
            .collect();
        order.sort_by_key(|&u| std::cmp::Reverse(unit_cost[u]));
        let mut load: BinaryHeap<Reverse<(u64, usize)>> = (0..m).map(|b| Reverse((0, b))).collect();
        for u in order {
            let Some(Reverse((l, b))) = load.pop() else {
                break;
            };
            assigned[b].push(u);
            load.push(Reverse((l.saturating_add(unit_cost[u]), b)));
        }
    } else {
        // Deal the shuffled units: mini-batch sizes differ by at most one unit.
        let (base, extra) = (order.len() / m, order.len() % m);
        let mut it = order.into_iter();
        for (b, a) in assigned.iter_mut().enumerate() {
            a.extend(it.by_ref().take(base + usize::from(b < extra)));
        }
    }
    let mb_rows: Vec<Vec<usize>> = assigned
        .iter()
        .map(|us| us.iter().flat_map(|&u| units[u].iter().copied()).collect())
        .collect();
    let sizes = padded_sizes(&mb_rows, cfg);
    let mini_batches = mb_rows
        .iter()
        .zip(sizes)
        .map(|(real, size)| build_mini_batch(rows, &row_cost, real, size, cfg, ids))
        .collect();
    Ok(Plan { mini_batches })
}

/// Row indices of each unit, in order of first appearance.
fn units(rows: &[RowShape], unit: Unit) -> Vec<Vec<usize>> {
    let mut index = HashMap::new();
    let mut units: Vec<Vec<usize>> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let key = match unit {
            Unit::Trajectory => r.trajectory,
            Unit::Group => r.group,
        };
        let u = *index.entry(key).or_insert_with(|| {
            units.push(Vec::new());
            units.len() - 1
        });
        units[u].push(i);
    }
    units
}

/// Row count of each mini-batch after padding: a multiple of dp; in the fixed-size mode all
/// equal; and the total a multiple of `pad_multiple`.
fn padded_sizes(mb_rows: &[Vec<usize>], cfg: &PlanConfig) -> Vec<usize> {
    let dp = cfg.dp_size;
    let up = |n: usize, k: usize| n.div_ceil(k) * k;
    let mut sizes: Vec<usize> = mb_rows.iter().map(|r| up(r.len(), dp)).collect();
    if cfg.equal_minibatch_rows {
        let mut size = sizes.iter().copied().max().unwrap_or(dp);
        if let Some(k) = cfg.pad_multiple {
            while !(size * sizes.len()).is_multiple_of(k) {
                size += dp;
            }
        }
        sizes.iter_mut().for_each(|s| *s = size);
    } else if let Some(k) = cfg.pad_multiple {
        // Spread the extra rows one rank-row (dp rows) at a time over the mini-batches in turn.
        let mut b = 0;
        while !sizes.iter().sum::<usize>().is_multiple_of(k) {
            let n = sizes.len();
            sizes[b % n] += dp;
            b += 1;
        }
    }
    sizes
}

fn build_mini_batch(
    rows: &[RowShape],
    row_cost: &[u64],
    real: &[usize],
    size: usize,
    cfg: &PlanConfig,
    ids: &mut PaddingIds,
) -> MiniBatch {
    let padding = size - real.len();
    let mut slots: Vec<Slot> = real.iter().map(|&i| Slot::Real(i)).collect();
    slots.extend((0..padding).map(|_| Slot::Padding(ids.next_id())));
    let tokens = |s: &Slot| match s {
        Slot::Real(i) => rows[*i].tokens(),
        Slot::Padding(_) => PADDING_ROW_TOKENS,
    };
    let pad_cost = cfg.cost.cost(PADDING_ROW_TOKENS);
    let costs: Vec<u64> = slots
        .iter()
        .map(|s| match s {
            Slot::Real(i) => row_cost[*i],
            Slot::Padding(_) => pad_cost,
        })
        .collect();
    let parts = equal_size_partitions(&costs, cfg.dp_size);
    let rank_costs = parts
        .iter()
        .map(|p| p.iter().map(|&i| costs[i]).fold(0, u64::saturating_add))
        .collect();
    let ranks: Vec<Vec<Slot>> = parts
        .into_iter()
        .map(|mut p| {
            // Real rows in mini-batch order, padding last: a stable layout for readers.
            p.sort_unstable();
            p.into_iter().map(|i| slots[i]).collect()
        })
        .collect();
    let rank_tokens = ranks.iter().map(|r| r.iter().map(tokens).sum()).collect();
    let trajectories: HashSet<usize> = real.iter().map(|&i| rows[i].trajectory).collect();
    let counts = GlobalCounts {
        rows: real.len(),
        trajectories: trajectories.len(),
        loss_tokens: real.iter().map(|&i| rows[i].loss_tokens).sum(),
        tokens: real.iter().map(|&i| rows[i].tokens()).sum(),
    };
    MiniBatch {
        ranks,
        counts,
        padding_rows: padding,
        rank_tokens,
        rank_costs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(lens: &[usize]) -> Vec<RowShape> {
        lens.iter()
            .enumerate()
            .map(|(t, &n)| RowShape {
                trajectory: t,
                transition: Some(0),
                group: t / 2,
                prompt_len: 1,
                response_len: n,
                loss_tokens: n,
            })
            .collect()
    }

    #[test]
    fn units_per_mini_batch_sets_the_mini_batch_count() {
        let cfg = PlanConfig {
            units_per_mini_batch: Some(4),
            num_mini_batches: 99,
            ..Default::default()
        };
        let p = plan(&rows(&[1; 10]), &cfg).unwrap();
        let sizes: Vec<usize> = p.mini_batches.iter().map(|m| m.counts.rows).collect();
        assert_eq!(
            sizes,
            vec![4, 3, 3],
            "ceil(10 / 4) = 3 mini-batches, dealt evenly"
        );
        let zero = PlanConfig {
            units_per_mini_batch: Some(0),
            ..Default::default()
        };
        assert!(plan(&rows(&[1]), &zero)
            .unwrap_err()
            .to_string()
            .contains("units_per_mini_batch"));
    }

    #[test]
    fn token_balanced_mode_evens_mini_batch_loads() {
        // One long unit and many short ones: dealing by count would put the long unit with
        // half of the short ones; dealing by cost gives it a mini-batch of its own.
        let mut lens = vec![1000];
        lens.extend([100; 10]);
        let cfg = PlanConfig {
            num_mini_batches: 2,
            token_balanced: true,
            cost: CostModel {
                linear: 1.0,
                quadratic: 0.0,
            },
            ..Default::default()
        };
        let p = plan(&rows(&lens), &cfg).unwrap();
        let tokens: Vec<usize> = p.mini_batches.iter().map(|m| m.counts.tokens).collect();
        assert_eq!(tokens.iter().sum::<usize>(), 1000 + 1000 + 11);
        assert!(
            tokens.iter().all(|&t| (1000..=1010).contains(&t)),
            "{tokens:?}"
        );
    }

    /// Costs past u64 (a huge quadratic coefficient, or lengths near u32::MAX) saturate
    /// rather than wrap: a wrapped sum would balance ranks on small false costs.
    #[test]
    fn costs_past_u64_saturate_rather_than_wrap() {
        let cfg = PlanConfig {
            dp_size: 2,
            num_mini_batches: 1,
            token_balanced: true,
            cost: CostModel {
                linear: 1.0,
                quadratic: 1e30,
            },
            ..Default::default()
        };
        let p = plan(&rows(&[4000; 8]), &cfg).unwrap();
        assert!(p.mini_batches[0].rank_costs.iter().all(|&c| c == u64::MAX));
    }

    #[test]
    fn padding_ids_continue_across_steps() {
        let mut ids = PaddingIds::default();
        let cfg = PlanConfig {
            dp_size: 4,
            ..Default::default()
        };
        let pads = |p: &Plan| -> Vec<PaddingId> {
            p.mini_batches
                .iter()
                .flat_map(|m| m.ranks.iter().flatten())
                .filter_map(|s| match s {
                    Slot::Padding(id) => Some(*id),
                    Slot::Real(_) => None,
                })
                .collect()
        };
        let a = pads(&plan_with_ids(&rows(&[5]), &cfg, &mut ids).unwrap());
        let b = pads(&plan_with_ids(&rows(&[5]), &cfg, &mut ids).unwrap());
        assert_eq!((a.len(), b.len()), (3, 3));
        assert!(a.iter().all(|x| !b.contains(x)), "{a:?} {b:?}");
    }
}
