//! The planning core of skein: everything between "rewarded trajectories" and "rows handed to
//! ranks for a PPO mini-batch step", with no tensor dependency.
//!
//! The pipeline: [`compute_advantages`] on whole groups → [`build_rows`] (token ids as stored,
//! never retokenised) → [`plan`] (whole units into mini-batches, ranks balanced inside each)
//! → [`row_token_weight`] per row from its mini-batch's [`GlobalCounts`].
//!
//! The invariants, where each is kept, and where it is tested:
//! - advantages are computed on whole groups before any reordering, dropping or padding;
//!   failed trajectories are excluded and counted, never scored 0 (`advantage`; its unit
//!   tests); with a critic, GAE estimates each trajectory whole, per token or per turn,
//!   wherever its rows are (`token_gae`, `turn_gae`; `token_gae_is_per_trajectory_in_both_layouts`,
//!   `turn_gae_is_per_trajectory_in_both_layouts`);
//! - rows are made of stored token ids only; a merged trajectory row requires each prompt to
//!   extend the previous context token for token, else an error names the trajectory and
//!   transition (`rows`; its unit tests);
//! - plan invariants, each a property in `tests/properties.rs` (`plan_invariants`,
//!   `pipeline_from_trajectories`):
//!   1. every real row appears exactly once;
//!   2. all rows of one unit (trajectory or group) are in the same mini-batch;
//!   3. within a mini-batch every rank has the same number of rows; with
//!      `equal_minibatch_rows` every mini-batch has the same row count; the total is a
//!      multiple of `pad_multiple` (see [`padding_multiple`]);
//!   4. each mini-batch's global counts are sums over its real rows only;
//!   5. mini-batches hold numbers of units that differ by at most one (unless
//!      `token_balanced`);
//!   6. a batch with no real row is an error naming the cause, never a fabricated batch;
//!   7. a plan is deterministic for a given seed (`rng`: a self-contained splitmix64);
//!      (all kept in `planner`);
//! - rank balancing happens inside a mini-batch, never across: Karmarkar–Karp with equal row
//!   counts per rank (`balance`); max/mean rank cost ≤ 1.05 on a long-tail batch
//!   (`karmarkar_karp_balances_long_tail_ranks_within_five_percent`), at most dp − 1 padding
//!   rows per mini-batch in the variable-size mode;
//! - padding rows are minimal (1 + 1 tokens), inert (loss mask 0, advantage 0, weight 0),
//!   have fresh ids ([`PaddingIds`]) and are in no count, group or outcome metric (`padding`,
//!   `planner`, `loss`, `metrics`);
//! - loss weights use the mini-batch's global counts, so the summed loss is the same for any
//!   data-parallel size, micro-batch split and amount of padding (`loss`;
//!   `loss_does_not_depend_on_the_layout`, and `rank_local_normalisation_would_depend_on_dp`
//!   shows what breaks without it).

pub mod advantage;
pub mod balance;
pub mod cli;
pub mod data;
pub mod error;
pub mod loss;
pub mod metrics;
pub mod moments;
pub mod padding;
pub mod planner;
mod rng;
pub mod rows;
pub mod token_gae;
pub mod turn_gae;

pub use advantage::{
    compute_advantages, gae, rewards_all_equal, turn_returns, turn_rewards, AdvantageConfig,
    AdvantageResult, Credit, Estimator, StepGroups,
};
pub use data::{reward_in_range, KeptSets, Status, Trajectory, Transition, MAX_REWARD};
pub use error::PlanError;
pub use loss::{rank_contribution, row_token_weight, LossAggMode, RowLoss};
pub use metrics::{
    plan_metrics, row_metrics, trajectory_metrics, RowMetrics, Stats, TrajectoryMetrics,
};
pub use moments::Moments;
pub use padding::{padding_multiple, PaddingId, PaddingIds, PADDING_ROW_TOKENS};
pub use planner::{
    plan, plan_with_ids, CostModel, GlobalCounts, MiniBatch, Plan, PlanConfig, Slot, Unit,
};
pub use rows::{
    build_rows, build_turn_rows, extends_token_for_token, Row, RowMode, RowShape, PADDING_TOKEN,
};
pub use token_gae::{token_gae_rows, TokenGae};
pub use turn_gae::{
    turn_gae, turn_gae_rows, turn_places, turn_value_mask, turn_value_position, TurnGae, TurnPlace,
};
