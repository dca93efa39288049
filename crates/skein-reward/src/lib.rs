//! Rewards: functions, worker subprocesses, remote services and a dynamic-batching executor.
//!
//! Everything scores `RewardRequest`s into `RewardOutput`s. Sources that are slow or batch
//! well (reward models, workers, services) sit behind an `Executor`, which takes single
//! requests from many threads and runs them in batches on its own threads, so a trajectory can
//! be scored the moment it ends without holding up generation. See README.md.

pub mod config;
mod error;
pub mod executor;
pub mod functions;
pub mod lines;
pub mod math;
pub mod remote;
mod request;
pub mod rewarder;
mod scorer;
pub mod server;
mod stats;
pub mod worker;

pub use config::{RewardConfig, RouteConfig, ServiceConfig, SourceConfig};
pub use error::RewardError;
pub use executor::{Executor, ExecutorConfig, Ticket};
pub use functions::{FormatCheck, MathAnswer, OverlongShaping, RewardFn};
pub use remote::{RemoteConfig, RemoteScorer};
pub use request::{RewardOutput, RewardRequest, WireResponse};
pub use rewarder::{Pending, Rewarder};
pub use scorer::BatchScorer;
pub use server::{serve, serve_with_metrics, MetricsSource, RewardServer, ServeConfig};
pub use stats::ExecutorMetrics;
pub use worker::{WorkerConfig, WorkerPool};
