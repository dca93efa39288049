//! The trainer: losses, optimizer, the PPO update over planned mini-batches, and the step loop.

pub mod config;
pub mod loss;
pub mod microbatch;
pub mod optim;
pub mod sft;
pub mod update;

pub use config::TrainConfig;
