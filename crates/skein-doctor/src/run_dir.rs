//! Diagnoses a run directory after the fact (`skein doctor`), and rebuilds a resumed run's
//! doctor: its `metrics.jsonl` replayed through a [`Doctor`] record by record, as the trainer
//! fed them, with a step's trajectories digested from its step file when the run kept it and
//! a rule needs them. Reads are bounded: overlong lines are skipped, and so are step files
//! that cannot be read.

use crate::diagnosis::Diagnosis;
use crate::digest::Digest;
use crate::doctor::Doctor;
use crate::history::WINDOW;
use crate::lines::{for_each_line, Line};
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use skein_report::trajectories::{read_step, step_path};
use std::collections::VecDeque;
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
    /// Lines of `metrics.jsonl` skipped (overlong or not a JSON object), and the number of
    /// the first (from 1). A last line without its newline, a record being written, is not.
    pub skipped_lines: usize,
    pub first_skipped_line: Option<usize>,
    /// Step files the replay read: those of steps where a diagnosis starts, and of the RL
    /// steps the doctor keeps at the end.
    pub step_files_read: usize,
    /// Step files the replay needed that could not be read (examples are missing there).
    pub unreadable_step_files: usize,
}

/// The diagnoses of the run in `dir`. A run with no RL step read is an error, not a healthy
/// run: there was nothing to judge.
pub fn diagnose_run_dir(dir: &Path) -> Result<RunDiagnoses> {
    let (doctor, replayed) = replay(dir)?;
    if replayed.steps == 0 {
        let path = dir.join("metrics.jsonl");
        let unreadable = match replayed.first_skipped_line {
            Some(first) => format!(
                " ({} unreadable lines, the first {}:{first})",
                replayed.skipped_lines,
                path.display()
            ),
            None => String::new(),
        };
        bail!(
            "{} holds no RL step yet{unreadable}: nothing to diagnose",
            path.display()
        );
    }
    Ok(RunDiagnoses {
        diagnoses: doctor.into_found(),
        replayed,
    })
}

/// A doctor that has seen every record of the run in `dir`, as the trainer fed them: the same
/// diagnoses, examples included, and the same steps stored, trajectories included.
///
/// Its memory and reads are bounded whatever the run's length. `metrics.jsonl` is streamed
/// (at most `MAX_LINES` lines of at most `MAX_LINE` bytes, one at a time), and the doctor
/// keeps a window of steps and running summaries. A step file is decompressed only where the
/// rules read it: at a step where a diagnosis starts (its examples come from there), and for
/// the RL steps the doctor keeps with their trajectories at the end (at most [`WINDOW`] + 1).
/// So one step's records are held at a time, and the step files read are at most the steps
/// where a diagnosis starts, plus [`WINDOW`] + 1, however long the run.
pub fn replay(dir: &Path) -> Result<(Doctor, Replayed)> {
    skein_report::check_run_dir(dir)?;
    let path = dir.join("metrics.jsonl");
    let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let mut doctor = Doctor::default();
    let mut out = Replayed::default();
    let mut files = StepFiles::new(dir);
    let mut number = 0;
    for_each_line(BufReader::new(file), MAX_LINE, MAX_LINES, |line| {
        number += 1;
        let Some(record) = record_of(line, number, &mut out) else {
            return;
        };
        if files.note(&record) {
            out.steps += 1;
        }
        doctor.observe_with(record, || files.read_newest(&mut out));
    })
    .with_context(|| format!("reading {}", path.display()))?;
    files.fill_window(&mut doctor, &mut out);
    Ok((doctor, out))
}

/// Which steps' files a replay may still read. A step's trajectories come with its first
/// record (an evaluation may add a second): a record of a new RL step names its step file.
struct StepFiles<'a> {
    dir: &'a Path,
    /// The step of the last record that had one.
    last_step: Option<usize>,
    /// The newest step, while its record named a step file not read yet.
    unread_newest: Option<usize>,
    /// The latest steps whose records named a step file, and whether it was read: as many as
    /// the doctor's window keeps, oldest first.
    named: VecDeque<(usize, bool)>,
}

impl<'a> StepFiles<'a> {
    fn new(dir: &'a Path) -> Self {
        StepFiles {
            dir,
            last_step: None,
            unread_newest: None,
            named: VecDeque::new(),
        }
    }

    /// Takes note of a record before the doctor sees it; true when it names its step's file
    /// (it is the first record of an RL step).
    fn note(&mut self, record: &Map<String, Value>) -> bool {
        let Some(step) = record
            .get("step")
            .and_then(Value::as_u64)
            .map(|s| s as usize)
        else {
            return false;
        };
        let new_step = self.last_step != Some(step);
        self.last_step = Some(step);
        // As `StepView::is_rl_step` decides: a step whose every trajectory failed logs no
        // `reward/mean`, and its file is the one the failure examples come from.
        let rl_step =
            record.contains_key("rollout/trajectories") || record.contains_key("reward/mean");
        let names_file = step > 0 && new_step && rl_step;
        if names_file {
            self.unread_newest = Some(step);
            self.named.push_back((step, false));
            if self.named.len() > WINDOW + 1 {
                self.named.pop_front();
            }
        } else if new_step {
            self.unread_newest = None;
        }
        names_file
    }

    /// The digests of the newest step's file, if its record named one not read yet.
    fn read_newest(&mut self, out: &mut Replayed) -> Vec<Digest> {
        let Some(step) = self.unread_newest.take() else {
            return Vec::new();
        };
        self.mark_read(step);
        step_digests(self.dir, step, out)
    }

    fn mark_read(&mut self, step: usize) {
        if let Some(n) = self.named.iter_mut().rev().find(|n| n.0 == step) {
            n.1 = true;
        }
    }

    /// Reads the files not read yet of the steps the doctor still keeps, so it holds what it
    /// would had it been given every step's trajectories.
    fn fill_window(&mut self, doctor: &mut Doctor, out: &mut Replayed) {
        for (step, read) in std::mem::take(&mut self.named) {
            let kept_bare = doctor
                .history()
                .step(step)
                .is_some_and(|s| s.trajectories.is_empty());
            if !read && kept_bare {
                doctor.attach(step, step_digests(self.dir, step, out));
            }
        }
        self.unread_newest = None;
    }
}

/// The record line `number` holds; a line that is too long or not a JSON object is counted
/// as skipped, a blank one ignored, and so is a last line still being written (no newline
/// yet).
fn record_of(line: Line, number: usize, out: &mut Replayed) -> Option<Map<String, Value>> {
    let mut skip = || {
        out.skipped_lines += 1;
        out.first_skipped_line.get_or_insert(number);
        None
    };
    let Line::Kept(bytes) = line else {
        return skip();
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(record)) => Some(record),
        _ if !bytes.ends_with(b"\n") => None,
        _ => skip(),
    }
}

/// The digests of `step`'s file, none when the run kept none or it cannot be read.
fn step_digests(dir: &Path, step: usize, out: &mut Replayed) -> Vec<Digest> {
    let path = step_path(dir, step);
    if !path.is_file() {
        return Vec::new();
    }
    out.step_files_read += 1;
    match read_step(&path) {
        Ok(records) => records.iter().map(Digest::of_record).collect(),
        Err(_) => {
            out.unreadable_step_files += 1;
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use skein_report::trajectories::{write_step, RowRecord, Status, TrajectoryRecord};
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
        // A record still being written is not an unreadable line.
        write!(f, "{{\"step\": 4, \"rew").unwrap();
        drop(f);
        let r = diagnose_run_dir(&dir).unwrap();
        assert_eq!((r.replayed.steps, r.replayed.skipped_lines), (3, 2));
        assert_eq!(r.replayed.first_skipped_line, Some(5));
        let names: Vec<&str> = r.diagnoses.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, vec!["truncation"]);
        assert_eq!((r.diagnoses[0].step, r.diagnoses[0].until), (2, 3));
        // No RL step read is no verdict: an error naming the first unreadable line.
        std::fs::write(dir.join("metrics.jsonl"), "{\"step\": 0}\ngarbage\n").unwrap();
        let err = format!("{:#}", diagnose_run_dir(&dir).unwrap_err());
        assert!(
            err.contains("no RL step yet (1 unreadable lines, the first")
                && err.contains("metrics.jsonl:2"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(diagnose_run_dir(&dir)
            .unwrap_err()
            .to_string()
            .contains("does not exist"));
    }

    // A long synthetic run: step 20's rewards go far beyond the range before; the steps below
    // cut off half their responses, have mostly equal groups, or fail half their trajectories'
    // reward calls; a gradient
    // norm spikes every 100 steps; every 10th step is evaluated (as a second record),
    // held-out accuracy falling from step 40 on while the reward rises.
    fn truncating(s: usize) -> bool {
        (10..13).contains(&(s % 60))
    }
    fn equal_groups(s: usize) -> bool {
        (30..34).contains(&(s % 90))
    }
    fn failing(s: usize) -> bool {
        s % 70 == 5
    }

    fn step_record(s: usize) -> Value {
        json!({
            "step": s,
            "reward/mean": 0.3 + 0.002 * s as f64,
            "reward/min": 0.0,
            "reward/max": if s == 20 { 50.0 } else { 1.0 },
            "response/truncated_fraction": if truncating(s) { 0.5 } else { 0.0 },
            "batch/equal_reward_group_fraction": if equal_groups(s) { 0.9 } else { 0.5 },
            "reward/step_failed": if failing(s) { 4 } else { 0 },
            "batch/failed_trajectories": if failing(s) { 4 } else { 0 },
            "rollout/trajectories": 8,
            "grad_norm": if s % 100 == 50 { 40.0 } else { 1.0 },
        })
    }

    fn trajectory(s: usize, k: usize) -> TrajectoryRecord {
        let (status, reason) = match k {
            0..4 if failing(s) => (Status::Failed, Some("reward call timed out".into())),
            0..4 if truncating(s) => (Status::Truncated, Some("max_new_tokens".into())),
            _ => (Status::Finished, None),
        };
        // Groups of 4; with equal groups, every member of one earns the same.
        let correct = equal_groups(s) || k.is_multiple_of(2);
        TrajectoryRecord {
            step: s,
            policy_version: s as u64,
            id: format!("s{s}-{k}"),
            group: format!("s{s}-g{}", k / 4),
            source: "synthetic".into(),
            status,
            reason,
            reward: if s == 20 && k == 5 {
                50.0
            } else {
                f64::from(u8::from(correct))
            },
            correct,
            turns: 1,
            tool_calls: 0,
            turn_rewards: vec![None],
            rows: vec![RowRecord {
                transition: None,
                mini_batch: Some(0),
                rank: Some(0),
                prompt_ids: vec![1, 2],
                prompt_text: vec!["a".into(), "b".into()],
                response_ids: vec![3; 2 + k],
                response_text: vec!["c".into(); 2 + k],
                loss_mask: vec![1; 2 + k],
                behavior_logp: vec![-0.5; 2 + k],
                versions: vec![0; 2 + k],
                advantages: vec![0.1; 2 + k],
                is_weight: Vec::new(),
            }],
        }
    }

    /// A run of `steps` RL steps after a warm-up evaluation, each with a step file but one
    /// that was never written and one that is not zstd.
    fn write_run(dir: &Path, steps: usize) {
        std::fs::create_dir_all(dir).unwrap();
        let mut f = File::create(dir.join("metrics.jsonl")).unwrap();
        writeln!(f, "{}", json!({"step": 0, "eval/accuracy": 0.5})).unwrap();
        for s in 1..=steps {
            writeln!(f, "{}", step_record(s)).unwrap();
            if s.is_multiple_of(10) {
                let accuracy = if s <= 40 { 0.5 + 0.005 * s as f64 } else { 0.6 };
                let accuracy = accuracy - 0.001 * s.saturating_sub(40) as f64;
                writeln!(f, "{}", json!({"step": s, "eval/accuracy": accuracy})).unwrap();
            }
            match s {
                131 => {}
                250 => std::fs::write(step_path(dir, s), b"not zstd").unwrap(),
                _ => {
                    let records: Vec<TrajectoryRecord> = (0..8).map(|k| trajectory(s, k)).collect();
                    write_step(dir, s, &records).unwrap();
                }
            }
        }
    }

    /// A doctor fed every record of `dir` one at a time, each step's digests with its first
    /// record, as the trainer feeds them.
    fn fed_one_at_a_time(dir: &Path) -> Doctor {
        let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
        let mut doctor = Doctor::default();
        let mut last_step = None;
        for line in text.lines() {
            let record: Map<String, Value> = serde_json::from_str(line).unwrap();
            let step = record["step"].as_u64().unwrap() as usize;
            let digests = match step > 0 && last_step != Some(step) {
                true => read_step(&step_path(dir, step))
                    .map(|r| r.iter().map(Digest::of_record).collect())
                    .unwrap_or_default(),
                false => Vec::new(),
            };
            last_step = Some(step);
            doctor.observe(record, digests);
        }
        doctor
    }

    #[test]
    fn a_long_replay_finds_what_feeding_every_step_finds_reading_few_step_files() {
        let dir = std::env::temp_dir().join(format!("skein-doctor-long-{}", std::process::id()));
        let steps = 400;
        write_run(&dir, steps);
        let (replayed, read) = replay(&dir).unwrap();
        let fed = fed_one_at_a_time(&dir);
        assert_eq!(replayed.found(), fed.found());
        let stored = |d: &Doctor| d.history().stored().cloned().collect::<Vec<_>>();
        assert_eq!(
            stored(&replayed),
            stored(&fed),
            "the window, trajectories included"
        );
        assert_eq!(
            format!("{:?}", replayed.history().summaries()),
            format!("{:?}", fed.history().summaries())
        );

        // Every kind of rule held, and examples come from steps long before the window.
        let found = replayed.found();
        let mut names: Vec<&str> = found.iter().map(|d| d.name.as_str()).collect();
        names.sort();
        names.dedup();
        let expected = [
            "failed-trajectories",
            "no-learning-signal",
            "overfitting",
            "reward-failures",
            "reward-out-of-range",
            "truncation",
            "unstable-updates",
        ];
        assert_eq!(names, expected);
        let early_examples = found
            .iter()
            .filter(|d| d.step + WINDOW < steps && !d.examples.is_empty())
            .count();
        assert!(early_examples >= 10, "{found:#?}");
        assert!(found
            .iter()
            .any(|d| d.evidence.contains("such groups were all right")));
        // A failure's reason comes from the step file the replay read where it started.
        assert!(found.iter().any(|d| d
            .evidence
            .ends_with("one failed for: reward call timed out")));

        // Files are read where a diagnosis starts and for the window, not for every step.
        assert_eq!(read.steps, steps);
        assert!(read.step_files_read <= found.len() + WINDOW + 1, "{read:?}");
        assert!(read.step_files_read < steps / 4, "{read:?}");
        // Step 250's file is needed (a gradient spike starts a diagnosis there) and broken;
        // step 131's was never written, so its diagnosis has no examples.
        assert_eq!(read.unreadable_step_files, 1);
        let at_131 = found.iter().find(|d| d.step == 131).unwrap();
        assert!(at_131.examples.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
