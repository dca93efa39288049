//! The files a run appends to step by step: `metrics.jsonl` (and its TensorBoard events), the
//! trajectories and the diagnoses. A new run opens them before its warm-up. A resumed run
//! opens them, cutting each back to its checkpoint and writing its `config.toml`, only when
//! its first step is ready to be written: a resume that fails before that (a bad setting, an
//! environment that does not start, a step that runs out of memory) leaves the run's files as
//! they were.

use super::config::TrainConfig;
use super::diagnoses::RunDoctor;
use super::run_dir::RunDir;
use super::trajectory_log::TrajectoryLog;
use anyhow::Result;
use skein_report::MetricsLog;
use skein_text::Tokenizer;

pub struct StepFiles {
    pub log: MetricsLog,
    /// Each step's trajectories, for `skein view` (written while the next step runs).
    pub trajectories: TrajectoryLog,
    pub doctor: RunDoctor,
}

impl StepFiles {
    /// The step files of a run whose metrics log is open, from RL step `first_step` on.
    pub fn after_log(
        log: MetricsLog,
        run_dir: &RunDir,
        cfg: &TrainConfig,
        tokenizer: &Tokenizer,
        first_step: usize,
    ) -> Result<StepFiles> {
        let trajectories =
            TrajectoryLog::start(&run_dir.path, &cfg.trajectories, tokenizer, first_step)?;
        let doctor = RunDoctor::open(&run_dir.path, first_step)?;
        Ok(StepFiles {
            log,
            trajectories,
            doctor,
        })
    }
}

/// What a resumed run writes when its files open: its config as built, and how many records
/// of `metrics.jsonl` its checkpoint was written after.
pub struct ResumedFiles {
    pub recorded: TrainConfig,
    pub metrics_lines: usize,
}

impl ResumedFiles {
    pub fn after(recorded: TrainConfig, metrics_lines: usize) -> Self {
        ResumedFiles {
            recorded,
            metrics_lines,
        }
    }

    /// Claims the directory, writes the config, cuts every file back to the checkpoint, and
    /// opens them for the steps from `first_step` on.
    pub fn open(
        self,
        run_dir: &mut RunDir,
        cfg: &TrainConfig,
        tokenizer: &Tokenizer,
        first_step: usize,
    ) -> Result<StepFiles> {
        let log = run_dir.open(&self.recorded, Some(self.metrics_lines))?;
        StepFiles::after_log(log, run_dir, cfg, tokenizer, first_step)
    }
}
