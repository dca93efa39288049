//! `RewardError`: why one request could not be scored. Each message says what failed and what
//! to do about it; the kind lets counters tell timeouts, crashes and outages apart.

use skein_config::ConfigError;
use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub enum RewardError {
    /// The request cannot be scored as given (e.g. a data source no route covers).
    BadRequest(String),
    /// A source took longer than its timeout for this request.
    Timeout { source: String, after: Duration },
    /// A worker process died (exit, EOF, broken pipe) while holding this request.
    WorkerCrashed { command: String, detail: String },
    /// A worker process could not be started.
    WorkerSpawn { command: String, detail: String },
    /// A worker or remote service answered `{"error": ...}` for this request.
    Rejected { source: String, message: String },
    /// A worker or service answered something that is not the protocol.
    Protocol { source: String, detail: String },
    /// A remote service stayed unreachable or failing through every retry.
    Remote {
        url: String,
        attempts: u32,
        detail: String,
    },
    /// A built-in function or an in-process scorer failed (or panicked).
    Scorer { source: String, detail: String },
    /// The executor stopped before the request was answered.
    Shutdown,
    /// Invalid configuration; every problem names its key.
    Config(ConfigError),
}

impl RewardError {
    /// A short, stable name of the kind, for counters and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            RewardError::BadRequest(_) => "bad_request",
            RewardError::Timeout { .. } => "timeout",
            RewardError::WorkerCrashed { .. } => "worker_crashed",
            RewardError::WorkerSpawn { .. } => "worker_spawn",
            RewardError::Rejected { .. } => "rejected",
            RewardError::Protocol { .. } => "protocol",
            RewardError::Remote { .. } => "remote",
            RewardError::Scorer { .. } => "scorer",
            RewardError::Shutdown => "shutdown",
            RewardError::Config(_) => "config",
        }
    }
}

impl fmt::Display for RewardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RewardError::BadRequest(m) => f.write_str(m),
            RewardError::Timeout { source, after } => write!(
                f,
                "reward source `{source}` did not answer within {:.3} s; the request failed and the \
                 source was restarted where it can be (raise its `timeout_ms` if this is expected)",
                after.as_secs_f64()
            ),
            RewardError::WorkerCrashed { command, detail } => write!(
                f,
                "reward worker `{command}` died while scoring ({detail}); it is restarted on the next \
                 request; its stderr says why"
            ),
            RewardError::WorkerSpawn { command, detail } => write!(
                f,
                "could not start reward worker `{command}`: {detail}; check the worker's `command` \
                 (the program must exist and be executable)"
            ),
            RewardError::Rejected { source, message } => {
                write!(f, "reward source `{source}` rejected the request: {message}")
            }
            RewardError::Protocol { source, detail } => write!(
                f,
                "reward source `{source}` broke the protocol: {detail}; each request needs one JSON \
                 line back: {{\"id\": ..., \"reward\": number, \"metrics\": {{...}}}} or \
                 {{\"id\": ..., \"error\": \"...\"}}"
            ),
            RewardError::Remote {
                url,
                attempts,
                detail,
            } => write!(
                f,
                "reward service {url} failed after {attempts} attempt(s): {detail}; check that it \
                 is running and reachable"
            ),
            RewardError::Scorer { source, detail } => {
                write!(f, "reward source `{source}` failed: {detail}")
            }
            RewardError::Shutdown => {
                f.write_str("the reward executor shut down before answering this request")
            }
            RewardError::Config(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RewardError {}

impl From<ConfigError> for RewardError {
    fn from(e: ConfigError) -> Self {
        RewardError::Config(e)
    }
}
