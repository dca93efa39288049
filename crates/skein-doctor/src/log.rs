//! `RUN_DIR/diagnoses.jsonl`: one [`Diagnosis`] per line, written when it starts and again as
//! it lasts ([`rewrite`], atomic, so a running run's file is readable). Reading is bounded: the file is the run's, but a
//! reader (`skein view`) must not be made to hold an unbounded one.

use crate::diagnosis::Diagnosis;
use crate::lines::{for_each_line, Line};
use anyhow::{Context, Result};
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

pub const FILE: &str = "diagnoses.jsonl";
/// Most bytes read of the file, and the longest line read: a longer one refuses the whole file,
/// with an error naming the line (`read_diagnoses`).
const MAX_BYTES: u64 = 16 << 20;
const MAX_LINE: usize = 64 << 10;

pub struct DiagnosisLog {
    path: PathBuf,
    file: File,
}

impl DiagnosisLog {
    /// Appends to `RUN_DIR/diagnoses.jsonl` (a resumed run keeps what its steps found).
    pub fn open(run_dir: &Path) -> Result<Self> {
        let path = run_dir.join(FILE);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(DiagnosisLog { path, file })
    }

    pub fn append(&mut self, d: &Diagnosis) -> Result<()> {
        let mut line = serde_json::to_string(d)?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// Keeps the lines of diagnoses that started at or before `step`, each lasting at most to
/// `step` (a resume from a checkpoint of that step redoes the steps after it, and finds their
/// diagnoses again); returns them.
pub fn truncate_after(run_dir: &Path, step: usize) -> Result<Vec<Diagnosis>> {
    let path = run_dir.join(FILE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let kept: Vec<Diagnosis> = read_diagnoses(&path)?
        .into_iter()
        .filter(|d| d.step <= step)
        .map(|d| Diagnosis {
            until: d.until.min(step),
            ..d
        })
        .collect();
    rewrite(run_dir, &kept)?;
    Ok(kept)
}

/// Replaces `RUN_DIR/diagnoses.jsonl` with `diagnoses`, one per line, through a temporary file
/// and a rename: a reader sees the old file or the new one, never half of one. A diagnosis's
/// `until` grows while it keeps holding, so the file is rewritten, not only appended to.
pub fn rewrite(run_dir: &Path, diagnoses: &[Diagnosis]) -> Result<()> {
    let path = run_dir.join(FILE);
    let tmp = run_dir.join(format!("{FILE}.tmp"));
    let mut out = String::new();
    for d in diagnoses {
        out.push_str(&serde_json::to_string(d)?);
        out.push('\n');
    }
    std::fs::write(&tmp, out).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))
}

/// The diagnoses of a `diagnoses.jsonl` (at most its first 16 MiB). A line that is not a
/// diagnosis is an error naming it: skipped, it would read as a rule that never held, and a
/// resume would write the file back without it. Only a last line without its newline, one
/// being appended, is passed over.
pub fn read_diagnoses(path: &Path) -> Result<Vec<Diagnosis>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    let mut bad: Option<(usize, String)> = None;
    let mut number = 0;
    let reader = BufReader::new(file.take(MAX_BYTES));
    for_each_line(reader, MAX_LINE, usize::MAX, |line| {
        number += 1;
        let why = match line {
            Line::TooLong => format!("longer than {MAX_LINE} bytes"),
            Line::Kept(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => return,
            Line::Kept(bytes) => match serde_json::from_slice::<Diagnosis>(bytes) {
                Ok(d) => return out.push(d),
                Err(_) if !bytes.ends_with(b"\n") => return,
                Err(e) => e.to_string(),
            },
        };
        bad.get_or_insert((number, why));
    })
    .with_context(|| format!("reading {}", path.display()))?;
    if let Some((line, why)) = bad {
        // The root error names the file only: `skein view` shows it and never whole paths.
        return Err(anyhow::anyhow!(
            "{FILE}:{line}: not a diagnosis ({why}); repair or remove that line (the run's \
             metrics.jsonl holds what the rules read, and `skein doctor` finds them again)"
        ))
        .with_context(|| format!("reading {}", path.display()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diagnosis(step: usize) -> Diagnosis {
        Diagnosis {
            name: "truncation".into(),
            title: "t".into(),
            step,
            until: step,
            steps: vec![step],
            evidence: "e".into(),
            examples: vec![],
            advice: "a".into(),
        }
    }

    #[test]
    fn appended_lines_read_back_truncate_by_step_and_a_broken_one_is_named() {
        let dir = std::env::temp_dir().join(format!("skein-doctor-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut log = DiagnosisLog::open(&dir).unwrap();
        log.append(&diagnosis(2)).unwrap();
        log.append(&diagnosis(5)).unwrap();
        log.append(&diagnosis(7)).unwrap();
        let path = dir.join(FILE);
        let steps = |p: &Path| -> Vec<usize> {
            read_diagnoses(p).unwrap().iter().map(|d| d.step).collect()
        };
        assert_eq!(steps(&path), vec![2, 5, 7]);
        let mut lasting = diagnosis(3);
        lasting.until = 9;
        log.append(&lasting).unwrap();
        truncate_after(&dir, 5).unwrap();
        assert_eq!(steps(&path), vec![2, 5, 3]);
        let untils: Vec<usize> = read_diagnoses(&path)
            .unwrap()
            .iter()
            .map(|d| d.until)
            .collect();
        assert_eq!(
            untils,
            vec![2, 5, 5],
            "a kept diagnosis lasts at most to the step kept"
        );
        // A line being appended (no newline yet) is passed over.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"name\": \"half a li").unwrap();
        assert_eq!(steps(&path), vec![2, 5, 3]);
        // A whole line that is not a diagnosis is named, and a resume keeps the file as it is.
        f.write_all(b"\n").unwrap();
        let before = std::fs::read(&path).unwrap();
        let err = format!("{:#}", read_diagnoses(&path).unwrap_err());
        assert!(err.contains("diagnoses.jsonl:4: not a diagnosis"), "{err}");
        assert!(truncate_after(&dir, 5).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), before);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
