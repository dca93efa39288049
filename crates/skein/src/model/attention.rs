//! How packed lines attend, and which kernel computes it on which device: the one place
//! that choice is made ([`packed_kernel`]); and how a decode step's single queries attend to
//! the cache ([`decode`]).
//!
//! A packed line holds several rows end to end, and a row may read a shared prefix placed
//! before it in the same line (`trainer/update/pack.rs` lays them out). Three kernels compute
//! the same attention:
//!
//! - **Mask**: one dense [width × width] mask per line through `scaled_dot_product_attention`.
//!   Cheapest on the CPU for narrow lines.
//! - **Spans** ([`Spans`]): span by span, each against its own keys and its prefix's. On the
//!   CPU it beats the mask for wide lines, whose mask computes every query against every key.
//!   On a GPU its launch per span is what costs.
//! - **Varlen** ([`Varlen`]): every span a variable-length sequence of one fused kernel call
//!   per layer (flash attention in half precision, memory-efficient attention in float32 and
//!   where flash refuses the GPU, `csrc/varlen_attention.cpp`), keys gathered once per layer
//!   so that a row's sequence is its prefix and itself. No mask, no loop. CUDA only;
//!   elsewhere [`Varlen`] computes the same numbers sequence by sequence, which the tests use
//!   to hold it to the other two.

use std::ops::Range;
use tch::{Device, Kind, Tensor};

/// The kernel of a micro-batch of packed lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedKernel {
    Mask,
    Spans,
    Varlen,
}

/// The fastest kernel for packed lines on `device`: on CUDA the fused variable-length one;
/// on the CPU spans for `wide` lines (laid out one per micro-batch) and a mask for narrow
/// ones (`skein bench train-tokens` measures each).
pub fn packed_kernel(device: Device, wide: bool) -> PackedKernel {
    match (device.is_cuda(), wide) {
        (true, _) => PackedKernel::Varlen,
        (false, true) => PackedKernel::Spans,
        (false, false) => PackedKernel::Mask,
    }
}

/// Attention of one new token per sequence against its cached keys (a decode step): `q`
/// [A, heads, 1, D], `k` and `v` [A, kv heads, span, D], `mask` [A, 1, 1, span].
///
/// The query heads of a group share one key head, so they are laid out as that head's queries
/// ([A, kv heads, group, D]), all at one position and under one mask: plain attention then
/// reads each cached key once. Passed as grouped-query attention instead, the cache is
/// expanded to every query head first, and on CUDA a mask with grouping leaves only the
/// unfused kernel; this way the memory-efficient kernel takes it.
pub fn decode(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Tensor {
    let (a, heads, one, d) = q.size4().expect("queries are [batch, heads, 1, dim]");
    let kv_heads = k.size()[1];
    let grouped = q.reshape([a, kv_heads, heads / kv_heads * one, d]);
    Tensor::scaled_dot_product_attention(&grouped, k, v, Some(mask), 0.0, false, None, false)
        .view([a, heads, one, d])
}

/// Spans of packed lines, for [`super::AttnMode::Spans`].
pub struct Spans {
    /// Per line, its spans end to end from column 0; columns after the last are padding.
    pub lines: Vec<Vec<Span>>,
    pub width: i64,
}

/// A run of tokens of one line that attends causally to itself, and to all of a shared
/// prefix.
pub struct Span {
    pub len: i64,
    /// The prefix: the index of its span in the line, and the mask [len, prefix + len] (the
    /// prefix, then causal over the span).
    pub prefix: Option<(usize, Tensor)>,
}

impl Spans {
    /// Attention of every span; padding columns get zeros. Lines and spans are taken apart
    /// with one split each (not a slice per span), so the backward joins their gradients once
    /// instead of adding a full-size tensor per span.
    pub(super) fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, gqa: bool) -> Tensor {
        let (heads, head_dim) = (q.size()[1], q.size()[3]);
        let (qs, ks, vs) = (q.split(1, 0), k.split(1, 0), v.split(1, 0));
        let lines: Vec<Tensor> = self
            .lines
            .iter()
            .enumerate()
            .map(|(l, spans)| {
                let mut sizes: Vec<i64> = spans.iter().map(|s| s.len).collect();
                let tail = self.width - sizes.iter().sum::<i64>();
                if tail > 0 {
                    sizes.push(tail);
                }
                let q = qs[l].split_with_sizes(&sizes, 2);
                let k = ks[l].split_with_sizes(&sizes, 2);
                let v = vs[l].split_with_sizes(&sizes, 2);
                let mut out: Vec<Tensor> = spans
                    .iter()
                    .enumerate()
                    .map(|(c, s)| match &s.prefix {
                        Some((p, mask)) => {
                            let kc = Tensor::cat(&[&k[*p], &k[c]], 2);
                            let vc = Tensor::cat(&[&v[*p], &v[c]], 2);
                            Tensor::scaled_dot_product_attention(
                                &q[c],
                                &kc,
                                &vc,
                                Some(mask),
                                0.0,
                                false,
                                None,
                                gqa,
                            )
                        }
                        None => Tensor::scaled_dot_product_attention(
                            &q[c],
                            &k[c],
                            &v[c],
                            None::<Tensor>,
                            0.0,
                            true,
                            None,
                            gqa,
                        ),
                    })
                    .collect();
                if tail > 0 {
                    out.push(Tensor::zeros(
                        [1, heads, tail, head_dim],
                        (q[0].kind(), q[0].device()),
                    ));
                }
                Tensor::cat(&out, 2)
            })
            .collect();
        Tensor::cat(&lines, 0)
    }
}

/// One sequence of a [`Varlen`] layout, in flat columns (line × width + column) of the
/// micro-batch: its queries, and the shared prefix it reads before them.
pub struct VarlenSeq {
    pub queries: Range<i64>,
    pub context: Option<Range<i64>>,
}

/// Packed lines as variable-length sequences. Every column of the micro-batch is the query of
/// exactly one sequence, in order; a sequence's keys are its context's columns, then its own.
pub struct Varlen {
    /// Flat columns of every sequence's keys, end to end; None when they are the queries'
    /// own (no sequence reads a prefix), so no gather is needed.
    key_index: Option<Tensor>,
    /// Cumulative query and key counts [sequences + 1], int32 on the device, for the kernel;
    /// and the same on the host.
    cu_q: Tensor,
    cu_k: Tensor,
    bounds_q: Vec<i64>,
    bounds_k: Vec<i64>,
    max_q: i64,
    max_k: i64,
}

impl Varlen {
    pub fn new(seqs: &[VarlenSeq], device: Device) -> Self {
        let (mut bounds_q, mut bounds_k, mut keys) = (vec![0i64], vec![0i64], Vec::new());
        let (mut max_q, mut max_k, mut gather) = (0, 0, false);
        for s in seqs {
            let ctx = s.context.clone().unwrap_or(0..0);
            gather |= !ctx.is_empty();
            keys.extend(ctx.clone().chain(s.queries.clone()));
            let (q, k) = (s.queries.end - s.queries.start, ctx.end - ctx.start);
            bounds_q.push(bounds_q.last().copied().unwrap_or(0) + q);
            bounds_k.push(bounds_k.last().copied().unwrap_or(0) + q + k);
            (max_q, max_k) = (max_q.max(q), max_k.max(q + k));
        }
        let int32 = |v: &[i64]| Tensor::from_slice(v).to_kind(Kind::Int).to_device(device);
        Varlen {
            key_index: gather.then(|| Tensor::from_slice(&keys).to_device(device)),
            cu_q: int32(&bounds_q),
            cu_k: int32(&bounds_k),
            bounds_q,
            bounds_k,
            max_q,
            max_k,
        }
    }

    /// Attention of `q` [B, heads, T, D] against `k`, `v` [B, kv heads, T, D], as `q`'s shape.
    pub(super) fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let (b, heads, t, d) = q.size4().expect("queries are [batch, heads, time, dim]");
        let kv_heads = k.size()[1];
        let flat = |x: &Tensor, h: i64| x.transpose(1, 2).reshape([b * t, h, d]);
        let keys = |x: &Tensor| match &self.key_index {
            Some(index) => flat(x, kv_heads).index_select(0, index),
            None => flat(x, kv_heads),
        };
        let (q, k, v) = (flat(q, heads), keys(k), keys(v));
        // The fused kernels take half precision and float32; float64 (tests) goes by sequence.
        let out = if q.device().is_cuda() && q.kind() != Kind::Double {
            self.fused(&q, &k, &v)
        } else {
            self.by_sequence(&q, &k, &v)
        };
        out.view([b, t, heads, d]).transpose(1, 2)
    }

    fn fused(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let mut error = [0 as std::ffi::c_char; 1024];
        // SAFETY: every pointer is a live tensor for the call; the shim returns a new tensor
        // (owned here) or null with a message in `error`.
        let out = unsafe {
            skein_varlen_attention(
                q.as_ptr(),
                k.as_ptr(),
                v.as_ptr(),
                self.cu_q.as_ptr(),
                self.cu_k.as_ptr(),
                self.max_q,
                self.max_k,
                error.as_mut_ptr(),
                error.len(),
            )
        };
        if out.is_null() {
            // SAFETY: the shim wrote a NUL-terminated message within the buffer.
            let msg = unsafe { std::ffi::CStr::from_ptr(error.as_ptr()) };
            panic!(
                "variable-length attention failed: {}",
                msg.to_string_lossy()
            );
        }
        // SAFETY: a tensor allocated by the shim, not referenced elsewhere.
        unsafe { Tensor::from_ptr(out) }
    }

    /// The same attention, one sequence at a time, with the causal mask aligned at the bottom
    /// right (a query sees every context key, then its own sequence causally).
    fn by_sequence(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let gqa = q.size()[1] != k.size()[1];
        let outs: Vec<Tensor> = (0..self.bounds_q.len() - 1)
            .map(|i| {
                let (q0, q1) = (self.bounds_q[i], self.bounds_q[i + 1]);
                let (k0, k1) = (self.bounds_k[i], self.bounds_k[i + 1]);
                let part = |x: &Tensor, at, n| x.narrow(0, at, n).transpose(0, 1).unsqueeze(0);
                let (nq, nk) = (q1 - q0, k1 - k0);
                let mask = Tensor::ones([nq, nk], (Kind::Bool, q.device())).tril(nk - nq);
                Tensor::scaled_dot_product_attention(
                    &part(q, q0, nq),
                    &part(k, k0, nk),
                    &part(v, k0, nk),
                    Some(mask),
                    0.0,
                    false,
                    None,
                    gqa,
                )
                .squeeze_dim(0)
                .transpose(0, 1)
            })
            .collect();
        Tensor::cat(&outs, 0)
    }
}

extern "C" {
    /// csrc/varlen_attention.cpp.
    fn skein_varlen_attention(
        q: *const torch_sys::C_tensor,
        k: *const torch_sys::C_tensor,
        v: *const torch_sys::C_tensor,
        cu_q: *const torch_sys::C_tensor,
        cu_k: *const torch_sys::C_tensor,
        max_q: i64,
        max_k: i64,
        error: *mut std::ffi::c_char,
        error_len: usize,
    ) -> *mut torch_sys::C_tensor;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decode step's grouped layout gives grouped-query attention under a boolean mask, with
    /// the mask made additive once (`kv_cache::decode_mask`).
    #[test]
    fn grouped_decode_is_grouped_query_attention() {
        tch::manual_seed(3);
        let (a, span, d) = (3, 7, 8);
        let positions = Tensor::from_slice(&[6i64, 2, 4]);
        for (heads, kv_heads) in [(6, 2), (4, 4), (4, 1)] {
            let opts = (Kind::Float, Device::Cpu);
            let q = Tensor::randn([a, heads, 1, d], opts);
            let k = Tensor::randn([a, kv_heads, span, d], opts);
            let v = Tensor::randn([a, kv_heads, span, d], opts);
            let seen = Tensor::arange(span, (Kind::Int64, Device::Cpu))
                .unsqueeze(0)
                .le_tensor(&positions.unsqueeze(1))
                .view([a, 1, 1, span]);
            let want = Tensor::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                Some(seen),
                0.0,
                false,
                None,
                heads != kv_heads,
            );
            let mask = super::super::kv_cache::decode_mask(&positions, span, Kind::Float);
            let got = decode(&q, &k, &v, &mask);
            let diff = (&got - &want).abs().max().double_value(&[]);
            assert!(diff < 1e-6, "{heads}/{kv_heads}: {diff}");
            assert_eq!(got.size(), want.size());
        }
    }
}
