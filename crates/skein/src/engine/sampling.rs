//! Turning next-token logits into sampled tokens and their behavior log-probs, on the device.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f64,
    /// 1.0 disables nucleus filtering.
    pub top_p: f64,
    /// 0 disables top-k filtering.
    pub top_k: usize,
    pub max_new_tokens: usize,
    pub stop_token_ids: Vec<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 64,
            stop_token_ids: Vec::new(),
        }
    }
}

/// Samples one token per row of `logits` [A, vocab]. Returns (tokens [A], log-probs [A]).
///
/// The log-prob recorded is that of the temperature-scaled distribution before top-k/top-p
/// truncation: the same quantity the trainer recomputes (it divides logits by the same
/// temperature), so the importance ratio of an unchanged policy is exactly 1. Truncated
/// samples would not be drawn from that distribution, so training refuses top-k/top-p
/// (`rollout.sampling`, and requests in a `skein serve` rollout); they are for serving.
///
/// Non-finite logits (a diverged policy) are mapped to finite ones first, so sampling still
/// returns tokens: the update then sees the non-finite loss and skips it, counted, instead of
/// the sampler aborting the run.
pub fn sample(logits: &Tensor, p: &SamplingParams) -> (Tensor, Tensor) {
    let logits = logits.to_kind(Kind::Float).nan_to_num(0.0, None, None);
    if p.temperature <= 0.0 {
        let logp = logits.log_softmax(-1, Kind::Float);
        let tokens = logits.argmax(-1, false);
        let chosen = logp.gather(1, &tokens.unsqueeze(1), false).squeeze_dim(1);
        return (tokens, chosen);
    }
    let scaled = logits / p.temperature;
    let logp = scaled.log_softmax(-1, Kind::Float);
    let mut filtered = scaled;
    let vocab = filtered.size()[1];
    if p.top_k > 0 && (p.top_k as i64) < vocab {
        let (top, _) = filtered.topk(p.top_k as i64, -1, true, true);
        let threshold = top.narrow(1, p.top_k as i64 - 1, 1);
        filtered = filtered.masked_fill(&filtered.lt_tensor(&threshold), f64::NEG_INFINITY);
    }
    if p.top_p < 1.0 {
        let (sorted, order) = filtered.sort(-1, true);
        let probs = sorted.softmax(-1, Kind::Float);
        // Drop a token when the mass strictly before it already reaches top_p.
        let before = probs.cumsum(-1, Kind::Float) - &probs;
        let drop_sorted = before.ge(p.top_p);
        let drop = drop_sorted.scatter(1, &order, &drop_sorted);
        filtered = filtered.masked_fill(&drop, f64::NEG_INFINITY);
    }
    let tokens = filtered
        .softmax(-1, Kind::Float)
        .multinomial(1, true)
        .squeeze_dim(1);
    let chosen = logp.gather(1, &tokens.unsqueeze(1), false).squeeze_dim(1);
    (tokens, chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_argmax_and_reports_its_logprob() {
        let logits = Tensor::from_slice(&[0.0f32, 2.0, 1.0, 5.0, 0.0, 0.0]).view([2, 3]);
        let params = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        let (tok, lp) = sample(&logits, &params);
        assert_eq!(Vec::<i64>::try_from(&tok).unwrap(), vec![1, 0]);
        let expected = 2.0 - (1f64.exp() + 2f64.exp() + 1.0).ln();
        assert!((lp.double_value(&[0]) - expected).abs() < 1e-5);
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_keeps_the_head() {
        tch::manual_seed(0);
        let logits = Tensor::from_slice(&[0.0f32, 3.0, 1.0, 2.9])
            .view([1, 4])
            .repeat([64, 1]);
        let k1 = SamplingParams {
            top_k: 1,
            ..Default::default()
        };
        let (tok, _) = sample(&logits, &k1);
        assert!(Vec::<i64>::try_from(&tok).unwrap().iter().all(|&t| t == 1));
        // The two top tokens hold ~85% of the mass: top_p 0.5 keeps only them.
        let p = SamplingParams {
            top_p: 0.5,
            ..Default::default()
        };
        let (tok, _) = sample(&logits, &p);
        assert!(Vec::<i64>::try_from(&tok)
            .unwrap()
            .iter()
            .all(|&t| t == 1 || t == 3));
    }
}
