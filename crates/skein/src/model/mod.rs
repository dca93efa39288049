//! The policy model: a Qwen2/Qwen3/Llama-family decoder on libtorch, read from and written to
//! Hugging Face model directories.

pub mod attention;
pub mod bert;
pub mod checkpoint;
pub mod config;
pub mod fused;
pub mod io;
pub mod kv_cache;
pub mod lora;
pub mod options;
pub mod peft;
pub mod rope;
pub mod safetensors_stream;
pub mod transformer;
pub mod value;

pub use attention::{packed_kernel, PackedKernel, Span, Spans, Varlen, VarlenSeq};
pub use checkpoint::Recompute;
pub use config::{ModelConfig, MAX_POSITIONS};
pub use io::Model;
pub use kv_cache::KvCache;
pub use lora::LoraConfig;
pub use options::{Dtype, ModelOptions};
pub use transformer::{AttnMode, DecodeForm, Transformer};
pub use value::ValueModel;

use tch::{nn, Tensor};

/// A model's variables sorted by name: one fixed order for the optimizer, data-parallel
/// replicas, MPI collectives and checkpoints alike.
pub fn sorted_variables(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// [`sorted_variables`], trainable ones only.
pub fn sorted_trainable(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    sorted_variables(vs)
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .collect()
}
