//! A slot-based key/value cache for continuous batching: each running sequence owns one slot
//! (a row of every layer's cache), so sequences join and leave the batch independently.

use tch::{Device, Kind, Tensor};

pub struct KvCache {
    /// Per layer, [slots, capacity, kv_heads, head_dim].
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    capacity: i64,
}

impl KvCache {
    pub fn new(
        layers: usize,
        slots: i64,
        capacity: i64,
        kv_heads: i64,
        head_dim: i64,
        kind: Kind,
        device: Device,
    ) -> Self {
        let make = || Tensor::zeros([slots, capacity, kv_heads, head_dim], (kind, device));
        KvCache {
            keys: (0..layers).map(|_| make()).collect(),
            values: (0..layers).map(|_| make()).collect(),
            capacity,
        }
    }

    /// Tokens one slot can hold (prompt plus generated).
    pub fn capacity(&self) -> i64 {
        self.capacity
    }

    /// Stores a prefilled batch's keys and values ([B, kv_heads, T, head_dim]) into `slots`
    /// (one index per row), in one copy per tensor. A row shorter than T leaves keys past its
    /// length in its slot; they are never read: each position is written before it is attended
    /// to, and a decode step attends to positions up to its own only.
    pub fn store_prefix(&mut self, layer: usize, k: &Tensor, v: &Tensor, slots: &Tensor) {
        let t = k.size()[2];
        for (cache, new) in [(&self.keys[layer], k), (&self.values[layer], v)] {
            let _ = cache
                .narrow(1, 0, t)
                .index_copy_(0, slots, &new.transpose(1, 2));
        }
    }

    /// Layer `layer`'s cached keys of slot `slot`, [capacity, kv_heads, head_dim].
    #[cfg(test)]
    pub fn slot_keys(&self, layer: usize, slot: i64) -> Tensor {
        self.keys[layer].get(slot)
    }

    /// Copies the first `len` positions of slot `from[i]` into slot `to[i]`, in every layer:
    /// sequences with the same context share one prefill.
    pub fn copy_slots(&mut self, from: &Tensor, to: &Tensor, len: i64) {
        for cache in self.keys.iter().chain(&self.values) {
            let mut head = cache.narrow(1, 0, len);
            let _ = head.index_copy_(0, to, &head.index_select(0, from));
        }
    }

    /// Writes one new key/value per sequence ([A, kv_heads, 1, head_dim]) at `positions` of
    /// `slots`, and returns the first `span` cached positions of those slots as
    /// [A, kv_heads, span, head_dim]. When `dense` (the slots are exactly 0..A), the cache is
    /// read as a view instead of gathered, which saves a copy per layer and step.
    #[allow(clippy::too_many_arguments)]
    pub fn append_and_read(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        slots: &Tensor,
        positions: &Tensor,
        span: i64,
        dense: bool,
    ) -> (Tensor, Tensor) {
        let index = [Some(slots.shallow_clone()), Some(positions.shallow_clone())];
        let _ = self.keys[layer].index_put_(&index, &k.squeeze_dim(2), false);
        let _ = self.values[layer].index_put_(&index, &v.squeeze_dim(2), false);
        let active = slots.size()[0];
        let read = |cache: &Tensor| {
            let head = cache.narrow(1, 0, span);
            let rows = if dense {
                head.narrow(0, 0, active)
            } else {
                head.index_select(0, slots)
            };
            rows.transpose(1, 2)
        };
        (read(&self.keys[layer]), read(&self.values[layer]))
    }
}

/// Which of the first `span` cached positions each sequence may attend to, as the additive
/// mask attention takes ([A, 1, 1, span] of 0 and −∞ in `kind`, the queries' dtype): made once
/// per step, where a boolean mask would be converted by every layer's attention.
pub fn decode_mask(positions: &Tensor, span: i64, kind: Kind) -> Tensor {
    let beyond = Tensor::arange(span, (Kind::Int64, positions.device()))
        .unsqueeze(0)
        .gt_tensor(&positions.unsqueeze(1));
    Tensor::zeros(beyond.size(), (kind, positions.device()))
        .masked_fill(&beyond, f64::NEG_INFINITY)
        .view([-1, 1, 1, span])
}
