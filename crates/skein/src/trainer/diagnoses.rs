//! The run's doctor ([`skein_doctor`]): after each step's record, the diagnoses that start are
//! announced in one line each and appended to `RUN_DIR/diagnoses.jsonl`. It starts from the
//! records already in `metrics.jsonl` (the warm-up's evaluation; on a resume, every step up to
//! the checkpoint), so a resumed run diagnoses what the uninterrupted one would have.

use super::rollout::stats::StepRollout;
use anyhow::Result;
use skein_doctor::{Diagnosis, DiagnosisLog, Digest, Doctor, Outcome};
use skein_plan::Status;
use skein_report::Record;
use std::path::Path;

pub struct RunDoctor {
    doctor: Doctor,
    log: DiagnosisLog,
}

impl RunDoctor {
    /// The doctor of the run in `dir`, whose RL steps start at `first_step`: diagnoses of the
    /// steps from there on (a resume redoes them) are dropped from `diagnoses.jsonl`.
    pub fn open(dir: &Path, first_step: usize) -> Result<Self> {
        skein_doctor::log::truncate_after(dir, first_step.saturating_sub(1))?;
        let doctor = match dir.join("metrics.jsonl").is_file() {
            true => skein_doctor::replay(dir)?.0,
            false => Doctor::default(),
        };
        Ok(RunDoctor {
            doctor,
            log: DiagnosisLog::open(dir)?,
        })
    }

    /// Reads a record as it went to `metrics.jsonl` (with the step's trajectories when it is
    /// a step's first record); announces and records each diagnosis that starts.
    pub fn observe(
        &mut self,
        record: Record,
        trajectories: Vec<Digest>,
        say: impl Fn(&str),
    ) -> Result<()> {
        for d in self.doctor.observe(record, trajectories) {
            say(&format!("skein: {}", d.line()));
            self.log.append(&d)?;
        }
        Ok(())
    }

    /// Every diagnosis of the run so far.
    pub fn found(&self) -> &[Diagnosis] {
        self.doctor.found()
    }
}

/// What the rules need of each of a step's trajectories.
pub fn digests(rollout: &StepRollout) -> Vec<Digest> {
    rollout
        .trajectories
        .iter()
        .zip(&rollout.correct)
        .zip(&rollout.info)
        .map(|((t, &correct), info)| {
            let (outcome, reason) = match &t.status {
                Status::Finished => (Outcome::Finished, None),
                Status::Truncated => (Outcome::Truncated, info.cutoff.clone()),
                Status::Failed(why) => (Outcome::Failed, Some(why.clone())),
            };
            Digest {
                id: t.id.clone(),
                group: t.group.clone(),
                reward: t.reward,
                correct,
                sampled_tokens: t.transitions.iter().map(|x| x.loss_tokens()).sum(),
                outcome,
                reason,
            }
        })
        .collect()
}

/// The end-of-run summary: the diagnoses found, or that none was.
pub fn summary(found: &[Diagnosis], dir: &Path) -> String {
    if found.is_empty() {
        return "skein: no diagnosis: none of the known failure modes showed".into();
    }
    let names: Vec<String> = found
        .iter()
        .map(|d| format!("{} (step {})", d.name, d.step))
        .collect();
    format!(
        "skein: {} diagnos{}: {}; details: skein doctor {}",
        found.len(),
        if found.len() == 1 { "is" } else { "es" },
        names.join(", "),
        dir.display()
    )
}
