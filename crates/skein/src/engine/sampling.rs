//! Turning next-token logits into sampled tokens and their behavior log-probs, on the device.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

/// Temperatures below this are greedy (as in vLLM): dividing logits by them would overflow.
/// `skein serve` rounds them to 0, and training refuses them.
pub const MIN_SAMPLING_TEMPERATURE: f64 = 1e-5;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f64,
    /// Nucleus sampling: the smallest head of the distribution holding this much mass; 1.0
    /// disables it. In training the engine records the ids it kept and the trainer computes
    /// π over them (docs/sampling.md), so the sample stays on-policy.
    pub top_p: f64,
    /// Top-k sampling: the k most likely tokens (ties at the cut included); 0 disables it.
    /// Recorded and trained on as `top_p` is.
    pub top_k: usize,
    pub max_new_tokens: usize,
    /// Ids that end a sample. In a run's config: ids that end it besides the tokenizer's
    /// end-of-sequence ids, which always do ([`SamplingParams::stopping_at`]).
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

impl SamplingParams {
    /// These settings stopping at every one of `eos` (a tokenizer's end-of-sequence ids, in
    /// its order: the first is the one a demonstration ends with) and then at each id of
    /// `stop_token_ids` not among them. A chat model often has several (Qwen2.5's instruct
    /// models end a turn with `<|im_end|>` and a text with `<|endoftext|>`); stopping at the
    /// first alone would sample past the others.
    pub fn stopping_at(&self, eos: &[u32]) -> SamplingParams {
        let mut stops = eos.to_vec();
        for &id in &self.stop_token_ids {
            if !stops.contains(&id) {
                stops.push(id);
            }
        }
        SamplingParams {
            stop_token_ids: stops,
            ..self.clone()
        }
    }
}

/// One sampling step's draws, one per row of the logits.
pub struct Sampled {
    pub tokens: Tensor,
    /// Each token's log-prob under the distribution it was drawn from.
    pub logprobs: Tensor,
    /// [A, vocab] bool: what top-k/top-p kept, when either truncated (None otherwise).
    pub kept: Option<Tensor>,
}

/// Samples one token per row of `logits` [A, vocab].
///
/// The log-prob recorded is that of the temperature-scaled distribution the token was drawn
/// from: the whole one, or with top-k/top-p the truncated one, renormalised over the kept
/// tokens, which are returned so the trainer can compute π over the same set. Top-k keeps
/// every token whose scaled logit is at least the k-th largest (ties at the cut all stay);
/// top-p then keeps, in descending order, each token while the mass before it is below
/// `top_p` (among tokens tied at the boundary, the sort's order decides, which is why the set
/// is recorded as ids rather than as a threshold to recompute). The trainer divides its logits
/// by the same temperature and masks the same ids, so the importance ratio of an unchanged
/// policy is 1 to round-off either way.
///
/// Non-finite logits (a diverged policy) are mapped to finite ones first, so sampling still
/// returns tokens: the update then sees the non-finite loss and skips it, counted, instead of
/// the sampler aborting the run.
pub fn sample(logits: &Tensor, p: &SamplingParams) -> Sampled {
    let logits = logits.to_kind(Kind::Float).nan_to_num(0.0, None, None);
    if p.temperature <= 0.0 {
        let logp = logits.log_softmax(-1, Kind::Float);
        let tokens = logits.argmax(-1, false);
        let logprobs = logp.gather(1, &tokens.unsqueeze(1), false).squeeze_dim(1);
        return Sampled {
            tokens,
            logprobs,
            kept: None,
        };
    }
    let scaled = logits / p.temperature;
    let vocab = scaled.size()[1];
    let mut dropped: Option<Tensor> = None;
    if p.top_k > 0 && (p.top_k as i64) < vocab {
        let (top, _) = scaled.topk(p.top_k as i64, -1, true, true);
        let threshold = top.narrow(1, p.top_k as i64 - 1, 1);
        dropped = Some(scaled.lt_tensor(&threshold));
    }
    if p.top_p < 1.0 {
        let after_k = match &dropped {
            Some(d) => scaled.masked_fill(d, f64::NEG_INFINITY),
            None => scaled.shallow_clone(),
        };
        let (sorted, order) = after_k.sort(-1, true);
        let probs = sorted.softmax(-1, Kind::Float);
        // Drop a token when the mass strictly before it already reaches top_p.
        let before = probs.cumsum(-1, Kind::Float) - &probs;
        let drop_sorted = before.ge(p.top_p);
        // The most likely token always stays: a top_p that rounds to 0 in float32 would
        // otherwise drop every token, and the draw would be of nothing.
        let _ = drop_sorted.narrow(1, 0, 1).fill_(0);
        let drop = drop_sorted.scatter(1, &order, &drop_sorted);
        dropped = Some(match dropped {
            Some(d) => d.logical_or(&drop),
            None => drop,
        });
    }
    let logp = match &dropped {
        Some(d) => scaled.masked_fill(d, f64::NEG_INFINITY),
        None => scaled,
    }
    .log_softmax(-1, Kind::Float);
    let tokens = draw(&logp.exp());
    let logprobs = logp.gather(1, &tokens.unsqueeze(1), false).squeeze_dim(1);
    Sampled {
        tokens,
        logprobs,
        kept: dropped.map(|d| d.logical_not()),
    }
}

/// One draw per row of `probs` [A, vocab], the draw libtorch's `multinomial(1)` makes from
/// the same generator: the exponential race, the argmax of p / E with E ~ Exp(1) drawn per
/// entry. Without its checks that the probabilities are finite, non-negative and not all zero:
/// each reads a value back to the host, which on a GPU waits for the whole forward and leaves
/// the GPU idle while the sampling's kernels are launched after it; and probabilities here are
/// a softmax of finite logits.
fn draw(probs: &Tensor) -> Tensor {
    let race = probs.empty_like().exponential_(1.0);
    (probs / race).argmax(-1, false)
}

/// The kept ids of each row of a [A, vocab] kept mask, row by row (one device-to-host copy of
/// the kept pairs, not of the mask).
pub fn kept_ids(kept: &Tensor) -> Vec<Vec<u32>> {
    let rows = kept.size()[0] as usize;
    let pairs = Vec::<i64>::try_from(kept.nonzero().to_device(tch::Device::Cpu).reshape([-1]))
        .unwrap_or_default();
    let mut out = vec![Vec::new(); rows];
    // nonzero lists (row, id) pairs in row-major order.
    for pair in pairs.chunks_exact(2) {
        out[pair[0] as usize].push(pair[1] as u32);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The draws are `multinomial`'s from the same generator state, in fewer calls and with no
    /// value read back to the host.
    #[test]
    fn draws_are_multinomials_without_its_host_reads() {
        let probs = Tensor::rand([64, 50], (Kind::Float, tch::Device::Cpu))
            .pow_tensor_scalar(4)
            .softmax(-1, Kind::Float);
        for seed in 0..4 {
            // libtorch's CPU generator is one for the process, and tests on other threads draw
            // from it and reseed it: a draw between the reseed and ours changes our draws. Such
            // a clash is rare and gone on a retry; a draw that is not multinomial's never
            // matches.
            let (got, want, ops) = (0..5)
                .map(|_| {
                    tch::manual_seed(seed);
                    let want = probs.multinomial(1, true).squeeze_dim(1);
                    tch::manual_seed(seed);
                    let (got, ops) = crate::op_count::count(|| draw(&probs));
                    (got, want, ops)
                })
                .find(|(got, want, _)| got.equal(want))
                .unwrap_or_else(|| panic!("seed {seed}: the draws are not multinomial's"));
            assert!(got.equal(&want), "seed {seed}");
            let reads = ops
                .computing
                .iter()
                .filter(|(name, _)| name.contains("_local_scalar_dense"))
                .count();
            assert_eq!(reads, 0, "{ops:?}");
            assert!(ops.computing_total() <= 3, "{ops:?}");
        }
    }

    #[test]
    fn a_run_stops_at_every_eos_id_then_at_the_configs_own() {
        let configured = SamplingParams {
            stop_token_ids: vec![7, 151643],
            ..Default::default()
        };
        let run = configured.stopping_at(&[151645, 151643]);
        assert_eq!(run.stop_token_ids, vec![151645, 151643, 7]);
        assert_eq!(run.max_new_tokens, configured.max_new_tokens);
    }

    #[test]
    fn greedy_picks_argmax_and_reports_its_logprob() {
        let logits = Tensor::from_slice(&[0.0f32, 2.0, 1.0, 5.0, 0.0, 0.0]).view([2, 3]);
        let params = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        let out = sample(&logits, &params);
        let (tok, lp) = (out.tokens, out.logprobs);
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
        let tok = sample(&logits, &k1).tokens;
        assert!(Vec::<i64>::try_from(&tok).unwrap().iter().all(|&t| t == 1));
        // The two top tokens hold ~85% of the mass: top_p 0.5 keeps only them.
        let p = SamplingParams {
            top_p: 0.5,
            ..Default::default()
        };
        let tok = sample(&logits, &p).tokens;
        assert!(Vec::<i64>::try_from(&tok)
            .unwrap()
            .iter()
            .all(|&t| t == 1 || t == 3));
        // A top_p too small for float32 keeps the most likely token, with log-prob 0.
        let tiny = SamplingParams {
            top_p: 1e-46,
            ..Default::default()
        };
        let s = sample(&logits, &tiny);
        assert!(Vec::<i64>::try_from(&s.tokens)
            .unwrap()
            .iter()
            .all(|&t| t == 1));
        assert!(Vec::<f32>::try_from(&s.logprobs)
            .unwrap()
            .iter()
            .all(|&l| l == 0.0));
    }

    /// With truncation the recorded log-prob is of the renormalised distribution over the kept
    /// set, and the set is returned: top-k keeps every token tied at its cut; top-p keeps, of
    /// tokens tied at its boundary, those the sort put first, and exactly as many as the mass
    /// rule allows.
    #[test]
    fn truncation_records_its_kept_set_and_renormalised_logprobs() {
        tch::manual_seed(1);
        // Top-k 2 of [3, 3, 3, 1]: the three tied at the top stay, each 1/3.
        let logits = Tensor::from_slice(&[3.0f32, 3.0, 3.0, 1.0]).view([1, 4]);
        let k2 = SamplingParams {
            top_k: 2,
            ..Default::default()
        };
        let out = sample(&logits, &k2);
        assert_eq!(kept_ids(out.kept.as_ref().unwrap()), vec![vec![0, 1, 2]]);
        assert!((out.logprobs.double_value(&[0]) - (1.0f64 / 3.0).ln()).abs() < 1e-6);
        // Top-p 0.5 over 16 equal logits: 8 kept (the mass before the 9th reaches 0.5).
        let flat = Tensor::zeros([3, 16], (Kind::Float, tch::Device::Cpu));
        let p = SamplingParams {
            top_p: 0.5,
            ..Default::default()
        };
        let out = sample(&flat, &p);
        let kept = kept_ids(out.kept.as_ref().unwrap());
        let tokens = Vec::<i64>::try_from(&out.tokens).unwrap();
        for (set, tok) in kept.iter().zip(tokens) {
            assert_eq!(set.len(), 8, "{set:?}");
            assert!(set.contains(&(tok as u32)));
        }
        for lp in Vec::<f32>::try_from(&out.logprobs).unwrap() {
            assert!((lp as f64 - (1.0f64 / 8.0).ln()).abs() < 1e-6, "{lp}");
        }
        // No truncation: nothing recorded, the whole distribution's log-prob.
        let out = sample(&logits, &SamplingParams::default());
        assert!(out.kept.is_none());
    }
}
