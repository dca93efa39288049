//! The LM head's log-probs of a micro-batch's targets, computed only at the positions that
//! predict a response token and a bounded number of positions at a time, so that no
//! [tokens × vocabulary] tensor of a whole micro-batch is ever held.
//!
//! A real vocabulary makes the head the largest tensor of a forward: 49,152 float32 logits
//! are 192 KiB per token, and the log-softmax, its exponent and their gradients are as many
//! again, where a decoder layer of a 135M model keeps about 30 KiB per token. So:
//!
//! - Prompt positions never reach the head: their logits train nothing.
//! - Without gradients (π_old, π_ref, checks), the response positions run through the head
//!   [`chunk_positions`] at a time and only each position's log-prob and entropy stay.
//! - With gradients, when the response positions fit in one chunk, the head runs once with
//!   autograd as any layer does. When they do not, the head runs chunk by chunk without a
//!   graph, the loss reads the log-probs (and entropies) as leaves, and [`Logprobs::backward`]
//!   runs each chunk's head again with a graph, seeded by the gradient the loss left on its
//!   log-probs: one chunk's logits are alive at a time, for one more matmul of the head over
//!   the response positions. libtorch's custom autograd functions are not reachable from
//!   Rust, so the backward is split by hand, as `model::checkpoint` splits the layers'.
//!
//! Every path computes the same numbers; `tests` hold them equal.

use super::kept::KeptPositions;
use super::tensors::MicroBatch;
use crate::model::Transformer;
use tch::{Kind, Tensor};

/// What a forward computes of each position's entropy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entropy {
    /// Nothing (π_old, π_ref and warm-up passes).
    Skip,
    /// A metric only: computed without gradients, so none of its vocabulary-sized tensors
    /// (the probabilities and their product with the log-probs) stays alive until the
    /// backward pass.
    Metric,
    /// A term of the loss (`algorithm.entropy_coef` ≠ 0): computed with gradients.
    Loss,
}

/// Bytes of one chunk's float32 logits. The head's peak is a few times this (the logits, the
/// log-softmax, their exponent and, in the backward, their gradients), which stays well
/// below the decoder's own activations of a micro-batch.
const CHUNK_LOGIT_BYTES: usize = 128 << 20;

/// Positions the head runs at once for a vocabulary of `vocab` tokens.
pub fn chunk_positions(vocab: usize) -> usize {
    (CHUNK_LOGIT_BYTES / (4 * vocab.max(1))).max(1)
}

/// Per-position log-probs of a micro-batch's targets, [lines, T], and their entropies as
/// [`Entropy`] asks: each position's own where it predicts a response token, 0 elsewhere.
pub struct Logprobs<'a> {
    pub logp: Tensor,
    pub entropy: Option<Tensor>,
    /// The head's backward still to run, when it ran in chunks under autograd.
    recompute: Option<HeadRecompute<'a>>,
}

impl Logprobs<'_> {
    /// Carries the gradient the loss's backward left on the log-probs into the head's weights
    /// and the hidden states (and through them into the layers). Run it right after the loss's
    /// `backward()` and before an activation-checkpointing recompute; without gradients, or
    /// when the head ran in one piece, there is nothing to do.
    pub fn backward(self) {
        if let Some(recompute) = self.recompute {
            recompute.backward();
        }
    }
}

/// [`Logprobs`] of `mb`'s targets under the model at `temperature`, from a forward of its own.
pub fn token_logprobs<'a>(
    net: &'a Transformer,
    mb: &MicroBatch,
    temperature: f64,
    entropy: Entropy,
) -> Logprobs<'a> {
    logprobs_of_hidden(net, mb, &mb.hidden(net), temperature, entropy)
}

/// [`Logprobs`] of `mb`'s targets from its final `hidden` states [lines, T, hidden], at
/// `temperature`.
pub fn logprobs_of_hidden<'a>(
    net: &'a Transformer,
    mb: &MicroBatch,
    hidden: &Tensor,
    temperature: f64,
    entropy: Entropy,
) -> Logprobs<'a> {
    let chunk = chunk_positions(net.config.vocab_size);
    logprobs_in_chunks(net, mb, hidden, temperature, entropy, chunk)
}

/// [`logprobs_of_hidden`] with `chunk` positions per head call.
fn logprobs_in_chunks<'a>(
    net: &'a Transformer,
    mb: &MicroBatch,
    hidden: &Tensor,
    temperature: f64,
    entropy: Entropy,
    chunk: usize,
) -> Logprobs<'a> {
    let shape = mb.targets.size();
    let width = *hidden.size().last().unwrap_or(&0);
    let index = mb.response_index();
    let targets = mb.targets.reshape([-1]).index_select(0, &index);
    let at = Positions {
        index,
        targets,
        shape,
        chunk,
        kept: mb.kept.as_ref().map(KeptPositions::shallow_clone),
    };
    let flat = hidden.reshape([-1, width]);
    let positions = at.targets.size()[0] as usize;
    if !hidden.requires_grad() || positions <= chunk {
        // One graph over at most one chunk, or no graph at all: the head as it is.
        let (logp, entropy) = at.head_values(net, &flat, temperature, entropy);
        return Logprobs {
            logp: at.scatter(&logp),
            entropy: entropy.map(|e| at.scatter(&e)),
            recompute: None,
        };
    }
    let (logp, ent) = tch::no_grad(|| at.head_values(net, &flat.detach(), temperature, entropy));
    let logp = logp.set_requires_grad(true);
    let ent = ent.map(|e| match entropy {
        Entropy::Loss => e.set_requires_grad(true),
        _ => e,
    });
    Logprobs {
        logp: at.scatter(&logp),
        entropy: ent.as_ref().map(|e| at.scatter(e)),
        recompute: Some(HeadRecompute {
            net,
            hidden: hidden.shallow_clone(),
            at,
            temperature,
            logp,
            entropy: ent.filter(|_| entropy == Entropy::Loss),
        }),
    }
}

/// The positions of a micro-batch that predict a response token, and their targets.
struct Positions {
    /// Flat indices into [lines × T].
    index: Tensor,
    targets: Tensor,
    /// [lines, T].
    shape: Vec<i64>,
    chunk: usize,
    /// The sampler's kept sets, where it truncated.
    kept: Option<KeptPositions>,
}

impl Positions {
    /// The chunks' ranges over the positions.
    fn chunks(&self) -> impl Iterator<Item = (i64, i64)> {
        let n = self.targets.size()[0];
        let chunk = i64::try_from(self.chunk).unwrap_or(i64::MAX).max(1);
        (0..n)
            .step_by(self.chunk.max(1))
            .map(move |start| (start, chunk.min(n - start)))
    }

    /// Log-probs (and entropies, unless `Skip`) at every position, [positions], chunk by
    /// chunk from the flat hidden states [lines × T, hidden], each with a graph where `flat`
    /// has one.
    fn head_values(
        &self,
        net: &Transformer,
        flat: &Tensor,
        temperature: f64,
        entropy: Entropy,
    ) -> (Tensor, Option<Tensor>) {
        let (mut logps, mut ents) = (Vec::new(), Vec::new());
        for (start, len) in self.chunks() {
            let (logp, ent) = self.chunk_values(net, flat, start, len, temperature, entropy);
            logps.push(logp);
            ents.extend(ent);
        }
        let cat = |parts: &[Tensor]| match parts {
            [one] => one.shallow_clone(),
            // No response position: an empty tensor still in `flat`'s graph, so a loss built
            // on it has a backward (of zero gradients), as one over the whole head would.
            [] => flat.narrow(0, 0, 0).sum_dim_intlist(-1, false, Kind::Float),
            _ => Tensor::cat(parts, 0),
        };
        let entropy = (entropy != Entropy::Skip).then(|| cat(&ents));
        (cat(&logps), entropy)
    }

    /// The head at positions `start..start + len`.
    fn chunk_values(
        &self,
        net: &Transformer,
        flat: &Tensor,
        start: i64,
        len: i64,
        temperature: f64,
        entropy: Entropy,
    ) -> (Tensor, Option<Tensor>) {
        let rows = flat.index_select(0, &self.index.narrow(0, start, len));
        let logits = net.logits(&rows).to_kind(Kind::Float);
        let logits = if temperature > 0.0 && temperature != 1.0 {
            logits / temperature
        } else {
            logits
        };
        // Where the sampler truncated, the distribution is over its kept ids, renormalised.
        let allowed = self
            .kept
            .as_ref()
            .and_then(|k| k.allowed(start, len, logits.size()[1]));
        let logits = match &allowed {
            Some(a) => logits.masked_fill(&a.logical_not(), f64::NEG_INFINITY),
            None => logits,
        };
        let logp_all = logits.log_softmax(-1, Kind::Float);
        let targets = self.targets.narrow(0, start, len).unsqueeze(1);
        let logp = logp_all.gather(1, &targets, false).squeeze_dim(1);
        // p·log p of a dropped id is 0 (not 0·−∞): its log-prob counts as 0 there.
        let of = |l: &Tensor| {
            let finite = match &allowed {
                Some(a) => l.masked_fill(&a.logical_not(), 0.0),
                None => l.shallow_clone(),
            };
            -(l.exp() * finite).sum_dim_intlist(-1, false, Kind::Float)
        };
        let entropy = match entropy {
            Entropy::Skip => None,
            Entropy::Metric => Some(tch::no_grad(|| of(&logp_all.detach()))),
            Entropy::Loss => Some(of(&logp_all)),
        };
        (logp, entropy)
    }

    /// `values` [positions] placed at their positions of a [lines, T] tensor of zeros (with
    /// a graph back to `values` where they have one).
    fn scatter(&self, values: &Tensor) -> Tensor {
        let n: i64 = self.shape.iter().product();
        Tensor::zeros([n], (Kind::Float, values.device()))
            .index_copy(0, &self.index, values)
            .view(self.shape.as_slice())
    }
}

/// The head's backward when it ran in chunks under autograd: what the loss's gradient
/// reaches (the log-probs and entropies, as leaves) and what it must go on to (the hidden
/// states, in the graph of the layers).
struct HeadRecompute<'a> {
    net: &'a Transformer,
    hidden: Tensor,
    at: Positions,
    temperature: f64,
    logp: Tensor,
    /// Set when the entropy is a term of the loss.
    entropy: Option<Tensor>,
}

impl HeadRecompute<'_> {
    /// Chunk by chunk: the head again with a graph from a leaf copy of the hidden states,
    /// backpropagated from Σ logp·∂L/∂logp (+ Σ H·∂L/∂H), which leaves the head's weight
    /// gradients and the chunk's hidden-state gradients as one backward would; then the
    /// hidden states' gradient goes on through the layers.
    fn backward(self) {
        let grad_logp = self.logp.grad();
        let entropy_grad = self
            .entropy
            .as_ref()
            .map(Tensor::grad)
            .filter(Tensor::defined);
        if !grad_logp.defined() && entropy_grad.is_none() {
            // The loss did not reach the log-probs: nothing flows into the model.
            return;
        }
        let width = *self.hidden.size().last().unwrap_or(&0);
        let leaf = self.hidden.detach().set_requires_grad(true);
        let flat = leaf.reshape([-1, width]);
        let want = match entropy_grad {
            Some(_) => Entropy::Loss,
            None => Entropy::Skip,
        };
        for (start, len) in self.at.chunks() {
            let (logp, ent) =
                self.at
                    .chunk_values(self.net, &flat, start, len, self.temperature, want);
            let mut seeded = Tensor::zeros([], (Kind::Float, logp.device()));
            if grad_logp.defined() {
                seeded += (logp * grad_logp.narrow(0, start, len)).sum(Kind::Float);
            }
            if let (Some(ent), Some(grad)) = (ent, &entropy_grad) {
                seeded += (ent * grad.narrow(0, start, len)).sum(Kind::Float);
            }
            seeded.backward();
        }
        let grad = leaf.grad();
        if grad.defined() && self.hidden.requires_grad() {
            (&self.hidden * grad).sum(Kind::Float).backward();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LoraConfig, Model, ModelConfig, ModelOptions};
    use crate::trainer::batch::TrainRow;
    use tch::Device;

    /// Three rows of unequal prompts and responses, one with a masked response token.
    fn rows() -> Vec<TrainRow> {
        let row = |tokens: Vec<u32>, prompt_len: usize, loss_mask: Vec<u8>| TrainRow {
            behavior_logp: vec![0.0; loss_mask.len()],
            advantages: vec![0.5; loss_mask.len()],
            loss_weight: 0.1,
            tokens,
            prompt_len,
            loss_mask,
            ..Default::default()
        };
        vec![
            row(vec![1, 5, 9, 3, 4, 7], 3, vec![1, 1, 1]),
            row(vec![2, 6, 11, 12], 2, vec![1, 0]),
            row(vec![8, 3, 3, 3, 10, 2, 5], 4, vec![1, 1, 1]),
        ]
    }

    fn model() -> Model {
        let cfg = ModelConfig::tiny_qwen2(16, 32, 2, 4, 2, 64, 32);
        Model::random(&cfg, Device::Cpu, 7).expect("a tiny model")
    }

    /// A loss that reads every log-prob and entropy, as the policy loss does.
    fn loss_of(lp: &Logprobs, mb: &MicroBatch) -> Tensor {
        let weights = &mb.mask * 0.7 + 0.3;
        let ent = lp.entropy.as_ref().map_or(Tensor::from(0.0), |e| {
            (e * &mb.mask).sum(Kind::Float) * 0.05
        });
        -((&lp.logp * 1.3).exp() * weights).sum(Kind::Float) - ent
    }

    /// The log-probs, entropies, loss and every parameter's gradient of one training forward
    /// with the head run `chunk` positions at a time.
    fn pass(model: &Model, chunk: usize, entropy: Entropy) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        pass_over(model, &rows(), chunk, entropy)
    }

    /// [`pass`] over `rows`.
    fn pass_over(
        model: &Model,
        rows: &[TrainRow],
        chunk: usize,
        entropy: Entropy,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let refs: Vec<&TrainRow> = rows.iter().collect();
        let mb = MicroBatch::padded(&refs, Device::Cpu);
        for mut t in model.vs.trainable_variables() {
            t.zero_grad();
        }
        let hidden = mb.hidden(&model.net);
        let lp = logprobs_in_chunks(&model.net, &mb, &hidden, 0.8, entropy, chunk);
        let flat = |t: &Tensor| Vec::<f32>::try_from(t.detach().reshape([-1])).unwrap();
        let logp = flat(&lp.logp);
        let ent = lp.entropy.as_ref().map(flat).unwrap_or_default();
        loss_of(&lp, &mb).backward();
        lp.backward();
        let mut grads = Vec::new();
        for v in model.vs.trainable_variables() {
            if v.grad().defined() {
                grads.extend(flat(&v.grad()));
            }
        }
        (logp.into_iter().chain(ent).collect(), grads, flat(&hidden))
    }

    /// A row one token longer than the model's positions (a sample the engine ended at a full
    /// context, its last position predicting one more token) reads exactly those positions:
    /// it trains, as `StepRollout::fail_longer_than` lets it.
    #[test]
    fn a_row_one_token_longer_than_the_context_trains() {
        let cfg = ModelConfig::tiny_qwen2(16, 32, 2, 4, 2, 64, 6);
        let model = Model::random(&cfg, Device::Cpu, 7).expect("a tiny model");
        let full = TrainRow {
            tokens: vec![1, 5, 9, 3, 4, 7, 2],
            prompt_len: 3,
            loss_mask: vec![1; 4],
            behavior_logp: vec![0.0; 4],
            advantages: vec![0.5; 4],
            loss_weight: 0.1,
            ..Default::default()
        };
        let (values, grads, _) = pass_over(&model, &[full], 64, Entropy::Skip);
        assert_eq!(values.len(), 6);
        assert!(values.iter().all(|v| v.is_finite()), "{values:?}");
        assert!(grads.iter().any(|&g| g != 0.0));
    }

    fn assert_close(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(worst < 1e-5, "{what}: max |Δ| {worst}");
    }

    /// In chunks of 1 or 2 positions, the head gives the log-probs, entropies and gradients of
    /// one whole pass (entropy as a metric and as a loss term), and the gradients are not all
    /// zero: the backward really reached the model.
    #[test]
    fn chunked_head_equals_the_whole_head() {
        let model = model();
        for entropy in [Entropy::Metric, Entropy::Loss, Entropy::Skip] {
            let (values, grads, _) = pass(&model, usize::MAX, entropy);
            assert!(grads.iter().any(|g| *g != 0.0), "{entropy:?}: no gradient");
            for chunk in [1, 2, 5] {
                let (v, g, _) = pass(&model, chunk, entropy);
                assert_close(&v, &values, &format!("{entropy:?} chunk {chunk} values"));
                assert_close(&g, &grads, &format!("{entropy:?} chunk {chunk} gradients"));
            }
        }
    }

    /// Where rows carry a sampler's kept sets, the log-probs are the log-softmax over the kept
    /// ids only (the others masked out), elsewhere the whole one's; in chunks the values and
    /// gradients (entropy a term of the loss, whose p·log p must not turn the masked ids' 0·∞
    /// into NaN) equal one whole pass's.
    #[test]
    fn kept_sets_restrict_the_log_softmax_in_every_chunking() {
        let model = model();
        let mut rows = rows();
        rows[0].kept.push(&[9, 3, 0]);
        rows[0].kept.push(&[]);
        rows[0].kept.push(&[7, 11]);
        rows[2].kept.push(&[10]);
        rows[2].kept.push(&[2, 5]);
        rows[2].kept.push(&[5, 1, 14, 13]);
        let refs: Vec<&TrainRow> = rows.iter().collect();
        let mb = MicroBatch::padded(&refs, Device::Cpu);
        let hidden = tch::no_grad(|| mb.hidden(&model.net));
        let lp =
            tch::no_grad(|| logprobs_in_chunks(&model.net, &mb, &hidden, 0.8, Entropy::Skip, 2));
        // By hand: the log-softmax of the scaled logits over the kept ids.
        let logits = tch::no_grad(|| model.net.logits(&hidden) / 0.8);
        let by_hand = |line: i64, col: i64, kept: &[i64], target: i64| {
            let l = logits.get(line).get(col);
            let kept_l = l.index_select(0, &Tensor::from_slice(kept));
            l.double_value(&[target]) - kept_l.logsumexp([0], false).double_value(&[])
        };
        let got = |line: i64, col: i64| lp.logp.double_value(&[line, col]);
        // Row 0 (prompt 3, response [3, 4, 7]): id 3 is predicted at column 2 from [9, 3, 0];
        // id 4, at column 3, has no set: the whole distribution.
        assert!((got(0, 2) - by_hand(0, 2, &[9, 3, 0], 3)).abs() < 1e-5);
        let whole = logits.get(0).get(3).log_softmax(0, Kind::Float);
        assert!((got(0, 3) - whole.double_value(&[4])).abs() < 1e-5);
        // Row 2 (prompt 4, response [10, 2, 5]): a set of one is certain; id 5 at column 5.
        assert_eq!(got(2, 3), 0.0);
        assert!((got(2, 5) - by_hand(2, 5, &[5, 1, 14, 13], 5)).abs() < 1e-5);
        // The entropy is −Σ p·log p of that same distribution: over the kept ids where there
        // is a set (one of a single id is certain: 0), over the whole vocabulary where not.
        let lp =
            tch::no_grad(|| logprobs_in_chunks(&model.net, &mb, &hidden, 0.8, Entropy::Metric, 2));
        let entropy = lp.entropy.as_ref().expect("an entropy metric");
        let entropy_by_hand = |line: i64, col: i64, kept: Option<&[i64]>| {
            let l = logits.get(line).get(col);
            let l = match kept {
                Some(kept) => l.index_select(0, &Tensor::from_slice(kept)),
                None => l,
            };
            let logp = Vec::<f64>::try_from(l.log_softmax(0, Kind::Double)).unwrap();
            -logp.iter().map(|lp| lp.exp() * lp).sum::<f64>()
        };
        for (line, col, kept) in [
            (0, 2, Some(&[9, 3, 0][..])),
            (0, 3, None),
            (2, 3, Some(&[10][..])),
            (2, 5, Some(&[5, 1, 14, 13][..])),
        ] {
            let (got, want) = (
                entropy.double_value(&[line, col]),
                entropy_by_hand(line, col, kept),
            );
            assert!(
                (got - want).abs() < 1e-5,
                "entropy at ({line}, {col}): {got} vs {want}"
            );
        }
        assert!(entropy.double_value(&[0, 3]) > entropy.double_value(&[0, 2]));
        for entropy in [Entropy::Metric, Entropy::Loss] {
            let (values, grads, _) = pass_over(&model, &rows, usize::MAX, entropy);
            assert!(
                values.iter().chain(&grads).all(|x| x.is_finite()),
                "{entropy:?}"
            );
            for chunk in [1, 2] {
                let (v, g, _) = pass_over(&model, &rows, chunk, entropy);
                assert_close(&v, &values, &format!("{entropy:?} chunk {chunk} values"));
                assert_close(&g, &grads, &format!("{entropy:?} chunk {chunk} gradients"));
            }
        }
    }

    /// The log-probs are the full log-softmax's at each position that predicts a response
    /// token, and 0 at prompt and padding positions; the chunked no-grad path gives the same.
    #[test]
    fn logprobs_are_the_log_softmax_at_response_positions_only() {
        let model = model();
        let rows = rows();
        let refs: Vec<&TrainRow> = rows.iter().collect();
        let mb = MicroBatch::padded(&refs, Device::Cpu);
        let hidden = tch::no_grad(|| mb.hidden(&model.net));
        let full = tch::no_grad(|| {
            (model.net.logits(&hidden) / 0.8)
                .log_softmax(-1, Kind::Float)
                .gather(2, &mb.targets.unsqueeze(2), false)
                .squeeze_dim(2)
        });
        let response = mb.response_tensor(&rows, 0.0, |_, _| 1.0);
        let want = Vec::<f32>::try_from((full * &response).reshape([-1])).unwrap();
        for chunk in [1, 3, usize::MAX] {
            let lp = tch::no_grad(|| {
                logprobs_in_chunks(&model.net, &mb, &hidden, 0.8, Entropy::Skip, chunk)
            });
            let got = Vec::<f32>::try_from(lp.logp.reshape([-1])).unwrap();
            assert_close(&got, &want, &format!("chunk {chunk}"));
        }
        // 8 response tokens in all; the masked one is a response token too.
        assert_eq!(response.sum(Kind::Float).double_value(&[]), 8.0);
    }

    /// With LoRA, the frozen head gets no gradient and the adapters get the same ones chunked
    /// or whole.
    #[test]
    fn chunked_head_trains_adapters_as_the_whole_one() {
        let cfg = ModelConfig::tiny_qwen2(16, 32, 2, 4, 2, 64, 32);
        let options = ModelOptions {
            lora: LoraConfig {
                rank: 4,
                ..Default::default()
            },
            ..Default::default()
        };
        let model = Model::random_with(&cfg, &options, Device::Cpu, 3).expect("a tiny model");
        // Non-zero B matrices, so every adapter's gradient flows.
        tch::no_grad(|| {
            for (name, mut v) in model.vs.variables() {
                if name.contains("lora_B") {
                    v.copy_(&(Tensor::randn_like(&v) * 0.1));
                }
            }
        });
        let (values, grads, _) = pass(&model, usize::MAX, Entropy::Metric);
        assert!(!grads.is_empty() && grads.iter().any(|g| *g != 0.0));
        let (v, g, _) = pass(&model, 2, Entropy::Metric);
        assert_close(&v, &values, "values");
        assert_close(&g, &grads, "adapter gradients");
    }

    /// A micro-batch without a response position trains nothing, and its loss still has a
    /// backward.
    #[test]
    fn a_micro_batch_without_responses_backpropagates_zeros() {
        let model = model();
        let row = TrainRow {
            tokens: vec![1, 2, 3],
            prompt_len: 3,
            ..Default::default()
        };
        let mb = MicroBatch::padded(&[&row], Device::Cpu);
        let hidden = mb.hidden(&model.net);
        let lp = logprobs_in_chunks(&model.net, &mb, &hidden, 1.0, Entropy::Metric, 4);
        assert!(lp.logp.requires_grad());
        loss_of(&lp, &mb).backward();
        lp.backward();
        for v in model.vs.trainable_variables() {
            let g = v.grad();
            assert!(!g.defined() || g.abs().max().double_value(&[]) == 0.0);
        }
    }

    #[test]
    fn a_real_vocabulary_is_chunked() {
        assert_eq!(chunk_positions(49_152), 682);
        assert!(
            chunk_positions(64) > 100_000,
            "a tiny vocabulary is never chunked"
        );
    }
}
