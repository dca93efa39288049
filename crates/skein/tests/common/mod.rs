//! Helpers the end-to-end tests share. Each test file uses only some of them.
#![allow(dead_code)]

use serde_json::Value;
use std::path::Path;

/// The Python interpreter that has the `openai` package; the test fails without one.
pub fn require_python_with_openai() -> String {
    require_python_with("openai", "scripts/setup-agent-client.sh")
}

/// The Python interpreter (the project's .venv first) that can import `module`. A test that
/// needs one fails without it, naming the script that installs it (`make test` runs them all),
/// rather than passing without having run.
pub fn require_python_with(module: &str, setup: &str) -> String {
    python_with(module)
        .unwrap_or_else(|| panic!("no Python can import `{module}`: run {setup} (make test does)"))
}

/// The Python interpreter (the project's .venv first) that can import `module`, if any.
pub fn python_with(module: &str) -> Option<String> {
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python");
    [venv, "python3"].into_iter().map(String::from).find(|py| {
        std::process::Command::new(py)
            .args(["-c", &format!("import {module}")])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// The training steps' records of a run's metrics.jsonl (SFT and eval-only lines left out).
pub fn step_metrics(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        // Every RL step logs its rollout's size; `reward/mean` is absent from a step whose
        // every trajectory failed.
        .filter(|m| m.get("rollout/trajectories").is_some())
        .collect()
}

/// The engine's log-probs of a step's tokens agree with the trainer's recomputation of them
/// (`logp_mismatch/*`, over the tokens the step's own weights sampled) to float round-off: the
/// tokens trained on are the ones the engine sampled, scored by the same policy.
pub fn assert_logprobs_agree(m: &Value) {
    let mean = m["logp_mismatch/mean"]
        .as_f64()
        .unwrap_or_else(|| panic!("no `logp_mismatch/mean` in {m}"));
    let max = m["logp_mismatch/max"]
        .as_f64()
        .unwrap_or_else(|| panic!("no `logp_mismatch/max` in {m}"));
    assert!(
        mean < 1e-5 && max < 1e-3,
        "engine and trainer log-probs differ: mean {mean}, max {max}"
    );
}

/// `--set` overrides of a run that takes a few seconds: a tiny model, one thread, no
/// evaluation between steps.
pub const TINY_RUN: &[&str] = &[
    "run.threads=1",
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "eval.every=0",
];

/// Runs `skein train --overwrite` in `dir` on the tiny model ([`TINY_RUN`]) with `sets` after
/// it; panics with the run's stderr when it fails.
pub fn train_tiny(dir: &Path, sets: &[String]) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_skein"));
    cmd.args(["train", "--overwrite", "--set"])
        .arg(format!("run.dir={:?}", dir.display().to_string()));
    for s in TINY_RUN
        .iter()
        .map(|s| s.to_string())
        .chain(sets.iter().cloned())
    {
        cmd.args(["--set", &s]);
    }
    let out = cmd.output().expect("skein train runs");
    assert!(
        out.status.success(),
        "{}: the run failed\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh, empty temporary directory for a test of `file` named `name`.
pub fn workdir(file: &str, name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("skein-{file}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A `[reward]` config whose one source is a remote service on a loopback port nothing listens
/// on: every trajectory's scoring fails.
pub fn down_reward_service() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port();
    format!(
        r#"
[reward.sources.far]
kind = "remote"
url = "http://127.0.0.1:{port}/score"
timeout_ms = 2000
retries = 1
backoff_ms = 10
[reward.default_route]
sources = ["far"]
"#
    )
}

/// Reads `child`'s piped stderr on a thread of its own and sends what `pick` finds in each
/// line, so a test can wait for a line (an address, a progress line) while the process runs.
pub fn watch_stderr<T: Send + 'static>(
    child: &mut std::process::Child,
    pick: impl Fn(&str) -> Option<T> + Send + 'static,
) -> std::sync::mpsc::Receiver<T> {
    use std::io::{BufRead, BufReader};
    let stderr = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(found) = pick(&line) {
                let _ = tx.send(found);
            }
        }
    });
    rx
}
