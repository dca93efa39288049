//! Reward worker processes: a long-lived command speaking JSON lines on stdin/stdout, one
//! request object per line in, one answer line out, in order.
//!
//! Each process is a [`crate::lines::LineProcess`]: a writer and a reader thread, so the caller
//! only ever waits on channels with a deadline, and a worker that hangs, stops reading, or
//! floods its output can never block a caller past the timeout. A worker that dies (exit, EOF,
//! broken pipe) fails the request it held and is started again for the next; a request that
//! times out fails alone, and its worker is killed (with its whole process group) and
//! restarted.

use crate::lines::{LineError, LineProcess};
use crate::request::clip;
use crate::{BatchScorer, RewardError, RewardOutput, RewardRequest, WireResponse};
use serde::{Deserialize, Serialize};
use skein_config::Validator;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// A worker source as written in the config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Program and arguments, e.g. `["python3", "scripts/reward_worker_example.py"]`.
    pub command: Vec<String>,
    /// Worker processes running at once.
    pub processes: usize,
    /// How long one request may take, in milliseconds.
    pub timeout_ms: u64,
    /// Extra time a freshly started process gets for its first answer (imports, loading a
    /// model), in milliseconds.
    pub start_timeout_ms: u64,
    /// Requests sent to one process back to back (pipelined) as one batch.
    pub batch_size: usize,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            command: Vec::new(),
            processes: 1,
            timeout_ms: 30_000,
            start_timeout_ms: 30_000,
            batch_size: 8,
        }
    }
}

impl WorkerConfig {
    pub fn validate(&self, key: &str, v: &mut Validator) {
        v.check(
            self.command.first().is_some_and(|p| !p.trim().is_empty()),
            &format!("{key}.command"),
            "must name a program, e.g. [\"python3\", \"my_reward.py\"]",
            format!("{:?}", self.command),
        );
        v.at_least(&format!("{key}.processes"), self.processes, 1);
        v.at_least(&format!("{key}.timeout_ms"), self.timeout_ms, 1);
        v.at_least(&format!("{key}.batch_size"), self.batch_size, 1);
    }
}

/// One running worker process (see [`crate::lines`]).
struct Process(LineProcess);

impl Process {
    fn spawn(command: &[String], label: &str) -> Result<Process, RewardError> {
        LineProcess::spawn(command, "skein-reward-worker")
            .map(Process)
            .map_err(|detail| RewardError::WorkerSpawn {
                command: label.to_string(),
                detail,
            })
    }
}

/// A pool of worker processes; scores a batch by pipelining it through one idle process.
pub struct WorkerPool {
    command: Vec<String>,
    label: String,
    timeout: Duration,
    start_timeout: Duration,
    /// Idle slots; `None` is a slot whose process died and is started again on its next use.
    idle: Mutex<Vec<Option<Process>>>,
    returned: Condvar,
    restarts: AtomicU64,
    timeouts: AtomicU64,
    crashes: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl WorkerPool {
    /// Validates `cfg` (keys under `key`) and starts every process now, so a command that
    /// cannot start fails at start-up rather than on the first trajectory.
    pub fn new(cfg: &WorkerConfig, key: &str) -> Result<WorkerPool, RewardError> {
        let mut v = Validator::new();
        cfg.validate(key, &mut v);
        v.finish()?;
        let label = cfg.command.join(" ");
        let mut idle = Vec::with_capacity(cfg.processes);
        for _ in 0..cfg.processes {
            idle.push(Some(Process::spawn(&cfg.command, &label)?));
        }
        Ok(WorkerPool {
            command: cfg.command.clone(),
            label,
            timeout: Duration::from_millis(cfg.timeout_ms),
            start_timeout: Duration::from_millis(cfg.start_timeout_ms),
            idle: Mutex::new(idle),
            returned: Condvar::new(),
            restarts: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            crashes: AtomicU64::new(0),
        })
    }

    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    pub fn timeouts(&self) -> u64 {
        self.timeouts.load(Ordering::Relaxed)
    }

    pub fn crashes(&self) -> u64 {
        self.crashes.load(Ordering::Relaxed)
    }

    fn checkout(&self) -> Option<Process> {
        let mut idle = lock(&self.idle);
        loop {
            if let Some(slot) = idle.pop() {
                return slot;
            }
            idle = self.returned.wait(idle).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn checkin(&self, slot: Option<Process>) {
        lock(&self.idle).push(slot);
        self.returned.notify_one();
    }

    /// Sends `batch` to `proc` and collects answers until all are in or one fails in a way that
    /// makes the process unusable. Returns the answers so far and whether the process is fine.
    fn exchange(
        &self,
        proc: &mut Process,
        batch: &[RewardRequest],
    ) -> (Vec<Result<RewardOutput, RewardError>>, bool) {
        let mut answers = Vec::with_capacity(batch.len());
        for req in batch {
            match serde_json::to_string(req) {
                Ok(line) => {
                    // A failed send means the writer saw a broken pipe; the reader reports it.
                    proc.0.send(line + "\n");
                }
                Err(e) => {
                    // Cannot happen for these types; answered without sending anything.
                    answers.push(Err(RewardError::BadRequest(format!(
                        "cannot encode request \"{}\": {e}",
                        req.id
                    ))));
                    return (answers, true);
                }
            }
        }
        // The worker answers in order; each answer gets `timeout` from the one before it.
        for req in batch {
            let allowed = if proc.0.answered() {
                self.timeout
            } else {
                self.timeout + self.start_timeout
            };
            let answer = match proc.0.recv(allowed) {
                Ok(line) => WireResponse::parse(&line, &self.label)
                    .and_then(|w| w.into_result(&req.id, &self.label)),
                Err(LineError::Closed(detail)) => {
                    self.crashes.fetch_add(1, Ordering::Relaxed);
                    Err(RewardError::WorkerCrashed {
                        command: self.label.clone(),
                        detail,
                    })
                }
                Err(LineError::Timeout) => {
                    self.timeouts.fetch_add(1, Ordering::Relaxed);
                    Err(RewardError::Timeout {
                        source: self.label.clone(),
                        after: self.timeout,
                    })
                }
            };
            // A rejected request leaves the stream in step; anything else may not.
            let usable = matches!(answer, Ok(_) | Err(RewardError::Rejected { .. }));
            answers.push(answer);
            if !usable {
                return (answers, false);
            }
        }
        (answers, true)
    }
}

impl BatchScorer for WorkerPool {
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        let mut slot = self.checkout();
        let mut results = Vec::with_capacity(batch.len());
        // Each round answers at least one request, so this ends.
        while results.len() < batch.len() {
            let mut proc = match slot.take() {
                Some(p) => p,
                None => match Process::spawn(&self.command, &self.label) {
                    Ok(p) => {
                        self.restarts.fetch_add(1, Ordering::Relaxed);
                        p
                    }
                    Err(e) => {
                        results.resize(batch.len(), Err(e));
                        break;
                    }
                },
            };
            let (answers, usable) = self.exchange(&mut proc, &batch[results.len()..]);
            results.extend(answers);
            if usable {
                slot = Some(proc);
            }
            // Otherwise `proc` drops here: killed and reaped; the next round starts a new one.
        }
        self.checkin(slot);
        results
    }

    fn counters(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("worker_restarts", self.restarts() as f64),
            ("worker_crashes", self.crashes() as f64),
            ("timeouts", self.timeouts() as f64),
        ]
    }
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WorkerPool({})", clip(&self.label, 80))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(command: &[&str]) -> WorkerConfig {
        WorkerConfig {
            command: command.iter().map(|s| s.to_string()).collect(),
            timeout_ms: 2_000,
            ..Default::default()
        }
    }

    #[test]
    fn a_missing_program_fails_at_start_up_naming_it() {
        let e = WorkerPool::new(&cfg(&["/nonexistent/reward-worker"]), "reward.sources.w")
            .err()
            .unwrap();
        assert_eq!(e.kind(), "worker_spawn");
        assert!(e.to_string().contains("/nonexistent/reward-worker"), "{e}");
    }

    #[test]
    fn config_problems_name_their_keys() {
        let bad = WorkerConfig {
            command: vec![" ".into()],
            processes: 0,
            timeout_ms: 0,
            start_timeout_ms: 0,
            batch_size: 0,
        };
        let e = WorkerPool::new(&bad, "reward.sources.w")
            .err()
            .unwrap()
            .to_string();
        for key in ["command", "processes", "timeout_ms", "batch_size"] {
            assert!(e.contains(&format!("`reward.sources.w.{key}`")), "{e}");
        }
    }

    #[test]
    fn a_worker_that_prints_garbage_fails_the_request_and_is_replaced() {
        // `cat` echoes the request back: valid JSON with an id but no reward.
        let pool = WorkerPool::new(&cfg(&["cat"]), "w").unwrap();
        let req = RewardRequest {
            id: "r1".into(),
            ..Default::default()
        };
        let out = pool.score_batch(&[req.clone(), req]);
        assert_eq!(out.len(), 2);
        assert!(
            out.iter()
                .all(|r| matches!(r, Err(RewardError::Protocol { .. }))),
            "{out:?}"
        );
        assert_eq!(pool.restarts(), 1);
    }
}
