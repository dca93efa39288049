//! The run directories a viewer shows, and reading their files. Files are read on each request,
//! so a run still training shows its new steps on a reload; what was made of a file is kept
//! while the file is unchanged, within the viewer's [`Limits`].

use crate::cache::{FileCache, Stamp};
use crate::limits::Limits;
use crate::{metrics, step_file};
use anyhow::{bail, Context, Result};
use axum::body::Bytes;
use skein_report::trajectories::{self, TrajectoryRecord};
use std::path::PathBuf;
use std::sync::Arc;

/// Decoded step files kept: the one being read, and a few to go back to.
const CACHED_STEPS: usize = 4;

/// One run directory.
#[derive(Debug, Clone)]
pub struct Run {
    /// Short name for the page: the directory's name, or its path where names repeat.
    pub name: String,
    pub dir: PathBuf,
}

pub struct Runs {
    runs: Vec<Run>,
    limits: Limits,
    steps: FileCache<Vec<TrajectoryRecord>>,
    metrics: FileCache<Bytes>,
}

impl Runs {
    /// The runs of `dirs`, in order; each must be a directory holding a `metrics.jsonl` or a
    /// `trajectories` folder.
    pub fn open(dirs: &[PathBuf], limits: Limits) -> Result<Runs> {
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
            limits,
            steps: FileCache::new(CACHED_STEPS, limits.step_cache_bytes),
            metrics: FileCache::new(usize::MAX, limits.metrics_cache_bytes),
        })
    }

    pub fn list(&self) -> &[Run] {
        &self.runs
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Run number `run`, or an error the page can show.
    pub fn get(&self, run: usize) -> Result<&Run> {
        self.runs
            .get(run)
            .with_context(|| format!("no run {run}: there are {}", self.runs.len()))
    }

    /// The API's reply for a run's metrics (see [`metrics::reply`]), made once per version of
    /// the file.
    pub fn metrics(&self, run: usize) -> Result<Bytes> {
        let r = self.get(run)?;
        let path = r.dir.join("metrics.jsonl");
        let Ok(meta) = std::fs::metadata(&path) else {
            return Ok(Bytes::from(metrics::missing_reply(run)));
        };
        let stamp = Stamp::of(&meta);
        if let Some(body) = self.metrics.get(&path, stamp) {
            return Ok(Bytes::clone(&body));
        }
        let shown = path.display().to_string();
        let body = Bytes::from(metrics::reply(&path, &shown, run, &self.limits)?);
        self.metrics
            .put(&path, stamp, body.len(), Arc::new(body.clone()));
        Ok(body)
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
        let r = self.get(run)?;
        let path = trajectories::step_path(&r.dir, step);
        let Ok(meta) = std::fs::metadata(&path) else {
            return Ok(None);
        };
        let stamp = Stamp::of(&meta);
        if let Some(records) = self.steps.get(&path, stamp) {
            return Ok(Some(records));
        }
        let shown = path.display().to_string();
        let step = step_file::read(&path, &shown, &self.limits)?;
        let records = Arc::new(step.records);
        self.steps
            .put(&path, stamp, step.held_bytes, records.clone());
        Ok(Some(records))
    }

    /// Memory the decoded step files kept hold, as counted when they were kept.
    pub fn step_cache_bytes(&self) -> usize {
        self.steps.held_bytes()
    }
}
