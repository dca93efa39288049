//! The planning core of skein: everything between "rewarded trajectories" and "rows handed to
//! ranks for a PPO mini-batch step", with no tensor dependency.
//!
//! The invariants and where they are kept:
//! - advantages are computed on whole groups, before any reordering, dropping or padding;
//!   failed trajectories are excluded and counted (`advantage`);
//! - a unit (trajectory or group) never straddles a mini-batch; rank balancing
//!   (Karmarkar–Karp, equal row counts) happens inside a mini-batch (`planner`, `balance`);
//! - padding rows are minimal, have fresh ids, and are in no count and weigh 0 (`padding`,
//!   `planner`, `loss`);
//! - loss weights use the mini-batch's global counts, so the loss is the same for any
//!   data-parallel size and micro-batch split (`loss`);
//! - a batch with no real row is an error, not a fabricated batch (`planner`).
//!
//! The property tests in `tests/properties.rs` check each of these on random batches.

pub mod advantage;
pub mod balance;
pub mod cli;
pub mod data;
pub mod error;
pub mod loss;
pub mod padding;
pub mod planner;
mod rng;
pub mod rows;

pub use advantage::{compute_advantages, gae, AdvantageConfig, AdvantageResult, Estimator};
pub use data::{Status, Trajectory, Transition};
pub use error::PlanError;
pub use loss::{rank_contribution, row_token_weight, LossAggMode, RowLoss};
pub use padding::{padding_multiple, PaddingId, PaddingIds, PADDING_ROW_TOKENS};
pub use planner::{plan, CostModel, GlobalCounts, MiniBatch, Plan, PlanConfig, Slot, Unit};
pub use rows::{build_rows, Row, RowMode, RowShape};
