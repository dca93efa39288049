//! Importance correction for tokens an older policy sampled (partial rollout carries samples
//! across weight updates). π_old, recomputed at the step's start, is the proximal policy the
//! PPO ratio is clipped against; each token's surrogate is then weighted by
//! π_old/π_behavior, the behavior log-prob recorded when the token was sampled.
//!
//! Tokens sampled by the step's own version weigh exactly 1: recomputed and recorded
//! log-probs of the same weights differ only by float round-off, which is no policy change.

use crate::trainer::batch::TrainRow;
use crate::trainer::config::OffPolicy;

/// Over loss tokens of real rows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ImportanceStats {
    /// Mean weight the loss applied (1 on tokens of the step's own version, capped beyond).
    pub weight_mean: f64,
    /// Mean raw weight π_old/π_behavior of the off-policy tokens, before the cap: how far
    /// the policy moved since they were sampled. The applied mean cannot pass the cap (2 by
    /// default) and is pulled to 1 by on-policy tokens, so a drift bound on it could never
    /// fire above; this one can. None without an off-policy token.
    pub raw_weight_mean: Option<f64>,
    /// Tokens whose raw weight exceeded the cap (truncated, or left out when decoupled).
    pub truncated_fraction: f64,
    /// Tokens sampled by an older version than the step's.
    pub off_policy_fraction: f64,
    /// Tokens left out (weight 0: `decoupled` above the cap, `mis` outside its band), and
    /// rows with loss tokens all of which were left out: those train nothing, and are
    /// counted rather than trained as zeros unseen.
    pub masked_tokens: usize,
    pub masked_rows: usize,
    /// The mode leaves tokens out (`decoupled`, `mis`): only then are the counts logged.
    pub masking: bool,
}

impl ImportanceStats {
    pub fn metrics(&self) -> Vec<(&'static str, f64)> {
        let mut m = vec![
            ("is/weight_mean", self.weight_mean),
            ("is/truncated_fraction", self.truncated_fraction),
            ("is/off_policy_fraction", self.off_policy_fraction),
        ];
        if self.masking {
            m.push(("is/masked_tokens", self.masked_tokens as f64));
            m.push(("is/masked_rows", self.masked_rows as f64));
        }
        if let Some(raw) = self.raw_weight_mean {
            m.push(("is/raw_weight_mean", raw));
        }
        m
    }
}

/// Fills every row's `importance_weights` (needs `old_logp`, so call after recomputing it).
pub fn importance_weights(
    rows: &mut [TrainRow],
    version: u64,
    mode: OffPolicy,
    cap: f64,
) -> ImportanceStats {
    let (mut sum, mut tokens, mut truncated, mut off) = (0.0, 0usize, 0usize, 0usize);
    let (mut raw_sum, mut masked_tokens, mut masked_rows) = (0.0, 0usize, 0usize);
    for row in rows.iter_mut() {
        let (mut row_tokens, mut row_masked) = (0usize, 0usize);
        row.importance_weights = (0..row.loss_mask.len())
            .map(|k| {
                if row.loss_mask[k] == 0 {
                    return 1.0;
                }
                tokens += 1;
                row_tokens += 1;
                let w = if row.versions.get(k).is_none_or(|&v| v >= version) {
                    1.0
                } else {
                    off += 1;
                    let raw = (row.old_logp[k] as f64 - row.behavior_logp[k] as f64).exp();
                    raw_sum += raw;
                    truncated += usize::from(raw > cap);
                    weight(raw, mode, cap)
                };
                if w == 0.0 {
                    masked_tokens += 1;
                    row_masked += 1;
                }
                sum += w;
                w as f32
            })
            .collect();
        masked_rows += usize::from(row_tokens > 0 && row_masked == row_tokens);
    }
    let n = tokens.max(1) as f64;
    ImportanceStats {
        weight_mean: if tokens == 0 { 1.0 } else { sum / n },
        raw_weight_mean: (off > 0).then(|| raw_sum / off as f64),
        truncated_fraction: truncated as f64 / n,
        off_policy_fraction: off as f64 / n,
        masked_tokens,
        masked_rows,
        masking: mode != OffPolicy::Tis,
    }
}

/// The weight of an off-policy token whose raw weight π_old/π_behavior is `raw`.
fn weight(raw: f64, mode: OffPolicy, cap: f64) -> f64 {
    match mode {
        OffPolicy::Tis => raw.min(cap),
        OffPolicy::Decoupled if raw > cap => 0.0,
        OffPolicy::Mis if raw > cap || raw < 1.0 / cap => 0.0,
        OffPolicy::Decoupled | OffPolicy::Mis => raw,
    }
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
            advantages: vec![1.0; n],
            old_logp: old,
            versions,
            loss_weight: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn on_policy_tokens_weigh_exactly_one_whatever_the_round_off() {
        for mode in [OffPolicy::Tis, OffPolicy::Decoupled] {
            let mut rows = vec![row(
                vec![5, 5, 6],
                vec![-1.0, -2.0, -0.3],
                vec![-1.1, -1.5, -3.0],
            )];
            let s = importance_weights(&mut rows, 5, mode, 2.0);
            assert_eq!(rows[0].importance_weights, vec![1.0, 1.0, 1.0]);
            assert_eq!(s.off_policy_fraction, 0.0);
            assert_eq!(s.weight_mean, 1.0);
            assert_eq!(s.raw_weight_mean, None);
        }
    }

    #[test]
    fn older_tokens_are_weighted_and_capped_per_mode() {
        // Raw loss_weights: e^0.5 ≈ 1.65 (below the cap), e^2 ≈ 7.39 (above), and one on-policy.
        let make = || {
            vec![row(
                vec![3, 3, 7],
                vec![-1.0, -1.0, -1.0],
                vec![-1.5, -3.0, -9.0],
            )]
        };
        let mut rows = make();
        let s = importance_weights(&mut rows, 7, OffPolicy::Tis, 2.0);
        let w = &rows[0].importance_weights;
        assert!((w[0] - 0.5f32.exp()).abs() < 1e-6 && w[1] == 2.0 && w[2] == 1.0);
        assert!((s.truncated_fraction - 1.0 / 3.0).abs() < 1e-12);
        assert!((s.off_policy_fraction - 2.0 / 3.0).abs() < 1e-12);
        // The raw mean is of the two off-policy tokens, uncapped: it can pass the cap, which
        // the applied mean never can.
        let raw = (0.5f64.exp() + 2f64.exp()) / 2.0;
        assert!(
            (s.raw_weight_mean.unwrap() - raw).abs() < 1e-6 && raw > 2.0,
            "{s:?}"
        );
        assert!(s.weight_mean <= 2.0);

        let mut rows = make();
        importance_weights(&mut rows, 7, OffPolicy::Decoupled, 2.0);
        let w = &rows[0].importance_weights;
        assert!((w[0] - 0.5f32.exp()).abs() < 1e-6 && w[1] == 0.0 && w[2] == 1.0);
    }

    /// `mis` leaves out tokens outside [1/cap, cap] on either side, keeps the raw weight
    /// inside, and counts what it left out: two tokens, and one row whose every token went.
    #[test]
    fn masked_importance_sampling_leaves_out_both_tails_and_counts_them() {
        // Raw weights e^0.5 ≈ 1.65 (inside), e^2 ≈ 7.39 (above 2), e^-1 ≈ 0.37 (below 1/2),
        // then a row of one token below the band.
        let mut rows = vec![
            row(
                vec![3, 3, 3],
                vec![-1.0, -1.0, -2.0],
                vec![-1.5, -3.0, -1.0],
            ),
            row(vec![3], vec![-3.0], vec![-1.0]),
        ];
        let s = importance_weights(&mut rows, 7, OffPolicy::Mis, 2.0);
        let w = &rows[0].importance_weights;
        assert!(
            (w[0] - 0.5f32.exp()).abs() < 1e-6 && w[1] == 0.0 && w[2] == 0.0,
            "{w:?}"
        );
        assert_eq!(rows[1].importance_weights, vec![0.0]);
        assert_eq!((s.masked_tokens, s.masked_rows), (3, 1), "{s:?}");
        // `tis` truncates the same tokens instead, and leaves none out.
        let mut rows = vec![row(vec![3], vec![-3.0], vec![-1.0])];
        let s = importance_weights(&mut rows, 7, OffPolicy::Tis, 2.0);
        assert_eq!((s.masked_tokens, s.masked_rows), (0, 0));
    }

    #[test]
    fn masked_tokens_are_not_counted() {
        let mut r = row(vec![0, 0], vec![-1.0, -1.0], vec![-5.0, -5.0]);
        r.loss_mask = vec![0, 0];
        let s = importance_weights(&mut [r], 9, OffPolicy::Tis, 2.0);
        assert_eq!(s.weight_mean, 1.0);
        assert_eq!(s.truncated_fraction, 0.0);
    }
}
