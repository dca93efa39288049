//! The run `--overwrite` replaces, kept until the new run has something to keep.
//!
//! When the new run starts writing, the previous run's files move into `RUN_DIR/.replaced/`
//! (renames within one directory: nothing is copied). They are removed once the new run has
//! written its first checkpoint, or has finished: from then on the new run can be resumed or
//! is done. A new run that fails before that (a NaN warm-up, a failed first evaluation, an
//! error on the way) or stops at a first Ctrl-C puts them back and removes its own files, so
//! the directory holds the previous run again. A process that is killed before either (or
//! stopped by a second Ctrl-C, which exits at once) leaves `.replaced/` for the next run in
//! the directory, which refuses to start and says how to restore it: nothing is lost.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// Where a replaced run waits, inside its run directory.
pub const REPLACED_DIR: &str = ".replaced";

/// A previous run set aside in `RUN_DIR/.replaced/`: committed (removed) by
/// [`ReplacedRun::commit`], else put back when dropped.
pub struct ReplacedRun {
    dir: PathBuf,
    /// The names of the previous run's entries, now under `.replaced/`.
    names: Vec<String>,
    /// The entries of the new run, removed before the previous run is put back.
    is_run_entry: fn(&str) -> bool,
    done: bool,
}

impl ReplacedRun {
    /// Refuses a directory an interrupted `--overwrite` left a replaced run in.
    pub fn check_none_left(dir: &Path) -> Result<()> {
        let left = dir.join(REPLACED_DIR);
        // Emptied by hand (the advice below: its files moved back), it holds nothing to keep.
        let emptied = std::fs::read_dir(&left).is_ok_and(|mut d| d.next().is_none());
        if emptied {
            std::fs::remove_dir(&left)
                .with_context(|| format!("removing the empty {}", left.display()))?;
        }
        if left.exists() {
            bail!(
                "{} holds a run that an interrupted --overwrite was replacing (the process was \
                 killed before the new run wrote a checkpoint). Nothing was removed: to keep the \
                 previous run, remove the new run's files from {} and move those of {} back \
                 (e.g. `mv {}/* {}/`); to drop it, delete {}. Then run again",
                left.display(),
                dir.display(),
                left.display(),
                left.display(),
                dir.display(),
                left.display()
            );
        }
        Ok(())
    }

    /// Moves `entries` (the previous run's files and directories, all in `dir`) into
    /// `dir/.replaced/`. `is_run_entry` names a run's entries (to clear the new run's before
    /// a restore).
    pub fn set_aside(
        dir: &Path,
        entries: &[PathBuf],
        is_run_entry: fn(&str) -> bool,
    ) -> Result<ReplacedRun> {
        let backup = dir.join(REPLACED_DIR);
        std::fs::create_dir(&backup).with_context(|| format!("creating {}", backup.display()))?;
        let mut replaced = ReplacedRun {
            dir: dir.to_path_buf(),
            names: Vec::new(),
            is_run_entry,
            done: false,
        };
        for path in entries {
            let Some(name) = path.file_name() else {
                continue;
            };
            if let Err(e) = std::fs::rename(path, backup.join(name)) {
                // Nothing of the new run exists yet: move back what moved, and remove nothing.
                replaced.done = true;
                for moved in &replaced.names {
                    let _ = std::fs::rename(backup.join(moved), dir.join(moved));
                }
                let _ = std::fs::remove_dir(&backup);
                return Err(e).with_context(|| {
                    format!("moving {} into {}", path.display(), backup.display())
                });
            }
            replaced.names.push(name.to_string_lossy().into_owned());
        }
        eprintln!(
            "skein: --overwrite: the previous run's files ({}) wait in {} until this run writes \
             its first checkpoint; if it fails before, they are put back",
            replaced.names.join(", "),
            backup.display()
        );
        Ok(replaced)
    }

    /// The new run has something to keep: the previous run is removed for good.
    pub fn commit(mut self) -> Result<()> {
        self.done = true;
        let backup = self.dir.join(REPLACED_DIR);
        std::fs::remove_dir_all(&backup).with_context(|| format!("removing {}", backup.display()))
    }

    /// Removes the new run's entries and moves the previous run's back.
    fn restore(&self) -> Result<()> {
        let backup = self.dir.join(REPLACED_DIR);
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if (self.is_run_entry)(name) {
                if path.is_dir() {
                    std::fs::remove_dir_all(&path)?;
                } else {
                    std::fs::remove_file(&path)?;
                }
            }
        }
        for name in &self.names {
            std::fs::rename(backup.join(name), self.dir.join(name))?;
        }
        std::fs::remove_dir(&backup)?;
        Ok(())
    }
}

impl Drop for ReplacedRun {
    /// Not committed: the new run ends with nothing to keep, so the previous run comes back.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        match self.restore() {
            Ok(()) => eprintln!(
                "skein: --overwrite: this run ended before its first checkpoint; the previous \
                 run is back in {}",
                self.dir.display()
            ),
            Err(e) => eprintln!(
                "skein: --overwrite: could not put the previous run back ({e}); its files are \
                 in {}",
                self.dir.join(REPLACED_DIR).display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_run_entry(name: &str) -> bool {
        ["metrics.jsonl", "checkpoint"].contains(&name)
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    /// Set aside, the previous run comes back whole when the new one is dropped uncommitted
    /// (its own files gone, other files untouched), and is gone once committed.
    #[test]
    fn a_replaced_run_comes_back_unless_the_new_one_commits() {
        let dir = std::env::temp_dir().join(format!("skein-replaced-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(dir.join("checkpoint")).unwrap();
        write(&dir, "metrics.jsonl", "old\n");
        write(&dir.join("checkpoint"), "w", "old weights");
        write(&dir, "notes.txt", "the user's");
        let entries = [dir.join("checkpoint"), dir.join("metrics.jsonl")];

        let replaced = ReplacedRun::set_aside(&dir, &entries, is_run_entry).unwrap();
        assert!(!dir.join("metrics.jsonl").exists());
        let e = ReplacedRun::check_none_left(&dir).unwrap_err().to_string();
        assert!(
            e.contains("interrupted --overwrite") && e.contains("mv "),
            "{e}"
        );
        write(&dir, "metrics.jsonl", "new\n");
        drop(replaced);
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(dir.join("metrics.jsonl")), "old\n");
        assert_eq!(read(dir.join("checkpoint/w")), "old weights");
        assert_eq!(read(dir.join("notes.txt")), "the user's");
        assert!(ReplacedRun::check_none_left(&dir).is_ok());

        let replaced = ReplacedRun::set_aside(&dir, &entries, is_run_entry).unwrap();
        write(&dir, "metrics.jsonl", "new\n");
        replaced.commit().unwrap();
        assert_eq!(read(dir.join("metrics.jsonl")), "new\n");
        assert!(!dir.join("checkpoint").exists() && !dir.join(REPLACED_DIR).exists());
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A set-aside that fails half way (an entry that cannot be moved) puts back what moved
    /// and removes nothing: the files not yet moved are the previous run's, not a new one's.
    #[test]
    fn a_set_aside_that_fails_half_way_changes_nothing() {
        let dir = std::env::temp_dir().join(format!("skein-replaced-half-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(dir.join("checkpoint")).unwrap();
        write(&dir, "metrics.jsonl", "old\n");
        let entries = [
            dir.join("metrics.jsonl"),
            dir.join("missing-entry"),
            dir.join("checkpoint"),
        ];
        assert!(ReplacedRun::set_aside(&dir, &entries, is_run_entry).is_err());
        assert_eq!(
            std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap(),
            "old\n"
        );
        assert!(dir.join("checkpoint").is_dir() && !dir.join(REPLACED_DIR).exists());
        std::fs::remove_dir_all(&dir).ok();
    }
}
