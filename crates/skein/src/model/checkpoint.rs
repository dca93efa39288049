//! Activation checkpointing of the decoder's training forward: keep only each layer's input,
//! and run each layer again during the backward. A forward's autograd graph holds every
//! layer's intermediate tensors (norms, projections, attention, the MLP's wide activations)
//! until the backward; this holds one [B, T, hidden] tensor per layer instead, and the
//! activations of one layer at a time, for one extra forward of every layer.
//!
//! libtorch's custom autograd functions are not reachable from Rust, so the backward is split
//! by hand: the layers run without a graph, the last one's output becomes a leaf that the
//! loss's backward leaves its gradient on, and [`Recompute::backward`] carries that gradient
//! back layer by layer (each recomputed from its saved input), then into the embedding.

use super::transformer::{AttnMode, Transformer};
use tch::{Kind, Tensor};

/// What the backward of a checkpointed forward needs: every layer's saved input and the
/// leaf the loss's gradient arrives at. Run [`Recompute::backward`] after the loss's
/// `backward()`; dropping it instead leaves the layers' and the embedding's gradients out.
pub struct Recompute<'a> {
    net: &'a Transformer,
    mode: AttnMode<'a>,
    /// The rotary tables of the forward, reused by every recomputed layer.
    cos: Tensor,
    sin: Tensor,
    /// Layer i's input, outside any graph (the first is the embedding's output).
    inputs: Vec<Tensor>,
    /// The embedding's output, in the graph of the embedding weight.
    embedded: Tensor,
    /// The last layer's output as a leaf: the loss's backward leaves its gradient here.
    last: Tensor,
}

impl Transformer {
    /// [`Transformer::hidden`] for a training forward with activation checkpointing: the
    /// layers run without a graph, keeping only their inputs; the final norm (and whatever the
    /// caller computes from the result) runs with one. The gradients of the layers and the
    /// embedding arrive once the caller runs the returned [`Recompute::backward`] after its
    /// loss's backward; together they equal those of [`Transformer::hidden`].
    ///
    /// Training modes only (`Causal`, `Masked`, `Spans`, `Varlen`): the cache modes write keys and values
    /// as they go, which a recomputation would write again.
    pub fn hidden_checkpointed<'a>(
        &'a self,
        input_ids: &Tensor,
        positions: &Tensor,
        mut mode: AttnMode<'a>,
    ) -> (Tensor, Recompute<'a>) {
        assert!(
            matches!(
                mode,
                AttnMode::Causal | AttnMode::Masked(_) | AttnMode::Spans(_) | AttnMode::Varlen(_)
            ),
            "activation checkpointing is for training forwards, not KV-cache ones"
        );
        let embedded = self.embed_tokens(input_ids);
        let (cos, sin) = self.rope_tables(positions, embedded.kind());
        let mut inputs = Vec::with_capacity(self.layers());
        let mut x = embedded.detach();
        tch::no_grad(|| {
            for i in 0..self.layers() {
                let y = self.block_forward(i, &x, &cos, &sin, &mut mode);
                inputs.push(std::mem::replace(&mut x, y));
            }
        });
        let last = x.detach().set_requires_grad(true);
        let hidden = self.final_norm(&last);
        let recompute = Recompute {
            net: self,
            mode,
            cos,
            sin,
            inputs,
            embedded,
            last,
        };
        (hidden, recompute)
    }
}

impl Recompute<'_> {
    /// The backward through the layers and the embedding, after the loss's backward has left
    /// the gradient of the last layer's output: from the last layer to the first, recompute
    /// the layer from its saved input with a graph, backpropagate the gradient through it
    /// (accumulating its parameters' gradients, as one whole backward would) and take its
    /// input's gradient on to the layer before. Each layer's graph is freed before the next is
    /// built, so one layer's activations live at a time.
    pub fn backward(self) {
        let Recompute {
            net,
            mut mode,
            cos,
            sin,
            inputs,
            embedded,
            last,
        } = self;
        let mut grad = last.grad();
        if !grad.defined() {
            // The loss did not reach the hidden states: nothing flows into the layers.
            return;
        }
        for (i, x) in inputs.into_iter().enumerate().rev() {
            let x = x.set_requires_grad(true);
            // Exact only while a layer is deterministic: a layer with dropout (LoRA's) would
            // need the forward's random numbers again here.
            let y = net.block_forward(i, &x, &cos, &sin, &mut mode);
            backward_with(&y, &grad);
            grad = x.grad();
        }
        // A frozen embedding (LoRA) needs nothing; a trained one gets the first layer's input
        // gradient, added to what the tied LM head already left on it.
        if embedded.requires_grad() {
            backward_with(&embedded, &grad);
        }
    }
}

/// Backpropagates `grad` (dLoss/d`y`) through `y`'s graph: libtorch's `backward(gradient)`,
/// which tch does not expose. d(Σ y·g)/dy is exactly g, so the gradients it accumulates are
/// those a backward seeded with `grad` would.
fn backward_with(y: &Tensor, grad: &Tensor) {
    (y * grad).sum(Kind::Float).backward();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::{Span, Spans, Varlen, VarlenSeq};
    use crate::model::transformer::positions_like;
    use crate::model::{Model, ModelConfig};
    use tch::{Device, Kind, Tensor};

    /// Which attention a test forward runs under.
    enum Layout {
        Causal,
        Masked,
        Spans,
        Varlen,
    }

    /// Two lines of 10 tokens: right-padded rows for `Causal`; for the packed layouts, line 0
    /// holds rows of 6 and 4 tokens end to end, line 1 a prefix of 4 and two continuations of
    /// 3 that share it (`Spans`; under `Masked`, a row of 4 and two of 3).
    fn inputs(
        layout: &Layout,
    ) -> (
        Tensor,
        Tensor,
        Option<Tensor>,
        Option<Spans>,
        Option<Varlen>,
    ) {
        let ids = Tensor::arange(20, (Kind::Int64, Device::Cpu))
            .remainder(15)
            .view([2, 10])
            + 1;
        let rows: [&[i64]; 2] = [&[6, 4], &[4, 3, 3]];
        let positions: Vec<i64> = rows
            .iter()
            .flat_map(|r| r.iter().flat_map(|&n| 0..n))
            .collect();
        let positions = Tensor::from_slice(&positions).view([2, 10]);
        match layout {
            Layout::Causal => (ids.shallow_clone(), positions_like(&ids), None, None, None),
            Layout::Masked => {
                let block = |n: i64| Tensor::ones([n, n], (Kind::Float, Device::Cpu)).tril(0);
                let line = |r: &[i64]| {
                    let blocks: Vec<Tensor> = r.iter().map(|&n| block(n)).collect();
                    Tensor::block_diag(&blocks).gt(0.5).unsqueeze(0)
                };
                let mask = Tensor::stack(&[line(rows[0]), line(rows[1])], 0);
                (ids, positions, Some(mask), None, None)
            }
            Layout::Spans | Layout::Varlen => {
                let shared = |n: i64, ctx: i64| {
                    let own = Tensor::ones([n, n], (Kind::Bool, Device::Cpu)).tril(0);
                    let prefix = Tensor::ones([n, ctx], (Kind::Bool, Device::Cpu));
                    Some((0, Tensor::cat(&[prefix, own], 1)))
                };
                let span = |len, prefix| Span { len, prefix };
                let spans = Spans {
                    lines: vec![
                        vec![span(6, None), span(4, None)],
                        vec![span(4, None), span(3, shared(3, 4)), span(3, shared(3, 4))],
                    ],
                    width: 10,
                };
                let positions = [
                    0i64, 1, 2, 3, 4, 5, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 4, 5, 6,
                ];
                let positions = Tensor::from_slice(&positions).view([2, 10]);
                if matches!(layout, Layout::Spans) {
                    return (ids, positions, None, Some(spans), None);
                }
                let seq = |queries, context| VarlenSeq { queries, context };
                let varlen = Varlen::new(
                    &[
                        seq(0..6, None),
                        seq(6..10, None),
                        seq(10..14, None),
                        seq(14..17, Some(10..14)),
                        seq(17..20, Some(10..14)),
                    ],
                    Device::Cpu,
                );
                (ids, positions, None, None, Some(varlen))
            }
        }
    }

    /// The final hidden states and every parameter's gradient of a loss over the logits
    /// (all of them weighted by fixed random numbers), with or without checkpointing.
    fn run(model: &Model, layout: &Layout, checkpoint: bool) -> (Tensor, Vec<Tensor>) {
        let (ids, positions, mask, spans, varlen) = inputs(layout);
        let mode = match (&mask, &spans, &varlen) {
            (Some(m), _, _) => AttnMode::Masked(m),
            (_, Some(s), _) => AttnMode::Spans(s),
            (_, _, Some(v)) => AttnMode::Varlen(v),
            _ => AttnMode::Causal,
        };
        for mut v in model.vs.trainable_variables() {
            v.zero_grad();
        }
        let (hidden, recompute) = if checkpoint {
            let (h, r) = model.net.hidden_checkpointed(&ids, &positions, mode);
            (h, Some(r))
        } else {
            (model.net.hidden(&ids, &positions, mode), None)
        };
        let logp = model.net.logits(&hidden).log_softmax(-1, Kind::Float);
        // Fixed weights that need no global seed: other tests draw from libtorch's generator
        // on other threads, which made two calls here weigh the log-probs differently.
        let weights = Tensor::arange(logp.numel() as i64, (Kind::Float, Device::Cpu))
            .sin()
            .view(logp.size().as_slice());
        (logp * weights).sum(Kind::Float).backward();
        if let Some(r) = recompute {
            r.backward();
        }
        let grads = crate::model::sorted_trainable(&model.vs)
            .iter()
            .map(|(_, v)| v.grad().copy())
            .collect();
        (hidden.detach(), grads)
    }

    /// Largest difference between two lists of tensors, and the largest magnitude in the
    /// first.
    fn worst(a: &[Tensor], b: &[Tensor]) -> (f64, f64) {
        a.iter().zip(b).fold((0.0, 0.0), |(d, m), (a, b)| {
            let diff = (a - b).abs().max().double_value(&[]);
            (d.max(diff), m.max(a.abs().max().double_value(&[])))
        })
    }

    /// Checkpointing changes no hidden state and no gradient (float32), under every training
    /// attention, with tied and untied embeddings and with a frozen embedding.
    #[test]
    fn checkpointed_gradients_equal_the_plain_ones() {
        for (tied, frozen_embedding) in [(true, false), (false, false), (true, true)] {
            let mut cfg = ModelConfig::tiny_qwen2(16, 32, 3, 4, 2, 64, 64);
            cfg.tie_word_embeddings = tied;
            let model = Model::random(&cfg, Device::Cpu, 7).unwrap();
            if frozen_embedding {
                let _ = model.vs.variables()["model.embed_tokens.weight"].set_requires_grad(false);
            }
            for layout in [
                Layout::Causal,
                Layout::Masked,
                Layout::Spans,
                Layout::Varlen,
            ] {
                let (want_hidden, want) = run(&model, &layout, false);
                let (hidden, got) = run(&model, &layout, true);
                let (dh, _) = worst(&[hidden], &[want_hidden]);
                assert!(dh < 1e-6, "hidden states differ by {dh}");
                assert_eq!(got.len(), want.len());
                let (diff, size) = worst(&got, &want);
                assert!(
                    size > 1e-3 && diff <= 1e-5 * size,
                    "tied {tied}, frozen {frozen_embedding}: gradients differ by {diff} of {size}"
                );
            }
        }
    }
}
