//! `skein serve`: an OpenAI-compatible HTTP front of the rollout engine that records
//! token-exact trajectories.
//!
//! Agents written against any OpenAI client call the model through a rollout's own base URL
//! (`/rollouts/{id}/v1`); every call is appended to that rollout with its exact prompt ids,
//! sampled ids, behavior log-probs and policy versions, and a reward closes it. The trainer
//! reads closed rollouts from the [`RolloutStore`] in-process. Every completion also returns
//! the same ids to the client (the `skein` field of each choice), so no client retokenizes.
//!
//! Routes (JSON errors in OpenAI's shape `{"error": {"message", "type", "code"}}`):
//!
//! | route | what |
//! | --- | --- |
//! | `GET /health` | `{"status": "ok", "version": N}`; never needs the API key |
//! | `GET /v1/models` | the one served model |
//! | `POST /v1/chat/completions` | chat, rendered with the model's chat template |
//! | `POST /v1/completions` | `prompt` as text or as token ids |
//! | `POST /rollouts/{id}/v1/chat/completions`, `…/v1/completions` | the same, recorded |
//! | `POST /tasks` | `{"tasks": [{"rollout_id", "group", "task"}]}` adds rollouts to hand out |
//! | `GET /tasks/next` | `{"rollout_id", "group", "base_url", "task"}`, or 204 when none waits |
//! | `POST /rollouts/{id}/reward` | `{"reward": f64, "correct": bool?}` closes it |
//! | `POST /rollouts/{id}/fail` | `{"error": "..."}` closes it as failed |
//! | `GET /rollouts/{id}` | its recording and state (`waiting`, `open`, `closed`) |
//! | `POST /v1/reload` | `{"path": HF dir}`: load new weights, answer `{"version": N}` (409 on a trainer's server) |
//!
//! Each choice carries `"skein": {"prompt_token_ids", "completion_token_ids", "logprobs",
//! "versions"}`. `stream: true` gets the answer as server-sent events, its text in pieces as
//! it is generated ([`stream`]). `stop` strings end a completion at the first token whose
//! text completes one (the text stops before it). OpenAI's `logprobs` are not supported and
//! are answered 400 when asked for, as is a field the server does not know
//! (`openai::IGNORED_FIELDS` are accepted); a completion that reaches the context's end
//! finishes with `length`. A prompt is refused by its length in
//! bytes before it is tokenized when it cannot fit (see [`TextSide`]); a server bound beyond
//! loopback without an API key refuses `/v1/reload`.

mod answer;
mod config;
mod engine_thread;
mod error;
mod generate;
mod guard;
mod openai;
mod reload_text;
mod routes;
mod server;
mod state;
mod store;
mod stream;
mod stream_text;
mod text;

pub use config::ServeConfig;
pub use engine_thread::spawn_engine_thread;
pub use error::ApiError;
pub use openai::Exact;
pub use routes::router;
pub use server::{bind, spawn, BackgroundServer, Server};
pub use state::ServeState;
pub use store::{
    HandedTask, RecordedCall, RecordedRollout, RolloutState, RolloutStore, StoreError, TaskSpec,
};
pub use text::TextSide;
