//! Rows → the tensors of one micro-batch (laid out by `pack`), and per-token log-probs of the
//! targets.
//!
//! A row is prompt ++ response token ids, exactly as sampled, and is fed without its last token
//! ([`input_len`]). The logit at a token's column predicts the row's next token, so every
//! per-token tensor here is [lines, T], aligned with `input`, and `targets` holds the next
//! tokens.

use super::kept::KeptPositions;
use super::pack::{attention_mask, input_len, LineAttention, MicroPlan};
use crate::model::transformer::positions_like;
use crate::model::{
    packed_kernel, AttnMode, PackedKernel, Recompute, Span, Spans, Transformer, ValueModel, Varlen,
    VarlenSeq,
};
use crate::trainer::batch::TrainRow;
use std::borrow::Borrow;
use tch::{Device, Kind, Tensor};

/// How a micro-batch's attention is computed.
enum Attention {
    /// One row per line.
    Causal,
    /// Packed lines under a dense [lines, 1, T, T] mask.
    Mask(Tensor),
    /// Packed lines, span by span.
    Spans(Spans),
    /// Packed lines as variable-length sequences of one fused kernel.
    Varlen(Varlen),
}

/// The spans of a packed plan: every segment (placed end to end from column 0), with the
/// index of its shared prefix's segment and the mask that reads it.
fn span_plan(plan: &MicroPlan, device: Device) -> Spans {
    let lines = plan
        .lines
        .iter()
        .map(|line| {
            line.iter()
                .map(|s| Span {
                    len: s.len as i64,
                    prefix: s.context.as_ref().map(|c| {
                        let at = line.iter().position(|p| p.col == c.start);
                        let at = at.expect("a shared prefix is a segment of its line");
                        let (n, ctx) = (s.len as i64, c.len() as i64);
                        let own = Tensor::ones([n, n], (Kind::Bool, device)).tril(0);
                        let prefix = Tensor::ones([n, ctx], (Kind::Bool, device));
                        (at, Tensor::cat(&[prefix, own], 1))
                    }),
                })
                .collect()
        })
        .collect();
    Spans {
        lines,
        width: plan.width as i64,
    }
}

/// The sequences of a packed plan for [`Varlen`]: every segment, reading its shared prefix,
/// and each line's unused tail as a sequence of its own (computed, never read).
fn varlen_plan(plan: &MicroPlan, device: Device) -> Varlen {
    let width = plan.width as i64;
    let mut seqs = Vec::new();
    for (l, line) in plan.lines.iter().enumerate() {
        let at = l as i64 * width;
        let mut end = 0;
        for s in line {
            let (col, len) = (s.col as i64, s.len as i64);
            seqs.push(VarlenSeq {
                queries: at + col..at + col + len,
                context: s
                    .context
                    .as_ref()
                    .map(|c| at + c.start as i64..at + c.end as i64),
            });
            end = col + len;
        }
        if end < width {
            seqs.push(VarlenSeq {
                queries: at + end..at + width,
                context: None,
            });
        }
    }
    Varlen::new(&seqs, device)
}

/// One micro-batch's layout and what every pass reads: the token ids, positions, attention,
/// targets and loss mask. What only one kind of pass reads is built by that pass from the same
/// layout: [`PolicyInputs`] for the policy loss, [`CriticInputs`] for the value loss.
pub struct MicroBatch {
    pub input: Tensor,
    /// Position of each token in its own row (packed lines restart them); None: 0..T.
    pub positions: Option<Tensor>,
    /// Which keys each query reads.
    attention: Attention,
    pub targets: Tensor,
    /// 1 at every response token the policy sampled, 0 elsewhere.
    pub mask: Tensor,
    /// Per row of the plan: its index in the step's rows, and (line, column) of the position
    /// that predicts its first response token.
    places: Vec<(usize, (usize, usize))>,
    /// Per row of the plan: its response tokens.
    response_lens: Vec<usize>,
    /// What a truncated sampler kept at each response position, when a row has sets.
    pub kept: Option<KeptPositions>,
    shape: [i64; 2],
    device: Device,
}

impl MicroBatch {
    /// One right-padded row per line, in the given order.
    pub fn padded(rows: &[&TrainRow], device: Device) -> Self {
        let lens: Vec<usize> = rows.iter().map(|r| input_len(r)).collect();
        let plan = MicroPlan::one_per_line((0..rows.len()).collect(), &lens);
        MicroBatch::new(rows, &plan, device)
    }

    /// The tensors of micro-batch `plan` over the step's `rows`, packed lines under the
    /// device's kernel ([`packed_kernel`]).
    pub fn new<R: Borrow<TrainRow>>(rows: &[R], plan: &MicroPlan, device: Device) -> Self {
        let kernel = packed_kernel(device, plan.attention == LineAttention::Spans);
        MicroBatch::build(rows, plan, device, kernel)
    }

    /// As [`MicroBatch::new`], with the kernel of a packed plan chosen.
    fn build<R: Borrow<TrainRow>>(
        rows: &[R],
        plan: &MicroPlan,
        device: Device,
        kernel: PackedKernel,
    ) -> Self {
        let (b, t) = (plan.lines.len().max(1), plan.width.max(1));
        let n = b * t;
        let (mut input, mut targets, mut positions) = (vec![0i64; n], vec![0i64; n], vec![0i64; n]);
        let mut places = vec![(0, (0, 0)); plan.rows.len()];
        let mut response_lens = vec![0; plan.rows.len()];
        for (l, line) in plan.lines.iter().enumerate() {
            for s in line {
                let r: &TrainRow = rows[plan.rows[s.row]].borrow();
                for i in 0..s.len {
                    let (at, k) = (l * t + s.col + i, s.skip + i);
                    input[at] = r.tokens[k] as i64;
                    targets[at] = r.tokens.get(k + 1).map_or(0, |&x| x as i64);
                    positions[at] = k as i64;
                }
                if !s.prefix {
                    // Response token k sits at row position prompt_len + k, predicted from
                    // the one before it.
                    places[s.row] = (plan.rows[s.row], (l, s.col + r.prompt_len - 1 - s.skip));
                    response_lens[s.row] = r.loss_mask.len();
                }
            }
        }
        let shape = [b as i64, t as i64];
        let ids = |v: &[i64]| Tensor::from_slice(v).view(shape).to_device(device);
        let input = ids(&input);
        let (positions, attention) = match (plan.attention, kernel) {
            (LineAttention::Causal, _) => (None, Attention::Causal),
            (_, PackedKernel::Spans) => (
                Some(ids(&positions)),
                Attention::Spans(span_plan(plan, device)),
            ),
            (_, PackedKernel::Varlen) => (
                Some(ids(&positions)),
                Attention::Varlen(varlen_plan(plan, device)),
            ),
            (_, PackedKernel::Mask) => {
                let m = Tensor::from_slice(&attention_mask(plan))
                    .view([b as i64, 1, t as i64, t as i64])
                    .to_device(device);
                (Some(ids(&positions)), Attention::Mask(m))
            }
        };
        let mut mb = MicroBatch {
            targets: ids(&targets),
            input,
            positions,
            attention,
            mask: Tensor::new(),
            kept: None,
            places,
            response_lens,
            shape,
            device,
        };
        mb.mask = mb.response_tensor(rows, 0.0, |r, k| r.loss_mask[k] as f32);
        let row = |i: usize| -> &TrainRow { rows[i].borrow() };
        // Untruncated sampling (no row with sets) costs no walk over the positions.
        if mb.places.iter().any(|&(i, _)| !row(i).kept.is_empty()) {
            let sets = mb.places.iter().flat_map(|&(i, _)| {
                let r = row(i);
                (0..r.loss_mask.len()).map(move |k| r.kept.get(k))
            });
            mb.kept = KeptPositions::new(sets, device);
        }
        mb
    }

    /// A [lines, T] tensor holding `at(row, k)` at the position that predicts response token
    /// k of each row, and `fill` everywhere else (prompts, padding).
    pub fn response_tensor<R: Borrow<TrainRow>>(
        &self,
        rows: &[R],
        fill: f32,
        at: impl Fn(&TrainRow, usize) -> f32,
    ) -> Tensor {
        let width = self.shape[1] as usize;
        let mut out = vec![fill; self.shape.iter().product::<i64>() as usize];
        for &(i, (line, first)) in &self.places {
            let r: &TrainRow = rows[i].borrow();
            for k in 0..r.loss_mask.len() {
                out[line * width + first + k] = at(r, k);
            }
        }
        Tensor::from_slice(&out)
            .view(self.shape)
            .to_device(self.device)
    }

    /// The index of each position's row among this micro-batch's rows (0..rows), int64
    /// [lines, T] (0 off the rows' responses), and the number of rows: a sequence-level loss
    /// (GSPO) averages over each row's tokens with it. A row is whole in one micro-batch.
    pub fn sequence_index(&self) -> (Tensor, i64) {
        let width = self.shape[1] as usize;
        let mut out = vec![0i64; self.shape.iter().product::<i64>() as usize];
        for (j, (&(_, (line, first)), &n)) in
            self.places.iter().zip(&self.response_lens).enumerate()
        {
            out[line * width + first..line * width + first + n].fill(j as i64);
        }
        let index = Tensor::from_slice(&out)
            .view(self.shape)
            .to_device(self.device);
        (index, self.places.len() as i64)
    }

    /// Flat indices into [lines × T] of every position that predicts a response token (loss
    /// mask 0 or 1), row by row: where log-probs are read.
    pub fn response_index(&self) -> Tensor {
        let width = self.shape[1] as usize;
        let index: Vec<i64> = self
            .places
            .iter()
            .zip(&self.response_lens)
            .flat_map(|(&(_, (line, first)), &n)| {
                (0..n).map(move |k| (line * width + first + k) as i64)
            })
            .collect();
        Tensor::from_slice(&index).to_device(self.device)
    }

    /// Final hidden states of every position.
    pub fn hidden(&self, net: &Transformer) -> Tensor {
        let (positions, mode) = self.attention_mode();
        net.hidden(&self.input, &positions, mode)
    }

    /// [`MicroBatch::hidden`] for a forward that trains: with `checkpoint` (activation
    /// checkpointing), only each layer's input is kept, and the returned [`Recompute`] must run
    /// its backward after the loss's; without, there is none and the loss's backward is all.
    pub fn train_hidden<'a>(
        &'a self,
        net: &'a Transformer,
        checkpoint: bool,
    ) -> (Tensor, Option<Recompute<'a>>) {
        let (positions, mode) = self.attention_mode();
        if checkpoint {
            let (hidden, recompute) = net.hidden_checkpointed(&self.input, &positions, mode);
            (hidden, Some(recompute))
        } else {
            (net.hidden(&self.input, &positions, mode), None)
        }
    }

    fn attention_mode(&self) -> (Tensor, AttnMode<'_>) {
        let positions = match &self.positions {
            Some(p) => p.shallow_clone(),
            None => positions_like(&self.input),
        };
        let mode = match &self.attention {
            Attention::Causal => AttnMode::Causal,
            Attention::Mask(m) => AttnMode::Masked(m),
            Attention::Spans(s) => AttnMode::Spans(s),
            Attention::Varlen(v) => AttnMode::Varlen(v),
        };
        (positions, mode)
    }

    /// The critic's values of every position, [lines, T].
    pub fn values(&self, critic: &ValueModel) -> Tensor {
        let (positions, mode) = self.attention_mode();
        critic.values_at(&self.input, &positions, mode)
    }

    /// [`MicroBatch::values`] for the value loss's forward, with activation checkpointing
    /// as [`MicroBatch::train_hidden`].
    pub fn train_values<'a>(
        &'a self,
        critic: &'a ValueModel,
        checkpoint: bool,
    ) -> (Tensor, Option<Recompute<'a>>) {
        let (hidden, recompute) = self.train_hidden(&critic.net, checkpoint);
        (critic.score(&hidden), recompute)
    }

    /// Per-token values of a [lines, T] tensor at each row's response positions, by row.
    pub fn response_values(&self, values: &Tensor, rows: &[&TrainRow]) -> Vec<Vec<f32>> {
        let flat = Vec::<f32>::try_from(
            values
                .to_kind(Kind::Float)
                .to_device(Device::Cpu)
                .contiguous()
                .view([-1]),
        )
        .unwrap_or_default();
        let width = values.size()[1] as usize;
        rows.iter()
            .zip(&self.places)
            .map(|(r, &(_, (line, first)))| {
                let start = line * width + first;
                flat[start..start + r.loss_mask.len()].to_vec()
            })
            .collect()
    }
}

/// What the policy loss reads of a micro-batch besides the forward's log-probs, each
/// [lines, T] and 0 outside the rows' response tokens.
pub struct PolicyInputs {
    /// Loss mask times the row's aggregation weight (0 for padding rows).
    pub loss_weights: Tensor,
    pub advantages: Tensor,
    /// π_old per token where the row brought one.
    old_logp: Tensor,
    /// 1 where the row brought its π_old log-prob; 0 where the forward's own detached log-prob
    /// stands in (rows of a step's first optimizer step, see `trainer::prepare`).
    has_old: Tensor,
    /// π_ref per token, when a KL term is on.
    pub ref_logp: Option<Tensor>,
    /// Importance weight of each token's surrogate against its behavior policy (1 elsewhere).
    pub importance_weights: Tensor,
}

impl PolicyInputs {
    /// The policy loss's inputs of `mb` over the step's `rows`; π_ref only with `reference`.
    pub fn new<R: Borrow<TrainRow>>(mb: &MicroBatch, rows: &[R], reference: bool) -> Self {
        let at = |v: &[f32], k: usize, or: f32| v.get(k).copied().unwrap_or(or);
        PolicyInputs {
            loss_weights: mb.response_tensor(rows, 0.0, |r, k| {
                r.loss_mask[k] as f32 * r.loss_weight as f32
            }),
            advantages: mb.response_tensor(rows, 0.0, |r, k| r.advantages[k]),
            old_logp: mb.response_tensor(rows, 0.0, |r, k| at(&r.old_logp, k, 0.0)),
            has_old: mb
                .response_tensor(rows, 0.0, |r, k| f32::from(u8::from(k < r.old_logp.len()))),
            ref_logp: reference
                .then(|| mb.response_tensor(rows, 0.0, |r, k| at(&r.ref_logp, k, 0.0))),
            importance_weights: mb
                .response_tensor(rows, 1.0, |r, k| at(&r.importance_weights, k, 1.0)),
        }
    }

    /// π_old per token: the row's own where it brought one, else the forward's `logp`
    /// (detached: π_old is a constant of the loss).
    pub fn old_logp_or(&self, logp: &Tensor) -> Tensor {
        self.old_logp
            .where_self(&self.has_old.gt(0.5), &logp.detach())
    }
}

/// What the value loss reads of a micro-batch besides the critic's values, each [lines, T].
pub struct CriticInputs {
    /// The value loss's weight of each position: the loss loss_weights, or where a row names the
    /// positions its value loss trains ([`TrainRow::value_mask`]), those only.
    pub value_loss_weights: Tensor,
    pub old_values: Tensor,
    pub returns: Tensor,
}

impl CriticInputs {
    /// The value loss's inputs of `mb` over the step's `rows`.
    pub fn new<R: Borrow<TrainRow>>(mb: &MicroBatch, rows: &[R]) -> Self {
        let at = |v: &[f32], k: usize| v.get(k).copied().unwrap_or(0.0);
        CriticInputs {
            value_loss_weights: mb.response_tensor(rows, 0.0, |r, k| match r.value_mask.get(k) {
                None if r.value_mask.is_empty() => r.loss_mask[k] as f32 * r.loss_weight as f32,
                Some(&v) if v != 0 => r.value_loss_weight as f32,
                _ => 0.0,
            }),
            old_values: mb.response_tensor(rows, 0.0, |r, k| at(&r.old_values, k)),
            returns: mb.response_tensor(rows, 0.0, |r, k| at(&r.returns, k)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trainer::update::head::{token_logprobs, Entropy};

    #[test]
    fn response_tokens_align_with_their_predicting_position() {
        let row = TrainRow {
            tokens: vec![5, 6, 7, 8],
            prompt_len: 2,
            loss_mask: vec![1, 0],
            behavior_logp: vec![-0.5, -0.7],
            advantages: vec![2.0, 2.0],
            loss_weight: 0.25,
            ..Default::default()
        };
        let mb = MicroBatch::padded(&[&row], Device::Cpu);
        assert_eq!(
            Vec::<i64>::try_from(mb.targets.view([-1])).unwrap(),
            vec![6, 7, 8]
        );
        // target 7 (first response token) is at index 1; target 8 is masked out.
        assert_eq!(
            Vec::<f32>::try_from(mb.mask.view([-1])).unwrap(),
            vec![0.0, 1.0, 0.0]
        );
        let policy = PolicyInputs::new(&mb, &[&row], false);
        assert_eq!(
            Vec::<f32>::try_from(policy.loss_weights.view([-1])).unwrap(),
            vec![0.0, 0.25, 0.0]
        );
        assert_eq!(
            Vec::<f32>::try_from(policy.advantages.view([-1])).unwrap(),
            vec![0.0, 2.0, 2.0]
        );
        assert!(policy.ref_logp.is_none(), "no reference, no π_ref tensor");
    }

    /// The value loss weighs every loss token by the row's weight, unless the row names the
    /// positions that have a value target: then those only, by the row's value weight.
    #[test]
    fn the_value_loss_weighs_only_the_positions_with_a_target() {
        let mut row = TrainRow {
            tokens: vec![5, 6, 7, 8, 9],
            prompt_len: 2,
            loss_mask: vec![1, 0, 1],
            behavior_logp: vec![0.0; 3],
            advantages: vec![0.0; 3],
            loss_weight: 0.25,
            ..Default::default()
        };
        let weights = |row: &TrainRow| {
            let mb = MicroBatch::padded(&[row], Device::Cpu);
            let critic = CriticInputs::new(&mb, &[row]);
            Vec::<f32>::try_from(critic.value_loss_weights.view([-1])).unwrap()
        };
        assert_eq!(weights(&row), vec![0.0, 0.25, 0.0, 0.25]);
        row.value_mask = vec![0, 0, 1];
        row.value_loss_weight = 0.5;
        assert_eq!(weights(&row), vec![0.0, 0.0, 0.0, 0.5]);
    }

    /// The same rows (two groups sharing prompts, rows of other lengths) padded, packed under
    /// a mask, packed span by span, and sharing prompts both ways: equal log-probs of every
    /// response token, and equal gradients of a loss over them.
    #[test]
    fn every_layout_gives_the_same_logprobs_and_gradients() {
        use super::super::pack::micro_batches;
        use crate::model::{Model, ModelConfig};
        use crate::trainer::config::Batching;
        let cfg = ModelConfig::tiny_qwen2(16, 32, 2, 2, 1, 64, 64);
        let model = Model::random(&cfg, Device::Cpu, 5).unwrap();
        let mut rows = Vec::new();
        for g in 0..2u32 {
            let prompt: Vec<u32> = (0..6 + g).map(|i| 1 + (i * 7 + g) % 15).collect();
            for s in 0..3u32 {
                let n = 2 + (s * 5 + g) as usize % 7;
                let mut tokens = prompt.clone();
                tokens.extend((0..n as u32).map(|i| 1 + (i * 3 + s + g) % 15));
                rows.push(TrainRow {
                    tokens,
                    prompt_len: prompt.len(),
                    loss_mask: (0..n).map(|k| u8::from(k != 1)).collect(),
                    behavior_logp: vec![0.0; n],
                    advantages: vec![0.0; n],
                    loss_weight: 0.01 * (1 + s) as f64,
                    ..Default::default()
                });
            }
        }
        let all: Vec<usize> = (0..rows.len()).collect();
        let run = |packing, shared_prefix, kernel| {
            let b = Batching {
                micro_batch_tokens: 4096,
                packing,
                shared_prefix,
            };
            let plans = micro_batches(&rows, &all, &b);
            assert_eq!(plans.len(), 1);
            let p = &plans[0];
            let mb = MicroBatch::build(&rows, p, Device::Cpu, kernel);
            model
                .vs
                .trainable_variables()
                .iter_mut()
                .for_each(|t| t.zero_grad());
            let lp = token_logprobs(&model.net, &mb, 1.0, Entropy::Skip);
            let logp = lp.logp.shallow_clone();
            let loss_weights = PolicyInputs::new(&mb, &rows, false).loss_weights;
            (&logp * &loss_weights).sum(Kind::Float).backward();
            lp.backward();
            let batch: Vec<&TrainRow> = p.rows.iter().map(|&i| &rows[i]).collect();
            let mut by_row = vec![Vec::new(); rows.len()];
            for (&i, v) in p.rows.iter().zip(mb.response_values(&logp, &batch)) {
                by_row[i] = v;
            }
            let grads: Vec<f32> = model
                .vs
                .trainable_variables()
                .iter()
                .flat_map(|t| Vec::<f32>::try_from(t.grad().view([-1])).unwrap())
                .collect();
            (by_row, grads)
        };
        let (want_logp, want_grad) = run(false, false, PackedKernel::Mask);
        // The padded reference against a plain forward of each whole row.
        for (r, got) in rows.iter().zip(&want_logp) {
            let ids: Vec<i64> = r.tokens.iter().map(|&t| t as i64).collect();
            let input = Tensor::from_slice(&ids).view([1, -1]);
            let logp = tch::no_grad(|| model.net.forward(&input))
                .log_softmax(-1, Kind::Float)
                .get(0);
            for (k, got) in got.iter().enumerate() {
                let at = r.prompt_len + k - 1;
                let want = logp.double_value(&[at as i64, ids[at + 1]]);
                assert!((want - *got as f64).abs() < 1e-5, "{want} vs {got}");
            }
        }
        for shared in [false, true] {
            for kernel in [
                PackedKernel::Mask,
                PackedKernel::Spans,
                PackedKernel::Varlen,
            ] {
                let (logp, grad) = run(true, shared, kernel);
                for (a, b) in logp.iter().flatten().zip(want_logp.iter().flatten()) {
                    assert!((a - b).abs() < 1e-5, "{shared} {kernel:?}: {a} vs {b}");
                }
                let worst = grad
                    .iter()
                    .zip(&want_grad)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                let size = want_grad.iter().map(|g| g.abs()).fold(0f32, f32::max);
                assert!(
                    size > 1e-3 && worst < 1e-5 * size.max(1.0),
                    "{worst} of {size}"
                );
            }
        }
    }

    /// As a metric, the entropy is the same numbers as the loss's but has no autograd graph,
    /// so its vocabulary-sized intermediates are freed at once instead of living until the
    /// backward pass; as a loss term it keeps its gradient.
    #[test]
    fn entropy_as_a_metric_keeps_no_graph() {
        use crate::model::{Model, ModelConfig};
        let cfg = ModelConfig::tiny_qwen2(16, 32, 1, 2, 1, 64, 32);
        let model = Model::random(&cfg, Device::Cpu, 2).unwrap();
        let row = TrainRow {
            tokens: vec![3, 4, 5, 6],
            prompt_len: 2,
            loss_mask: vec![1, 1],
            behavior_logp: vec![0.0; 2],
            advantages: vec![0.0; 2],
            ..Default::default()
        };
        let mb = MicroBatch::padded(&[&row], Device::Cpu);
        let entropy = |e| token_logprobs(&model.net, &mb, 0.7, e).entropy;
        let (metric, loss) = (
            entropy(Entropy::Metric).unwrap(),
            entropy(Entropy::Loss).unwrap(),
        );
        assert!(!metric.requires_grad() && loss.requires_grad());
        let diff = (&metric - &loss).abs().max().double_value(&[]);
        // Positive at both response positions (the prompt's is never computed).
        let at_responses = metric.masked_select(&mb.mask.gt(0.5));
        assert!(
            diff < 1e-6 && at_responses.size() == [2] && at_responses.min().double_value(&[]) > 0.0,
            "{diff}"
        );
        assert!(entropy(Entropy::Skip).is_none());
    }
}
