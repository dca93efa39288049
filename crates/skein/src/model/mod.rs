//! The policy model: a Qwen2/Qwen3/Llama-family decoder on libtorch, read from and written to
//! Hugging Face model directories.

pub mod bert;
pub mod config;
pub mod io;
pub mod kv_cache;
pub mod rope;
pub mod transformer;
pub mod value;

pub use config::ModelConfig;
pub use io::Model;
pub use kv_cache::KvCache;
pub use transformer::{AttnMode, Transformer};
pub use value::ValueModel;
