//! The rollout engine: batched autoregressive generation with KV caches and continuous
//! batching, behavior log-probs and policy versions per token, and token budgets that pause a
//! request so it can be resumed from its tokens later.

pub mod continuous;
pub mod sampling;

pub use continuous::{Engine, EngineStats, Finish, GenOutput, GenRequest};
pub use sampling::SamplingParams;
