//! The run directory, kept safe: one process at a time owns it (`run_lock.rs`), a new run
//! refuses a directory that holds another run (unless told to overwrite it, and then sets that
//! run aside until the new one has written a checkpoint: `replaced_run.rs`), a resume writes
//! nothing until its checkpoint has loaded, and every path a run writes is checked before the
//! first step, so a run that fails never changes a finished run's files.

use super::checkpoint;
use super::config::{Tracking, TrainConfig};
use super::replaced_run::ReplacedRun;
use super::run_lock::RunLock;
use anyhow::{bail, Context, Result};
use skein_report::{tensorboard, trajectories, MetricsLog};
use std::path::PathBuf;

/// Files a run writes at the top of its directory (besides `checkpoint-N/`).
const RUN_FILES: &[&str] = &[
    "config.toml",
    "metrics.jsonl",
    tensorboard::DIR,
    "plot.png",
    "checkpoint",
    "published",
    trajectories::DIR,
    skein_doctor::log::FILE,
];

/// Whether a directory entry named `name` is a run's: its files and `checkpoint-N`
/// directories (with their `.tmp`/`.old` leftovers of an interrupted write).
fn is_run_entry(name: &str) -> bool {
    RUN_FILES.contains(&name) || name.starts_with("checkpoint-")
}

/// Whether a run's `entries` are those of one that stopped before its first record: its
/// config, and a metrics log and diagnoses file with nothing in them.
fn logged_nothing(entries: &[PathBuf]) -> bool {
    entries.iter().all(|p| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let empty = || std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() == 0);
        match name {
            "config.toml" => p.is_file(),
            "metrics.jsonl" => empty(),
            _ => name == skein_doctor::log::FILE && empty(),
        }
    })
}

/// The last component of each path, for messages that list a run's entries.
fn file_names(paths: &[PathBuf]) -> Vec<String> {
    paths
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect()
}

/// What a run may write in `run.dir`, once it has been checked and locked.
pub struct RunDir {
    pub path: PathBuf,
    /// A previous run's files that `--overwrite` sets aside when the run starts writing.
    replaced: Vec<PathBuf>,
    /// Once set aside: removed at the run's first checkpoint, else put back
    /// ([`ReplacedRun`]). Before `lock`, so it is put back while the lock is still held.
    pub set_aside: Option<ReplacedRun>,
    /// Held for the life of the run.
    pub lock: RunLock,
}

impl RunDir {
    /// The directory of a new run. One that already holds a run is refused, unless `overwrite`:
    /// then that run's files are set aside when the run starts writing ([`RunDir::open`]);
    /// anything else in the directory stays.
    pub fn for_new_run(cfg: &TrainConfig, overwrite: bool) -> Result<RunDir> {
        let mut dir = RunDir::checked(cfg)?;
        ReplacedRun::check_none_left(&dir.path)?;
        let previous = dir.run_entries()?;
        if !previous.is_empty() {
            let names = file_names(&previous);
            if !overwrite && logged_nothing(&previous) {
                // A run that failed as it started (an environment that died in the warm-up)
                // left its config and an empty log: nothing to lose, and a rerun with the cause
                // fixed should not need --overwrite. Set aside all the same, as --overwrite's.
                eprintln!(
                    "skein: `run.dir` = {} holds a run that stopped before it logged anything \
                     ({}): replacing it",
                    dir.path.display(),
                    names.join(", ")
                );
            } else if !overwrite {
                let resumable = names.iter().any(|n| n.starts_with("checkpoint-"));
                let resume = if resumable {
                    format!(
                        "continue it with `skein train --resume {}`, ",
                        dir.path.display()
                    )
                } else {
                    String::new()
                };
                bail!(
                    "`run.dir` = {} holds another run ({}): {resume}choose another `run.dir`, \
                     or pass --overwrite to replace it",
                    dir.path.display(),
                    names.join(", "),
                );
            }
            dir.replaced = previous;
        }
        Ok(dir)
    }

    /// Sets the run `--overwrite` replaces aside, where it waits for this run's first
    /// checkpoint ([`ReplacedRun`]).
    fn set_aside_replaced_run(&mut self) -> Result<()> {
        if self.replaced.is_empty() {
            return Ok(());
        }
        let previous = std::mem::take(&mut self.replaced);
        self.set_aside = Some(ReplacedRun::set_aside(&self.path, &previous, is_run_entry)?);
        Ok(())
    }

    /// The directory of a run to resume (it must exist; its files are checked, not touched).
    pub fn for_resume(cfg: &TrainConfig) -> Result<RunDir> {
        // Checked before the lock, which would create it.
        if !cfg.run.dir.trim().is_empty() && !std::path::Path::new(&cfg.run.dir).is_dir() {
            bail!(
                "nothing to resume: `run.dir` = {} is not a directory",
                cfg.run.dir
            );
        }
        let dir = RunDir::checked(cfg)?;
        // A killed --overwrite left the run it replaced there: which one to go on with is the
        // user's call, and the new run's checkpoints may not even exist yet.
        ReplacedRun::check_none_left(&dir.path)?;
        Ok(dir)
    }

    /// The directory, locked for this process, with every path the run writes checked.
    fn checked(cfg: &TrainConfig) -> Result<RunDir> {
        if cfg.run.dir.trim().is_empty() {
            bail!("`run.dir` is empty: name the directory the run writes to, e.g. runs/my-run");
        }
        let path = PathBuf::from(&cfg.run.dir);
        if path.exists() && !path.is_dir() {
            bail!(
                "`run.dir` = {} is a file, not a directory: choose another `run.dir`",
                path.display()
            );
        }
        let dir = RunDir {
            lock: RunLock::acquire(&path)?,
            path,
            replaced: Vec::new(),
            set_aside: None,
        };
        dir.check_outputs()?;
        Ok(dir)
    }

    /// A previous run's entries: the run files and `checkpoint-N` directories (with their
    /// `.tmp`/`.old` leftovers of an interrupted write).
    fn run_entries(&self) -> Result<Vec<PathBuf>> {
        let mut found = Vec::new();
        let entries = match std::fs::read_dir(&self.path) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
            Err(e) => return Err(e).with_context(|| format!("listing {}", self.path.display())),
        };
        for entry in entries {
            let path = entry
                .with_context(|| format!("listing {}", self.path.display()))?
                .path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if is_run_entry(name) {
                found.push(path);
            }
        }
        found.sort();
        Ok(found)
    }

    /// Every path the run writes is of a kind it can write: a directory where a directory goes,
    /// a file where a file goes (else training would end without its weights or curves).
    fn check_outputs(&self) -> Result<()> {
        for name in [
            "config.toml",
            "metrics.jsonl",
            "plot.png",
            skein_doctor::log::FILE,
        ] {
            let p = self.path.join(name);
            if p.is_dir() {
                bail!(
                    "{} is a directory, but the run writes a file there: move it away first",
                    p.display()
                );
            }
        }
        for name in ["checkpoint", "published", trajectories::DIR] {
            let p = self.path.join(name);
            if p.exists() && !p.is_dir() {
                bail!(
                    "{} is a file, but the run writes a directory there: move it away first",
                    p.display()
                );
            }
        }
        let p = self.path.join(tensorboard::DIR);
        if p.exists() && !p.is_dir() {
            bail!(
                "{} is a file, but the run writes TensorBoard event files in a directory there: \
                 move it away first",
                p.display()
            );
        }
        Ok(())
    }

    /// What a resume's first record rewrites, checked before any work: `metrics.jsonl` is cut
    /// back to the checkpoint's step there, and with TensorBoard its events are rebuilt from
    /// the lines kept. A file missing or unreadable would fail the resume after its first step,
    /// with the finished run's records already changed.
    pub fn check_records_for_resume(&self, cfg: &TrainConfig) -> Result<()> {
        let metrics = self.path.join("metrics.jsonl");
        if !metrics.is_file() {
            bail!(
                "{} is missing: a resume keeps the run's records up to its checkpoint from it. \
                 Put it back, or start a new run in another `run.dir` from the checkpoint's \
                 weights (`model.path` = one of its checkpoint directories)",
                metrics.display()
            );
        }
        if cfg.run.tracking.contains(&Tracking::Tensorboard) {
            skein_report::read_metrics(&metrics)?;
        } else {
            std::fs::read(&metrics).with_context(|| format!("reading {}", metrics.display()))?;
        }
        Ok(())
    }

    /// Starts writing: the resolved config, and the metrics log — new, or cut back to
    /// `keep_lines` lines (a resumed checkpoint's) — with its TensorBoard events rebuilt to
    /// match. A resume that no longer tracks TensorBoard removes the old events, which would
    /// show the steps it discards.
    /// A run that `--overwrite` replaces is set aside first: this is where a fresh run starts
    /// writing, after everything that can refuse it, and a resumed one when its first step is
    /// about to be written (`step_files.rs`).
    pub fn open(&mut self, cfg: &TrainConfig, keep_lines: Option<usize>) -> Result<MetricsLog> {
        std::fs::create_dir_all(&self.path)
            .with_context(|| format!("creating run directory {}", self.path.display()))?;
        self.lock.claim()?;
        self.set_aside_replaced_run()?;
        let metrics = self.path.join("metrics.jsonl");
        match keep_lines {
            Some(lines) => checkpoint::truncate_lines(&metrics, lines)?,
            None => {
                if metrics.exists() {
                    std::fs::remove_file(&metrics)
                        .with_context(|| format!("removing {}", metrics.display()))?;
                }
            }
        }
        let mut log = MetricsLog::create(&metrics)?;
        let events = self.path.join(tensorboard::DIR);
        if cfg.run.tracking.contains(&Tracking::Tensorboard) {
            log = log.with_tensorboard(&events)?;
        } else if events.exists() {
            eprintln!(
                "skein: removing {}: `run.tracking` has no \"tensorboard\", and its events \
                 would show the steps this resume discards",
                events.display()
            );
            std::fs::remove_dir_all(&events)
                .with_context(|| format!("removing {}", events.display()))?;
        }
        // Last: a resume that fails on the way leaves the config of the run it resumed.
        let config = self.path.join("config.toml");
        std::fs::write(&config, skein_config::to_toml_string(cfg))
            .with_context(|| format!("writing {}", config.display()))?;
        Ok(log)
    }
}
