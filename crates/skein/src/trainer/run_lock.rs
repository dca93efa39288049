//! One process per run directory. A run holds an OS lock on `RUN_DIR/run.lock` for as long as
//! its process lives, so a second `train`, `--overwrite` or `--resume` in the same directory
//! is refused before it reads or removes anything, instead of two processes writing one run.
//! The operating system releases the lock when the process ends, however it ends (a crash or
//! a kill included), so a lock is never stale. Once a run has started writing, the file stays:
//! it names the last owner (pid, host, start time) for the message a refused process prints.
//! A run refused or failed before it writes removes what it created; a process that locked
//! the removed file meanwhile sees that `run.lock` no longer names it and opens it again
//! ([`lock_if_current`]), so no two processes each own a different file.

use anyhow::{bail, Context, Result};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

pub const LOCK_FILE: &str = "run.lock";

/// The lock of one run directory, held until dropped.
pub struct RunLock {
    file: File,
    path: PathBuf,
    /// What taking the lock created, removed again by a run that never starts writing.
    made_file: bool,
    made_dir: Option<PathBuf>,
    claimed: bool,
}

impl RunLock {
    /// Takes `dir`'s lock (creating `dir` if needed), or says which process holds it.
    pub fn acquire(dir: &Path) -> Result<RunLock> {
        let path = dir.join(LOCK_FILE);
        for _ in 0..MAX_ATTEMPTS {
            let made_dir = (!dir.exists()).then(|| dir.to_path_buf());
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating run directory {}", dir.display()))?;
            let made_file = !path.exists();
            let file = match OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
            {
                Ok(file) => file,
                // A run that gave up removed the directory it had made between our two steps.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
            };
            if let Some(file) = lock_if_current(file, &path, dir)? {
                return Ok(RunLock {
                    file,
                    path,
                    made_file,
                    made_dir,
                    claimed: false,
                });
            }
        }
        bail!(
            "could not lock {}: it was removed under this process {MAX_ATTEMPTS} times in a \
             row; is another program deleting files in `run.dir`?",
            path.display()
        )
    }

    /// Writes who owns the run now, for a process that is refused while this one runs. Called
    /// once the run is sure to go ahead, so a refused run never rewrites the file.
    pub fn claim(&mut self) -> Result<()> {
        self.claimed = true;
        let owner = format!(
            "skein process {} on host {} (started at unix time {})\n",
            std::process::id(),
            host_name(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        );
        let write = |f: &mut File| -> std::io::Result<()> {
            f.set_len(0)?;
            f.rewind()?;
            f.write_all(owner.as_bytes())?;
            f.sync_data()
        };
        write(&mut self.file).with_context(|| format!("writing {}", self.path.display()))
    }
}

impl Drop for RunLock {
    /// A run refused or failed before it wrote anything leaves no trace: not the lock file,
    /// nor the directory it had to create to hold it.
    fn drop(&mut self) {
        if self.claimed {
            return;
        }
        if self.made_file {
            let _ = std::fs::remove_file(&self.path);
        }
        if let Some(dir) = &self.made_dir {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Tries before [`RunLock::acquire`] gives up on a lock file that keeps being removed.
const MAX_ATTEMPTS: usize = 8;

/// Locks `file`, opened at `path`, and checks that `path` still names it. A process that gave
/// up before writing removes the lock file it created; a process that opened that file just
/// before can then lock the removed inode while a third creates and locks a new `run.lock`.
/// The check catches it: the lock is on a file `run.lock` no longer names, so it is let go
/// (None) and the caller opens the path again. Refused, naming the owner, while held.
fn lock_if_current(mut file: File, path: &Path, dir: &Path) -> Result<Option<File>> {
    use std::os::unix::fs::MetadataExt;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut owner = String::new();
            let _ = file.read_to_string(&mut owner);
            let owner = owner.trim();
            let owner = if owner.is_empty() {
                "another process".to_string()
            } else {
                owner.to_string()
            };
            bail!(
                "`run.dir` = {} is in use by {owner}: wait for that run to end, or choose \
                 another `run.dir` (two processes writing one run would mix their steps)",
                dir.display()
            )
        }
        Err(TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
    let held = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?;
    let current = match std::fs::metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let same = current.is_some_and(|m| (m.dev(), m.ino()) == (held.dev(), held.ino()));
    Ok(same.then_some(file))
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The race of removing an unclaimed lock file: B opens `run.lock` while A holds it, A
    /// gives up (removing the file) and lets go, B locks the removed inode, and C creates and
    /// locks a new `run.lock`. B must not count as an owner beside C.
    #[test]
    fn a_lock_on_a_removed_lock_file_is_not_ownership() {
        let dir = std::env::temp_dir().join(format!("skein-run-lock-race-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(LOCK_FILE);
        let a = RunLock::acquire(&dir).unwrap();
        let b_file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        drop(a);
        assert!(!path.exists(), "A removed the lock file it made");
        let c = RunLock::acquire(&dir).unwrap();
        // B's lock on the removed inode succeeds at the OS level, and is let go.
        let b = lock_if_current(b_file, &path, &dir).unwrap();
        assert!(b.is_none(), "B locked a file run.lock no longer names");
        // B opening the path again meets C.
        let e = RunLock::acquire(&dir).err().unwrap().to_string();
        assert!(e.contains("is in use by"), "{e}");
        drop(c);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_held_lock_refuses_a_second_owner_and_names_the_first() {
        let dir = std::env::temp_dir().join(format!("skein-run-lock-{}", std::process::id()));
        let mut first = RunLock::acquire(&dir).unwrap();
        first.claim().unwrap();
        // A second open file description is a second owner, as another process would be.
        let e = RunLock::acquire(&dir).err().unwrap().to_string();
        assert!(
            e.contains("in use by skein process") && e.contains(&std::process::id().to_string()),
            "{e}"
        );
        drop(first);
        let again = RunLock::acquire(&dir);
        assert!(again.is_ok(), "a dropped lock is free again");
        drop(again);
        std::fs::remove_dir_all(&dir).ok();

        // Taken and given up before the run writes: nothing is left behind.
        let unused = RunLock::acquire(&dir.join("new")).unwrap();
        drop(unused);
        assert!(dir.exists() && !dir.join("new").exists());
        std::fs::remove_dir_all(&dir).ok();
    }
}
