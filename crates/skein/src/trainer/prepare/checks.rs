//! Figures of a prepared batch that say whether two of its inputs can be trusted (the
//! diagnoses `logprob-mismatch` and `critic-not-learning` read them):
//! - [`LogpMismatch`]: behavior log-probs (the engine's, recorded when a token was sampled)
//!   against π_old recomputed by the trainer, on tokens the step's own version sampled: the
//!   same weights, so any difference beyond float round-off is an engine that does not compute
//!   the policy the trainer trains.
//! - [`explained_variance`]: how much of the GAE returns the critic's values explain.

use crate::trainer::batch::TrainRow;
use skein_plan::Moments;

/// Rows an engine–trainer comparison recomputes when the batch left every on-policy row's
/// π_old to the update's first forward (one epoch): enough tokens to see a mismatch, a small
/// share of a step's forward.
pub const PROBE_ROWS: usize = 4;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LogpMismatch {
    /// Mean and largest |behavior − π_old| log-prob, in nats.
    pub mean: f64,
    pub max: f64,
    pub tokens: usize,
    /// The mean that float round-off explains in the policy's dtype
    /// ([`crate::model::Dtype::logp_round_off`]): what `logprob-mismatch` compares against.
    pub tolerance: f64,
}

impl LogpMismatch {
    pub fn metrics(&self) -> [(&'static str, f64); 3] {
        [
            ("logp_mismatch/mean", self.mean),
            ("logp_mismatch/max", self.max),
            ("logp_mismatch/tolerance", self.tolerance),
        ]
    }

    /// Over the loss tokens of `rows` (those with a recomputed π_old) that `version` sampled;
    /// None when there is none.
    pub fn of<'a>(rows: impl Iterator<Item = &'a TrainRow>, version: u64) -> Option<Self> {
        let mut m = LogpMismatch::default();
        let mut sum = 0.0;
        for row in rows.filter(|r| !r.old_logp.is_empty()) {
            for k in 0..row.loss_mask.len() {
                let current = row.versions.get(k).is_none_or(|&v| v >= version);
                if row.loss_mask[k] == 0 || !current {
                    continue;
                }
                let d = (row.old_logp[k] as f64 - row.behavior_logp[k] as f64).abs();
                sum += d;
                m.max = m.max.max(d);
                m.tokens += 1;
            }
        }
        (m.tokens > 0).then(|| LogpMismatch {
            mean: sum / m.tokens as f64,
            ..m
        })
    }
}

/// Rows to recompute for the comparison when no real row of `rows` has a π_old of its own
/// (a padding row's says nothing: it has no loss token): up to [`PROBE_ROWS`] real rows with
/// loss tokens, spread over the batch.
pub fn probe_rows(rows: &[TrainRow]) -> Vec<usize> {
    let real = |r: &TrainRow| r.loss_weight > 0.0 && r.loss_mask.contains(&1);
    if rows.iter().any(|r| real(r) && !r.old_logp.is_empty()) {
        return Vec::new();
    }
    let real: Vec<usize> = (0..rows.len()).filter(|&i| real(&rows[i])).collect();
    let k = real.len().min(PROBE_ROWS);
    (0..k).map(|j| real[j * real.len() / k]).collect()
}

/// 1 − Var(returns − values) / Var(returns) over the positions the value loss trains: 1 is a
/// perfect critic, 0 one no better than the mean return, below 0 worse. None without a critic
/// or with returns that do not vary.
pub fn explained_variance(rows: &[TrainRow]) -> Option<f64> {
    let mut pairs = Vec::new();
    for row in rows
        .iter()
        .filter(|r| !r.returns.is_empty() && r.loss_weight > 0.0)
    {
        let mask = if row.value_mask.is_empty() {
            &row.loss_mask
        } else {
            &row.value_mask
        };
        for (k, &m) in mask.iter().enumerate() {
            if m != 0 {
                pairs.push((row.returns[k] as f64, row.old_values[k] as f64));
            }
        }
    }
    let returns = Moments::of(pairs.iter().map(|p| p.0));
    let residual = Moments::of(pairs.iter().map(|p| p.0 - p.1));
    (returns.n > 1 && returns.std > 0.0)
        .then(|| 1.0 - (residual.std * residual.std) / (returns.std * returns.std))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(versions: Vec<u64>, old: Vec<f32>, behavior: Vec<f32>) -> TrainRow {
        let n = versions.len();
        TrainRow {
            tokens: vec![1; n + 1],
            prompt_len: 1,
            loss_mask: vec![1; n],
            behavior_logp: behavior,
            old_logp: old,
            versions,
            loss_weight: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn mismatch_counts_only_tokens_of_the_current_version_with_a_recomputed_logp() {
        let rows = [
            // The stale token (version 2) differs by 3 and is left out.
            row(
                vec![5, 5, 2],
                vec![-1.0, -2.0, -1.0],
                vec![-1.1, -2.3, -4.0],
            ),
            // No π_old: the update computes it, nothing to compare.
            row(vec![5], vec![], vec![-9.0]),
        ];
        let m = LogpMismatch::of(rows.iter(), 5).unwrap();
        assert_eq!(m.tokens, 2);
        assert!(
            (m.mean - 0.2).abs() < 1e-6 && (m.max - 0.3).abs() < 1e-6,
            "{m:?}"
        );
        assert!(LogpMismatch::of(rows[1..].iter(), 5).is_none());
    }

    #[test]
    fn probes_are_real_rows_only_when_no_row_has_a_logp() {
        let mut rows: Vec<TrainRow> = (0..10).map(|_| row(vec![1], vec![], vec![0.0])).collect();
        rows[3].loss_weight = 0.0; // padding
        let p = probe_rows(&rows);
        assert_eq!(p.len(), PROBE_ROWS);
        assert!(!p.contains(&3));
        // A padding row with a π_old gives nothing to compare: the probes stay.
        rows[3].old_logp = vec![0.0];
        assert_eq!(probe_rows(&rows), p);
        rows[0].old_logp = vec![0.0];
        assert!(probe_rows(&rows).is_empty());
    }

    #[test]
    fn explained_variance_is_one_for_exact_values_and_negative_for_worse_than_the_mean() {
        let mut r = row(vec![1; 4], vec![], vec![]);
        r.returns = vec![1.0, 2.0, 3.0, 4.0];
        r.old_values = r.returns.clone();
        assert_eq!(explained_variance(std::slice::from_ref(&r)), Some(1.0));
        r.old_values = vec![4.0, 3.0, 2.0, 1.0];
        assert!(explained_variance(std::slice::from_ref(&r)).unwrap() < 0.0);
        r.returns = vec![1.0; 4];
        assert_eq!(explained_variance(&[r]), None);
    }
}
