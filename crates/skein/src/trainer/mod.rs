//! The trainer: losses, optimizer, the PPO update over planned mini-batches, and the step loop.

pub mod agent;
pub mod agent_step;
pub mod checkpoint;
pub mod config;
pub mod critic;
pub mod dataset_task;
pub mod dp;
pub mod eval;
pub mod external;
pub mod interrupt;
pub mod loss;
pub mod microbatch;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod offpolicy;
pub mod optim;
pub mod partial;
pub mod preflight;
pub mod ranks;
pub mod reward;
pub mod rollout;
pub mod run;
pub mod sft;
pub mod step_batch;
pub mod update;
pub mod validate;
#[cfg(any(feature = "mpi", test))]
pub mod wire;

pub use config::TrainConfig;
