//! Short training runs of the default task with each kind of reward source: each test checks
//! that the logged reward is what that source computes (not the task's own reward), that
//! accuracy is judged by `eval.correct_by` (the routed answer check, else the task's checker),
//! and that failures fail trajectories, not the run.
//! Real components only: the example worker script, the all-MiniLM-L6-v2 reward model
//! (scripts/setup-reward-model.sh), and a `skein serve-reward` subprocess on 127.0.0.1.

mod common;

use serde_json::Value;
use skein::trainer::run::train;
use skein::trainer::TrainConfig;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const PROMPTS: usize = 8;
const SAMPLES: usize = 4;
const STEPS: usize = 2;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A small, quickly warmed-up policy (so some answers are right), and `extra` TOML on top.
fn config(name: &str, extra: &str) -> TrainConfig {
    let dir = std::env::temp_dir().join(format!("skein-rewards-{name}-{}", std::process::id()));
    let text = format!(
        r#"
[run]
dir = "{}"
threads = 1
[model]
hidden_size = 64
num_layers = 2
num_heads = 2
num_kv_heads = 1
intermediate_size = 128
[task]
difficulty = 1
[sft]
steps = 40
batch_size = 32
lr = 5e-3
[rollout]
prompts_per_step = {PROMPTS}
samples_per_prompt = {SAMPLES}
[trainer]
steps = {STEPS}
[eval]
problems = 16
every = 0
{extra}
"#,
        dir.display()
    );
    skein_config::load(Some(&text), name, &[]).expect("test config loads")
}

/// The RL steps' records of metrics.jsonl (those with a rollout: a step whose every
/// trajectory failed has no training reward).
fn steps(dir: &Path) -> Vec<serde_json::Map<String, Value>> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).expect("metrics.jsonl");
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .filter_map(|v| match v {
            Value::Object(m) if m.contains_key("rollout/trajectories") => Some(m),
            _ => None,
        })
        .collect()
}

fn get(m: &serde_json::Map<String, Value>, key: &str) -> f64 {
    m.get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("metric `{key}` missing in {m:?}"))
}

/// One training run at a time: runs in this process share libtorch's global random
/// generator, and two runs drawing from it on parallel test threads sample differently from
/// one run alone, so a run's accuracy would depend on its neighbours' timing.
static ONE_RUN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(name: &str, extra: &str) -> Vec<serde_json::Map<String, Value>> {
    let cfg = config(name, extra);
    let _alone = ONE_RUN_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let summary = train(&cfg).expect("the run completes");
    let records = steps(&summary.dir);
    assert_eq!(records.len(), STEPS);
    records
}

/// Accuracy is right somewhere, so a reward that copied it would show.
fn some_correct(records: &[serde_json::Map<String, Value>]) {
    assert!(
        records.iter().any(|m| get(m, "reward/accuracy") > 0.0),
        "the warmed-up policy should get some answers right"
    );
}

#[test]
fn a_math_function_gives_the_reward_with_its_weight() {
    let records = run(
        "math",
        r#"
[reward.sources.answer]
kind = "math"
flexible = true
[reward.routes.arithmetic]
sources = ["answer"]
weights = [2.0]
[reward.default_route]
sources = []
"#,
    );
    some_correct(&records);
    for m in &records {
        // Weighted 2: the task's own reward would be the plain accuracy.
        let acc = get(m, "score/answer/acc");
        assert!((get(m, "reward/mean") - 2.0 * acc).abs() < 1e-9, "{m:?}");
        // The routed `math` source is the judge: accuracy is its verdict.
        assert!((get(m, "reward/accuracy") - acc).abs() < 1e-9, "{m:?}");
        // Every response went to the rewarder: the eval before RL, then each step's.
        let step = get(m, "step") as usize;
        assert_eq!(
            get(m, "reward/requests") as usize,
            16 + step * PROMPTS * SAMPLES
        );
        assert_eq!(get(m, "reward/failed"), 0.0);
        assert_eq!(get(m, "batch/failed_trajectories"), 0.0);
    }
    assert!(records.iter().any(|m| get(m, "score/answer/acc") > 0.0));
}

/// The example worker as the `python` source, the default route's one source.
fn example_worker_source() -> String {
    let script = root().join("scripts/reward_worker_example.py");
    format!(
        r#"
[reward.sources.python]
kind = "worker"
command = ["python3", "{}"]
processes = 1
batch_size = 8
[reward.default_route]
sources = ["python"]
"#,
        script.display()
    )
}

#[test]
fn the_example_worker_scores_through_its_process() {
    let records = run("worker", &example_worker_source());
    some_correct(&records);
    for m in &records {
        // The example worker wants `#### n` or \boxed{n}; bare numbers find no answer, so its
        // reward is 0 where the task's would equal the accuracy.
        assert_eq!(get(m, "score/python/answer_found"), 0.0);
        assert_eq!(get(m, "reward/mean"), 0.0);
        assert_eq!(get(m, "reward/worker_restarts"), 0.0);
        assert!(get(m, "reward/python/batches") >= 1.0);
    }
}

/// all-MiniLM-L6-v2, installed by scripts/setup-reward-model.sh (which `make test` runs).
fn minilm_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("SKEIN_MINILM_DIR") {
        return PathBuf::from(dir);
    }
    let recorded = root().join(".venv/minilm.path");
    let text = std::fs::read_to_string(&recorded).unwrap_or_else(|_| {
        panic!(
            "{} is missing: run scripts/setup-reward-model.sh (make test does)",
            recorded.display()
        )
    });
    PathBuf::from(text.trim())
}

/// A burst of finished responses reaches the reward model in batches (the executor's own
/// counters say so), and the reward is the model's cosine similarity, not the task's 0/1.
#[test]
fn the_minilm_reward_model_scores_bursts_in_batches() {
    let records = run(
        "scorer",
        &format!(
            r#"
[reward.executor]
threads = 1
max_batch_size = 32
max_wait_ms = 50
[reward.sources.rm]
kind = "scorer"
[reward.default_route]
sources = ["rm"]
[reward_models]
rm = "{}"
"#,
            minilm_dir().display()
        ),
    );
    for m in &records {
        let (reward, acc) = (get(m, "reward/mean"), get(m, "reward/accuracy"));
        assert!((reward - get(m, "score/rm/reward")).abs() < 1e-9);
        assert!(reward > 0.0 && reward < 1.0, "{reward}");
        // A mean of 0/1 rewards over 32 samples is a multiple of 1/32; cosines are not.
        let k = reward * (PROMPTS * SAMPLES) as f64;
        assert!(
            (k - k.round()).abs() > 1e-6,
            "{reward} looks like a 0/1 reward"
        );
        assert!((reward - acc).abs() > 1e-6);
        let (requests, batches) = (get(m, "reward/rm/requests"), get(m, "reward/rm/batches"));
        assert!(batches < requests / 4.0, "{batches} batches for {requests}");
        assert!(get(m, "reward/rm/batch_size_max") >= 8.0);
        assert!(get(m, "reward/rm/tokens_per_s") > 0.0);
        assert_eq!(get(m, "batch/failed_trajectories"), 0.0);
    }
}

/// A `skein serve-reward` process, killed when dropped.
struct Service {
    child: Child,
    url: String,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_reward(name: &str, config: &str) -> Service {
    let path = std::env::temp_dir().join(format!("skein-serve-{name}-{}.toml", std::process::id()));
    std::fs::write(&path, config).expect("writing the service config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(["serve-reward", "--addr", "127.0.0.1:0", "--config"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("skein serve-reward starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    // Owned by the guard from here, so a failed start still kills the process.
    let mut service = Service {
        child,
        url: String::new(),
    };
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("serve-reward prints its URL");
    service.url = line
        .trim()
        .rsplit(' ')
        .next()
        .filter(|u| u.starts_with("http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    service
}

/// Training against a real `skein serve-reward` on loopback: the service's exact-match reward,
/// weighted 2 on its side, comes back through the remote source.
#[test]
fn a_remote_source_trains_against_serve_reward() {
    let service = serve_reward(
        "exact",
        r#"
[reward.sources.exact]
kind = "exact_match"
[reward.default_route]
sources = ["exact"]
weights = [2.0]
[serve]
http_threads = 4
"#,
    );
    let records = run(
        "remote",
        &format!(
            r#"
[reward.sources.far]
kind = "remote"
url = "{}"
timeout_ms = 10000
[reward.default_route]
sources = ["far"]
"#,
            service.url
        ),
    );
    some_correct(&records);
    for m in &records {
        // Exact match is the arithmetic task's own correctness, so the reward is twice it.
        let acc = get(m, "reward/accuracy");
        assert!((get(m, "reward/mean") - 2.0 * acc).abs() < 1e-9, "{m:?}");
        assert!((get(m, "score/far/exact/acc") - acc).abs() < 1e-9);
        assert_eq!(get(m, "reward/remote_failures"), 0.0);
        assert_eq!(get(m, "batch/failed_trajectories"), 0.0);
    }
}

/// `GET /metrics` of `skein serve-reward` gives its sources' own counters, where batching
/// happens, not those of the pass-through in front of them.
#[test]
fn serve_reward_metrics_are_its_sources_counters() {
    let service = serve_reward("metrics", &example_worker_source());
    let requests: Vec<Value> = (0..3)
        .map(|i| {
            serde_json::json!({"id": i.to_string(), "data_source": "d", "prompt": "1+1=",
                               "response": "#### 2", "ground_truth": "2"})
        })
        .collect();
    let answers = ureq::post(&service.url)
        .set("Content-Type", "application/json")
        .send_string(&Value::Array(requests).to_string())
        .expect("POST /score")
        .into_string()
        .expect("an answer");
    let answers: Vec<Value> = serde_json::from_str(&answers).expect("a JSON array");
    assert_eq!(answers.len(), 3, "{answers:?}");
    let base = service.url.trim_end_matches("/score");
    let m = ureq::get(&format!("{base}/metrics"))
        .call()
        .expect("GET /metrics")
        .into_string()
        .expect("metrics");
    let m: Value = serde_json::from_str(&m).expect("JSON metrics");
    assert_eq!(m["reward/requests"], 3.0, "{m}");
    assert_eq!(m["reward/python/requests"], 3.0, "{m}");
    assert_eq!(m["reward/python/completed"], 3.0, "{m}");
    assert!(m["reward/python/batches"].as_f64() >= Some(1.0), "{m}");
    assert_eq!(m["reward/worker_restarts"], 0.0, "{m}");
}

/// A service that is down fails every trajectory it should have scored, counted, and the run
/// still completes.
#[test]
fn a_remote_service_that_is_down_fails_trajectories_not_the_run() {
    let records = run("down", &common::down_reward_service());
    for m in &records {
        assert_eq!(
            get(m, "batch/failed_trajectories") as usize,
            PROMPTS * SAMPLES
        );
        assert_eq!(get(m, "reward/step_failed") as usize, PROMPTS * SAMPLES);
        assert_eq!(get(m, "reward/step_calls") as usize, PROMPTS * SAMPLES);
        // Nothing was answered: no reward mean to read as "all wrong".
        assert!(m.get("reward/mean").is_none(), "{m:?}");
        assert!(get(m, "reward/remote_failures") >= (PROMPTS * SAMPLES) as f64);
        assert!(get(m, "reward/remote_retries") >= 1.0);
        assert_eq!(get(m, "batch/rows"), 0.0);
    }
}
