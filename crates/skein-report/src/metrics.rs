//! `metrics.jsonl`: one JSON object per line, flushed as written so a crash loses nothing.

use anyhow::{Context, Result};
use serde_json::{Map, Value};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

pub type Record = Map<String, Value>;

pub struct MetricsLog {
    file: File,
    path: PathBuf,
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
        })
    }

    pub fn append(&mut self, record: &Record) -> Result<()> {
        let mut line = serde_json::to_string(record)?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// Reads every record; a bad line is an error naming the file and line number.
pub fn read_metrics(path: &Path) -> Result<Vec<Record>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line =
            line.with_context(|| format!("{}:{}: unreadable line", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: not a JSON object", path.display(), i + 1))?;
        match value {
            Value::Object(m) => out.push(m),
            _ => anyhow::bail!("{}:{}: not a JSON object", path.display(), i + 1),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_and_bad_lines_name_their_number() {
        let dir = std::env::temp_dir().join(format!("skein-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        let mut log = MetricsLog::create(&path).unwrap();
        for step in 0..3 {
            let Value::Object(m) = json!({"step": step, "reward/mean": step as f64 * 0.5}) else {
                unreachable!()
            };
            log.append(&m).unwrap();
        }
        let records = read_metrics(&path).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(records[2]["reward/mean"], 1.0);
        std::fs::write(&path, "{\"step\": 1}\nnot json\n").unwrap();
        let err = format!("{:#}", read_metrics(&path).unwrap_err());
        assert!(err.contains("metrics.jsonl:2"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
