//! `skein doctor RUN_DIR…`: replays each run's `metrics.jsonl` and step files through the
//! diagnoses' rules (`skein-doctor`) and reports what held. Exit status 0: every run healthy;
//! 1: a diagnosis held in one; 2: a run could not be read or has no RL step yet (the others
//! are reported all the same).

use anyhow::Result;
use skein_doctor::{diagnose_run_dir, Diagnosis, Replayed, RunDiagnoses};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Run directories (finished or still running).
    #[arg(required = true)]
    run_dirs: Vec<PathBuf>,
    /// One JSON object per diagnosis on stdout (with a `run` key) instead of the report.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &DoctorArgs) -> ExitCode {
    // A run that cannot be read is said and passed over: the others are still diagnosed.
    let (mut sick, mut unreadable) = (false, false);
    for dir in &args.run_dirs {
        let shown = diagnose_run_dir(dir).and_then(|r| {
            sick |= !r.diagnoses.is_empty();
            match args.json {
                true => {
                    // stdout is the diagnoses alone; what was passed over goes beside it.
                    if let Some(notes) = notes(&r.replayed) {
                        eprintln!("{}: {notes}", dir.display());
                    }
                    json_lines(dir, &r.diagnoses)
                }
                false => Ok(report(dir, &r)),
            }
        });
        match shown {
            Ok(text) => print!("{text}"),
            Err(e) => {
                eprintln!("error: {}: {e:#}", dir.display());
                unreadable = true;
            }
        }
    }
    ExitCode::from(match (unreadable, sick) {
        (true, _) => 2,
        (false, true) => 1,
        (false, false) => 0,
    })
}

/// What the replay passed over, if anything: unreadable lines (the first named) and step
/// files.
fn notes(read: &Replayed) -> Option<String> {
    let mut notes = Vec::new();
    if let (n @ 1.., Some(first)) = (read.skipped_lines, read.first_skipped_line) {
        notes.push(format!(
            "{n} unreadable metrics lines skipped (the first: metrics.jsonl:{first})"
        ));
    }
    if read.unreadable_step_files > 0 {
        notes.push(format!(
            "{} step files unreadable (no examples there)",
            read.unreadable_step_files
        ));
    }
    (!notes.is_empty()).then(|| notes.join(", "))
}

fn json_lines(dir: &std::path::Path, found: &[Diagnosis]) -> Result<String> {
    let mut out = String::new();
    for d in found {
        let mut v = serde_json::to_value(d)?;
        v["run"] = dir.display().to_string().into();
        out.push_str(&serde_json::to_string(&v)?);
        out.push('\n');
    }
    Ok(out)
}

/// The report of one run: a header line, then each diagnosis with its evidence, examples and
/// advice.
fn report(dir: &std::path::Path, r: &RunDiagnoses) -> String {
    let read = &r.replayed;
    let notes = notes(read).map_or_else(String::new, |n| format!("; {n}"));
    let mut out = match r.diagnoses.len() {
        0 => format!("{}: healthy ({} steps{notes})\n", dir.display(), read.steps),
        n => format!(
            "{}: {n} diagnos{} over {} steps{notes}\n",
            dir.display(),
            if n == 1 { "is" } else { "es" },
            read.steps
        ),
    };
    for d in &r.diagnoses {
        let span = if d.until > d.step {
            format!("steps {}–{}", d.step, d.until)
        } else {
            format!("step {}", d.step)
        };
        out.push_str(&format!("\n  {} ({span}): {}\n", d.name, d.title));
        out.push_str(&format!("    evidence: {}\n", d.evidence));
        if !d.examples.is_empty() {
            let ex: Vec<String> = d
                .examples
                .iter()
                .map(|e| format!("step {} {}", e.step, e.id))
                .collect();
            out.push_str(&format!("    examples: {}\n", ex.join(", ")));
        }
        out.push_str(&format!("    try: {}\n", d.advice));
    }
    out
}
