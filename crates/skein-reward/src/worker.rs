//! Reward worker processes: a long-lived command speaking JSON lines on stdin/stdout, one
//! request object per line in, one answer line out, in order.
//!
//! Each process is a [`crate::lines::LineProcess`]: a writer and a reader thread, so the caller
//! only ever waits on channels with a deadline, and a worker that hangs, stops reading, or
//! floods its output can never block a caller past the timeout. A worker that dies (exit, EOF,
//! broken pipe) or answers out of step (a line for another request's id) fails the request it
//! held, is killed (with its whole process group) and is started again for the rest; a line
//! that answers the request unusably (not JSON, a reward that is not a finite number) fails
//! that request alone. One that does not answer within the
//! timeout is killed and fails every request it held at once: a hung worker costs one timeout
//! per batch, not one per request. A worker whose processes keep failing before any of them
//! answers is given up on ([`GIVE_UP_AFTER`]): its requests then fail at once, with an error
//! that names it and says what to check.

use crate::lines::{LineError, LineProcess};
use crate::request::clip;
use crate::{BatchScorer, RewardError, RewardOutput, RewardRequest, WireResponse};
use serde::{Deserialize, Serialize};
use skein_config::Validator;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
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
        v.command(
            &format!("{key}.command"),
            &self.command,
            "a program, e.g. [\"python3\", \"my_reward.py\"]",
        );
        v.at_least(&format!("{key}.processes"), self.processes, 1);
        v.at_least(&format!("{key}.timeout_ms"), self.timeout_ms, 1);
        v.at_least(&format!("{key}.batch_size"), self.batch_size, 1);
    }
}

/// Worker processes that fail in a row (each ended for a timeout, a crash or a broken answer
/// before any process answered again, or could not be started) before the pool gives up.
pub const GIVE_UP_AFTER: u64 = 3;

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
    /// The config key of the source (`reward.sources.NAME`), for the give-up message.
    key: String,
    timeout: Duration,
    start_timeout: Duration,
    /// Idle slots; `None` is a slot whose process ended and is started again on its next use.
    idle: Mutex<Vec<Option<Process>>>,
    returned: Condvar,
    restarts: AtomicU64,
    timeouts: AtomicU64,
    crashes: AtomicU64,
    /// Processes that failed since a process last answered.
    failing: AtomicU64,
    /// Why the pool stopped starting processes, once it has.
    given_up: OnceLock<RewardError>,
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
            key: key.to_string(),
            timeout: Duration::from_millis(cfg.timeout_ms),
            start_timeout: Duration::from_millis(cfg.start_timeout_ms),
            idle: Mutex::new(idle),
            returned: Condvar::new(),
            restarts: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            crashes: AtomicU64::new(0),
            failing: AtomicU64::new(0),
            given_up: OnceLock::new(),
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

    /// Why the pool no longer starts processes, if it has given up.
    pub fn given_up(&self) -> Option<&RewardError> {
        self.given_up.get()
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

    /// The slot's process, or a new one (a restart) for a slot whose process ended, in a
    /// batch or since (a worker that died while idle fails no request it never held).
    fn process(&self, slot: Option<Process>) -> Result<Process, RewardError> {
        if let Some(mut p) = slot {
            if p.0.running() {
                return Ok(p);
            }
        }
        let p = Process::spawn(&self.command, &self.label)?;
        self.restarts.fetch_add(1, Ordering::Relaxed);
        Ok(p)
    }

    /// Sends `batch` to `proc` and collects its answers in order, until all are in or the
    /// process fails: the answers so far (the failed one last), and the failure. A process
    /// that timed out takes every request it held with it (each is answered with the
    /// timeout), so a hung worker costs one timeout per batch, not one per request; after a
    /// crash or an answer out of step the rest are left for a new process.
    fn exchange(
        &self,
        proc: &mut Process,
        batch: &[RewardRequest],
    ) -> (Vec<Result<RewardOutput, RewardError>>, Option<RewardError>) {
        let mut answers = Vec::with_capacity(batch.len());
        for req in batch {
            match serde_json::to_string(req) {
                // A failed send means the writer saw a broken pipe; the reader reports it.
                Ok(line) => proc.0.send(line + "\n"),
                Err(e) => {
                    // Cannot happen for these types; the process holds what was sent.
                    let e = RewardError::BadRequest(format!(
                        "cannot encode request \"{}\": {e}",
                        req.id
                    ));
                    return (vec![Err(e.clone())], Some(e));
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
            // A line that answers this request, even unusably (not JSON, a reward that is not
            // a finite number, an error), keeps the stream in step: it fails this request
            // alone. A line for another id, or none, does not.
            let (answer, in_step) = match proc.0.recv(allowed) {
                Ok(line) => {
                    let parsed = WireResponse::parse(&line, &self.label);
                    let in_step = parsed
                        .as_ref()
                        .map_or(true, |w| w.id.as_str() == Some(req.id.as_str()));
                    (
                        parsed.and_then(|w| w.into_result(&req.id, &self.label)),
                        in_step,
                    )
                }
                Err(LineError::Closed(detail)) => {
                    self.crashes.fetch_add(1, Ordering::Relaxed);
                    let crashed = RewardError::WorkerCrashed {
                        command: self.label.clone(),
                        detail,
                    };
                    (Err(crashed), false)
                }
                Err(LineError::Timeout) => {
                    let e = RewardError::Timeout {
                        source: self.label.clone(),
                        after: allowed,
                    };
                    let held = batch.len() - answers.len();
                    self.timeouts.fetch_add(held as u64, Ordering::Relaxed);
                    answers.resize(batch.len(), Err(e.clone()));
                    return (answers, Some(e));
                }
            };
            match answer {
                Err(e) if !in_step => {
                    answers.push(Err(e.clone()));
                    return (answers, Some(e));
                }
                // The process answered this request: it works, whatever the answer was.
                answer => {
                    self.failing.store(0, Ordering::Relaxed);
                    answers.push(answer);
                }
            }
        }
        (answers, None)
    }

    /// Counts a failed process; the error every request gets once this makes the pool give up.
    fn failed(&self, why: &RewardError) {
        let failing = self.failing.fetch_add(1, Ordering::Relaxed) + 1;
        if failing < GIVE_UP_AFTER {
            return;
        }
        let e = RewardError::Scorer {
            source: self.key.clone(),
            detail: format!(
                "its worker `{}` is given up on: {failing} of its processes in a row failed \
                 before any answered (the last {}); every request to it now fails. Check \
                 that it starts, reads one JSON request per line on stdin and writes one JSON \
                 answer line per request on stdout, flushed, within `{key}.timeout_ms` (the \
                 first within `{key}.timeout_ms` + `{key}.start_timeout_ms`); its stderr says \
                 why it failed",
                self.label,
                briefly(why),
                key = self.key,
            ),
        };
        if self.given_up.set(e.clone()).is_ok() {
            eprintln!("skein: {e}");
        }
    }
}

/// How a process failed, in a few words.
fn briefly(why: &RewardError) -> String {
    match why {
        RewardError::Timeout { after, .. } => {
            format!("did not answer within {:.3} s", after.as_secs_f64())
        }
        RewardError::WorkerCrashed { detail, .. } => format!("died: {detail}"),
        RewardError::WorkerSpawn { detail, .. } => format!("could not start: {detail}"),
        RewardError::Protocol { detail, .. } => format!("broke the protocol: {detail}"),
        other => format!("failed: {other}"),
    }
}

impl BatchScorer for WorkerPool {
    /// The batch goes to one process. A process that fails is killed and started again once,
    /// for what is left of the batch or the slot's next one; after [`GIVE_UP_AFTER`]
    /// processes in a row failed, every request fails at once.
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        let mut slot = self.checkout();
        let mut results = Vec::with_capacity(batch.len());
        // Each round answers at least one request or ends the batch, so this ends.
        while results.len() < batch.len() {
            if let Some(e) = self.given_up() {
                results.resize(batch.len(), Err(e.clone()));
                break;
            }
            let mut proc = match self.process(slot.take()) {
                Ok(p) => p,
                Err(e) => {
                    self.failed(&e);
                    results.resize(batch.len(), Err(e));
                    break;
                }
            };
            let (answers, failure) = self.exchange(&mut proc, &batch[results.len()..]);
            results.extend(answers);
            match failure {
                None => slot = Some(proc),
                Some(why) => {
                    // Killed now, its group with it; a new one starts on the next round.
                    proc.0.kill();
                    self.failed(&why);
                }
            }
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
    fn a_missing_program_is_a_config_error_naming_its_key() {
        let e = WorkerPool::new(&cfg(&["/nonexistent/reward-worker"]), "reward.sources.w")
            .err()
            .unwrap();
        assert_eq!(e.kind(), "config");
        let e = e.to_string();
        assert!(
            e.contains("`reward.sources.w.command`") && e.contains("/nonexistent/reward-worker"),
            "{e}"
        );
    }

    #[test]
    fn a_program_that_cannot_start_fails_at_start_up_naming_it() {
        // A file that exists but is no program (not executable).
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
        let e = WorkerPool::new(&cfg(&[manifest]), "reward.sources.w")
            .err()
            .unwrap();
        assert_eq!(e.kind(), "worker_spawn");
        assert!(e.to_string().contains(manifest), "{e}");
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
    fn a_worker_that_answers_without_a_reward_fails_those_requests_and_is_kept() {
        // `cat` echoes each request back: an answer for its id, but with no reward.
        let pool = WorkerPool::new(&cfg(&["cat"]), "w").unwrap();
        let req = RewardRequest {
            id: "r1".into(),
            ..Default::default()
        };
        for _ in 0..GIVE_UP_AFTER + 1 {
            let out = pool.score_batch(&[req.clone(), req.clone()]);
            assert_eq!(out.len(), 2);
            assert!(
                out.iter()
                    .all(|r| matches!(r, Err(RewardError::Protocol { .. }))),
                "{out:?}"
            );
        }
        assert_eq!(pool.restarts(), 0);
        assert!(
            pool.given_up().is_none(),
            "a worker that answers is not given up"
        );
    }

    #[test]
    fn a_worker_out_of_step_fails_the_request_and_is_replaced() {
        let other = r#"while read l; do echo '{"id": "other", "reward": 1}'; done"#;
        let pool = WorkerPool::new(&cfg(&["sh", "-c", other]), "w").unwrap();
        let req = RewardRequest {
            id: "r1".into(),
            ..Default::default()
        };
        let out = pool.score_batch(&[req.clone(), req]);
        assert!(
            out.iter()
                .all(|r| matches!(r, Err(RewardError::Protocol { .. }))),
            "{out:?}"
        );
        assert_eq!(pool.restarts(), 1);
    }
}
