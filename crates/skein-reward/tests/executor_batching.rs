//! A burst of single requests from many threads is served in batches, and each caller gets its
//! own answer back; checked with the executor's own counters.

use skein_reward::{
    BatchScorer, Executor, ExecutorConfig, RewardError, RewardOutput, RewardRequest,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// A stand-in reward model: a fixed cost per batch (like one forward pass), reward = the
/// number in the request's id, so a misrouted answer is visible.
struct SlowModel {
    per_batch: Duration,
    calls: AtomicUsize,
}

impl BatchScorer for SlowModel {
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.per_batch);
        batch
            .iter()
            .map(|r| match r.id.parse::<f64>() {
                Ok(v) => Ok(RewardOutput::new(v).with_metric("batch", batch.len() as f64)),
                Err(e) => Err(RewardError::BadRequest(e.to_string())),
            })
            .collect()
    }
}

fn model(per_batch_ms: u64) -> Arc<SlowModel> {
    Arc::new(SlowModel {
        per_batch: Duration::from_millis(per_batch_ms),
        calls: AtomicUsize::new(0),
    })
}

fn request(id: usize) -> RewardRequest {
    RewardRequest {
        id: id.to_string(),
        prompt_ids: vec![1; 10],
        response_ids: vec![2; 20 + id % 7],
        ..Default::default()
    }
}

/// `callers` threads each submit `per_caller` requests at once, then wait for all of them.
fn burst(exec: &Executor, callers: usize, per_caller: usize) -> Duration {
    let barrier = Barrier::new(callers);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for c in 0..callers {
            let (barrier, exec) = (&barrier, exec);
            s.spawn(move || {
                barrier.wait();
                let ids: Vec<usize> = (0..per_caller).map(|k| c * 1000 + k).collect();
                let tickets: Vec<_> = ids.iter().map(|&id| exec.submit(request(id))).collect();
                for (id, t) in ids.into_iter().zip(tickets) {
                    let out = t.wait().expect("scored");
                    assert_eq!(
                        out.reward, id as f64,
                        "caller {c} got another caller's answer"
                    );
                }
            });
        }
    });
    t0.elapsed()
}

#[test]
fn a_burst_of_single_requests_is_served_in_batches_to_the_right_callers() {
    let model = model(20);
    let cfg = ExecutorConfig {
        threads: 2,
        max_batch_size: 16,
        max_batch_tokens: 1 << 20,
        max_wait_ms: 10,
        length_buckets: true,
    };
    let exec = Executor::new(model.clone(), cfg, "reward.executor", "model").expect("valid config");
    let took = burst(&exec, 16, 8);
    let m = exec.metrics();
    assert_eq!(m.requests, 128);
    assert_eq!(m.completed, 128);
    assert_eq!(m.failed, 0);
    assert_eq!(m.batches as usize, model.calls.load(Ordering::SeqCst));
    assert!(m.batches <= 32, "128 requests took {} batches", m.batches);
    assert!(
        m.batch_size_mean() >= 4.0,
        "mean batch {}",
        m.batch_size_mean()
    );
    assert!(m.batch_size_max > 1 && m.batch_size_max <= 16);
    assert!(
        m.queue_depth_max >= 16,
        "queue depth max {}",
        m.queue_depth_max
    );
    assert_eq!(m.queue_depth, 0);
    assert_eq!(m.batch_size_histogram.iter().sum::<u64>(), m.batches);
    // One at a time this would take 128 × 20 ms / 2 threads = 1.28 s.
    assert!(took < Duration::from_millis(1000), "{took:?}");
    let map = m.to_map("reward");
    assert!(map["reward/latency_p95_s"] >= map["reward/latency_p50_s"]);
    assert!(map["reward/latency_p50_s"] > 0.0);
    assert!(map["reward/tokens_per_s"] > 0.0);
    assert!(map["reward/busy_s"] > 0.0 && map["reward/busy_s"] <= took.as_secs_f64() + 0.01);
}

#[test]
fn dropping_the_executor_answers_what_was_queued_and_joins_its_threads() {
    let model = model(5);
    let cfg = ExecutorConfig {
        threads: 2,
        max_batch_size: 4,
        max_wait_ms: 60_000,
        ..Default::default()
    };
    let exec = Executor::new(model, cfg, "reward.executor", "model").expect("valid config");
    let tickets: Vec<_> = (0..10).map(|i| exec.submit(request(i))).collect();
    let t0 = Instant::now();
    drop(exec);
    assert!(t0.elapsed() < Duration::from_secs(5));
    for (i, t) in tickets.into_iter().enumerate() {
        assert_eq!(t.wait().expect("answered before shutdown").reward, i as f64);
    }
}
