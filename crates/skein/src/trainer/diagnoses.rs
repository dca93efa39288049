//! The run's doctor ([`skein_doctor`]): after each step's record, the diagnoses that start are
//! announced in one line each and written to `RUN_DIR/diagnoses.jsonl`, and a diagnosis that
//! keeps holding has its `until` carried there. It starts from the records already in
//! `metrics.jsonl` (the warm-up's evaluation; on a resume, every step up to the checkpoint),
//! so a resumed run diagnoses what the uninterrupted one would have.

use super::config::Keep;
use super::rollout::stats::StepRollout;
use anyhow::Result;
use skein_doctor::{Diagnosis, Digest, Doctor, Outcome};
use skein_plan::Status;
use skein_report::Record;
use std::path::{Path, PathBuf};

pub struct RunDoctor {
    doctor: Doctor,
    dir: PathBuf,
    /// What `diagnoses.jsonl` holds: the lines kept from before a resume (with the examples
    /// the run saw), then the diagnoses this process found.
    written: Vec<Diagnosis>,
}

impl RunDoctor {
    /// The doctor of the run in `dir`, whose RL steps start at `first_step`: diagnoses of the
    /// steps from there on (a resume redoes them) are dropped from `diagnoses.jsonl`.
    pub fn open(dir: &Path, first_step: usize) -> Result<Self> {
        let written = skein_doctor::log::truncate_after(dir, first_step.saturating_sub(1))?;
        if !dir.join(skein_doctor::FILE).exists() {
            // A healthy run's file is there, and empty.
            skein_doctor::log::rewrite(dir, &[])?;
        }
        let doctor = match dir.join("metrics.jsonl").is_file() {
            true => skein_doctor::replay(dir)?.0,
            false => Doctor::default(),
        };
        Ok(RunDoctor {
            doctor,
            dir: dir.to_path_buf(),
            written,
        })
    }

    /// Reads a record as it went to `metrics.jsonl` (with the step's trajectories when it is
    /// a step's first record); announces each diagnosis that starts, and writes the file again
    /// when one started or one that holds on lasted longer.
    pub fn observe(
        &mut self,
        record: Record,
        trajectories: Vec<Digest>,
        say: impl Fn(&str),
    ) -> Result<()> {
        let started = self.doctor.observe(record, trajectories);
        let mut changed = !started.is_empty();
        for d in started {
            say(&format!("skein: {}", d.line()));
            self.written.push(d);
        }
        for found in self.doctor.found() {
            let line = self
                .written
                .iter_mut()
                .find(|w| w.name == found.name && w.step == found.step);
            if let Some(w) = line.filter(|w| w.until != found.until) {
                w.until = found.until;
                changed = true;
            }
        }
        if changed {
            skein_doctor::log::rewrite(&self.dir, &self.written)?;
        }
        Ok(())
    }

    /// Every diagnosis of the run so far.
    pub fn found(&self) -> &[Diagnosis] {
        self.doctor.found()
    }
}

/// The digests of the trajectories the run keeps (`keep`, its `trajectories.keep`), which
/// its doctor reads as `skein doctor` reads them later: the same counts on replay, and
/// examples `skein view` can open.
pub fn kept_digests(rollout: &StepRollout, keep: Keep) -> Vec<Digest> {
    let mut kept = digests(rollout);
    kept.truncate(keep.count(kept.len()));
    kept
}

/// What the rules need of each of a step's trajectories.
fn digests(rollout: &StepRollout) -> Vec<Digest> {
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
