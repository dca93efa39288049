//! skein: reinforcement-learning post-training of LLM agents.

pub mod cli;
pub mod devices;
pub mod engine;
pub mod gpu_memory;
pub mod memory;
pub mod model;
pub mod op_count;
pub mod panic_message;
pub mod reward_model;
pub mod serve;
pub mod trainer;
