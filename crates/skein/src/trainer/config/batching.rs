//! How rows become micro-batches ([`Batching`]); `update/pack.rs` lays them out.

use serde::{Deserialize, Serialize};

/// How rows become micro-batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batching {
    /// Most tokens per micro-batch, counted as lines × width (padding included).
    pub micro_batch_tokens: usize,
    /// Rows end to end in lines instead of one padded row per line.
    pub packing: bool,
    /// With packing: identical prompts in a micro-batch are computed once.
    pub shared_prefix: bool,
}

impl Batching {
    /// One padded row per line.
    pub fn padded(micro_batch_tokens: usize) -> Self {
        Batching {
            micro_batch_tokens,
            packing: false,
            shared_prefix: false,
        }
    }
}
