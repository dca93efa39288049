//! The `skein` binary, run for real as a subprocess.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

fn skein(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("skein runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

const BATCH: &str = r#"{"dp_size": 4, "num_mini_batches": 2, "unit": "trajectory", "equal_minibatch_rows": false, "loss_agg_mode": "token-mean", "seed": 0,
  "trajectories": [
    {"id": "t0", "group": "g0", "reward": 1.0, "status": "finished", "transitions": [{"prompt_len": 120, "response_len": 40, "loss_tokens": 40}]},
    {"id": "t1", "group": "g0", "reward": 0.0, "status": "finished", "transitions": [{"prompt_len": 120, "response_len": 10, "loss_tokens": 10}, {"prompt_len": 200, "response_len": 30, "loss_tokens": 20}]},
    {"id": "t2", "group": "g1", "reward": 0.5, "status": "truncated", "transitions": [{"prompt_len": 80, "response_len": 64, "loss_tokens": 64}]}]}"#;

#[test]
fn plan_prints_a_plan_with_padding_and_global_counts() {
    let (code, out, err) = skein(&["plan"], BATCH);
    assert_eq!(code, 0, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mbs = plan["mini_batches"].as_array().unwrap();
    assert_eq!(mbs.len(), 2);
    let loss_tokens: u64 = mbs
        .iter()
        .map(|m| m["global_loss_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(loss_tokens, 40 + 10 + 20 + 64);
    for m in mbs {
        let ranks = m["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 4);
        let n = ranks[0].as_array().unwrap().len();
        assert!(ranks.iter().all(|r| r.as_array().unwrap().len() == n));
    }
    // t1's two transitions sit in one mini-batch.
    let holder: Vec<usize> = mbs
        .iter()
        .enumerate()
        .filter(|(_, m)| m.to_string().contains("\"t1\""))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(holder.len(), 1);
}

#[test]
fn plan_rejects_bad_input_with_one_line_and_status_2() {
    let (code, out, err) = skein(
        &["plan"],
        &BATCH.replace("\"dp_size\": 4", "\"dp_size\": 0"),
    );
    assert_eq!(code, 2);
    assert!(out.is_empty(), "no partial output");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("dp_size"), "{err}");
}

#[test]
fn train_config_errors_name_the_key_and_print_config_shows_defaults() {
    let (code, _, err) = skein(&["train", "--set", "trainer.stpes=3"], "");
    assert_eq!(code, 2);
    assert!(
        err.contains("`trainer.stpes`") && err.contains("steps"),
        "{err}"
    );
    let (code, _, err) = skein(&["train", "--set", "algorithm.estimator=ppo2"], "");
    assert_eq!(code, 2);
    assert!(
        err.contains("`algorithm.estimator`") && err.contains("rloo"),
        "{err}"
    );
    let (code, out, _) = skein(&["train", "--print-config"], "");
    assert_eq!(code, 0);
    assert!(
        out.contains("[algorithm]") && out.contains("estimator = \"grpo\""),
        "{out}"
    );
    // The clip range's default depends on the loss: unset, it is shown with what unset means,
    // and the printed config still reads back as TOML.
    assert!(
        out.contains("# clip_low is unset by default") && out.contains("3e-4 (gspo)"),
        "{out}"
    );
    assert!(out.parse::<toml::Table>().is_ok(), "{out}");
}

/// The body of the benches' tests: one layer, 32 wide, two heads.
const TINY_BODY: [&str; 6] = ["--hidden", "32", "--heads", "2", "--layers", "1"];

/// The three layouts run in child processes of their own and agree on the loss; sharing the
/// groups' prompts computes fewer tokens than padding, and the same loss tokens.
#[test]
fn bench_train_tokens_compares_the_layouts_on_one_loss() {
    let args = [
        "bench",
        "train-tokens",
        "--groups",
        "2",
        "--samples",
        "3",
        "--prompt",
        "300",
        "--median-response",
        "8",
        "--max-response",
        "40",
        "--iters",
        "1",
    ];
    let (code, out, err) = skein(&[&args[..], &TINY_BODY].concat(), "");
    assert_eq!(code, 0, "{out}\n{err}");
    let row = |name: &str| -> Vec<f64> {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} row in\n{out}"));
        line.split_whitespace()
            .skip(1)
            .map(|v| v.trim_end_matches('x').parse().unwrap())
            .collect()
    };
    let (padded, packed, shared) = (row("padded"), row("packed"), row("shared-prefix"));
    // loss tokens, computed tokens, update s, speed-up, peak RSS, loss
    assert_eq!(padded[0], shared[0]);
    assert_eq!(padded[0], packed[0]);
    assert!(shared[1] < 0.5 * padded[1], "{out}");
    assert!(packed[1] <= padded[1], "{out}");
    for r in [&packed, &shared] {
        assert!((r[5] - padded[5]).abs() <= 1e-4 * padded[5].abs(), "{out}");
        assert!(r[4] > 0.0, "peak memory measured: {out}");
    }
    let (code, _, err) = skein(&["bench", "train-tokens", "--vocab", "1"], "");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`--vocab`"), "{err}");
}

/// `--decode-only` times decode and nothing else; without it the training step comes first.
#[test]
fn bench_decode_only_skips_the_training_step() {
    let tiny = [
        "bench",
        "--intermediate",
        "64",
        "--vocab",
        "40",
        "--batch",
        "2",
        "--seq",
        "24",
        "--iters",
        "1",
    ];
    let lines = |extra: &[&str]| {
        let (code, out, err) = skein(&[&tiny[..], &TINY_BODY, extra].concat(), "");
        assert_eq!(code, 0, "{out}\n{err}");
        let starts = |prefix: &str| out.lines().filter(|l| l.starts_with(prefix)).count();
        let train_ops = out.contains("per training step");
        (starts("train step ("), starts("decode ("), train_ops)
    };
    assert_eq!(lines(&["--op-breakdown"]), (1, 1, true));
    assert_eq!(lines(&["--decode-only", "--op-breakdown"]), (0, 1, false));
    let (code, _, err) = skein(
        &[&tiny[..], &["--decode-only", "--optimizer-form", "fused"]].concat(),
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--optimizer-form"), "{err}");
}

#[test]
fn bench_sizes_that_cannot_work_name_their_flag() {
    // (--seq 8 under the default --decode-prompt 16 left decode nothing to generate: it
    // printed 0 tokens/s and exited 0.)
    for (flag, value) in [
        ("--batch", "0"),
        ("--heads", "0"),
        ("--hidden", "250"),
        ("--seq", "8"),
    ] {
        let (code, _, err) = skein(&["bench", flag, value, "--iters", "1"], "");
        assert_eq!(code, 2, "{flag} {value}: {err}");
        assert!(err.contains(&format!("`{flag}`")), "{flag} {value}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// The summary's held-out accuracy starts "after the warm-up" when either warm-up stage ran,
/// the second alone included, and "before RL" when neither did.
#[test]
fn the_summary_says_where_its_accuracy_starts() {
    let dir = common::workdir("cli", "summary");
    let run_dir = format!("run.dir={:?}", dir.display().to_string());
    let start = |warm_up: &[&str]| {
        let mut args = vec!["train", "--overwrite", "--set", &run_dir];
        let short = ["eval.problems=2", "trainer.steps=0"];
        for s in common::TINY_RUN.iter().chain(&short).chain(warm_up) {
            args.extend(["--set", s]);
        }
        let (code, out, err) = skein(&args, "");
        assert_eq!(code, 0, "{err}");
        out.lines()
            .find(|l| l.contains("greedy accuracy"))
            .unwrap_or_else(|| panic!("no accuracy line: {out}"))
            .to_string()
    };
    let line = start(&["sft.steps=0", "sft.direct_steps=2"]);
    assert!(line.contains("(after the warm-up → after RL"), "{line}");
    let line = start(&["sft.steps=0"]);
    assert!(line.contains("(before RL → after RL"), "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}
