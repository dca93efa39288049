//! The run directories a viewer shows, and reading their files. Files are read on each request,
//! so a run still training shows its new steps on a reload; what was made of a file is kept
//! while the file is unchanged, within the viewer's [`Limits`].

use crate::cache::{FileCache, Stamp};
use crate::limits::Limits;
use crate::lines::open_regular;
use crate::{metrics, step_file};
use anyhow::{anyhow, bail, Context, Result};
use axum::body::Bytes;
use skein_doctor::Diagnosis;
use skein_report::trajectories::{self, TrajectoryRecord};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Decoded step files kept: the one being read, and a few to go back to.
const CACHED_STEPS: usize = 4;

/// One run directory.
#[derive(Debug, Clone)]
pub struct Run {
    /// Its name on the page and in messages: the directory's name, or where names repeat its
    /// path from the folder the runs share. Never the whole path: the page is no map of the
    /// machine's folders.
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
        let mut canonical = Vec::new();
        for dir in dirs {
            // A run's trajectories are enough to browse, its metrics.jsonl lost or not.
            if !dir.join(trajectories::DIR).is_dir() {
                skein_report::check_run_dir(dir)?;
            }
            canonical.push(
                dir.canonicalize()
                    .with_context(|| format!("{}: not readable", dir.display()))?,
            );
        }
        let runs = skein_report::run_names(&canonical)
            .into_iter()
            .zip(dirs)
            .map(|(name, dir)| Run {
                name,
                dir: dir.clone(),
            })
            .collect();
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
        let shown = shown(r, &path);
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
        let shown = shown(r, &path);
        let step = step_file::read(&path, &shown, &self.limits)?;
        let records = Arc::new(step.records);
        self.steps
            .put(&path, stamp, step.held_bytes, records.clone());
        Ok(Some(records))
    }

    /// The diagnoses the run recorded while it trained (`diagnoses.jsonl`, read within
    /// [`skein_doctor::read_diagnoses`]'s bounds); None when it has no such file (a run from
    /// before diagnoses: a run creates it, empty, when it starts).
    pub fn diagnoses(&self, run: usize) -> Result<Option<Vec<Diagnosis>>> {
        let r = self.get(run)?;
        let path = r.dir.join(skein_doctor::FILE);
        if std::fs::metadata(&path).is_err() {
            return Ok(None);
        }
        let shown = shown(r, &path);
        // A device or a pipe is refused before it is read: reading one may never end. (It is
        // opened again by path to be read: a file swapped for one in between is not caught.)
        drop(open_regular(&path, &shown)?);
        // Its messages name the whole path; the viewer's name the file from its run.
        let read = skein_doctor::read_diagnoses(&path)
            .map_err(|e| anyhow!("{shown}: {}", e.root_cause()))?;
        Ok(Some(read))
    }

    /// Memory the decoded step files kept hold, as counted when they were kept.
    pub fn step_cache_bytes(&self) -> usize {
        self.steps.held_bytes()
    }
}

/// A file of a run as messages name it: the run's name, then the path within the run.
fn shown(run: &Run, path: &Path) -> String {
    let within = path.strip_prefix(&run.dir).unwrap_or(path);
    format!("{}/{}", run.name, within.display())
}
