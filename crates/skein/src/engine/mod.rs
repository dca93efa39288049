//! The rollout engine: batched autoregressive generation with KV caches and continuous
//! batching, behavior log-probs and policy versions per token, and token budgets that pause a
//! request so it can be resumed from its tokens later.

pub mod continuous;
pub mod cuda_graph;
mod graph_decode;
pub mod handle;
pub mod inference_mode;
pub mod remote;
pub mod sampling;
mod token_watch;

pub use continuous::{Engine, EngineStats, Feed, Finish, GenOutput, GenRequest, PREFILL_TOKENS};
pub use graph_decode::{captured_logits_bound, StepTimes};
pub use handle::{channel, Control, EngineGone, EngineHandle, EngineQueue};
pub use remote::{Publish, RemoteEngine, RemoteEngineConfig};
pub use token_watch::TokenWatch;

use crate::model::Model;

/// What generates rollouts: the embedded engine (on the policy's own weights), or a remote
/// server the trainer publishes its weights to after each step.
pub enum Generator {
    Local(Engine),
    Remote(RemoteEngine),
}

impl Generator {
    /// Generates every request at `version`, calling `on_finish` as each one stops (see
    /// [`Engine::generate`]); a remote request that fails comes back as `Finish::Failed`.
    pub fn generate(
        &self,
        model: &Model,
        version: u64,
        requests: Vec<GenRequest>,
        on_finish: impl FnMut(GenOutput),
    ) -> EngineStats {
        match self {
            Generator::Local(e) => e.generate(model, version, requests, on_finish),
            Generator::Remote(r) => r.generate(version, requests, on_finish),
        }
    }
}
pub use sampling::SamplingParams;
