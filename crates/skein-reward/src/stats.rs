//! Counters of an executor and their flat `reward/...` view.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Latencies kept for percentiles: the most recent ones, so memory stays bounded on long runs.
const LATENCY_WINDOW: usize = 1 << 16;

/// Running counters, updated under the executor's lock.
#[derive(Debug)]
pub(crate) struct Stats {
    pub submitted: u64,
    pub completed: u64,
    pub failed: u64,
    pub batches: u64,
    pub batch_size_max: usize,
    /// `histogram[k]`: batches of size in (2^(k-1), 2^k].
    pub histogram: Vec<u64>,
    pub tokens: u64,
    pub queue_depth: usize,
    pub queue_depth_max: usize,
    latencies: Vec<f64>,
    next_latency: usize,
    /// Batches running right now, and since when at least one has been.
    running: usize,
    busy_since: Option<Instant>,
    busy: Duration,
    thread_busy: Duration,
}

impl Stats {
    pub fn new() -> Self {
        Stats {
            submitted: 0,
            completed: 0,
            failed: 0,
            batches: 0,
            batch_size_max: 0,
            histogram: Vec::new(),
            tokens: 0,
            queue_depth: 0,
            queue_depth_max: 0,
            latencies: Vec::new(),
            next_latency: 0,
            running: 0,
            busy_since: None,
            busy: Duration::ZERO,
            thread_busy: Duration::ZERO,
        }
    }

    pub fn batch_started(&mut self, now: Instant) {
        if self.running == 0 {
            self.busy_since = Some(now);
        }
        self.running += 1;
    }

    pub fn batch_finished(&mut self, size: usize, tokens: usize, started: Instant, now: Instant) {
        self.running = self.running.saturating_sub(1);
        if self.running == 0 {
            if let Some(since) = self.busy_since.take() {
                self.busy += now.saturating_duration_since(since);
            }
        }
        self.thread_busy += now.saturating_duration_since(started);
        self.batches += 1;
        self.batch_size_max = self.batch_size_max.max(size);
        let k = size.max(1).next_power_of_two().trailing_zeros() as usize;
        if self.histogram.len() <= k {
            self.histogram.resize(k + 1, 0);
        }
        self.histogram[k] += 1;
        self.tokens += tokens as u64;
    }

    pub fn answered(&mut self, latency: Duration, ok: bool) {
        self.completed += 1;
        if !ok {
            self.failed += 1;
        }
        let s = latency.as_secs_f64();
        if self.latencies.len() < LATENCY_WINDOW {
            self.latencies.push(s);
        } else {
            self.latencies[self.next_latency] = s;
            self.next_latency = (self.next_latency + 1) % LATENCY_WINDOW;
        }
    }

    pub fn snapshot(&self, now: Instant) -> ExecutorMetrics {
        // A batch still running counts its time so far.
        let open = self
            .busy_since
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
        ExecutorMetrics {
            requests: self.submitted,
            completed: self.completed,
            failed: self.failed,
            batches: self.batches,
            batch_size_max: self.batch_size_max,
            batch_size_histogram: self.histogram.clone(),
            tokens: self.tokens,
            queue_depth: self.queue_depth,
            queue_depth_max: self.queue_depth_max,
            latencies_s: self.latencies.clone(),
            busy_s: (self.busy + open).as_secs_f64(),
            thread_busy_s: self.thread_busy.as_secs_f64(),
        }
    }
}

/// A snapshot of an executor's counters. Cumulative since it started, except `queue_depth`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecutorMetrics {
    /// Requests submitted.
    pub requests: u64,
    /// Requests answered (successfully or not).
    pub completed: u64,
    /// Requests answered with an error.
    pub failed: u64,
    /// Batches run.
    pub batches: u64,
    pub batch_size_max: usize,
    /// `batch_size_histogram[k]`: batches whose size is in (2^(k-1), 2^k] (k = 0: size 1).
    pub batch_size_histogram: Vec<u64>,
    /// Cost units (tokens by default) of all scored requests.
    pub tokens: u64,
    /// Requests waiting for a batch now, and the most ever waiting at once.
    pub queue_depth: usize,
    pub queue_depth_max: usize,
    /// Submit-to-answer latencies of the most recent requests, in seconds.
    pub latencies_s: Vec<f64>,
    /// Wall time during which at least one batch was running. Read it when generation ends and
    /// again when the last reward is in: the difference is reward time generation did not hide.
    pub busy_s: f64,
    /// Sum over threads of time spent in batches.
    pub thread_busy_s: f64,
}

impl ExecutorMetrics {
    pub fn batch_size_mean(&self) -> f64 {
        if self.batches == 0 {
            0.0
        } else {
            self.completed as f64 / self.batches as f64
        }
    }

    /// The `q`-quantile (0..=1) of latencies, nearest rank; 0 without samples.
    pub fn latency_quantile_s(&self, q: f64) -> f64 {
        quantile(&self.latencies_s, q)
    }

    /// Cost units scored per second of busy wall time.
    pub fn tokens_per_s(&self) -> f64 {
        if self.busy_s > 0.0 {
            self.tokens as f64 / self.busy_s
        } else {
            0.0
        }
    }

    /// Adds another executor's counters (for a total over several sources).
    pub fn merge(&mut self, other: &ExecutorMetrics) {
        self.requests += other.requests;
        self.completed += other.completed;
        self.failed += other.failed;
        self.batches += other.batches;
        self.batch_size_max = self.batch_size_max.max(other.batch_size_max);
        if self.batch_size_histogram.len() < other.batch_size_histogram.len() {
            self.batch_size_histogram
                .resize(other.batch_size_histogram.len(), 0);
        }
        for (a, b) in self
            .batch_size_histogram
            .iter_mut()
            .zip(&other.batch_size_histogram)
        {
            *a += b;
        }
        self.tokens += other.tokens;
        self.queue_depth += other.queue_depth;
        self.queue_depth_max += other.queue_depth_max;
        self.latencies_s.extend_from_slice(&other.latencies_s);
        self.busy_s += other.busy_s;
        self.thread_busy_s += other.thread_busy_s;
    }

    /// Flat metrics named `{prefix}/requests`, `{prefix}/batch_size_mean`, … .
    pub fn to_map(&self, prefix: &str) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: f64| {
            m.insert(format!("{prefix}/{k}"), v);
        };
        put("requests", self.requests as f64);
        put("completed", self.completed as f64);
        put("failed", self.failed as f64);
        put("batches", self.batches as f64);
        put("batch_size_mean", self.batch_size_mean());
        put("batch_size_max", self.batch_size_max as f64);
        put("queue_depth", self.queue_depth as f64);
        put("queue_depth_max", self.queue_depth_max as f64);
        put("latency_p50_s", self.latency_quantile_s(0.5));
        put("latency_p95_s", self.latency_quantile_s(0.95));
        put("tokens", self.tokens as f64);
        put("tokens_per_s", self.tokens_per_s());
        put("busy_s", self.busy_s);
        put("thread_busy_s", self.thread_busy_s);
        for (k, &n) in self.batch_size_histogram.iter().enumerate() {
            put(&format!("batch_size_le_{}", 1usize << k), n as f64);
        }
        m
    }
}

fn quantile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_nearest_rank() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&s, 0.5), 50.0);
        assert_eq!(quantile(&s, 0.95), 95.0);
        assert_eq!(quantile(&s, 0.0), 1.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn busy_time_is_the_union_of_overlapping_batches() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut s = Stats::new();
        s.batch_started(ms(0));
        s.batch_started(ms(10));
        s.batch_finished(4, 40, ms(0), ms(20));
        s.batch_finished(1, 10, ms(10), ms(30));
        let m = s.snapshot(ms(30));
        assert!((m.busy_s - 0.030).abs() < 1e-9, "{}", m.busy_s);
        assert!((m.thread_busy_s - 0.040).abs() < 1e-9);
        assert_eq!(m.batch_size_histogram, vec![1, 0, 1]);
        assert_eq!(m.batch_size_max, 4);
        let map = m.to_map("reward");
        assert_eq!(map["reward/batch_size_le_4"], 1.0);
        assert!((map["reward/tokens_per_s"] - 50.0 / 0.030).abs() < 1e-6);
    }
}
