//! Reward worker processes: a long-lived command speaking JSON lines on stdin/stdout, one
//! request object per line in, one answer line out, in order.
//!
//! Each process has a writer and a reader thread, so the caller only ever waits on channels
//! with a deadline: a worker that hangs, stops reading, or floods its output can never block a
//! caller past the timeout. A worker that dies (exit, EOF, broken pipe) fails the request it
//! held and is started again for the next; a request that times out fails alone, and its
//! worker is killed (with its whole process group) and restarted.

use crate::request::clip;
use crate::{BatchScorer, RewardError, RewardOutput, RewardRequest, WireResponse};
use serde::{Deserialize, Serialize};
use skein_config::Validator;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Longest answer line accepted from a worker; longer means it is not speaking the protocol.
const MAX_LINE_BYTES: u64 = 16 << 20;
/// How long a worker gets to exit by itself once its stdin is closed.
const EXIT_GRACE: Duration = Duration::from_millis(500);

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

enum Event {
    Line(String),
    Closed(String),
}

/// One running worker process and its two pipe threads.
struct Process {
    child: Child,
    /// Whether it has answered anything yet (until then it may still be starting up).
    answered: bool,
    to_stdin: Sender<String>,
    from_stdout: Receiver<Event>,
}

impl Process {
    fn spawn(command: &[String], label: &str) -> Result<Process, RewardError> {
        let spawn_err = |detail: String| RewardError::WorkerSpawn {
            command: label.to_string(),
            detail,
        };
        let (program, args) = command
            .split_first()
            .ok_or_else(|| spawn_err("the command is empty".into()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // Its own process group, so a timeout kills what a wrapper script started, too.
            cmd.process_group(0);
        }
        let mut child = cmd.spawn().map_err(|e| spawn_err(e.to_string()))?;
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(i), Some(o)) => (i, o),
            _ => {
                kill(&mut child);
                return Err(spawn_err("its stdin/stdout pipes were not created".into()));
            }
        };
        let (to_stdin, lines_in) = channel();
        let (lines_out, from_stdout) = channel();
        let threads = std::thread::Builder::new()
            .name("skein-reward-worker-in".into())
            .spawn(move || write_lines(stdin, lines_in))
            .and_then(|_| {
                std::thread::Builder::new()
                    .name("skein-reward-worker-out".into())
                    .spawn(move || read_lines(stdout, lines_out))
            });
        if let Err(e) = threads {
            kill(&mut child);
            return Err(spawn_err(format!("cannot start its pipe threads: {e}")));
        }
        Ok(Process {
            child,
            answered: false,
            to_stdin,
            from_stdout,
        })
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Closing stdin (the writer thread ends when this sender goes) asks the worker to exit.
        let (dead, _) = channel();
        self.to_stdin = dead;
        let deadline = Instant::now() + EXIT_GRACE;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => break,
            }
        }
        kill(&mut self.child);
    }
}

/// Kills the child's process group (or the child alone where there are no groups) and reaps it.
fn kill(child: &mut Child) {
    #[cfg(unix)]
    {
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) with a negative pid signals the process group we created for this
            // child; it touches no memory of ours.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn write_lines(mut stdin: ChildStdin, lines: Receiver<String>) {
    for line in lines {
        if stdin.write_all(line.as_bytes()).is_err() || stdin.flush().is_err() {
            return; // Broken pipe: the reader sees the worker go and reports it.
        }
    }
}

fn read_lines(stdout: ChildStdout, events: Sender<Event>) {
    let mut reader = BufReader::new(stdout);
    loop {
        let mut buf = Vec::new();
        let n = match (&mut reader)
            .take(MAX_LINE_BYTES)
            .read_until(b'\n', &mut buf)
        {
            Ok(n) => n,
            Err(e) => {
                let _ = events.send(Event::Closed(format!("reading its stdout failed: {e}")));
                return;
            }
        };
        if n == 0 {
            let _ = events.send(Event::Closed("its stdout closed".into()));
            return;
        }
        if !buf.ends_with(b"\n") && n as u64 >= MAX_LINE_BYTES {
            let _ = events.send(Event::Closed(format!(
                "it wrote a line longer than {MAX_LINE_BYTES} bytes"
            )));
            return;
        }
        let line = String::from_utf8_lossy(&buf).trim().to_string();
        if line.is_empty() {
            continue;
        }
        if events.send(Event::Line(line)).is_err() {
            return;
        }
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
                    let _ = proc.to_stdin.send(line + "\n");
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
            let allowed = if proc.answered {
                self.timeout
            } else {
                self.timeout + self.start_timeout
            };
            let event = proc.from_stdout.recv_timeout(allowed);
            proc.answered |= matches!(event, Ok(Event::Line(_)));
            let answer = match event {
                Ok(Event::Line(line)) => WireResponse::parse(&line, &self.label)
                    .and_then(|w| w.into_result(&req.id, &self.label)),
                Ok(Event::Closed(detail)) => {
                    self.crashes.fetch_add(1, Ordering::Relaxed);
                    Err(RewardError::WorkerCrashed {
                        command: self.label.clone(),
                        detail,
                    })
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.crashes.fetch_add(1, Ordering::Relaxed);
                    Err(RewardError::WorkerCrashed {
                        command: self.label.clone(),
                        detail: "its output thread ended".into(),
                    })
                }
                Err(RecvTimeoutError::Timeout) => {
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
