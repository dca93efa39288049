//! Ctrl-C from start-up to exit, sent as real SIGINTs to the real binary: a second press
//! stops the run at a safe point (exit status 130) instead of crashing it, when the stage it
//! landed in ends, and a press during the warm-up stops it with a message. (A single press
//! during RL, which checkpoints and resumes, is `tests/resume.rs`.)

mod common;

use common::TINY_RUN;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SMALL: &[&str] = &[
    "rollout.prompts_per_step=8",
    "rollout.samples_per_prompt=4",
    "eval.problems=8",
];

fn workdir(name: &str) -> PathBuf {
    common::workdir("interrupt", name)
}

fn start(dir: &Path, extra: &[&str]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_skein"));
    cmd.arg("train");
    let run_dir = format!("run.dir=\"{}\"", dir.display());
    for s in TINY_RUN.iter().chain(SMALL).chain(extra).copied() {
        cmd.args(["--set", s]);
    }
    cmd.args(["--set", &run_dir])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("skein runs")
}

fn metrics_lines(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("metrics.jsonl")).map_or(0, |t| t.lines().count())
}

fn interrupt(child: &Child) {
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// Waits (at most two minutes) until `ready`, with the run still going.
fn wait_for(child: &mut Child, ready: impl Fn() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < Duration::from_secs(120), "never ready");
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn finish(child: Child) -> (Output, String) {
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, err)
}

#[test]
fn a_second_ctrl_c_stops_at_a_safe_point_and_never_crashes() {
    for attempt in 0..3 {
        let dir = workdir(&format!("twice-{attempt}"));
        let mut child = start(&dir, &["sft.steps=2", "trainer.steps=500"]);
        // Into the RL steps: the warm-up and the first evaluation are logged by then.
        wait_for(&mut child, || metrics_lines(&dir) >= 4);
        interrupt(&child);
        std::thread::sleep(Duration::from_millis(10 + 30 * attempt));
        interrupt(&child);
        let (out, err) = finish(child);
        // 130 when the second press stopped it; 0 when the first press's step and
        // checkpoint were done before the second arrived. Never a signal or a panic.
        let code = out.status.code();
        assert!(
            matches!(code, Some(130) | Some(0)),
            "{:?}: {err}",
            out.status
        );
        assert!(!err.contains("panicked"), "{err}");
        if code == Some(130) {
            assert!(err.contains("second interrupt"), "{err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A reward worker that answers at once, except for the first request after the file `hold`
/// appears: it takes the file away, writes `held`, and holds that answer for `seconds`,
/// which holds the rollout stage open.
const HOLDING_WORKER: &str = r#"
import json, os, sys, time
hold, held, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
for line in sys.stdin:
    request = json.loads(line)
    if os.path.exists(hold):
        os.remove(hold)
        open(held, "w").close()
        time.sleep(seconds)
    print(json.dumps({"id": request["id"], "reward": 0.0}), flush=True)
"#;

/// Both presses land inside one stage (a rollout held open by its reward worker): the run
/// stops when that stage ends, with exit status 130, saying where, and the step in flight
/// logs nothing and writes no checkpoint.
#[test]
fn a_second_ctrl_c_stops_the_run_when_its_stage_ends() {
    let dir = workdir("held-stage");
    let aside = workdir("held-stage-worker");
    std::fs::create_dir_all(&aside).unwrap();
    let script = aside.join("worker.py");
    std::fs::write(&script, HOLDING_WORKER).unwrap();
    let (hold, held) = (aside.join("hold"), aside.join("held"));
    let path = |p: &Path| format!("{:?}", p.display().to_string());
    let command = format!(
        "reward.sources.slow.command=[\"python3\", {}, {}, {}, \"4\"]",
        path(&script),
        path(&hold),
        path(&held)
    );
    let sets = [
        "sft.steps=2",
        "trainer.steps=500",
        "trainer.checkpoint_every=0",
        "reward.sources.slow.kind=\"worker\"",
        "reward.sources.slow.processes=1",
        "reward.default_route.sources=[\"slow\"]",
        command.as_str(),
    ];
    let mut child = start(&dir, &sets);
    // Into the RL steps, then one rollout held.
    wait_for(&mut child, || metrics_lines(&dir) >= 4);
    std::fs::write(&hold, "").unwrap();
    wait_for(&mut child, || held.exists());
    let logged = metrics_lines(&dir);
    let started = Instant::now();
    interrupt(&child);
    std::thread::sleep(Duration::from_millis(50));
    interrupt(&child);
    let (out, err) = finish(child);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains("stopped after the rollout (second interrupt)"),
        "{err}"
    );
    assert!(
        started.elapsed() > Duration::from_secs(2),
        "it waited for the stage to end"
    );
    assert_eq!(
        metrics_lines(&dir),
        logged,
        "the step in flight logged nothing"
    );
    let checkpoints: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("checkpoint"))
        .collect();
    assert!(
        checkpoints.is_empty(),
        "no checkpoint was written: {checkpoints:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&aside);
}

#[test]
fn ctrl_c_during_the_warm_up_stops_with_a_message() {
    let dir = workdir("warm-up");
    let mut child = start(&dir, &["sft.steps=100000", "trainer.steps=2"]);
    wait_for(&mut child, || metrics_lines(&dir) >= 2);
    interrupt(&child);
    let (out, err) = finish(child);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("interrupted during the warm-up"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // The press says what it will do, and the error how to start again: the directory
    // holds the stopped run's records, which only --overwrite replaces.
    assert!(err.contains("stopping after this warm-up step"), "{err}");
    assert!(
        !err.contains("then writing a checkpoint"),
        "no checkpoint is written: {err}"
    );
    assert!(err.contains("with --overwrite"), "{err}");
    // The warm-up's curves are drawn, as a stopped RL phase's are.
    assert!(err.contains("The curves so far"), "{err}");
    assert!(dir.join("plot.png").is_file(), "no plot.png");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Ctrl-C during one of a bench's training runs checkpoints that run and stops the bench:
/// it reports no figures for a cut run (its "after" evaluation never ran) and starts no
/// further run.
#[test]
fn ctrl_c_during_a_bench_run_stops_the_bench_without_figures() {
    let dir = workdir("bench");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_skein"));
    cmd.args([
        "bench-partial",
        "--steps",
        "500",
        "--out",
        dir.to_str().unwrap(),
    ]);
    for s in TINY_RUN.iter().chain(SMALL).chain(&["sft.steps=2"]) {
        cmd.args(["--set", s]);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("skein runs");
    let first = dir.join("sync");
    wait_for(&mut child, || metrics_lines(&first) >= 4);
    interrupt(&child);
    let (out, err) = finish(child);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("the sync run was interrupted"), "{err}");
    assert!(out.stdout.is_empty(), "no table for a cut run");
    assert!(!dir.join("partial").exists(), "the next run never started");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C during `skein eval --samples` leaves no file at that path, so the same command runs
/// again; the file appears only whole, with a line per sample.
#[test]
fn ctrl_c_during_an_eval_leaves_its_samples_path_free() {
    let dir = workdir("eval");
    let sets: Vec<String> = SMALL
        .iter()
        .chain(&["sft.steps=2", "trainer.steps=1"])
        .map(|s| s.to_string())
        .collect();
    common::train_tiny(&dir, &sets);
    let samples = dir.join("samples.jsonl");
    let eval = |n: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_skein"));
        cmd.args(["eval", dir.to_str().unwrap(), "--set", "run.threads=1"])
            .args(["--problems", "8", "--temperature", "1", "--n", n])
            .arg(format!("--samples={}", samples.display()));
        cmd
    };
    let mut child = eval("4096")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("skein runs");
    // The progress line of the first finished sample: the evaluation is under way.
    let rx = common::watch_stderr(&mut child, |line| {
        line.starts_with("sample 1/").then_some(())
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("no progress line");
    interrupt(&child);
    let status = child.wait().unwrap();
    assert!(!status.success(), "{status:?}");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("samples"))
        .collect();
    assert!(left.is_empty(), "the interrupted eval left {left:?}");

    let out = eval("2").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("sample 16/16"), "{err}");
    let written = std::fs::read_to_string(&samples).unwrap();
    assert_eq!(written.lines().count(), 16);
    let _ = std::fs::remove_dir_all(&dir);
}
