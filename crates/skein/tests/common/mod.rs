//! Helpers the end-to-end tests share. Each test file uses only some of them.
#![allow(dead_code)]

use serde_json::Value;
use std::path::Path;

/// The Python interpreter that has the `openai` package, if any.
pub fn python_with_openai() -> Option<String> {
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python");
    [venv, "python3"].into_iter().map(String::from).find(|py| {
        std::process::Command::new(py)
            .args(["-c", "import openai"])
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
        .filter(|m| m.get("reward/mean").is_some())
        .collect()
}
