//! The run directories a viewer shows, and reading their files. Files are read on each request,
//! so a run still training shows its new steps on a reload; a decoded step is kept while its
//! file is unchanged, since reading one trajectory after another decodes the same file.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use skein_report::trajectories::{self, TrajectoryRecord};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Decoded step files kept: the one being read, and a few to go back to.
const CACHED_STEPS: usize = 4;

/// One run directory.
#[derive(Debug, Clone)]
pub struct Run {
    /// Short name for the page: the directory's name, or its path where names repeat.
    pub name: String,
    pub dir: PathBuf,
}

/// A run's metrics: every record of `metrics.jsonl` that has a `step`, and the names of the
/// numeric metrics among them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Metrics {
    pub keys: Vec<String>,
    pub records: Vec<serde_json::Map<String, Value>>,
    /// There is no `metrics.jsonl` (yet).
    pub missing: bool,
}

type Cached = (PathBuf, SystemTime, u64, Arc<Vec<TrajectoryRecord>>);

pub struct Runs {
    runs: Vec<Run>,
    cache: Mutex<VecDeque<Cached>>,
}

impl Runs {
    /// The runs of `dirs`, in order; each must be a directory holding a `metrics.jsonl` or a
    /// `trajectories` folder.
    pub fn open(dirs: &[PathBuf]) -> Result<Runs> {
        if dirs.is_empty() {
            bail!("no run directory given");
        }
        let mut runs = Vec::new();
        for dir in dirs {
            if !dir.is_dir() {
                bail!("{}: not a directory", dir.display());
            }
            if !dir.join("metrics.jsonl").exists() && !dir.join(trajectories::DIR).exists() {
                bail!(
                    "{}: neither metrics.jsonl nor {}/ in it; is it a run directory?",
                    dir.display(),
                    trajectories::DIR
                );
            }
            let name = dir
                .canonicalize()
                .ok()
                .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| dir.display().to_string());
            runs.push(Run {
                name,
                dir: dir.clone(),
            });
        }
        let names: Vec<String> = runs.iter().map(|r| r.name.clone()).collect();
        for r in &mut runs {
            if names.iter().filter(|n| **n == r.name).count() > 1 {
                r.name = r.dir.display().to_string();
            }
        }
        Ok(Runs {
            runs,
            cache: Mutex::new(VecDeque::new()),
        })
    }

    pub fn list(&self) -> &[Run] {
        &self.runs
    }

    /// Run number `run`, or an error the page can show.
    pub fn get(&self, run: usize) -> Result<&Run> {
        self.runs
            .get(run)
            .with_context(|| format!("no run {run}: there are {}", self.runs.len()))
    }

    pub fn metrics(&self, run: usize) -> Result<Metrics> {
        let path = self.get(run)?.dir.join("metrics.jsonl");
        if !path.exists() {
            return Ok(Metrics {
                keys: Vec::new(),
                records: Vec::new(),
                missing: true,
            });
        }
        let records: Vec<_> = skein_report::read_metrics(&path)?
            .into_iter()
            .filter(|r| r.get("step").is_some_and(Value::is_number))
            .collect();
        let mut keys: Vec<String> = records
            .iter()
            .flat_map(|r| r.iter())
            .filter(|(k, v)| k.as_str() != "step" && v.is_number())
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys.dedup();
        Ok(Metrics {
            keys,
            records,
            missing: false,
        })
    }

    pub fn steps(&self, run: usize) -> Result<Vec<usize>> {
        let dir = &self.get(run)?.dir;
        Ok(trajectories::list_steps(dir)?
            .into_iter()
            .map(|(s, _)| s)
            .collect())
    }

    /// The records of one step (None: the run has no file of it), decoded once per version of
    /// its file.
    pub fn step(&self, run: usize, step: usize) -> Result<Option<Arc<Vec<TrajectoryRecord>>>> {
        let path = trajectories::step_path(&self.get(run)?.dir, step);
        let Ok(meta) = std::fs::metadata(&path) else {
            return Ok(None);
        };
        let stamp = (
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            meta.len(),
        );
        if let Some(records) = self.cached(&path, stamp) {
            return Ok(Some(records));
        }
        let records = Arc::new(trajectories::read_step(&path)?);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.retain(|c| c.0 != path);
        if cache.len() == CACHED_STEPS {
            cache.pop_back();
        }
        cache.push_front((path, stamp.0, stamp.1, records.clone()));
        Ok(Some(records))
    }

    fn cached(&self, path: &Path, stamp: (SystemTime, u64)) -> Option<Arc<Vec<TrajectoryRecord>>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .iter()
            .find(|c| c.0 == path && (c.1, c.2) == stamp)
            .map(|c| c.3.clone())
    }
}
