//! `metrics.jsonl`: one JSON object per line, flushed as written so a crash loses nothing;
//! optionally mirrored to TensorBoard event files.

use crate::record::Record;
use crate::tensorboard::EventWriter;
use anyhow::{Context, Result};
use serde_json::Value;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

/// Appends records to a `metrics.jsonl`, one JSON object per line, and to the event file of
/// [`MetricsLog::with_tensorboard`] when there is one.
pub struct MetricsLog {
    file: File,
    path: PathBuf,
    tensorboard: Option<EventWriter>,
}

impl MetricsLog {
    /// Opens `path` for appending (created if missing).
    pub fn create(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(MetricsLog {
            file,
            path: path.to_path_buf(),
            tensorboard: None,
        })
    }

    /// Also writes every record to a TensorBoard event file in `dir`, rebuilt first from the
    /// records the log already holds, so the two always show the same steps.
    pub fn with_tensorboard(mut self, dir: &Path) -> Result<Self> {
        let records = read_metrics(&self.path)?;
        self.tensorboard = Some(EventWriter::rebuild(dir, &records)?);
        Ok(self)
    }

    /// Writes `record` as one line and flushes it, so a crash loses at most the step in flight;
    /// then the same to TensorBoard.
    pub fn append(&mut self, record: &Record) -> Result<()> {
        let mut line = serde_json::to_string(record)?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))?;
        match &mut self.tensorboard {
            Some(tb) => tb.append(record),
            None => Ok(()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Reads every record; a bad line is an error naming the file and line number, except a last
/// line without its newline that is not a record: one a running job is still writing, left out.
pub fn read_metrics(path: &Path) -> Result<Vec<Record>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = BufReader::new(file);
    let mut out = Vec::new();
    let mut line = String::new();
    for i in 0.. {
        line.clear();
        let read = reader
            .read_line(&mut line)
            .with_context(|| format!("{}:{}: unreadable line", path.display(), i + 1))?;
        if read == 0 {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let being_written = !line.ends_with('\n');
        let record = match serde_json::from_str(&line) {
            Ok(Value::Object(m)) => m,
            _ if being_written => break,
            _ => anyhow::bail!("{}:{}: not a JSON object", path.display(), i + 1),
        };
        out.push(record);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tmp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("skein-metrics-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn appended_records_read_back_in_order_and_survive_reopening() {
        let dir = tmp_dir("round-trip");
        let path = dir.join("metrics.jsonl");
        for round in 0..2 {
            // A second log on the same file (a resumed run) appends instead of truncating.
            let mut log = MetricsLog::create(&path).unwrap();
            for step in 0..3 {
                let Value::Object(m) =
                    json!({"step": round * 3 + step, "reward/mean": step as f64 * 0.5})
                else {
                    unreachable!()
                };
                log.append(&m).unwrap();
            }
            // Flushed per line: readable before the log is dropped.
            assert_eq!(read_metrics(log.path()).unwrap().len(), 3 * (round + 1));
        }
        let records = read_metrics(&path).unwrap();
        let steps: Vec<u64> = records
            .iter()
            .map(|r| r["step"].as_u64().unwrap())
            .collect();
        assert_eq!(steps, [0, 1, 2, 3, 4, 5]);
        assert_eq!(records[2]["reward/mean"], 1.0);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_lines_are_errors_naming_file_and_line() {
        let dir = tmp_dir("bad");
        let path = dir.join("metrics.jsonl");
        std::fs::write(&path, "{\"step\": 1}\n\nnot json\n").unwrap();
        let err = format!("{:#}", read_metrics(&path).unwrap_err());
        assert!(err.contains("metrics.jsonl:3"), "{err}");
        std::fs::write(&path, "{\"step\": 1}\n[1, 2]\n").unwrap();
        let err = format!("{:#}", read_metrics(&path).unwrap_err());
        assert!(err.contains("metrics.jsonl:2: not a JSON object"), "{err}");
        let err = format!("{:#}", read_metrics(&dir.join("absent.jsonl")).unwrap_err());
        assert!(err.contains("absent.jsonl"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A run appending a record may be read between its first bytes and its newline: that
    /// line is left out, a whole last record without its newline kept.
    #[test]
    fn a_record_still_being_written_is_left_out() {
        let dir = tmp_dir("being-written");
        let path = dir.join("metrics.jsonl");
        std::fs::write(&path, "{\"step\": 1}\n{\"step\": 2, \"reward/me").unwrap();
        assert_eq!(read_metrics(&path).unwrap().len(), 1);
        std::fs::write(&path, "{\"step\": 1}\n{\"step\": 2}").unwrap();
        assert_eq!(read_metrics(&path).unwrap().len(), 2);
        std::fs::remove_dir_all(&dir).ok();
    }
}
