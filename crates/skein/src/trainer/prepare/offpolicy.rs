//! Importance correction for tokens an older policy sampled (partial rollout carries samples
//! across weight updates). π_old, recomputed at the step's start, is the proximal policy the
//! PPO ratio is clipped against; each token's surrogate is then weighted by
//! π_old/π_behavior, the behavior log-prob recorded when the token was sampled.
//!
//! Tokens sampled by the step's own version weigh exactly 1: recomputed and recorded
//! log-probs of the same weights differ only by float round-off, which is no policy change.
//! `icepop` is the exception: it exists to catch where they differ by more than round-off
//! (an engine computing in another precision or with other kernels), so it weighs and masks
//! every token.

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
    /// The share of all loss tokens (as every fraction here) that the mode weighs and whose
    /// raw weight exceeded the cap (truncated, or left out when decoupled). The mode weighs
    /// the off-policy tokens, and with `icepop` all of them.
    pub truncated_fraction: f64,
    /// Tokens sampled by an older version than the step's.
    pub off_policy_fraction: f64,
    /// Tokens the correction weighted by something other than exactly 1 and kept, and rows
    /// (trajectories) with at least one such token.
    pub weighted_tokens: usize,
    pub weighted_rows: usize,
    /// Tokens left out (weight 0: `decoupled` above the cap, `mis` and `icepop` outside their
    /// band, every token of a sequence `seq-mis` rejects), and rows with loss tokens all of
    /// which were left out: those train nothing, and are counted rather than trained as
    /// zeros unseen.
    pub masked_tokens: usize,
    pub masked_rows: usize,
    /// The mode leaves tokens out (all but `tis`): only then are the masked counts logged.
    pub masking: bool,
    /// The mode weighs every token, fresh ones too (`icepop`): it acts, and its counts are
    /// logged, without partial rollout.
    pub weighs_every_token: bool,
}

impl ImportanceStats {
    pub fn metrics(&self) -> Vec<(&'static str, f64)> {
        let mut m = vec![
            ("is/weight_mean", self.weight_mean),
            ("is/truncated_fraction", self.truncated_fraction),
            ("is/off_policy_fraction", self.off_policy_fraction),
            ("is/weighted_tokens", self.weighted_tokens as f64),
            ("is/weighted_rows", self.weighted_rows as f64),
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

/// Fills every row's `importance_weights` (needs `old_logp`, of every row for `icepop`, so
/// call after recomputing it).
pub fn importance_weights(
    rows: &mut [TrainRow],
    version: u64,
    mode: OffPolicy,
    cap: f64,
) -> ImportanceStats {
    let mut s = ImportanceStats {
        masking: mode != OffPolicy::Tis,
        weighs_every_token: mode == OffPolicy::Icepop,
        ..Default::default()
    };
    let (mut sum, mut tokens, mut truncated, mut off, mut raw_sum) = (0.0, 0usize, 0, 0, 0.0);
    for row in rows.iter_mut() {
        let log_raw = |k: usize| row.old_logp[k] as f64 - row.behavior_logp[k] as f64;
        let stale = |k: usize| row.versions.get(k).is_some_and(|&v| v < version);
        let loss_tokens: Vec<usize> = (0..row.loss_mask.len())
            .filter(|&k| row.loss_mask[k] != 0)
            .collect();
        // `seq-mis` judges the sequence by the geometric mean of its off-policy tokens' raw
        // weights: a length-independent measure of how far the whole sample is off-policy.
        let rejected = mode == OffPolicy::SeqMis && {
            let logs: Vec<f64> = loss_tokens
                .iter()
                .filter(|&&k| stale(k))
                .map(|&k| log_raw(k))
                .collect();
            !logs.is_empty() && !in_band((logs.iter().sum::<f64>() / logs.len() as f64).exp(), cap)
        };
        let mut weights = vec![1.0f32; row.loss_mask.len()];
        let (mut row_masked, mut row_weighted) = (0usize, 0usize);
        for &k in &loss_tokens {
            tokens += 1;
            let is_stale = stale(k);
            let w = if is_stale || mode == OffPolicy::Icepop {
                let raw = log_raw(k).exp();
                // Every weighed token: icepop's on-policy ones too.
                truncated += usize::from(raw > cap);
                if is_stale {
                    off += 1;
                    raw_sum += raw;
                }
                weight(raw, mode, cap)
            } else {
                1.0
            };
            let w = if rejected { 0.0 } else { w };
            if w == 0.0 {
                row_masked += 1;
            } else if w != 1.0 {
                row_weighted += 1;
            }
            sum += w;
            weights[k] = w as f32;
        }
        row.importance_weights = weights;
        s.masked_tokens += row_masked;
        s.masked_rows += usize::from(!loss_tokens.is_empty() && row_masked == loss_tokens.len());
        s.weighted_tokens += row_weighted;
        s.weighted_rows += usize::from(row_weighted > 0);
    }
    let n = tokens.max(1) as f64;
    s.weight_mean = if tokens == 0 { 1.0 } else { sum / n };
    s.raw_weight_mean = (off > 0).then(|| raw_sum / off as f64);
    s.truncated_fraction = truncated as f64 / n;
    s.off_policy_fraction = off as f64 / n;
    s
}

/// Whether a raw weight lies in the masking modes' band [1/cap, cap].
fn in_band(raw: f64, cap: f64) -> bool {
    (1.0 / cap..=cap).contains(&raw)
}

/// The weight of a token whose raw weight π_old/π_behavior is `raw` (off-policy tokens; with
/// `icepop`, every token). A sequence `seq-mis` keeps is truncated as `tis` does.
fn weight(raw: f64, mode: OffPolicy, cap: f64) -> f64 {
    match mode {
        OffPolicy::Tis | OffPolicy::SeqMis => raw.min(cap),
        OffPolicy::Decoupled if raw > cap => 0.0,
        OffPolicy::Mis | OffPolicy::Icepop if !in_band(raw, cap) => 0.0,
        OffPolicy::Decoupled | OffPolicy::Mis | OffPolicy::Icepop => raw,
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

    /// `seq-mis` rejects a whole sequence when the geometric mean of its off-policy tokens'
    /// raw weights leaves [1/cap, cap], on-policy tokens included, and truncates the tokens of
    /// the sequences it keeps. Row 0: raw weights e^0.5 and e^1 (mean log 0.75, e^0.75 ≈ 2.1
    /// above 2): rejected, its on-policy token with it. Row 1: e^2 and e^-1.5 (mean log 0.25):
    /// kept, though each token alone is outside the band (token-level `mis` drops both, and
    /// keeps two of row 0's three tokens); the far one is truncated to 2.
    #[test]
    fn sequence_level_mis_rejects_whole_sequences_by_their_geometric_mean() {
        let make = || {
            vec![
                row(
                    vec![3, 3, 7],
                    vec![-1.0, -1.0, -1.0],
                    vec![-1.5, -2.0, -1.2],
                ),
                row(vec![3, 3], vec![-1.0, -3.0], vec![-3.0, -1.5]),
            ]
        };
        let mut rows = make();
        let s = importance_weights(&mut rows, 7, OffPolicy::SeqMis, 2.0);
        assert_eq!(rows[0].importance_weights, vec![0.0, 0.0, 0.0]);
        let w = &rows[1].importance_weights;
        assert!(
            w[0] == 2.0 && (w[1] - (-1.5f32).exp()).abs() < 1e-6,
            "{w:?}"
        );
        assert_eq!((s.masked_tokens, s.masked_rows), (3, 1), "{s:?}");
        assert_eq!((s.weighted_tokens, s.weighted_rows), (2, 1), "{s:?}");
        let mut rows = make();
        let s = importance_weights(&mut rows, 7, OffPolicy::Mis, 2.0);
        assert_eq!(rows[1].importance_weights, vec![0.0, 0.0]);
        assert_eq!(rows[0].importance_weights[1..], [0.0, 1.0]);
        assert_eq!((s.masked_tokens, s.masked_rows), (3, 1), "{s:?}");
    }

    /// `icepop` weighs and masks every token by π_old/π_behavior, those of the step's own
    /// version too: there the ratio is the engine's mismatch with the trainer, which it
    /// exists to catch. Other modes give the same tokens exactly 1.
    #[test]
    fn icepop_masks_the_mismatch_of_on_policy_tokens() {
        // All on-policy (version 7): raw e^0.1 (inside), e^1 ≈ 2.7 (above), e^-1 (below).
        let make = || {
            vec![row(
                vec![7, 7, 7],
                vec![-1.0, -1.0, -2.0],
                vec![-1.1, -2.0, -1.0],
            )]
        };
        let mut rows = make();
        let s = importance_weights(&mut rows, 7, OffPolicy::Icepop, 2.0);
        let w = &rows[0].importance_weights;
        assert!(
            (w[0] - 0.1f32.exp()).abs() < 1e-6 && w[1] == 0.0 && w[2] == 0.0,
            "{w:?}"
        );
        assert_eq!(
            (s.masked_tokens, s.masked_rows, s.weighted_tokens),
            (2, 0, 1)
        );
        assert_eq!(s.raw_weight_mean, None, "no token is off-policy");
        assert!(
            (s.truncated_fraction - 1.0 / 3.0).abs() < 1e-12,
            "e^1 is over the cap"
        );
        for mode in [OffPolicy::Mis, OffPolicy::SeqMis] {
            let mut rows = make();
            importance_weights(&mut rows, 7, mode, 2.0);
            assert_eq!(rows[0].importance_weights, vec![1.0; 3]);
        }
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
