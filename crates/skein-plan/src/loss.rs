//! Loss aggregation as per-token weights. Every mode is linear in the per-token losses, so a
//! rank's contribution is Σ mask·loss·weight, and the weights use the mini-batch's GLOBAL
//! counts: summed over ranks and micro-batches, the result is the mini-batch loss whatever the
//! data-parallel layout. Padding rows weigh 0 and are in no count.

use crate::planner::GlobalCounts;
use std::fmt;
use std::str::FromStr;

/// How a mini-batch's token losses are averaged. In these names (verl's), a "seq" is a row:
/// one sequence fed to the model, which is a whole trajectory when its turns are merged and
/// one turn when they are not; `trajectory-mean` averages over trajectories whatever their
/// rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAggMode {
    /// Mean over all loss tokens of the mini-batch.
    TokenMean,
    /// Token sums, averaged over rows.
    SeqMeanTokenSum,
    /// Each row's token mean, averaged over rows.
    SeqMeanTokenMean,
    /// Token sums over rows, divided by a constant horizon (Dr. GRPO): no length bias.
    SeqMeanTokenSumNorm,
    /// Each trajectory's token mean, averaged over trajectories, however many turns it has.
    TrajectoryMean,
}

impl LossAggMode {
    pub const ALL: [LossAggMode; 5] = [
        LossAggMode::TokenMean,
        LossAggMode::SeqMeanTokenSum,
        LossAggMode::SeqMeanTokenMean,
        LossAggMode::SeqMeanTokenSumNorm,
        LossAggMode::TrajectoryMean,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            LossAggMode::TokenMean => "token-mean",
            LossAggMode::SeqMeanTokenSum => "seq-mean-token-sum",
            LossAggMode::SeqMeanTokenMean => "seq-mean-token-mean",
            LossAggMode::SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
            LossAggMode::TrajectoryMean => "trajectory-mean",
        }
    }
}

impl fmt::Display for LossAggMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LossAggMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                let allowed: Vec<&str> = Self::ALL.iter().map(|m| m.as_str()).collect();
                format!(
                    "unknown loss aggregation mode `{s}` (allowed: {})",
                    allowed.join(", ")
                )
            })
    }
}

/// Weight of each loss token of a real row. `row_loss_tokens`: the row's loss tokens;
/// `trajectory_loss_tokens`: its trajectory's loss tokens in this mini-batch; `horizon`: the
/// constant of `seq-mean-token-sum-norm`.
pub fn row_token_weight(
    mode: LossAggMode,
    row_loss_tokens: usize,
    trajectory_loss_tokens: usize,
    counts: &GlobalCounts,
    horizon: usize,
) -> f64 {
    let inv = |d: usize| if d == 0 { 0.0 } else { 1.0 / d as f64 };
    match mode {
        LossAggMode::TokenMean => inv(counts.loss_tokens),
        LossAggMode::SeqMeanTokenSum => inv(counts.rows),
        LossAggMode::SeqMeanTokenMean => inv(counts.rows) * inv(row_loss_tokens),
        LossAggMode::SeqMeanTokenSumNorm => inv(counts.rows) * inv(horizon.max(1)),
        LossAggMode::TrajectoryMean => inv(counts.trajectories) * inv(trajectory_loss_tokens),
    }
}

/// Per-token losses of one row, for the reference arithmetic.
#[derive(Debug, Clone)]
pub struct RowLoss {
    pub token_losses: Vec<f64>,
    pub mask: Vec<u8>,
    pub trajectory_loss_tokens: usize,
    pub is_padding: bool,
}

/// A rank's (or micro-batch's) contribution to the mini-batch loss, in f64.
pub fn rank_contribution(
    mode: LossAggMode,
    rows: &[RowLoss],
    counts: &GlobalCounts,
    horizon: usize,
) -> f64 {
    rows.iter()
        .filter(|r| !r.is_padding)
        .map(|r| {
            let n = r.mask.iter().filter(|&&m| m != 0).count();
            let w = row_token_weight(mode, n, r.trajectory_loss_tokens, counts, horizon);
            r.token_losses
                .iter()
                .zip(&r.mask)
                .filter(|(_, &m)| m != 0)
                .map(|(l, _)| l * w)
                .sum::<f64>()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_unknown_ones_list_the_allowed() {
        for m in LossAggMode::ALL {
            assert_eq!(m.as_str().parse::<LossAggMode>().unwrap(), m);
        }
        let e = "mean".parse::<LossAggMode>().unwrap_err();
        assert!(
            e.contains("token-mean") && e.contains("trajectory-mean"),
            "{e}"
        );
    }

    #[test]
    fn trajectory_mean_weighs_trajectories_equally() {
        // Trajectory A: two rows of 1 and 3 loss tokens; trajectory B: one row of 1 token.
        let counts = GlobalCounts {
            rows: 3,
            trajectories: 2,
            loss_tokens: 5,
            tokens: 20,
        };
        let row = |n: usize, t: usize, v: f64| RowLoss {
            token_losses: vec![v; n],
            mask: vec![1; n],
            trajectory_loss_tokens: t,
            is_padding: false,
        };
        let rows = vec![row(1, 4, 1.0), row(3, 4, 1.0), row(1, 1, 3.0)];
        let total = rank_contribution(LossAggMode::TrajectoryMean, &rows, &counts, 8);
        assert!((total - (1.0 + 3.0) / 2.0).abs() < 1e-12);
        let tm = rank_contribution(LossAggMode::TokenMean, &rows, &counts, 8);
        assert!((tm - 7.0 / 5.0).abs() < 1e-12);
    }
}
