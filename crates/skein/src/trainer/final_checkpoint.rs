//! A run's `checkpoint/`, the weights it ends with in Hugging Face layout, and which weights of
//! a run directory `skein eval RUN` and `skein serve --model RUN` take.
//!
//! `checkpoint/` is written at the end of a run, whole or not at all, with the step its weights
//! are of. It is not always the run's newest: a run stopped by Ctrl-C has none, and a resume
//! that trains a finished run further leaves the old one in place until its own end. A run's
//! newest weights are then its newest `checkpoint-N`, which holds the policy in the same layout.

use super::checkpoint;
use crate::engine::SamplingParams;
use crate::model::Model;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use skein_text::Tokenizer;
use std::path::{Path, PathBuf};

/// The final checkpoint's directory in a run directory.
pub const DIR: &str = "checkpoint";
/// In `checkpoint/`: the RL step whose weights it holds.
pub const STEP_FILE: &str = "run_step.json";

#[derive(Serialize, Deserialize)]
struct StepRecord {
    step: usize,
}

/// Writes the policy at `step` as `run_dir/checkpoint`, replacing the one there only once the
/// new one is whole: a write that fails (a full disk) leaves the old weights, tokenizer and
/// generation config together. `previous` is a checkpoint this process wrote of the same
/// policy, whose LoRA base is linked rather than written again.
pub fn save(
    run_dir: &Path,
    policy: &Model,
    tokenizer: &Tokenizer,
    sampling: &SamplingParams,
    step: usize,
    previous: Option<&Path>,
) -> Result<PathBuf> {
    let dir = run_dir.join(DIR);
    checkpoint::write_aside(&dir, |tmp| {
        checkpoint::save_policy_dir(policy, tokenizer, sampling, tmp, previous)?;
        let path = tmp.join(STEP_FILE);
        let record = serde_json::to_string(&StepRecord { step })?;
        std::fs::write(&path, record).with_context(|| format!("writing {}", path.display()))
    })?;
    Ok(dir)
}

/// The step of `run_dir`'s final checkpoint: None without one, or for one written before the
/// step was recorded.
pub fn step(run_dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(run_dir.join(DIR).join(STEP_FILE)).ok()?;
    serde_json::from_str::<StepRecord>(&text)
        .ok()
        .map(|r| r.step)
}

/// The weights a run directory's newest policy is in, and why they are not `checkpoint/`
/// when they are not.
#[derive(Debug, PartialEq)]
pub struct NewestWeights {
    pub dir: PathBuf,
    pub note: Option<String>,
}

/// `run_dir`'s newest policy: `checkpoint/`, unless a numbered checkpoint is of a later step
/// (or there is no `checkpoint/`); None when the run has written neither.
pub fn newest(run_dir: &Path) -> Result<Option<NewestWeights>> {
    let last = run_dir.join(DIR);
    let has_final = last.join("config.json").is_file();
    let numbered = checkpoint::latest(run_dir)?;
    let final_step = step(run_dir);
    Ok(match numbered {
        Some((n, dir)) if !has_final => Some(NewestWeights {
            dir,
            note: Some(format!(
                "{} has no final {DIR}/ (the run stopped before its end): its newest weights \
                 are those of step {n}",
                run_dir.display()
            )),
        }),
        Some((n, dir)) if final_step.is_some_and(|s| s < n) => Some(NewestWeights {
            dir,
            note: Some(format!(
                "{}'s {DIR}/ holds step {} and the run went on to step {n}: its newest \
                 weights are those of step {n}",
                run_dir.display(),
                final_step.unwrap_or_default()
            )),
        }),
        _ if has_final => Some(NewestWeights {
            dir: last,
            note: None,
        }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "skein-final-checkpoint-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn weights(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
    }

    fn numbered(run: &Path, n: usize) -> PathBuf {
        let dir = run.join(format!("checkpoint-{n}"));
        weights(&dir);
        std::fs::write(dir.join(checkpoint::STATE_FILE), "{}").unwrap();
        dir
    }

    fn finished_at(run: &Path, step: Option<usize>) {
        weights(&run.join(DIR));
        if let Some(step) = step {
            let record = serde_json::to_string(&StepRecord { step }).unwrap();
            std::fs::write(run.join(DIR).join(STEP_FILE), record).unwrap();
        }
    }

    #[test]
    fn a_finished_run_is_its_final_checkpoint() {
        let run = run_dir("finished");
        numbered(&run, 4);
        finished_at(&run, Some(4));
        let weights = newest(&run).unwrap().unwrap();
        assert_eq!((weights.dir, weights.note), (run.join(DIR), None));
        assert_eq!(step(&run), Some(4));
        // One written before steps were recorded is taken as it always was.
        let run = run_dir("unrecorded");
        numbered(&run, 6);
        finished_at(&run, None);
        assert_eq!(newest(&run).unwrap().unwrap().dir, run.join(DIR));
        assert_eq!(step(&run), None);
    }

    #[test]
    fn a_run_trained_past_its_final_checkpoint_is_its_newest_numbered_one() {
        let run = run_dir("resumed");
        numbered(&run, 4);
        finished_at(&run, Some(4));
        let six = numbered(&run, 6);
        let weights = newest(&run).unwrap().unwrap();
        assert_eq!(weights.dir, six);
        let note = weights.note.unwrap();
        assert!(
            note.contains("holds step 4 and the run went on to step 6"),
            "{note}"
        );
    }

    #[test]
    fn a_run_stopped_before_its_end_is_its_newest_numbered_one() {
        let run = run_dir("stopped");
        numbered(&run, 2);
        let three = numbered(&run, 3);
        let weights = newest(&run).unwrap().unwrap();
        assert_eq!(weights.dir, three);
        assert!(weights.note.unwrap().contains("no final checkpoint/"));
        assert_eq!(newest(&run_dir("empty")).unwrap(), None);
    }
}
