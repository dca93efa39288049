//! The rollout engine: batched autoregressive generation with KV caches and continuous
//! batching, behavior log-probs and policy versions per token, and token budgets that pause a
//! request so it can be resumed from its tokens later.

pub mod continuous;
pub mod handle;
pub mod sampling;

pub use continuous::{Engine, EngineStats, Feed, Finish, GenOutput, GenRequest};
pub use handle::{channel, Control, EngineGone, EngineHandle, EngineQueue};
pub use sampling::SamplingParams;
