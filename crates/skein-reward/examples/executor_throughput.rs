//! Batched against one-at-a-time throughput of the executor on a stand-in reward model whose
//! batch costs a fixed 5 ms plus 0.1 ms per request (a forward pass that batching amortises).
//!
//! cargo run --release -p skein-reward --example executor_throughput

use skein_reward::{
    BatchScorer, Executor, ExecutorConfig, RewardError, RewardOutput, RewardRequest,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct StandInModel;

impl BatchScorer for StandInModel {
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        std::thread::sleep(Duration::from_micros(5_000 + 100 * batch.len() as u64));
        batch.iter().map(|_| Ok(RewardOutput::new(1.0))).collect()
    }
}

fn run(max_batch_size: usize) -> Result<(f64, f64), RewardError> {
    let cfg = ExecutorConfig {
        threads: 1,
        max_batch_size,
        max_wait_ms: 5,
        ..Default::default()
    };
    let exec = Executor::new(Arc::new(StandInModel), cfg, "reward.executor", "model")?;
    let (callers, each) = (16, 16);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for c in 0..callers {
            let exec = &exec;
            s.spawn(move || {
                // Each caller is a rollout whose trajectories finish one after another.
                for k in 0..each {
                    let req = RewardRequest {
                        id: format!("{c}-{k}"),
                        response_ids: vec![0; 64],
                        ..Default::default()
                    };
                    let _ = exec.submit(req).wait();
                }
            });
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    Ok((
        (callers * each) as f64 / secs,
        exec.metrics().batch_size_mean(),
    ))
}

fn main() -> Result<(), RewardError> {
    let (single, _) = run(1)?;
    let (batched, mean) = run(32)?;
    println!("one at a time: {single:.0} requests/s");
    println!("batched:       {batched:.0} requests/s (mean batch {mean:.1})");
    println!("ratio:         {:.1}x", batched / single);
    Ok(())
}
