//! Decode steps of fixed shapes, replayed as CUDA graphs (`rollout.cuda_graphs`).
//!
//! A decode step of a small model on a GPU costs its kernel launches more than its
//! arithmetic: a few hundred launches of a few microseconds of host time each. A CUDA graph
//! records a step's kernels once and replays them with one launch, but only a step whose
//! shapes and memory never change. So a step here is of one of a few shapes:
//!
//! - **the batch padded** to the next power of two (at most the engine's slots): a padding row
//!   decodes token 0 at position 0 into a scratch slot no sequence owns;
//! - **the cache read up to a span bucket**: the next power of two above the step's furthest
//!   position (at least 16, at most the cache's capacity), each row masked past its own;
//! - **the step's inputs copied into tensors the shape owns**, which its graph reads.
//!
//! A shape is computed directly (eagerly) the first time it is used, captured on its second
//! use, and replayed after: a shape the run needs once costs no capture. Sampling reads the
//! replayed logits before any other shape replays (all graphs of a run share one memory
//! pool, so one graph's replay may write where another's outputs were). Off CUDA nothing is
//! captured and every step is computed eagerly in these shapes: the same numbers, which is
//! how the CPU tests them.
//!
//! The graphs live as long as the run (`Engine::run`): they read the decoding copy's weights
//! and the run's cache where they were when captured.

use super::cuda_graph::CudaGraph;
use crate::model::{AttnMode, KvCache, Transformer};
use std::collections::HashMap;
use tch::{Device, Tensor};

/// The fewest cached positions a step reads: steps at the start of short contexts share one
/// shape.
const MIN_SPAN: i64 = 16;

pub struct GraphDecoder {
    /// The engine's slots; the cache holds one more, the scratch slot (index `slots`), which
    /// padding rows write to and nothing attends to.
    slots: i64,
    capacity: i64,
    /// Whether shapes are captured (CUDA), or computed eagerly (elsewhere).
    capture: bool,
    shapes: HashMap<(i64, i64), Shape>,
    graphs: Vec<Captured>,
    /// Whether graphs stopped for this run, once one failed (the reason is printed then):
    /// steps go back to the engine's ordinary decode.
    stopped: bool,
    /// How the last step's forward ran, until its time is recorded.
    last: Option<StepKind>,
    times: StepTimes,
}

/// How a decode step's forward ran.
#[derive(Debug, Clone, Copy)]
enum StepKind {
    Replayed,
    /// Captured, the capture's warm-up computing this step's logits.
    Captured,
    /// Computed directly in its fixed shape: a shape's first use, or any step off CUDA.
    Eager,
}

/// Decode steps' count and wall time, by how their forward ran. A step's time is the
/// engine's whole step: forward, sampling, reading the sampled tokens back (which waits for
/// the device) and handing finished requests on. A step whose every row takes a reused
/// session's next prompt token samples nothing and reads nothing back: its time is only what
/// launching it took. Graphs live for one run, so what keeping them between runs would save is the
/// captured and eager steps' time beyond a replayed step's.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct StepTimes {
    /// (steps, seconds)
    pub replayed: (usize, f64),
    pub captured: (usize, f64),
    pub eager: (usize, f64),
}

impl StepTimes {
    /// Both runs' steps.
    pub fn combined(self, other: StepTimes) -> StepTimes {
        let sum = |a: (usize, f64), b: (usize, f64)| (a.0 + b.0, a.1 + b.1);
        StepTimes {
            replayed: sum(self.replayed, other.replayed),
            captured: sum(self.captured, other.captured),
            eager: sum(self.eager, other.eager),
        }
    }
}

/// One fixed shape: [batch, span].
struct Shape {
    /// The step's rows as the graph reads them: [3, batch] of last tokens, positions, slots.
    inputs: Tensor,
    uses: usize,
    graph: Option<usize>,
}

/// A captured shape. The logits are declared first so they are dropped first: they live in
/// the graph's memory pool, which the graph releases.
struct Captured {
    /// The logits each replay writes: [batch, vocab].
    logits: Tensor,
    graph: CudaGraph,
}

impl GraphDecoder {
    /// For a run of `slots` slots of `capacity` positions on `device`: its cache needs
    /// [`GraphDecoder::cache_slots`] slots.
    pub fn new(slots: usize, capacity: i64, device: Device) -> Self {
        GraphDecoder {
            slots: slots as i64,
            capacity,
            capture: device.is_cuda(),
            shapes: HashMap::new(),
            graphs: Vec::new(),
            stopped: false,
            last: None,
            times: StepTimes::default(),
        }
    }

    /// Shapes captured so far.
    pub fn captures(&self) -> usize {
        self.graphs.len()
    }

    /// The recorded steps' times so far.
    pub fn step_times(&self) -> StepTimes {
        self.times
    }

    /// Records the wall time of the step whose logits [`GraphDecoder::logits`] last gave; a
    /// step decoded without graphs (they stopped) is not recorded.
    pub fn record_step(&mut self, seconds: f64) {
        let into = match self.last.take() {
            Some(StepKind::Replayed) => &mut self.times.replayed,
            Some(StepKind::Captured) => &mut self.times.captured,
            Some(StepKind::Eager) => &mut self.times.eager,
            None => return,
        };
        into.0 += 1;
        into.1 += seconds;
    }

    /// The slots the run's cache holds: the engine's and the scratch slot.
    pub fn cache_slots(&self) -> usize {
        self.slots as usize + 1
    }

    /// The logits [n, vocab] of one decode step whose rows are `host` ([3, n] end to end:
    /// last tokens, positions, slots), computed in the step's fixed shape. `None` once graphs
    /// failed for this run (the reason is printed once): the caller decodes as it would
    /// without them.
    pub fn logits(
        &mut self,
        net: &Transformer,
        cache: &mut KvCache,
        host: &[i64],
    ) -> Option<Tensor> {
        (!self.stopped).then_some(())?;
        let n = (host.len() / 3) as i64;
        let furthest = host[n as usize..2 * n as usize]
            .iter()
            .max()
            .copied()
            .unwrap_or(0);
        let key = (
            batch_bucket(n, self.slots),
            span_bucket(furthest + 1, self.capacity),
        );
        let padded = self.padded(host, key.0);
        let (inputs, uses, graph) = {
            let shape = self.shapes.entry(key).or_insert_with(|| Shape {
                inputs: Tensor::zeros([3, key.0], (tch::Kind::Int64, net.device())),
                uses: 0,
                graph: None,
            });
            shape
                .inputs
                .copy_(&Tensor::from_slice(&padded).view([3, key.0]));
            shape.uses += 1;
            (shape.inputs.shallow_clone(), shape.uses, shape.graph)
        };
        let (kind, result) = match graph {
            Some(g) => {
                let captured = &self.graphs[g];
                let replayed = captured
                    .graph
                    .replay()
                    .map(|()| captured.logits.shallow_clone());
                (StepKind::Replayed, replayed)
            }
            None if self.capture && uses >= 2 => (
                StepKind::Captured,
                self.capture_shape(net, cache, key, &inputs),
            ),
            None => (
                StepKind::Eager,
                Ok(step_logits(net, cache, &inputs, key.1, false)),
            ),
        };
        match result {
            Ok(logits) => {
                self.last = Some(kind);
                Some(logits.narrow(0, 0, n))
            }
            Err(why) => {
                eprintln!("skein: decoding without CUDA graphs from here on: {why}");
                self.stopped = true;
                None
            }
        }
    }

    /// Captures the step of shape `key` (its first use ran it eagerly) and returns the
    /// logits of this step, which the capture's warm-up computed.
    fn capture_shape(
        &mut self,
        net: &Transformer,
        cache: &mut KvCache,
        key: (i64, i64),
        inputs: &Tensor,
    ) -> Result<Tensor, String> {
        let device = match net.device() {
            Device::Cuda(i) => i,
            other => return Err(format!("no CUDA graphs on {other:?}")),
        };
        // Every shape shares the first one's stream and memory pool: one step's intermediates.
        let mut graph = CudaGraph::new(device, self.graphs.first().map(|c| &c.graph))?;
        let (now, replayed) = graph.capture(|| step_logits(net, cache, inputs, key.1, false))?;
        self.graphs.push(Captured {
            logits: replayed,
            graph,
        });
        if let Some(shape) = self.shapes.get_mut(&key) {
            shape.graph = Some(self.graphs.len() - 1);
        }
        Ok(now)
    }

    /// `host`'s rows followed by padding rows up to `batch`, as [3, batch] end to end.
    fn padded(&self, host: &[i64], batch: i64) -> Vec<i64> {
        let n = host.len() / 3;
        let pad = batch as usize - n;
        let mut rows = Vec::with_capacity(3 * batch as usize);
        for (part, fill) in [(0, 0), (1, 0), (2, self.slots)] {
            rows.extend_from_slice(&host[part * n..(part + 1) * n]);
            rows.extend(std::iter::repeat_n(fill, pad));
        }
        rows
    }
}

/// The most memory the captured shapes' logits of one run hold: every (batch, span) shape
/// of `slots` slots and `capacity` positions captured, each keeping its [batch, vocab] logits
/// of `element_bytes` each (the graphs' intermediates share one pool, the size of one step's).
pub fn captured_logits_bound(slots: usize, capacity: i64, vocab: usize, element_bytes: f64) -> f64 {
    let buckets = |last: i64, bucket: &dyn Fn(i64) -> i64| {
        let mut seen: Vec<i64> = (1..=last).map(bucket).collect();
        seen.dedup();
        seen
    };
    let batches = buckets(slots as i64, &|n| batch_bucket(n, slots as i64));
    let spans = buckets(capacity, &|s| span_bucket(s, capacity));
    let rows: i64 = batches.iter().sum();
    rows as f64 * spans.len() as f64 * vocab as f64 * element_bytes
}

/// The batch a step of `n` rows is padded to, of an engine of `slots` slots.
fn batch_bucket(n: i64, slots: i64) -> i64 {
    (n.max(1) as u64).next_power_of_two().min(slots as u64) as i64
}

/// The cached positions a step whose furthest row reads `span` of them reads, in a cache of
/// `capacity` positions.
fn span_bucket(span: i64, capacity: i64) -> i64 {
    (span.max(MIN_SPAN) as u64)
        .next_power_of_two()
        .min(capacity as u64) as i64
}

/// The logits [A, vocab] of one decode step whose rows are `step` ([3, A] on the device: last
/// tokens, positions, slots), reading the first `span` cached positions of each slot. `dense`:
/// the slots are exactly 0..A, so the cache is read as a view.
pub fn step_logits(
    net: &Transformer,
    cache: &mut KvCache,
    step: &Tensor,
    span: i64,
    dense: bool,
) -> Tensor {
    let (input, positions, slots) = (step.get(0).view([-1, 1]), step.get(1), step.get(2));
    let mask = crate::model::kv_cache::decode_mask(&positions, span, net.kind());
    let hidden = net.hidden(
        &input,
        &positions.view([-1, 1]),
        AttnMode::Decode {
            cache,
            slots: &slots,
            positions: &positions,
            mask: &mask,
            span,
            dense,
        },
    );
    net.logits(&hidden.squeeze_dim(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DecodeForm, Dtype, LoraConfig, Model, ModelConfig, ModelOptions};
    use tch::Kind;

    /// A step of three rows runs in the shape [4, 16]: the padding row writes only the scratch
    /// slot, the three rows get the logits the step's own shape gives, and a step of five rows
    /// at position 20 takes the shape [6, 32] (the batch capped at the slots, 6).
    #[test]
    fn a_step_runs_in_its_bucket_and_padding_touches_only_the_scratch_slot() {
        let cfg = ModelConfig::tiny_qwen2(40, 32, 2, 4, 2, 64, 64);
        let model = Model::random(&cfg, Device::Cpu, 5).expect("a tiny model");
        let net = model.net.for_decoding();
        let mut graphs = GraphDecoder::new(6, 40, Device::Cpu);
        let cache_for = || {
            KvCache::new(
                2,
                graphs.cache_slots() as i64,
                40,
                2,
                8,
                Kind::Float,
                Device::Cpu,
            )
        };
        let (mut fixed, mut plain) = (cache_for(), cache_for());
        // Rows: tokens 3, 9, 27 at positions 0 in slots 1, 4, 2.
        let host = [3i64, 9, 27, 0, 0, 0, 1, 4, 2];
        let got = tch::no_grad(|| graphs.logits(&net, &mut fixed, &host)).expect("no failure");
        let want = tch::no_grad(|| {
            let step = Tensor::from_slice(&host).view([3, 3]);
            step_logits(&net, &mut plain, &step, 1, false)
        });
        assert_eq!(got.size(), [3, 40]);
        assert!((&got - &want).abs().max().double_value(&[]) < 1e-5);
        assert_eq!(graphs.shapes.keys().copied().collect::<Vec<_>>(), [(4, 16)]);
        // The padding row wrote the scratch slot's first position, and no other slot.
        let keys = |cache: &KvCache, slot: i64| cache.slot_keys(0, slot).abs().sum(Kind::Float);
        assert!(keys(&fixed, 6).double_value(&[]) > 0.0);
        for slot in 0..6 {
            let diff = (keys(&fixed, slot) - keys(&plain, slot))
                .abs()
                .double_value(&[]);
            assert!(diff < 1e-4, "slot {slot}: {diff}");
        }

        let host = [1i64, 2, 3, 4, 5, 20, 20, 20, 20, 20, 0, 1, 2, 3, 5];
        let got = tch::no_grad(|| graphs.logits(&net, &mut fixed, &host)).expect("no failure");
        assert_eq!(got.size(), [5, 40]);
        assert!(graphs.shapes.contains_key(&(6, 32)));

        // A step's time goes to how its forward ran (eagerly, off CUDA), once.
        graphs.record_step(0.25);
        graphs.record_step(0.5);
        assert_eq!(graphs.step_times().eager, (1, 0.25));
        let both = graphs.step_times().combined(graphs.step_times());
        assert_eq!((both.eager, both.replayed), ((2, 0.5), (0, 0.0)));
    }

    /// A capture records kernels without running them, so a step that reads a value back to
    /// the host (an `item`, a `nonzero`) cannot be captured, and fails only on a GPU. The
    /// fixed-shape step of CUDA's decoding form reads nothing back, in float32 and in
    /// bfloat16 with adapters.
    #[test]
    fn a_fixed_shape_step_reads_nothing_back_to_the_host() {
        let cfg = ModelConfig::tiny_qwen2(40, 32, 2, 4, 2, 64, 64);
        for (dtype, rank) in [(Dtype::Float32, 0), (Dtype::Bfloat16, 4)] {
            let options = ModelOptions {
                dtype,
                lora: LoraConfig {
                    rank,
                    ..Default::default()
                },
            };
            let model = Model::random_with(&cfg, &options, Device::Cpu, 2).expect("a tiny model");
            let net = model.net.for_decoding_as(DecodeForm::Fused);
            let mut graphs = GraphDecoder::new(4, 40, Device::Cpu);
            let mut cache = KvCache::new(
                2,
                graphs.cache_slots() as i64,
                40,
                2,
                8,
                net.kind(),
                Device::Cpu,
            );
            let host = [3i64, 9, 27, 5, 2, 7, 0, 1, 3];
            let (logits, ops) =
                crate::op_count::count(|| tch::no_grad(|| graphs.logits(&net, &mut cache, &host)));
            assert!(logits.is_some());
            let steps: Vec<&String> = ops.computing.iter().map(|(name, _)| name).collect();
            assert!(
                steps.iter().any(|n| n.contains("scaled_dot_product")),
                "{steps:?}"
            );
            for read in [
                "_local_scalar_dense",
                "item",
                "nonzero",
                "masked_select",
                "unique",
            ] {
                assert!(
                    !steps.iter().any(|n| n.contains(read)),
                    "{dtype:?}: {read} in {steps:?}"
                );
            }
        }
    }

    /// The bound counts each batch bucket once per span bucket: 6 slots pad to 1, 2, 4 and 6
    /// rows, and 40 positions are read in spans of 16, 32 and 40.
    #[test]
    fn the_logits_bound_counts_every_shape_once() {
        let bytes = captured_logits_bound(6, 40, 10, 2.0);
        assert_eq!(bytes, ((1 + 2 + 4 + 6) * 3 * 10 * 2) as f64);
    }
}
