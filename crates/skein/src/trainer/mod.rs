//! The trainer. `run.rs` is the step loop; every stage of a step is a call into its own room:
//!
//! | stage | room | what it does |
//! | --- | --- | --- |
//! | set up | `setup.rs` | config checks, run directory (`run_dir.rs`: never damages another run; `run_lock.rs`: one process per run), policy, rollout source, warm-up (`sft.rs`), optimizer, reference, critic, ranks; everything a resume restores |
//! | rollout | `rollout/` | a [`rollout::Workload`] — prompts, multi-turn episodes or external agents — returns one [`rollout::stats::StepRollout`] |
//! | batch | `batch/` | group advantages, rows, the mini-batch plan and loss weights ([`batch::StepBatch`]) |
//! | prepare | `prepare/` | π_old/π_ref log-probs, importance weights, critic values and GAE ([`prepare::PreparedBatch`]: advantages final) |
//! | update | `update/` | PPO epochs over the plan, one optimizer step per mini-batch, on data-parallel ranks (`update/ranks/`) |
//! | log | `metrics.rs`, `trajectory_log.rs`, `step_files.rs` | one `metrics.jsonl` record from every stage's own metrics; the step's trajectories to `trajectories/step-N.jsonl.zst`, written by a thread of their own; a resume's files opened, and cut back to its checkpoint, at its first record |
//! | checkpoint | `checkpoint.rs` | atomic checkpoints that resume exactly |
//!
//! Beside them: `config/` (every key, typed and validated), `preflight.rs` (memory estimate),
//! `interrupt.rs` (Ctrl-C).
//!
//! | invariant | kept in | checked by |
//! | --- | --- | --- |
//! | token in, token out | `rollout/judge.rs`, `rollout/buffer.rs`, `rollout/episodes.rs`, `rollout/external.rs` | `rollout/episodes.rs` tests, `tests/agents.rs`, `tests/serve.rs` |
//! | the trajectory is the atom | `batch/mod.rs` (skein-plan's advantages and planner) | `skein-plan/tests/properties.rs`, `tests/dp_invariance.rs` |
//! | padding is inert | `batch/row.rs` (`TrainRow::from_plan_row` of `skein_plan::Row::padding`) | `tests/dp_invariance.rs` (with and without padding rows) |
//! | the loss does not depend on parallelism | `batch/mod.rs` (global-count weights), `update/mod.rs`, `update/ranks/` | `tests/dp_invariance.rs`, `tests/dp_mpi.rs` |
//! | nothing waits that needn't | `rollout/buffer.rs` (partial rollout), `rollout/reward.rs` (scoring during generation) | `rollout/buffer.rs` tests, `tests/rewards.rs` |
//! | off-policyness is bounded and corrected | `rollout/buffer.rs` (staleness cap), `prepare/offpolicy.rs` | `rollout/buffer.rs` and `prepare/offpolicy.rs` tests |
//! | bad input gets a clear error | `config/` (typed keys, `validate.rs`), `preflight.rs`, `checkpoint.rs` | `config/validate.rs` tests, `tests/config_fuzz.rs`, `tests/cli.rs`, `tests/resume.rs` |

pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod diagnoses;
pub mod final_checkpoint;
pub mod fit;
pub mod interrupt;
pub mod metrics;
pub mod preflight;
pub mod prepare;
pub mod replaced_run;
pub mod rollout;
pub mod run;
pub mod run_dir;
pub mod run_lock;
pub mod setup;
pub mod sft;
pub mod step_files;
pub mod trajectory_log;
pub mod update;

pub use config::TrainConfig;
