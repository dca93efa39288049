//! Diagnoses a run directory after the fact (`skein doctor`): its `metrics.jsonl` replayed
//! through a [`Doctor`] record by record, as the trainer fed them, with each step's
//! trajectories digested from its step file when the run kept it. Reads are bounded:
//! overlong lines are skipped, and so are step files that cannot be read.

use crate::diagnosis::Diagnosis;
use crate::digest::Digest;
use crate::doctor::Doctor;
use crate::lines::{for_each_line, Line};
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use skein_report::trajectories::{read_step, step_path};
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

/// Longest `metrics.jsonl` line read (longer ones are skipped whole), and most lines.
const MAX_LINE: usize = 1 << 20;
const MAX_LINES: usize = 1 << 20;

/// What a run directory's records and step files say, and what could not be read.
#[derive(Debug)]
pub struct RunDiagnoses {
    pub diagnoses: Vec<Diagnosis>,
    pub replayed: Replayed,
}

/// What a replay read.
#[derive(Debug, Default)]
pub struct Replayed {
    /// RL steps replayed.
    pub steps: usize,
    /// Lines of `metrics.jsonl` skipped (overlong or not a JSON object).
    pub skipped_lines: usize,
    /// Steps whose trajectories could not be read (examples are missing there).
    pub unreadable_step_files: usize,
}

pub fn diagnose_run_dir(dir: &Path) -> Result<RunDiagnoses> {
    let (doctor, replayed) = replay(dir)?;
    Ok(RunDiagnoses {
        diagnoses: doctor.into_found(),
        replayed,
    })
}

/// A doctor that has seen every record of the run in `dir`, as the trainer fed them.
pub fn replay(dir: &Path) -> Result<(Doctor, Replayed)> {
    let path = dir.join("metrics.jsonl");
    if !path.is_file() {
        bail!(
            "{} has no metrics.jsonl: not a skein run directory (a run writes it from its \
             first step)",
            dir.display()
        );
    }
    let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let mut doctor = Doctor::default();
    let mut out = Replayed::default();
    let mut last_step = None;
    for_each_line(BufReader::new(file), MAX_LINE, MAX_LINES, |line| {
        let Some(record) = record_of(line, &mut out) else {
            return;
        };
        let step = record
            .get("step")
            .and_then(Value::as_u64)
            .map(|s| s as usize);
        // A step's trajectories come with its first record (an evaluation may add a second).
        let digests = match step {
            Some(s) if s > 0 && last_step != Some(s) && record.contains_key("reward/mean") => {
                out.steps += 1;
                step_digests(dir, s, &mut out.unreadable_step_files)
            }
            _ => Vec::new(),
        };
        last_step = step.or(last_step);
        doctor.observe(record, digests);
    })
    .with_context(|| format!("reading {}", path.display()))?;
    Ok((doctor, out))
}

/// The record a line holds; a line that is too long or not a JSON object is counted as
/// skipped, a blank one ignored.
fn record_of(line: Line, out: &mut Replayed) -> Option<Map<String, Value>> {
    let Line::Kept(bytes) = line else {
        out.skipped_lines += 1;
        return None;
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(record)) => Some(record),
        _ => {
            out.skipped_lines += 1;
            None
        }
    }
}

fn step_digests(dir: &Path, step: usize, unreadable: &mut usize) -> Vec<Digest> {
    let path = step_path(dir, step);
    if !path.is_file() {
        return Vec::new();
    }
    match read_step(&path) {
        Ok(records) => records.iter().map(Digest::of_record).collect(),
        Err(_) => {
            *unreadable += 1;
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_run_directory_replays_to_the_same_diagnoses_and_skips_bad_lines() {
        let dir = std::env::temp_dir().join(format!("skein-doctor-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut f = File::create(dir.join("metrics.jsonl")).unwrap();
        writeln!(f, "{{\"step\": 0, \"eval/accuracy\": 0.2}}").unwrap();
        for s in 1..=3 {
            writeln!(
                f,
                "{{\"step\": {s}, \"reward/mean\": 0.1, \"response/truncated_fraction\": 0.9}}"
            )
            .unwrap();
        }
        writeln!(f, "not json").unwrap();
        writeln!(f, "{}", "x".repeat(MAX_LINE + 10)).unwrap();
        drop(f);
        let r = diagnose_run_dir(&dir).unwrap();
        assert_eq!((r.replayed.steps, r.replayed.skipped_lines), (3, 2));
        let names: Vec<&str> = r.diagnoses.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, vec!["truncation"]);
        assert_eq!((r.diagnoses[0].step, r.diagnoses[0].until), (2, 3));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(diagnose_run_dir(&dir)
            .unwrap_err()
            .to_string()
            .contains("no metrics.jsonl"));
    }
}
