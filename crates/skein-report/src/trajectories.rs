//! A run's trajectories on disk: `RUN_DIR/trajectories/step-N.jsonl.zst`, one JSON object per
//! trajectory ([`TrajectoryRecord`]), zstd-compressed, written whole or not at all.
//!
//! A record holds what a person needs to read a trajectory after the run: what was said turn
//! by turn (token ids with their text), what the environment answered, which tokens trained
//! and with which advantage, staleness and importance weight, and where it trained (mini-batch
//! and rank). `skein view` reads these files.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

/// The folder of a run directory that holds the step files.
pub const DIR: &str = "trajectories";
/// Longest line accepted when reading a step file back (a record of a long episode is large,
/// but not unboundedly so).
const MAX_LINE_BYTES: usize = 256 << 20;
/// zstd level: fast to write off the step's hot path, still ~10× smaller than plain JSON.
const ZSTD_LEVEL: i32 = 3;

/// One trajectory of one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryRecord {
    pub step: usize,
    /// Policy version at the step's start (tokens sampled by older versions are stale).
    pub policy_version: u64,
    pub id: String,
    /// The prompt it answers: the samples of a group are compared with each other.
    pub group: String,
    /// Where its prompt came from: the task's name, or a dataset row's `data_source`.
    pub source: String,
    pub status: Status,
    /// Why it failed or was cut off (None when it finished).
    pub reason: Option<String>,
    pub reward: f64,
    pub correct: bool,
    /// Messages the model wrote.
    pub turns: usize,
    /// Of those, the ones answered by a tool.
    pub tool_calls: usize,
    /// Each transition's own reward (None where the environment gave none).
    pub turn_rewards: Vec<Option<f64>>,
    /// The rows it trained as: one for a merged trajectory, one per transition for step-wise
    /// ones; the transitions themselves for a failed trajectory, which does not train.
    pub rows: Vec<RowRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Finished,
    /// Stopped by a length or turn limit; trained on as it is.
    Truncated,
    /// Excluded from advantages and training.
    Failed,
}

/// One row: a prompt and a response, per response token everything the loss used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowRecord {
    /// The transition it is (None: the whole trajectory, merged into one row).
    pub transition: Option<usize>,
    /// Mini-batch and data-parallel rank it trained on (None: it did not train).
    pub mini_batch: Option<usize>,
    pub rank: Option<usize>,
    pub prompt_ids: Vec<u32>,
    /// The text of each prompt token as it reads in place, word spaces included
    /// (`Tokenizer::token_texts`); a token that is part of a multi-byte character shows as
    /// U+FFFD.
    pub prompt_text: Vec<String>,
    pub response_ids: Vec<u32>,
    /// The same for each response token, its first read after the prompt's last.
    pub response_text: Vec<String>,
    /// Per response token from here on: 1 = sampled and trained, 0 = inserted by the
    /// environment (or a tool) and never trained.
    pub loss_mask: Vec<u8>,
    /// Log-prob under the policy that sampled it.
    pub behavior_logp: Vec<f32>,
    /// Policy version that sampled it.
    pub versions: Vec<u64>,
    /// Final advantage (empty when the row did not train).
    pub advantages: Vec<f32>,
    /// Importance weight against its behavior policy (empty: 1 everywhere).
    pub is_weight: Vec<f32>,
}

/// The file of `step` in a run directory.
pub fn step_path(run_dir: &Path, step: usize) -> PathBuf {
    run_dir.join(DIR).join(format!("step-{step}.jsonl.zst"))
}

/// Writes one step's records at once: into a temporary file beside it, then renamed, so a
/// reader (or a crash) never sees half a step. Returns the compressed size in bytes.
pub fn write_step(run_dir: &Path, step: usize, records: &[TrajectoryRecord]) -> Result<u64> {
    let path = step_path(run_dir, step);
    let folder = run_dir.join(DIR);
    std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    let tmp = folder.join(format!(".step-{step}.jsonl.zst.tmp"));
    let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut z = zstd::Encoder::new(file, ZSTD_LEVEL)?;
    for r in records {
        serde_json::to_writer(&mut z, r)?;
        z.write_all(b"\n")?;
    }
    let file = z
        .finish()
        .with_context(|| format!("writing {}", tmp.display()))?;
    file.sync_all()
        .with_context(|| format!("writing {}", tmp.display()))?;
    let bytes = file.metadata()?.len();
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(bytes)
}

/// Reads one step file; a bad line is an error naming the file and line.
pub fn read_step(path: &Path) -> Result<Vec<TrajectoryRecord>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let z = zstd::Decoder::new(file).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = BufReader::new(z);
    let mut out = Vec::new();
    let mut line = String::new();
    for n in 1.. {
        line.clear();
        let read = (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_line(&mut line)
            .with_context(|| {
                format!(
                    "{}:{n}: unreadable (not a zstd JSONL file?)",
                    path.display()
                )
            })?;
        if read == 0 {
            break;
        }
        if read > MAX_LINE_BYTES {
            bail!(
                "{}:{n}: a line longer than {MAX_LINE_BYTES} bytes",
                path.display()
            );
        }
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(&line)
            .with_context(|| format!("{}:{n}: not a trajectory record", path.display()))?;
        out.push(record);
    }
    Ok(out)
}

/// The steps a run directory has trajectories of, in order, with their files.
pub fn list_steps(run_dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let folder = run_dir.join(DIR);
    if !folder.exists() {
        return Ok(Vec::new());
    }
    let mut steps = Vec::new();
    for entry in
        std::fs::read_dir(&folder).with_context(|| format!("reading {}", folder.display()))?
    {
        let path = entry?.path();
        let step = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("step-"))
            .and_then(|n| n.strip_suffix(".jsonl.zst"))
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(step) = step {
            steps.push((step, path));
        }
    }
    steps.sort();
    Ok(steps)
}

/// Removes the files of steps after `step` (and unfinished temporary files): a resumed run
/// continues from its checkpoint, and what an interrupted run wrote past it never trained
/// the weights it resumes with.
pub fn remove_after(run_dir: &Path, step: usize) -> Result<()> {
    for (s, path) in list_steps(run_dir)? {
        if s > step {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    let folder = run_dir.join(DIR);
    if folder.exists() {
        for entry in std::fs::read_dir(&folder)? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') && name.ends_with(".tmp") {
                std::fs::remove_file(&path).ok();
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("skein-traj-{}-{name}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn record(step: usize, id: &str) -> TrajectoryRecord {
        TrajectoryRecord {
            step,
            policy_version: step as u64 - 1,
            id: id.into(),
            group: "g0".into(),
            source: "arithmetic".into(),
            status: Status::Finished,
            reason: None,
            reward: 1.0,
            correct: true,
            turns: 1,
            tool_calls: 0,
            turn_rewards: vec![None],
            rows: vec![RowRecord {
                transition: None,
                mini_batch: Some(0),
                rank: Some(1),
                prompt_ids: vec![5, 6],
                prompt_text: vec!["1".into(), "+".into()],
                response_ids: vec![7, 2],
                response_text: vec!["2".into(), "</s>".into()],
                loss_mask: vec![1, 1],
                behavior_logp: vec![-0.5, -0.25],
                versions: vec![step as u64 - 1; 2],
                advantages: vec![0.75, 0.75],
                is_weight: vec![],
            }],
        }
    }

    #[test]
    fn steps_round_trip_and_list_in_order() {
        let dir = tmp_dir("round-trip");
        for step in [10, 2, 1] {
            let records = vec![record(step, "a"), record(step, "b")];
            let bytes = write_step(&dir, step, &records).unwrap();
            assert!(bytes > 0);
            assert_eq!(read_step(&step_path(&dir, step)).unwrap(), records);
        }
        let steps: Vec<usize> = list_steps(&dir).unwrap().into_iter().map(|s| s.0).collect();
        assert_eq!(steps, [1, 2, 10]);
        // No temporary file is left beside the steps.
        let names = std::fs::read_dir(dir.join(DIR)).unwrap().count();
        assert_eq!(names, 3);
        remove_after(&dir, 2).unwrap();
        let steps: Vec<usize> = list_steps(&dir).unwrap().into_iter().map(|s| s.0).collect();
        assert_eq!(steps, [1, 2]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_files_are_errors_naming_file_and_line() {
        let dir = tmp_dir("bad");
        std::fs::create_dir_all(dir.join(DIR)).unwrap();
        let path = step_path(&dir, 1);
        std::fs::write(&path, "plain text, not zstd").unwrap();
        let err = format!("{:#}", read_step(&path).unwrap_err());
        assert!(err.contains("step-1.jsonl.zst"), "{err}");
        let mut z = zstd::Encoder::new(File::create(&path).unwrap(), 1).unwrap();
        serde_json::to_writer(&mut z, &record(1, "a")).unwrap();
        z.write_all(b"\n{\"step\": 1}\n").unwrap();
        z.finish().unwrap();
        let err = format!("{:#}", read_step(&path).unwrap_err());
        assert!(
            err.contains("step-1.jsonl.zst:2: not a trajectory record"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
