//! The policy-gradient loss per token: PPO's clipped surrogate with separate low/high clip
//! (clip-higher) and dual-clip, or CISPO's clipped importance weight on a REINFORCE term
//! ([`PolicyLoss`]); then a KL penalty to a frozen reference, and an entropy bonus.
//! Aggregation over tokens is not done here: every token carries a weight from the planning
//! core that already includes the mini-batch's global counts.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

/// `algorithm.kl_estimator`: the per-token estimate of KL(π‖π_ref) that the loss adds, times
/// `kl_coef`, on tokens sampled from π (Schulman's k1, k2, k3 of d = log π − log π_ref).
///
/// As a loss term, what matters is the gradient of the estimate with the sampled token held
/// fixed, in expectation over π (the `two_token_toy` test checks each on a two-token policy):
/// - k1 = d: gradient ∇log π, whose expectation under π is 0. It estimates KL's value without
///   bias (which is why it suits a KL penalty subtracted from the reward, where the
///   score-function gradient carries it), but as a loss it pulls nowhere, so training refuses it.
/// - k2 = d²/2: gradient d·∇log π, whose expectation is ∇KL(π‖π_ref), the reverse KL of the
///   objective this penalty stands for.
/// - k3 = e^(−d) + d − 1 (GRPO's choice, non-negative): gradient (1 − π_ref/π)·∇log π, whose
///   expectation is ∇KL(π_ref‖π), the forward KL. It still holds π near π_ref, more gently
///   where π has dropped mass π_ref keeps; its value is clamped at [`K3_MAX`].
///
/// Reference: J. Schulman, "Approximating KL Divergence" (2020), for the estimators; Y. Tang
/// and R. Munos, "On a few pitfalls in KL divergence gradient estimation for RL" (2025), for
/// their gradients as loss terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KlEstimator {
    K1,
    K2,
    K3,
}

/// The largest k3 estimate a token contributes. e^(−d) grows without bound where π has all but
/// left a token π_ref likes (d = −20 gives 4.8e8); beyond 10 (π_ref/π above about 13, or π
/// above π_ref by e^11) the token adds a constant and no gradient, so one token cannot swamp
/// the step's loss.
pub const K3_MAX: f64 = 10.0;

/// `algorithm.policy_loss`: the policy-gradient term of each token, with r = π/π_old its
/// ratio and A its advantage. Every loss composes the same way with the rest: the term is
/// scaled by the token's off-policy importance weight (`algorithm.off_policy`), the KL term to
/// the reference and the entropy bonus are added to it, and the aggregation weight
/// (`algorithm.loss_agg_mode`) sums the tokens. GSPO alone implies an aggregation (its
/// objective is a mean over sequences): the config refuses the others with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyLoss {
    /// PPO's clipped surrogate, −min(r·A, clip(r, 1 − `clip_low`, 1 + `clip_high`)·A), with
    /// dual-clip bounding it at −c·A for A < 0. A token whose ratio left the range on the side
    /// its advantage pushes gets no gradient.
    #[default]
    Ppo,
    /// CISPO (MiniMax-M1, 2025): −sg(clip(r, 1 − `clip_low`, 1 + `clip_high`))·A·log π. The
    /// importance weight is clipped and its gradient stopped, and it scales a REINFORCE term
    /// on every token, so no token's gradient is dropped: a clipped token still moves the
    /// policy, by a bounded weight. Its gradient is −clip(r)·A·∇log π. As in the paper, the
    /// weight has no lower bound unless `clip_low` is set below its default of 1. Dual-clip
    /// does not apply (the weight is bounded already); the config refuses it set.
    Cispo,
    /// GSPO (Zheng et al., 2025): one ratio per sequence, s = exp(mean over the sequence's
    /// loss tokens of log r), the geometric mean of its token ratios, clipped per sequence:
    /// −min(s·A, clip(s, 1 − `clip_low`, 1 + `clip_high`)·A). Computed per token as GSPO-token
    /// does, s_t = sg(s)·π_t/sg(π_t): the value is s on every token of the sequence and the
    /// gradient of a token is s·A·∇log π_t where s is inside the range (on the advantage's
    /// side), so with `seq-mean-token-mean` aggregation (required: the objective is a mean
    /// over sequences of one term each) the sequence's gradient is A·∇s, GSPO's. Its ranges
    /// are in thousandths (the paper's 3e-4, 4e-4, the defaults when unset): a geometric mean
    /// moves far less than a token's ratio. Dual-clip is PPO's only.
    Gspo,
    /// SAPO (Gao et al., Qwen, 2025): no hard clip; a soft gate of the ratio,
    /// −(4/τ)·σ(τ·(r − 1))·A, τ = `sapo_tau_pos` where A > 0 and `sapo_tau_neg` elsewhere
    /// (larger: negative advantages are damped faster). Its gradient is 4σ(1 − σ)·r·A·∇log π:
    /// r·A·∇log π (PPO's unclipped gradient) at r = 1, fading smoothly as the ratio leaves 1
    /// instead of dropping to 0 at a boundary. Clip keys and dual-clip do not apply; there
    /// is no clipped share to log.
    Sapo,
    /// DPPO as prime-rl trains with it (Binary-TV; "Rethinking the Trust Region in LLM RL",
    /// 2026): the trust region is on the sampled token's probability, not its ratio. With
    /// δ = π − π_old, a token whose probability rose by more than `clip_high` with A > 0, or
    /// fell by more than `clip_low` with A < 0, is masked (no policy-gradient term); the others
    /// train −r·A. Every token also adds `dppo_kl_coef`·(log r)², a pull back toward π_old
    /// (prime-rl's `kl_tau`). Defaults when unset: 0.2 and 0.2, as prime-rl's.
    Dppo,
}

impl PolicyLoss {
    /// Its name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyLoss::Ppo => "ppo",
            PolicyLoss::Cispo => "cispo",
            PolicyLoss::Gspo => "gspo",
            PolicyLoss::Sapo => "sapo",
            PolicyLoss::Dppo => "dppo",
        }
    }

    /// `(clip_low, clip_high)` where the config leaves them unset (None: the loss has no
    /// clip range).
    pub fn default_clip(self) -> Option<(f64, f64)> {
        match self {
            PolicyLoss::Ppo => Some((0.2, 0.28)),
            // MiniMax-M1 leaves the weight unbounded below (ε_low large): a lower bound of 0.
            PolicyLoss::Cispo => Some((1.0, 0.28)),
            PolicyLoss::Gspo => Some((3e-4, 4e-4)),
            PolicyLoss::Dppo => Some((0.2, 0.2)),
            PolicyLoss::Sapo => None,
        }
    }

    /// What the logged clip figure counts: `clip_frac`, the share of tokens a ratio (or, for
    /// DPPO, a probability) bound cut off or capped; `clip_frac/sequence` for GSPO, the share
    /// of tokens whose sequence's ratio was clipped; none for SAPO.
    pub fn clip_metric(self) -> Option<&'static str> {
        match self {
            PolicyLoss::Ppo | PolicyLoss::Cispo | PolicyLoss::Dppo => Some("clip_frac"),
            PolicyLoss::Gspo => Some("clip_frac/sequence"),
            PolicyLoss::Sapo => None,
        }
    }
}

/// SAPO's temperatures of the paper: positive advantages' gate, and negative ones' (larger).
pub const SAPO_TAU_POS: f64 = 1.0;
pub const SAPO_TAU_NEG: f64 = 1.05;
/// prime-rl's default `kl_tau`: the weight of DPPO's (log r)² term.
pub const DPPO_KL_COEF: f64 = 1e-3;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LossConfig {
    pub kind: PolicyLoss,
    pub clip_low: f64,
    pub clip_high: f64,
    /// Dual-clip constant c > 1 bounding the loss of negative-advantage tokens; 0 disables.
    pub dual_clip: f64,
    pub kl_coef: f64,
    pub kl_estimator: KlEstimator,
    pub entropy_coef: f64,
    /// SAPO's gate temperatures for A > 0 and A ≤ 0.
    pub sapo_tau_pos: f64,
    pub sapo_tau_neg: f64,
    /// DPPO's weight of (log π − log π_old)² on every token.
    pub dppo_kl_coef: f64,
}

impl Default for LossConfig {
    /// PPO's clip range with clip-higher and dual-clip; no KL or entropy term.
    fn default() -> Self {
        LossConfig {
            kind: PolicyLoss::Ppo,
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: 3.0,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            entropy_coef: 0.0,
            sapo_tau_pos: SAPO_TAU_POS,
            sapo_tau_neg: SAPO_TAU_NEG,
            dppo_kl_coef: DPPO_KL_COEF,
        }
    }
}

/// Per-token inputs of one micro-batch, all [rows, time] and aligned with the targets.
pub struct TokenBatch<'a> {
    pub logp: &'a Tensor,
    pub old_logp: &'a Tensor,
    pub ref_logp: Option<&'a Tensor>,
    pub entropy: Option<&'a Tensor>,
    pub advantages: &'a Tensor,
    /// Importance weight of each token's surrogate against its behavior policy (1 on-policy).
    pub importance_weights: &'a Tensor,
    /// Loss mask times the aggregation weight of the token's row (0 for padding).
    pub loss_weights: &'a Tensor,
    /// Plain 0/1 loss mask, for metrics.
    pub mask: &'a Tensor,
    /// GSPO: the index of each token's sequence (row) in the micro-batch, int64 (any value off
    /// the mask), and how many sequences there are.
    pub sequences: Option<(&'a Tensor, i64)>,
}

/// The micro-batch's contribution to the mini-batch loss, and sums for metrics (over masked
/// tokens: clipped tokens, approx-KL, entropy, KL to reference).
pub struct LossOut {
    pub loss: Tensor,
    pub clipped_tokens: f64,
    pub approx_kl_sum: f64,
    pub entropy_sum: f64,
    pub ref_kl_sum: f64,
    pub tokens: f64,
}

pub fn policy_loss(b: &TokenBatch, cfg: &LossConfig) -> LossOut {
    let log_ratio = b.logp - b.old_logp;
    let (pg, is_clipped) = match cfg.kind {
        PolicyLoss::Ppo => ppo_term(&log_ratio, b.advantages, cfg),
        PolicyLoss::Cispo => cispo_term(b.logp, &log_ratio, b.advantages, cfg),
        PolicyLoss::Gspo => {
            let (index, n) = b
                .sequences
                .expect("GSPO's loss is given each token's sequence");
            let seq_log_ratio = sequence_log_ratio(b.logp, &log_ratio, b.mask, index, n);
            ppo_term(
                &seq_log_ratio,
                b.advantages,
                &LossConfig {
                    dual_clip: 0.0,
                    ..*cfg
                },
            )
        }
        PolicyLoss::Sapo => sapo_term(&log_ratio, b.advantages, cfg),
        PolicyLoss::Dppo => dppo_term(b.logp, b.old_logp, &log_ratio, b.advantages, cfg),
    };
    let mut per_token = pg * b.importance_weights;
    // A token the off-policy correction left out (weight 0) trains nothing under any term: the
    // KL penalty and the entropy bonus are not weighted by π_old/π_behavior, but they skip it.
    let trained = || b.importance_weights.ne(0.0).to_kind(b.logp.kind());
    let mut ref_kl_sum = 0.0;
    if let Some(ref_logp) = b.ref_logp {
        let kl = kl_penalty(b.logp, ref_logp, cfg.kl_estimator);
        ref_kl_sum = tch::no_grad(|| (&kl * b.mask).sum(Kind::Double).double_value(&[]));
        // Out of place: in-place ops on tensors autograd saved break backward.
        per_token = kl * cfg.kl_coef * trained() + &per_token;
    }
    let mut entropy_sum = 0.0;
    if let Some(entropy) = b.entropy {
        entropy_sum = tch::no_grad(|| (entropy * b.mask).sum(Kind::Double).double_value(&[]));
        if cfg.entropy_coef != 0.0 {
            per_token = entropy * (-cfg.entropy_coef) * trained() + &per_token;
        }
    }
    let loss = (per_token * b.loss_weights).sum(Kind::Float);
    let (clipped_tokens, approx_kl_sum, tokens) = tch::no_grad(|| {
        let m = b.mask;
        (
            (is_clipped.to_kind(Kind::Float) * m)
                .sum(Kind::Double)
                .double_value(&[]),
            (log_ratio.pow_tensor_scalar(2) * 0.5 * m)
                .sum(Kind::Double)
                .double_value(&[]),
            m.sum(Kind::Double).double_value(&[]),
        )
    });
    LossOut {
        loss,
        clipped_tokens,
        approx_kl_sum,
        entropy_sum,
        ref_kl_sum,
        tokens,
    }
}

/// PPO's clipped surrogate per token, and which tokens the clip bound.
fn ppo_term(log_ratio: &Tensor, adv: &Tensor, cfg: &LossConfig) -> (Tensor, Tensor) {
    let ratio = log_ratio.exp();
    let unclipped = -(adv * &ratio);
    let clipped = -(adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high));
    let mut pg = unclipped.maximum(&clipped);
    let mut is_clipped = clipped.gt_tensor(&unclipped);
    if cfg.dual_clip > 1.0 {
        let bound = -(adv * cfg.dual_clip);
        let negative = adv.lt(0.0);
        // Where the dual clip binds, the term is a constant and the token gets no gradient,
        // as where the plain clip does: both count as clipped.
        is_clipped = is_clipped.logical_or(&pg.gt_tensor(&bound).logical_and(&negative));
        pg = pg.minimum(&bound).where_self(&negative, &pg);
    }
    (pg, is_clipped)
}

/// CISPO's term per token, −sg(clip(r))·A·log π, and which tokens' weights the clip bound
/// (they still train, by the bounded weight).
fn cispo_term(
    logp: &Tensor,
    log_ratio: &Tensor,
    adv: &Tensor,
    cfg: &LossConfig,
) -> (Tensor, Tensor) {
    let ratio = log_ratio.exp().detach();
    let weight = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
    let is_clipped = weight.ne_tensor(&ratio);
    (-(adv * weight * logp), is_clipped)
}

/// GSPO-token's per-token log-ratio: every token of a sequence carries the mean log-ratio of
/// its sequence's loss tokens, sg(mean) + log π_t − sg(log π_t), so its value is the
/// sequence's and its gradient is the token's own ∇log π_t (times the ratio, once
/// exponentiated). `index` gives each position's sequence (0..n); off the mask it is ignored.
fn sequence_log_ratio(
    logp: &Tensor,
    log_ratio: &Tensor,
    mask: &Tensor,
    index: &Tensor,
    n: i64,
) -> Tensor {
    let mean = tch::no_grad(|| {
        let flat_index = index.reshape([-1]);
        let m = mask.reshape([-1]).to_kind(Kind::Double);
        let zeros = Tensor::zeros([n], (Kind::Double, logp.device()));
        let sums = zeros.index_add(
            0,
            &flat_index,
            &(log_ratio.reshape([-1]).to_kind(Kind::Double) * &m),
        );
        let counts = zeros.index_add(0, &flat_index, &m).clamp_min(1.0);
        (sums / counts)
            .index_select(0, &flat_index)
            .reshape(log_ratio.size())
            .to_kind(log_ratio.kind())
    });
    mean + logp - logp.detach()
}

/// SAPO's soft gate per token, −(4/τ)·σ(τ(r − 1))·A with τ by the advantage's sign. No
/// token is clipped.
fn sapo_term(log_ratio: &Tensor, adv: &Tensor, cfg: &LossConfig) -> (Tensor, Tensor) {
    let ratio = log_ratio.exp();
    let tau = Tensor::full_like(adv, cfg.sapo_tau_pos)
        .where_self(&adv.gt(0.0), &Tensor::full_like(adv, cfg.sapo_tau_neg));
    let gate = ((ratio - 1.0) * &tau).sigmoid() * 4.0 / &tau;
    (-(adv * gate), adv.zeros_like().to_kind(Kind::Bool))
}

/// DPPO's term per token (prime-rl's Binary-TV form): −r·A where the sampled token's
/// probability has not left its trust region on the side the advantage pushes (π − π_old
/// above `clip_high` with A > 0, below −`clip_low` with A < 0), plus `dppo_kl_coef`·(log r)²
/// on every token; and which tokens the region masked.
fn dppo_term(
    logp: &Tensor,
    old_logp: &Tensor,
    log_ratio: &Tensor,
    adv: &Tensor,
    cfg: &LossConfig,
) -> (Tensor, Tensor) {
    let masked = tch::no_grad(|| {
        let delta = logp.exp() - old_logp.exp();
        let up = delta.gt(cfg.clip_high).logical_and(&adv.gt(0.0));
        let down = delta.lt(-cfg.clip_low).logical_and(&adv.lt(0.0));
        up.logical_or(&down)
    });
    let keep = masked.logical_not().to_kind(log_ratio.kind());
    let pg = -(adv * log_ratio.exp()) * keep;
    let trust = log_ratio.pow_tensor_scalar(2) * cfg.dppo_kl_coef;
    (pg + trust, masked)
}

/// KL(π‖π_ref) estimators from per-token log-probs (Schulman's k1, k2, k3).
pub fn kl_penalty(logp: &Tensor, ref_logp: &Tensor, est: KlEstimator) -> Tensor {
    let diff = logp - ref_logp;
    match est {
        KlEstimator::K1 => diff,
        KlEstimator::K2 => diff.pow_tensor_scalar(2) * 0.5,
        KlEstimator::K3 => {
            // exp(ref - logp) - (ref - logp) - 1, at most K3_MAX; the log-ratio is bounded
            // first only so that exp cannot overflow before the clamp.
            let r = (-&diff).clamp(-50.0, 50.0);
            (r.exp() - &r - 1.0).clamp_max(K3_MAX)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LossConfig {
        LossConfig::default()
    }

    /// Tokens without a reference, entropy or off-policy weight, each of weight 1.
    fn plain_batch<'a>(
        logp: &'a Tensor,
        old: &'a Tensor,
        adv: &'a Tensor,
        ones: &'a Tensor,
    ) -> TokenBatch<'a> {
        TokenBatch {
            logp,
            old_logp: old,
            ref_logp: None,
            entropy: None,
            advantages: adv,
            importance_weights: ones,
            loss_weights: ones,
            mask: ones,
            sequences: None,
        }
    }

    /// The loss's value and its gradient in log π.
    fn value_and_grad(batch: &TokenBatch, logp: &Tensor, cfg: &LossConfig) -> (f64, Vec<f64>) {
        let out = policy_loss(batch, cfg);
        let value = out.loss.double_value(&[]);
        let g = Tensor::run_backward(&[out.loss], &[logp], false, false);
        (value, Vec::<f64>::try_from(g[0].view([-1])).unwrap())
    }

    fn f64s(v: &[f64]) -> Tensor {
        Tensor::from_slice(v).view([1, -1])
    }

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_slice(v).view([1, -1])
    }

    #[test]
    fn clip_higher_and_dual_clip_bound_the_surrogate() {
        // ratios e^0.5 ≈ 1.65 with positive and negative advantages, and e^-2 ≈ 0.14 …
        let logp = t(&[0.5, 0.5, 2.0, -2.0]);
        let old = t(&[0.0, 0.0, 0.0, 0.0]);
        let adv = t(&[1.0, -1.0, -1.0, 1.0]);
        let ones = t(&[1.0, 1.0, 1.0, 1.0]);
        let out = policy_loss(&plain_batch(&logp, &old, &adv, &ones), &cfg());
        // The loss is the larger of unclipped and clipped: token 0 (A>0, ratio above 1.28) is
        // clipped to -1.28; token 1 (A<0) keeps 1.65; token 2 (A<0, ratio 7.39) is bounded by
        // the dual clip at 3; token 3 (A>0, ratio below 0.8) keeps -e^-2.
        let want = -1.28 + 0.5f64.exp() + 3.0 - (-2.0f64).exp();
        assert!(
            (out.loss.double_value(&[]) - want).abs() < 1e-4,
            "{}",
            out.loss.double_value(&[])
        );
        // Token 0 by the clip, token 2 by the dual clip: neither gets a gradient.
        assert_eq!(out.clipped_tokens, 2.0);
    }

    /// The lower clip, with bounds unlike the upper one's (1 − 0.1, 1 + 0.3), so that
    /// swapping or dropping either would show. Ratios e^-0.2 ≈ 0.82 (below 0.9) and e^-0.05
    /// with A = −1, and e^0.2 ≈ 1.22 (above 1.1, below 1.3) with A = 1. PPO: the first token's
    /// term is the constant −A·0.9, with no gradient, and it counts as clipped; the others keep
    /// their gradient −A·r. CISPO: the first token trains by the bounded weight 0.9.
    #[test]
    fn the_lower_clip_bounds_a_falling_ratio_with_a_negative_advantage() {
        let logp = f64s(&[-0.2, -0.05, 0.2]).set_requires_grad(true);
        let old = f64s(&[0.0; 3]);
        let adv = f64s(&[-1.0, -1.0, 1.0]);
        let ones = f64s(&[1.0; 3]);
        let batch = plain_batch(&logp, &old, &adv, &ones);
        let (r1, r2) = ((-0.05f64).exp(), 0.2f64.exp());
        for (kind, want_value, want_grad) in [
            (PolicyLoss::Ppo, 0.9 + r1 - r2, [0.0, r1, -r2]),
            (
                PolicyLoss::Cispo,
                0.9 * -0.2 + r1 * -0.05 - r2 * 0.2,
                [0.9, r1, -r2],
            ),
        ] {
            let cfg = LossConfig {
                kind,
                clip_low: 0.1,
                clip_high: 0.3,
                ..cfg()
            };
            let (value, g) = value_and_grad(&batch, &logp, &cfg);
            assert!((value - want_value).abs() < 1e-6, "{kind:?}: {value}");
            assert!(
                g.iter().zip(want_grad).all(|(a, b)| (a - b).abs() < 1e-9),
                "{kind:?}: {g:?} vs {want_grad:?}"
            );
            assert_eq!(policy_loss(&batch, &cfg).clipped_tokens, 1.0, "{kind:?}");
        }
    }

    /// CISPO on two tokens, by hand: ratios e^0.5 ≈ 1.65 (above 1 + 0.28, so its weight is
    /// clipped to 1.28) and e^-0.1 ≈ 0.905 (inside), advantages 1 and −2, weights 1. The loss
    /// is −Σ w·A·log π and its gradient in log π is −w·A: the clipped token keeps a gradient
    /// (−1.28), where PPO's clipped surrogate gives it none.
    #[test]
    fn cispo_two_token_toy() {
        let logp = Tensor::from_slice(&[-0.5f64, -1.1])
            .view([1, -1])
            .set_requires_grad(true);
        let old = Tensor::from_slice(&[-1.0f64, -1.0]).view([1, -1]);
        let adv = Tensor::from_slice(&[1.0f64, -2.0]).view([1, -1]);
        let ones = Tensor::from_slice(&[1.0f64, 1.0]).view([1, -1]);
        let batch = plain_batch(&logp, &old, &adv, &ones);
        let grad = |kind: PolicyLoss| -> (f64, Vec<f64>) {
            let out = policy_loss(&batch, &LossConfig { kind, ..cfg() });
            let value = out.loss.double_value(&[]);
            let g = Tensor::run_backward(&[out.loss], &[&logp], false, false);
            (value, Vec::<f64>::try_from(g[0].view([-1])).unwrap())
        };
        let w1 = (-0.1f64).exp();
        let (value, g) = grad(PolicyLoss::Cispo);
        let want = -(1.28 * 1.0 * -0.5) - (w1 * -2.0 * -1.1);
        // The loss is summed in float32.
        assert!((value - want).abs() < 1e-6, "{value} vs {want}");
        assert!(
            (g[0] + 1.28).abs() < 1e-9 && (g[1] - 2.0 * w1).abs() < 1e-9,
            "{g:?}"
        );
        let out = policy_loss(
            &batch,
            &LossConfig {
                kind: PolicyLoss::Cispo,
                ..cfg()
            },
        );
        assert_eq!(out.clipped_tokens, 1.0);
        // PPO on the same tokens: the clipped one has no gradient.
        let (_, g) = grad(PolicyLoss::Ppo);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 * w1).abs() < 1e-9, "{g:?}");
    }

    /// GSPO on two sequences of two tokens, by hand, with a ±0.2 range to make the clip
    /// visible. Sequence 0: log-ratios 0.5 and 0 (mean 0.25, s = e^0.25 ≈ 1.284, above 1.2)
    /// with A = 1: clipped, no gradient. Sequence 1: log-ratios −0.1 and 0.2 (mean 0.05,
    /// s = e^0.05) with A = −2: inside, every token's gradient −A·s times its weight. With
    /// `seq-mean-token-mean` weights (¼ each) that is ½·s per token: the gradient of the
    /// sequence objective −½·s·A in each token's log π, s = exp(mean log r). A fifth position
    /// off the mask, in sequence 0, changes nothing. Token-level PPO gives the last token a
    /// different gradient (its own ratio e^0.2 is inside the range, but it is not s).
    #[test]
    fn gspo_two_sequence_toy() {
        let logp = f64s(&[-0.5, -1.0, -1.1, -0.8, 3.0]).set_requires_grad(true);
        let old = f64s(&[-1.0, -1.0, -1.0, -1.0, -1.0]);
        let adv = f64s(&[1.0, 1.0, -2.0, -2.0, 1.0]);
        let ones = f64s(&[1.0; 5]);
        let mask = f64s(&[1.0, 1.0, 1.0, 1.0, 0.0]);
        let weights = f64s(&[0.25, 0.25, 0.25, 0.25, 0.0]);
        let index = Tensor::from_slice(&[0i64, 0, 1, 1, 0]).view([1, -1]);
        let batch = TokenBatch {
            loss_weights: &weights,
            mask: &mask,
            sequences: Some((&index, 2)),
            ..plain_batch(&logp, &old, &adv, &ones)
        };
        let cfg = LossConfig {
            kind: PolicyLoss::Gspo,
            clip_low: 0.2,
            clip_high: 0.2,
            ..cfg()
        };
        let (value, g) = value_and_grad(&batch, &logp, &cfg);
        let s1 = 0.05f64.exp();
        let want = 0.25 * 2.0 * -1.2 + 0.25 * 2.0 * (2.0 * s1);
        assert!((value - want).abs() < 1e-6, "{value} vs {want}");
        let want_grad = [0.0, 0.0, 0.5 * s1, 0.5 * s1, 0.0];
        assert!(
            g.iter().zip(want_grad).all(|(a, b)| (a - b).abs() < 1e-9),
            "{g:?} vs {want_grad:?}"
        );
        let out = policy_loss(&batch, &cfg);
        assert_eq!(
            out.clipped_tokens, 2.0,
            "both tokens of the clipped sequence"
        );
        let (_, ppo) = value_and_grad(
            &batch,
            &logp,
            &LossConfig {
                kind: PolicyLoss::Ppo,
                ..cfg
            },
        );
        assert!((ppo[3] - 0.25 * 2.0 * 0.2f64.exp()).abs() < 1e-9, "{ppo:?}");
    }

    /// SAPO's gate by hand: −(4/τ)·σ(τ(r − 1))·A, gradient −4σ(1 − σ)·r·A in log π, with τ 1
    /// for A > 0 and 1.05 for A < 0. At r = 1 the gradient is −A exactly (PPO's), and far
    /// from 1 it fades (7e-4 at r = e^2.5) but does not drop to 0, as PPO's clip does.
    #[test]
    fn sapo_two_token_toy() {
        let logp = f64s(&[-0.5, -1.1, -1.0, 1.5]).set_requires_grad(true);
        let old = f64s(&[-1.0, -1.0, -1.0, -1.0]);
        let adv = f64s(&[1.0, -2.0, 1.0, 1.0]);
        let ones = f64s(&[1.0; 4]);
        let batch = plain_batch(&logp, &old, &adv, &ones);
        let cfg = LossConfig {
            kind: PolicyLoss::Sapo,
            ..cfg()
        };
        let (value, g) = value_and_grad(&batch, &logp, &cfg);
        let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
        let (mut want, mut want_grad) = (0.0, Vec::new());
        for (log_r, a) in [(0.5f64, 1.0f64), (-0.1, -2.0), (0.0, 1.0), (2.5, 1.0)] {
            let tau = if a > 0.0 { 1.0 } else { 1.05 };
            let r = log_r.exp();
            let sg = sigmoid(tau * (r - 1.0));
            want -= 4.0 / tau * sg * a;
            want_grad.push(-4.0 * sg * (1.0 - sg) * r * a);
        }
        assert!((value - want).abs() < 1e-6, "{value} vs {want}");
        assert!(
            g.iter().zip(&want_grad).all(|(x, y)| (x - y).abs() < 1e-9),
            "{g:?} vs {want_grad:?}"
        );
        assert_eq!(g[2], -1.0);
        assert!(g[3] < 0.0, "a ratio of e^2.5 still trains: {}", g[3]);
        assert_eq!(policy_loss(&batch, &cfg).clipped_tokens, 0.0);
    }

    /// DPPO by hand on probabilities (prime-rl's Binary-TV mask), bounds 0.2 and kl 0.003:
    /// token 0 rose from 0.1 to 0.5 with A > 0 (masked: only the trust term trains it);
    /// token 1 fell from 0.5 to 0.1 with A < 0 (masked); token 2 fell the same way with
    /// A > 0 (kept: the probability moved against its advantage); token 3 rose 0.2 → 0.3 with
    /// A < 0 (inside). Kept tokens train −r·A; every token adds 0.003·(log r)².
    #[test]
    fn dppo_two_token_toy() {
        let probs = [
            (0.5f64, 0.1f64, 1.0f64),
            (0.1, 0.5, -1.0),
            (0.1, 0.5, 1.0),
            (0.3, 0.2, -1.0),
        ];
        let logp = f64s(&probs.map(|p| p.0.ln())).set_requires_grad(true);
        let old = f64s(&probs.map(|p| p.1.ln()));
        let adv = f64s(&probs.map(|p| p.2));
        let ones = f64s(&[1.0; 4]);
        let batch = plain_batch(&logp, &old, &adv, &ones);
        let cfg = LossConfig {
            kind: PolicyLoss::Dppo,
            clip_low: 0.2,
            clip_high: 0.2,
            dppo_kl_coef: 0.003,
            ..cfg()
        };
        let (value, g) = value_and_grad(&batch, &logp, &cfg);
        let kept = [false, false, true, true];
        let (mut want, mut want_grad) = (0.0, Vec::new());
        for (&(p, p_old, a), keep) in probs.iter().zip(kept) {
            let (r, log_r) = (p / p_old, (p / p_old).ln());
            let pg = if keep { -r * a } else { 0.0 };
            want += pg + 0.003 * log_r * log_r;
            want_grad.push(pg + 2.0 * 0.003 * log_r);
        }
        assert!((value - want).abs() < 1e-6, "{value} vs {want}");
        assert!(
            g.iter().zip(&want_grad).all(|(x, y)| (x - y).abs() < 1e-9),
            "{g:?} vs {want_grad:?}"
        );
        assert_eq!(policy_loss(&batch, &cfg).clipped_tokens, 2.0);
    }

    #[test]
    fn k3_is_nonnegative_and_zero_at_equality() {
        let a = t(&[-1.0, -0.5, -3.0]);
        let b = t(&[-1.0, -2.0, -0.1]);
        let k = kl_penalty(&a, &b, KlEstimator::K3);
        let v = Vec::<f32>::try_from(k.view([-1])).unwrap();
        assert!(v[0].abs() < 1e-7 && v[1] > 0.0 && v[2] > 0.0);
    }

    /// Each estimator's loss gradient on a two-token policy π = softmax(θ) against a fixed
    /// π_ref, in expectation over π (Σ_x π(x)·∇k(x), π(x) held fixed as a sample weight):
    /// k1's is 0, k2's is ∇KL(π‖π_ref) and k3's is ∇KL(π_ref‖π), each computed exactly.
    #[test]
    fn two_token_toy() {
        let theta = Tensor::from_slice(&[0.3f64, -0.4]).set_requires_grad(true);
        let ref_logp = Tensor::from_slice(&[0.8f64, 0.2]).log();
        let grad_of = |loss: Tensor| -> Vec<f64> {
            let g = tch::Tensor::run_backward(&[loss], &[&theta], false, false);
            Vec::<f64>::try_from(&g[0]).unwrap()
        };
        let expected = |est: KlEstimator| {
            let logp = theta.log_softmax(0, Kind::Double);
            let weight = logp.exp().detach();
            grad_of((weight * kl_penalty(&logp, &ref_logp, est)).sum(Kind::Double))
        };
        let logp = || theta.log_softmax(0, Kind::Double);
        let reverse = grad_of((logp().exp() * (logp() - &ref_logp)).sum(Kind::Double));
        let forward = grad_of((ref_logp.exp() * (&ref_logp - logp())).sum(Kind::Double));
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9);
        assert!(reverse.iter().all(|g| g.abs() > 0.05) && !close(&reverse, &forward));
        assert!(close(&expected(KlEstimator::K1), &[0.0, 0.0]));
        assert!(close(&expected(KlEstimator::K2), &reverse), "{reverse:?}");
        assert!(close(&expected(KlEstimator::K3), &forward), "{forward:?}");
    }

    /// A token the correction left out (weight 0) gets no gradient from the KL penalty or the
    /// entropy bonus either; a kept token's KL and entropy terms are not scaled by its weight.
    #[test]
    fn a_masked_token_trains_no_kl_and_no_entropy() {
        let logp = f64s(&[-1.0, -1.0, -1.0]).set_requires_grad(true);
        let old = f64s(&[-1.0, -1.0, -1.0]);
        let reference = f64s(&[-2.0, -2.0, -2.0]);
        let entropy = f64s(&[0.5, 0.5, 0.5]).set_requires_grad(true);
        let adv = f64s(&[0.0, 0.0, 0.0]);
        let ones = f64s(&[1.0, 1.0, 1.0]);
        let weights = f64s(&[1.0, 0.5, 0.0]);
        let batch = TokenBatch {
            ref_logp: Some(&reference),
            entropy: Some(&entropy),
            importance_weights: &weights,
            ..plain_batch(&logp, &old, &adv, &ones)
        };
        let cfg = LossConfig {
            kl_coef: 0.1,
            kl_estimator: KlEstimator::K1,
            entropy_coef: 0.01,
            ..cfg()
        };
        let out = policy_loss(&batch, &cfg);
        let g = Tensor::run_backward(&[out.loss], &[&logp, &entropy], false, false);
        let grads = |t: &Tensor| Vec::<f64>::try_from(t.view([-1])).unwrap();
        assert_eq!(grads(&g[0]), vec![0.1, 0.1, 0.0]);
        assert_eq!(grads(&g[1]), vec![-0.01, -0.01, 0.0]);
        // The metrics still read every token of the mask.
        assert_eq!((out.ref_kl_sum, out.entropy_sum), (3.0, 1.5));
    }

    /// k3 stays at most K3_MAX where π has left a token π_ref likes (d = −20 would be 4.8e8).
    #[test]
    fn k3_is_bounded() {
        let k = kl_penalty(&t(&[-25.0, -1.0]), &t(&[-5.0, -1.0]), KlEstimator::K3);
        assert_eq!(
            Vec::<f32>::try_from(k.view([-1])).unwrap(),
            vec![K3_MAX as f32, 0.0]
        );
    }
}
