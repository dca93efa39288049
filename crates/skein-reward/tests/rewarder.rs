//! The front door end to end: a TOML config routing data sources to inline functions, a real
//! worker process and a program-supplied scorer, with weights, errors and metrics.

use skein_reward::{BatchScorer, RewardConfig, RewardError, RewardOutput, RewardRequest, Rewarder};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Stands in for a reward model: reward = response tokens / 100, 10 ms per batch.
struct LengthModel;

impl BatchScorer for LengthModel {
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        std::thread::sleep(Duration::from_millis(10));
        batch
            .iter()
            .map(|r| Ok(RewardOutput::new(r.response_ids.len() as f64 / 100.0)))
            .collect()
    }
}

fn config(extra: &str) -> RewardConfig {
    let worker = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/reward_worker_example.py")
        .display()
        .to_string();
    let text = format!(
        r#"
[executor]
threads = 1
max_batch_size = 8
max_wait_ms = 20

[sources.answer]
kind = "math"

[sources.length]
kind = "overlong"
max_response_tokens = 100
overlong_buffer = 20

[sources.python]
kind = "worker"
command = ["python3", "{worker}"]

[sources.rm]
kind = "scorer"

[routes.gsm8k]
sources = ["answer", "length"]
weights = [1.0, 0.5]

[routes.py]
sources = ["python"]

[routes.rm]
sources = ["rm", "answer"]

[default_route]
sources = []
{extra}
"#
    );
    toml::from_str(&text).expect("valid TOML config")
}

fn scorers() -> BTreeMap<String, Arc<dyn BatchScorer>> {
    BTreeMap::from([(
        "rm".to_string(),
        Arc::new(LengthModel) as Arc<dyn BatchScorer>,
    )])
}

fn req(id: usize, data_source: &str, response: &str, truth: &str, tokens: usize) -> RewardRequest {
    RewardRequest {
        id: id.to_string(),
        data_source: data_source.into(),
        response: response.into(),
        response_ids: vec![7; tokens],
        ground_truth: truth.into(),
        ..Default::default()
    }
}

#[test]
fn requests_are_routed_by_data_source_and_combined_with_weights() {
    let rewarder = Rewarder::new(&config(""), scorers()).expect("valid config");
    // Right answer, 90 tokens: 1 + 0.5 × (−0.5).
    let out = rewarder
        .score(req(0, "gsm8k", r"\boxed{12}", "#### 12", 90))
        .expect("scored");
    assert_eq!(out.reward, 0.75);
    assert_eq!(out.metrics["answer/reward"], 1.0);
    assert_eq!(out.metrics["length/reward"], -0.5);
    assert_eq!(out.metrics["answer/answer_found"], 1.0);
    // The Python worker.
    let out = rewarder
        .score(req(1, "py", "#### 3", "3", 5))
        .expect("scored");
    assert_eq!((out.reward, out.metrics["python/answer_found"]), (1.0, 1.0));
    // The supplied scorer plus the math function.
    let out = rewarder
        .score(req(2, "rm", r"\boxed{1}", "2", 40))
        .expect("scored");
    assert_eq!(out.reward, 0.4);
    // No route and no default: a clear error, counted.
    let e = rewarder
        .score(req(3, "chess", "", "", 1))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`reward.routes.chess`") && e.contains("gsm8k, py, rm"),
        "{e}"
    );
    let m = rewarder.metrics();
    assert_eq!(m["reward/requests"], 4.0);
    assert_eq!(m["reward/failed"], 1.0);
}

#[test]
fn submissions_from_many_threads_batch_on_the_scorer_and_report_metrics() {
    let rewarder = Rewarder::new(&config(""), scorers()).expect("valid config");
    let pending: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let rewarder = &rewarder;
                s.spawn(move || {
                    (0..8)
                        .map(|k| {
                            (
                                t * 8 + k,
                                rewarder.submit(req(t * 8 + k, "rm", "x", "y", t * 8 + k)),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("submitter"))
            .collect()
    });
    for (i, p) in pending {
        let out = rewarder.wait(p).expect("scored");
        assert!(
            (out.reward - i as f64 / 100.0).abs() < 1e-12,
            "request {i} got {}",
            out.reward
        );
    }
    let m = rewarder.metrics();
    for key in [
        "reward/queue_depth_max",
        "reward/batch_size_mean",
        "reward/latency_p50_s",
        "reward/latency_p95_s",
        "reward/tokens_per_s",
        "reward/failed",
        "reward/worker_restarts",
        "reward/timeouts",
        "reward/busy_s",
        "reward/rm/batches",
    ] {
        assert!(m.contains_key(key), "missing {key} in {m:?}");
    }
    assert_eq!(m["reward/rm/completed"], 32.0);
    assert!(m["reward/rm/batches"] < 32.0, "{m:?}");
    assert!(m["reward/batch_size_mean"] > 1.0);
    assert_eq!(m["reward/failed"], 0.0);
}

/// The totals count whole requests: a request routed to two queued sources is one request
/// and, once both parts are in, one completed, while each source counts its own part.
#[test]
fn totals_count_whole_requests_and_sources_their_parts() {
    let both = "[routes.both]\nsources = [\"python\", \"rm\"]\n";
    let rewarder = Rewarder::new(&config(both), scorers()).expect("valid config");
    for i in 0..4 {
        rewarder
            .score(req(i, "both", "#### 2", "2", 3))
            .expect("scored");
    }
    let m = rewarder.metrics();
    assert_eq!(m["reward/python/completed"], 4.0, "{m:?}");
    assert_eq!(m["reward/rm/completed"], 4.0, "{m:?}");
    assert_eq!(m["reward/requests"], 4.0, "{m:?}");
    assert_eq!(m["reward/completed"], 4.0, "{m:?}");
    assert_eq!(m["reward/failed"], 0.0, "{m:?}");
}

#[test]
fn start_up_errors_name_the_key_instead_of_panicking() {
    let e = Rewarder::new(&config(""), BTreeMap::new())
        .err()
        .expect("no scorer supplied");
    assert!(
        e.to_string()
            .contains("`reward.sources.rm`: kind = \"scorer\" needs a scorer"),
        "{e}"
    );
    let mut cfg = config("");
    cfg.executor.threads = 0;
    let e = Rewarder::new(&cfg, scorers())
        .err()
        .expect("zero threads")
        .to_string();
    assert!(e.contains("`reward.executor.threads`: must be ≥ 1"), "{e}");
    let e = toml::from_str::<RewardConfig>("[sources.w]\nkind = \"worker\"\nprocesses = 1\n")
        .map_err(|e| e.to_string())
        .and_then(|cfg| {
            Rewarder::new(&cfg, BTreeMap::new())
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .unwrap_err();
    assert!(
        e.contains("`reward.sources.w.command`: must name a program"),
        "{e}"
    );
}
