//! The dynamic-batching executor: single requests in from any thread, batches out to a
//! `BatchScorer` on the executor's own threads.
//!
//! A batch is cut when a length bucket holds `max_batch_size` requests or `max_batch_tokens`
//! of cost, when its oldest request has waited `max_wait_ms`, or at shutdown. Buckets are
//! powers of two of a request's cost, so the longest request in a batch is less than twice the
//! shortest (padding wastes under half) and one long response never pads a batch of short
//! ones. The runner threads take batches themselves (no dispatcher thread): while all are busy,
//! requests pile up and the next free thread takes a fuller batch, which is what makes the
//! batches grow exactly when the scorer is the bottleneck.

use crate::stats::{ExecutorMetrics, Stats};
use crate::{BatchScorer, RewardError, RewardOutput, RewardRequest};
use serde::{Deserialize, Serialize};
use skein_config::Validator;
use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Reply = Result<RewardOutput, RewardError>;

/// How an executor batches and how many threads run batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutorConfig {
    /// OS threads running batches: this pool's own, separate from the policy engine's.
    pub threads: usize,
    /// Requests in one batch at most.
    pub max_batch_size: usize,
    /// Cost (prompt + response tokens by default) of one batch at most; a single request over
    /// it runs alone.
    pub max_batch_tokens: usize,
    /// How long the oldest request of a bucket waits for the batch to fill, in milliseconds.
    pub max_wait_ms: u64,
    /// Batch only requests of similar cost together (buckets of powers of two).
    pub length_buckets: bool,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            threads: 1,
            max_batch_size: 32,
            max_batch_tokens: 32_768,
            max_wait_ms: 5,
            length_buckets: true,
        }
    }
}

impl ExecutorConfig {
    /// Records every problem with the keys under `key` (e.g. `reward.executor`).
    pub fn validate(&self, key: &str, v: &mut Validator) {
        v.at_least(&format!("{key}.threads"), self.threads, 1);
        v.at_least(&format!("{key}.max_batch_size"), self.max_batch_size, 1);
        v.at_least(&format!("{key}.max_batch_tokens"), self.max_batch_tokens, 1);
    }

    fn bucket(&self, cost: usize) -> u32 {
        if self.length_buckets {
            cost.max(1).next_power_of_two().trailing_zeros()
        } else {
            0
        }
    }
}

/// A submitted request's answer, to be waited for.
#[derive(Debug)]
pub struct Ticket {
    rx: Receiver<Reply>,
    /// An answer already taken off the channel by `is_ready`.
    got: Option<Reply>,
}

impl Ticket {
    fn new(rx: Receiver<Reply>) -> Ticket {
        Ticket { rx, got: None }
    }

    /// Blocks until the answer is in.
    pub fn wait(self) -> Reply {
        match self.got {
            Some(r) => r,
            None => self.rx.recv().unwrap_or(Err(RewardError::Shutdown)),
        }
    }

    /// The answer, or `Err(self)` if it is not in after `timeout` (wait again later).
    pub fn wait_timeout(self, timeout: Duration) -> Result<Reply, Ticket> {
        if let Some(r) = self.got {
            return Ok(r);
        }
        match self.rx.recv_timeout(timeout) {
            Ok(r) => Ok(r),
            Err(RecvTimeoutError::Timeout) => Err(self),
            Err(RecvTimeoutError::Disconnected) => Ok(Err(RewardError::Shutdown)),
        }
    }

    /// Whether the answer is in (or can no longer come), so `wait` will not block.
    pub fn is_ready(&mut self) -> bool {
        if self.got.is_none() {
            match self.rx.try_recv() {
                Ok(r) => self.got = Some(r),
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => self.got = Some(Err(RewardError::Shutdown)),
            }
        }
        self.got.is_some()
    }

    /// The answer if it is already in.
    pub fn try_take(&mut self) -> Option<Reply> {
        self.is_ready();
        self.got.take()
    }

    /// A ticket that is already answered.
    pub fn ready(reply: Reply) -> Ticket {
        let (_, rx) = sync_channel(1);
        Ticket {
            rx,
            got: Some(reply),
        }
    }
}

struct Job {
    req: RewardRequest,
    cost: usize,
    enqueued: Instant,
    reply: SyncSender<Reply>,
}

#[derive(Default)]
struct Bucket {
    jobs: VecDeque<Job>,
    cost: usize,
}

#[derive(Default)]
struct Queue {
    buckets: BTreeMap<u32, Bucket>,
    len: usize,
    closing: bool,
}

struct Shared {
    scorer: Arc<dyn BatchScorer>,
    /// The reward source the scorer is, as its failures name it.
    source: String,
    cfg: ExecutorConfig,
    queue: Mutex<Queue>,
    wake: Condvar,
    stats: Mutex<Stats>,
}

/// Batches single requests for a `BatchScorer` on its own thread pool. Dropping it finishes the
/// requests already queued, then joins its threads.
pub struct Executor {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// Locks, recovering from a poisoned lock: the guarded state is only counters and queues that
/// are consistent between statements, and scorer code never runs under these locks.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Executor {
    /// Validates `cfg` (keys named under `key`) and starts `cfg.threads` threads for the
    /// reward source named `source`.
    pub fn new(
        scorer: Arc<dyn BatchScorer>,
        cfg: ExecutorConfig,
        key: &str,
        source: &str,
    ) -> Result<Executor, RewardError> {
        let mut v = Validator::new();
        cfg.validate(key, &mut v);
        v.finish()?;
        let shared = Arc::new(Shared {
            scorer,
            source: source.to_string(),
            cfg,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            stats: Mutex::new(Stats::new()),
        });
        let mut exec = Executor {
            shared,
            threads: Vec::new(),
        };
        for i in 0..exec.shared.cfg.threads {
            let shared = Arc::clone(&exec.shared);
            let handle = std::thread::Builder::new()
                .name(format!("skein-reward-{i}"))
                .spawn(move || run(&shared))
                .map_err(|e| RewardError::Scorer {
                    source: key.to_string(),
                    detail: format!("cannot start executor thread {i}: {e}"),
                })?;
            exec.threads.push(handle);
        }
        Ok(exec)
    }

    /// Queues one request; never blocks on scoring.
    pub fn submit(&self, req: RewardRequest) -> Ticket {
        let (tx, rx) = sync_channel(1);
        let cost = self.shared.scorer.cost(&req);
        let bucket = self.shared.cfg.bucket(cost);
        {
            let mut q = lock(&self.shared.queue);
            let b = q.buckets.entry(bucket).or_default();
            b.cost += cost;
            b.jobs.push_back(Job {
                req,
                cost,
                enqueued: Instant::now(),
                reply: tx,
            });
            q.len += 1;
            let mut s = lock(&self.shared.stats);
            s.submitted += 1;
            s.queue_depth = q.len;
            s.queue_depth_max = s.queue_depth_max.max(q.len);
        }
        self.shared.wake.notify_one();
        Ticket::new(rx)
    }

    /// Submits and waits.
    pub fn score(&self, req: RewardRequest) -> Reply {
        self.submit(req).wait()
    }

    pub fn metrics(&self) -> ExecutorMetrics {
        lock(&self.shared.stats).snapshot(Instant::now())
    }

    /// The scorer's own counters (worker restarts, timeouts, retries…).
    pub fn scorer_counters(&self) -> Vec<(&'static str, f64)> {
        self.shared.scorer.counters()
    }

    pub fn config(&self) -> &ExecutorConfig {
        &self.shared.cfg
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        lock(&self.shared.queue).closing = true;
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            // A runner never panics (scorer panics are caught), so there is nothing to report.
            let _ = t.join();
        }
    }
}

/// One runner thread: take a ready batch, score it, answer, repeat; leave once closing and empty.
fn run(shared: &Shared) {
    let max_wait = Duration::from_millis(shared.cfg.max_wait_ms);
    loop {
        let batch = {
            let mut q = lock(&shared.queue);
            loop {
                let now = Instant::now();
                if let Some(batch) = take_ready(&mut q, &shared.cfg, max_wait, now) {
                    lock(&shared.stats).queue_depth = q.len;
                    if q.len > 0 {
                        // Whatever is left may be ready for another idle thread.
                        shared.wake.notify_one();
                    }
                    break batch;
                }
                if q.closing && q.len == 0 {
                    return;
                }
                q = match next_deadline(&q, max_wait) {
                    Some(d) => {
                        let timeout = d.saturating_duration_since(now);
                        shared
                            .wake
                            .wait_timeout(q, timeout)
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                    }
                    None => shared.wake.wait(q).unwrap_or_else(|e| e.into_inner()),
                };
            }
        };
        score(shared, batch);
    }
}

/// The oldest ready bucket's next batch, if any bucket is ready.
fn take_ready(
    q: &mut Queue,
    cfg: &ExecutorConfig,
    max_wait: Duration,
    now: Instant,
) -> Option<Vec<Job>> {
    let closing = q.closing;
    let (&key, _) = q
        .buckets
        .iter()
        .filter_map(|(k, b)| b.jobs.front().map(|j| (k, (b, j.enqueued))))
        .filter(|(_, (b, oldest))| {
            closing
                || b.jobs.len() >= cfg.max_batch_size
                || b.cost >= cfg.max_batch_tokens
                || now.saturating_duration_since(*oldest) >= max_wait
        })
        .min_by_key(|(_, (_, oldest))| *oldest)?;
    let bucket = q.buckets.get_mut(&key)?;
    let mut batch = Vec::new();
    let mut cost = 0usize;
    while let Some(job) = bucket.jobs.front() {
        let fits = batch.len() < cfg.max_batch_size
            && (batch.is_empty() || cost + job.cost <= cfg.max_batch_tokens);
        if !fits {
            break;
        }
        if let Some(job) = bucket.jobs.pop_front() {
            cost += job.cost;
            bucket.cost -= job.cost;
            batch.push(job);
        }
    }
    if bucket.jobs.is_empty() {
        q.buckets.remove(&key);
    }
    q.len -= batch.len();
    Some(batch)
}

/// When the next bucket runs out of waiting time; `None` if the queue is empty.
fn next_deadline(q: &Queue, max_wait: Duration) -> Option<Instant> {
    q.buckets
        .values()
        .filter_map(|b| b.jobs.front())
        .map(|j| j.enqueued + max_wait)
        .min()
}

fn score(shared: &Shared, batch: Vec<Job>) {
    let started = Instant::now();
    lock(&shared.stats).batch_started(started);
    let reqs: Vec<RewardRequest> = batch.iter().map(|j| j.req.clone()).collect();
    let results = catch_unwind(AssertUnwindSafe(|| shared.scorer.score_batch(&reqs)))
        .unwrap_or_else(|panic| {
            let detail = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panicked".into());
            let error = scorer_error(&shared.source, format!("panicked: {detail}"));
            vec![Err(error); reqs.len()]
        });
    let results = if results.len() == reqs.len() {
        results
    } else {
        let detail = format!(
            "returned {} results for a batch of {}",
            results.len(),
            reqs.len()
        );
        vec![Err(scorer_error(&shared.source, detail)); reqs.len()]
    };
    let finished = Instant::now();
    let tokens: usize = batch.iter().map(|j| j.cost).sum();
    let mut stats = lock(&shared.stats);
    stats.batch_finished(batch.len(), tokens, started, finished);
    for (job, result) in batch.into_iter().zip(results) {
        stats.answered(
            finished.saturating_duration_since(job.enqueued),
            result.is_ok(),
        );
        // The caller may have dropped its ticket; then nobody wants the answer.
        let _ = job.reply.send(result);
    }
}

fn scorer_error(source: &str, detail: String) -> RewardError {
    RewardError::Scorer {
        source: source.to_string(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Rewards each request with its response length and records the batches it saw.
    struct Recorder {
        batches: Mutex<Vec<Vec<usize>>>,
        delay: Duration,
    }

    impl BatchScorer for Recorder {
        fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Reply> {
            std::thread::sleep(self.delay);
            lock(&self.batches).push(batch.iter().map(|r| r.response_ids.len()).collect());
            batch
                .iter()
                .map(|r| Ok(RewardOutput::new(r.response_ids.len() as f64)))
                .collect()
        }
    }

    fn recorder(delay_ms: u64) -> Arc<Recorder> {
        Arc::new(Recorder {
            batches: Mutex::new(Vec::new()),
            delay: Duration::from_millis(delay_ms),
        })
    }

    fn req(len: usize) -> RewardRequest {
        RewardRequest {
            id: len.to_string(),
            response_ids: vec![0; len],
            ..Default::default()
        }
    }

    fn cfg(threads: usize, size: usize, tokens: usize, wait_ms: u64) -> ExecutorConfig {
        ExecutorConfig {
            threads,
            max_batch_size: size,
            max_batch_tokens: tokens,
            max_wait_ms: wait_ms,
            length_buckets: true,
        }
    }

    #[test]
    fn long_requests_are_not_batched_with_short_ones_and_budgets_hold() {
        let rec = recorder(0);
        // A long wait: batches are cut by size, tokens or shutdown, never by time.
        let exec = Executor::new(rec.clone(), cfg(1, 4, 40, 10_000), "x", "x").unwrap();
        let lens = [3, 3, 100, 3, 3, 12, 12, 12, 12];
        let tickets: Vec<_> = lens.iter().map(|&n| exec.submit(req(n))).collect();
        drop(exec);
        for (t, &n) in tickets.into_iter().zip(&lens) {
            assert_eq!(t.wait().unwrap().reward, n as f64);
        }
        let batches = lock(&rec.batches).clone();
        for b in &batches {
            let (lo, hi) = (b.iter().min().unwrap(), b.iter().max().unwrap());
            assert!(*hi < 2 * lo || b.len() == 1, "mixed lengths in {b:?}");
            assert!(
                b.iter().sum::<usize>() <= 40 || b.len() == 1,
                "over budget {b:?}"
            );
            assert!(b.len() <= 4);
        }
        assert!(batches.contains(&vec![3, 3, 3, 3]), "{batches:?}");
        assert!(batches.contains(&vec![100]), "{batches:?}");
        // 4 × 12 = 48 > 40 tokens: the twelves split.
        assert!(batches.contains(&vec![12, 12, 12]), "{batches:?}");
    }

    #[test]
    fn a_lone_request_waits_at_most_max_wait() {
        let rec = recorder(0);
        let exec = Executor::new(rec, cfg(1, 64, 1 << 20, 30), "x", "x").unwrap();
        let t0 = Instant::now();
        let out = exec.score(req(5)).unwrap();
        let waited = t0.elapsed();
        assert_eq!(out.reward, 5.0);
        assert!(waited >= Duration::from_millis(30), "{waited:?}");
        assert!(waited < Duration::from_millis(1000), "{waited:?}");
        assert!(exec.metrics().latency_quantile_s(0.5) >= 0.030);
    }

    struct Faulty(AtomicUsize);

    impl BatchScorer for Faulty {
        fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Reply> {
            match self.0.fetch_add(1, Ordering::SeqCst) {
                0 => panic!("model blew up"),
                1 => Vec::new(),
                _ => batch.iter().map(|_| Ok(RewardOutput::new(1.0))).collect(),
            }
        }
    }

    #[test]
    fn panicking_or_miscounting_scorers_fail_their_batch_and_the_executor_goes_on() {
        let exec = Executor::new(
            Arc::new(Faulty(AtomicUsize::new(0))),
            cfg(1, 8, 1 << 20, 0),
            "reward.executor",
            "rm",
        )
        .unwrap();
        // Each failure names the source, as a user's config does.
        let e = exec.score(req(1)).unwrap_err().to_string();
        assert!(
            e.starts_with("reward source `rm` failed: panicked: ") && e.contains("model blew up"),
            "{e}"
        );
        let e = exec.score(req(1)).unwrap_err().to_string();
        assert_eq!(
            e,
            "reward source `rm` failed: returned 0 results for a batch of 1"
        );
        assert_eq!(exec.score(req(1)).unwrap().reward, 1.0);
        let m = exec.metrics();
        assert_eq!((m.requests, m.completed, m.failed), (3, 3, 2));
    }

    #[test]
    fn zero_threads_is_a_config_error_naming_the_key() {
        let rec = recorder(0);
        let e = Executor::new(rec, cfg(0, 0, 1, 0), "reward.executor", "x")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("`reward.executor.threads`: must be ≥ 1 (got 0)"),
            "{e}"
        );
        assert!(e.contains("`reward.executor.max_batch_size`"), "{e}");
    }

    #[test]
    fn tickets_can_be_polled_and_waited_with_a_timeout() {
        let rec = recorder(100);
        let exec = Executor::new(rec, cfg(1, 1, 1 << 20, 0), "x", "x").unwrap();
        let mut t = exec.submit(req(2));
        assert!(!t.is_ready());
        assert!(t.try_take().is_none());
        let t = t.wait_timeout(Duration::from_millis(1)).unwrap_err();
        assert_eq!(t.wait().unwrap().reward, 2.0);
        assert_eq!(
            Ticket::ready(Ok(RewardOutput::new(3.0)))
                .wait()
                .unwrap()
                .reward,
            3.0
        );
    }
}
