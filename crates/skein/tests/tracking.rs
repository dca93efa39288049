//! `run.tracking = ["jsonl", "tensorboard"]`: a real run's TensorBoard event files, read back
//! with the `tensorboard` package itself, hold every scalar of metrics.jsonl at its step and
//! nothing else — after a resume that discards steps too.

mod common;

use common::{require_python_with, TINY_RUN};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Three steps of a tiny run after a short warm-up, with a checkpoint at step 2 only, so a
/// resume discards step 3 and the final evaluation.
const SMALL: &[&str] = &[
    "sft.steps=2",
    "sft.batch_size=8",
    "rollout.prompts_per_step=4",
    "rollout.samples_per_prompt=2",
    "trainer.steps=3",
    "trainer.checkpoint_every=2",
    "eval.problems=4",
    "run.tracking=[\"jsonl\", \"tensorboard\"]",
];

/// `skein train ARGS...` with the small run's settings and `extra` ones; stderr on success.
fn skein_train(args: &[&str], extra: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_skein"));
    cmd.arg("train").args(args);
    for s in TINY_RUN.iter().chain(SMALL).chain(extra).copied() {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("skein runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "skein train {args:?} failed:\n{stderr}"
    );
    stderr
}

/// Each metric's (step, value) points in the order metrics.jsonl has them.
type Curves = BTreeMap<String, Vec<(i64, f64)>>;

fn jsonl_curves(dir: &Path) -> Curves {
    let mut curves = Curves::new();
    for line in std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
    {
        let record: serde_json::Map<String, Value> = serde_json::from_str(line).unwrap();
        let step = record["step"].as_i64().unwrap();
        for (k, v) in &record {
            if let (false, Some(v)) = (k == "step", v.as_f64()) {
                curves.entry(k.clone()).or_default().push((step, v));
            }
        }
    }
    curves
}

/// The event files of `dir/tensorboard` and their scalars, as the `tensorboard` package reads
/// them (scripts/read_tensorboard.py).
fn tensorboard_curves(python: &str, dir: &Path) -> (Vec<String>, Curves) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/read_tensorboard.py"
    );
    let out = Command::new(python)
        .arg(script)
        .arg(dir.join("tensorboard"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "read_tensorboard.py failed:\n{stderr}"
    );
    let read: Value = serde_json::from_slice(&out.stdout).unwrap();
    let files = read["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    let curves = read["scalars"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(tag, points)| {
            let points = points
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_i64().unwrap(), p[1].as_f64().unwrap()))
                .collect();
            (tag.clone(), points)
        })
        .collect();
    (files, curves)
}

/// TensorBoard shows exactly metrics.jsonl: the same metrics, each with the same steps in the
/// same order, and each value the metric's as a 32-bit float (what an event holds).
fn assert_same(python: &str, dir: &Path) {
    let (files, tb) = tensorboard_curves(python, dir);
    assert_eq!(files.len(), 1, "one event file, not {files:?}");
    assert!(files[0].starts_with("events.out.tfevents."), "{files:?}");
    let jsonl = jsonl_curves(dir);
    assert_eq!(
        tb.keys().collect::<Vec<_>>(),
        jsonl.keys().collect::<Vec<_>>()
    );
    for (tag, want) in &jsonl {
        let got = &tb[tag];
        let steps = |c: &[(i64, f64)]| c.iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(steps(got), steps(want), "steps of {tag}");
        for ((step, g), (_, w)) in got.iter().zip(want) {
            assert_eq!(*g as f32, *w as f32, "{tag} at step {step}: {g} vs {w}");
        }
    }
}

#[test]
fn tensorboard_shows_every_metric_of_metrics_jsonl_across_a_resume() {
    let python = require_python_with(
        "tensorboard.backend.event_processing.event_accumulator",
        "scripts/setup-tensorboard.sh",
    );
    let dir = common::workdir("tracking", "tb");
    let run_dir = format!("run.dir=\"{}\"", dir.display());
    skein_train(&[], &[&run_dir]);
    assert_same(&python, &dir);
    let first = jsonl_curves(&dir);
    // The warm-up, the evaluations before and after, and the RL steps are all there.
    assert_eq!(first["sft/loss"].len(), 2);
    assert_eq!(first["eval/accuracy"].len(), 2);
    let rl_steps = |c: &Curves| c["reward/mean"].iter().map(|p| p.0).collect::<Vec<_>>();
    assert_eq!(rl_steps(&first), [1, 2, 3]);

    // Resumed from checkpoint-2 with one more step: step 3 and the final evaluation of the
    // first run are discarded from metrics.jsonl, and from TensorBoard with them.
    let resume = ["--resume", dir.to_str().unwrap()];
    skein_train(&resume, &["trainer.steps=4"]);
    let resumed = jsonl_curves(&dir);
    assert_eq!(rl_steps(&resumed), [1, 2, 3, 4]);
    let final_eval: Vec<i64> = resumed["eval/accuracy"].iter().map(|p| p.0).collect();
    assert_eq!(final_eval, [0, 4]);
    assert_same(&python, &dir);

    // A resume that stops tracking TensorBoard removes the events, which would show the steps
    // it discards.
    let err = skein_train(&resume, &["trainer.steps=5", "run.tracking=[\"jsonl\"]"]);
    assert!(err.contains("has no \"tensorboard\""), "{err}");
    assert!(!dir.join("tensorboard").exists());

    // A new run over it starts the events afresh; one that does not track TensorBoard
    // removes them with the rest of the previous run.
    skein_train(&["--overwrite"], &[&run_dir]);
    assert_same(&python, &dir);
    assert_eq!(rl_steps(&jsonl_curves(&dir)), [1, 2, 3]);
    let err = skein_train(&["--overwrite"], &[&run_dir, "run.tracking=[\"jsonl\"]"]);
    assert!(err.contains("tensorboard"), "{err}");
    assert!(!dir.join("tensorboard").exists());
    std::fs::remove_dir_all(&dir).ok();
}
