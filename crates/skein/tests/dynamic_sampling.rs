//! Dynamic sampling end to end (`rollout.skip_zero_variance_groups`), with the real binary:
//! every step trains only groups whose rewards differ, tops up with more prompts until it has
//! `rollout.prompts_per_step` of them or hits `rollout.max_draws_per_step`, says so in
//! metrics.jsonl, and a resumed run draws exactly what the uninterrupted one drew. A step that
//! finds no group with variance trains on nothing and the run goes on.

mod common;

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

const PROMPTS: usize = 4;
const SAMPLES: usize = 4;

/// `reverse` (partial credit: the matched prefix) after a short warm-up: some groups' rewards
/// differ, some do not.
fn varied_run() -> Vec<String> {
    [
        "task.name=\"reverse\"",
        "task.difficulty=1",
        "sft.steps=20",
        "rollout.sampling.max_new_tokens=12",
        "eval.problems=8",
        "trainer.steps=4",
        "trainer.checkpoint_every=2",
    ]
    .into_iter()
    .map(String::from)
    .chain(dynamic_sampling(0))
    .collect()
}

/// Dynamic sampling on, `PROMPTS` × `SAMPLES` a step; `max_draws` 0 keeps the default bound.
fn dynamic_sampling(max_draws: usize) -> Vec<String> {
    vec![
        "rollout.skip_zero_variance_groups=true".into(),
        format!("rollout.max_draws_per_step={max_draws}"),
        format!("rollout.prompts_per_step={PROMPTS}"),
        format!("rollout.samples_per_prompt={SAMPLES}"),
    ]
}

/// `skein train` with the tiny model and `sets`, in `dir`; panics with its stderr if it fails.
fn train(dir: &Path, sets: &[String], resume: bool) {
    let mut args: Vec<String> = vec!["train".into()];
    if resume {
        args.extend(["--resume".into(), dir.display().to_string()]);
    } else {
        args.extend(["--set".into(), format!("run.dir={}", dir.display())]);
        for s in common::TINY_RUN {
            args.extend(["--set".into(), s.to_string()]);
        }
    }
    for s in sets {
        args.extend(["--set".into(), s.clone()]);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skein {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn num(m: &Value, key: &str) -> f64 {
    m.get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("step {}: no `{key}` in {m}", m["step"]))
}

/// Groups the step trained: one row per trajectory that did not fail (single-turn), and none
/// failed here.
fn trained_groups(m: &Value) -> f64 {
    assert_eq!(num(m, "batch/failed_trajectories"), 0.0);
    num(m, "batch/rows") / SAMPLES as f64
}

#[test]
fn steps_train_only_groups_with_variance_and_resume_exactly() {
    let whole = common::workdir("dynamic_sampling", "whole");
    train(&whole, &varied_run(), false);
    let steps = common::step_metrics(&whole);
    assert_eq!(steps.len(), 4);
    let limit = (4 * PROMPTS) as f64;
    let (mut skipped_any, mut full_steps) = (false, 0);
    for m in &steps {
        let (drawn, skipped) = (
            num(m, "rollout/drawn_groups"),
            num(m, "rollout/skipped_groups"),
        );
        let trained = trained_groups(m);
        assert_eq!(
            drawn,
            trained + skipped,
            "step {}: drawn = trained + skipped",
            m["step"]
        );
        // The equal-reward share is of what was drawn (none failed: the skipped groups), not
        // of the trained groups, which all differ by construction.
        assert_eq!(
            num(m, "batch/equal_reward_group_fraction"),
            skipped / drawn,
            "step {}",
            m["step"]
        );
        assert!(drawn <= limit, "step {}: {drawn} groups drawn", m["step"]);
        match num(m, "rollout/draw_limit_hit") {
            0.0 => {
                assert_eq!(trained, PROMPTS as f64, "step {}", m["step"]);
                full_steps += 1;
            }
            1.0 => {
                assert_eq!(drawn, limit, "step {}", m["step"]);
                assert!(trained < PROMPTS as f64, "step {}", m["step"]);
            }
            hit => panic!("step {}: rollout/draw_limit_hit = {hit}", m["step"]),
        }
        skipped_any |= skipped > 0.0;
    }
    // The run exercised both: groups were skipped, and steps were topped up to the target.
    assert!(skipped_any, "no group was skipped: {steps:?}");
    assert!(full_steps > 0, "every step hit the draw limit: {steps:?}");

    // Cut after step 2 and resumed: steps 3 and 4 draw, skip and train exactly the same.
    let cut = common::workdir("dynamic_sampling", "cut");
    let mut two = varied_run();
    two.push("trainer.steps=2".into());
    train(&cut, &two, false);
    train(&cut, &["trainer.steps=4".into()], true);
    let resumed = common::step_metrics(&cut);
    assert_eq!(resumed.len(), 4);
    for (a, b) in steps.iter().zip(&resumed).skip(2) {
        for key in [
            "rollout/drawn_groups",
            "rollout/skipped_groups",
            "reward/mean",
            "kept/reward_mean",
            "tokens/generated",
            "loss/policy",
        ] {
            assert_eq!(a.get(key), b.get(key), "step {}: `{key}`", a["step"]);
        }
    }
    let _ = std::fs::remove_dir_all(&whole);
    let _ = std::fs::remove_dir_all(&cut);
}

/// An untrained model never gets a sum right: every group's rewards are all 0, so each step
/// draws its bound, skips everything, trains on no group — and the run goes on, logging what
/// it drew and no figure of the update it did not make. The same run without dynamic sampling
/// logs every group as equal, and none of the `rollout/` counters.
#[test]
fn a_step_without_variance_trains_nothing_and_the_run_goes_on() {
    let sets = |dynamic: bool| -> Vec<String> {
        let mut s: Vec<String> = [
            "task.difficulty=3",
            "sft.steps=0",
            "eval.problems=4",
            "trainer.steps=2",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        if dynamic {
            s.extend(dynamic_sampling(2 * PROMPTS));
        } else {
            s.extend([
                format!("rollout.prompts_per_step={PROMPTS}"),
                format!("rollout.samples_per_prompt={SAMPLES}"),
            ]);
        }
        s
    };
    let dir = common::workdir("dynamic_sampling", "empty");
    train(&dir, &sets(true), false);
    let steps = common::step_metrics(&dir);
    assert_eq!(steps.len(), 2);
    for m in &steps {
        assert_eq!(num(m, "rollout/drawn_groups"), (2 * PROMPTS) as f64);
        assert_eq!(num(m, "rollout/skipped_groups"), (2 * PROMPTS) as f64);
        assert_eq!(num(m, "rollout/draw_limit_hit"), 1.0);
        // The training reward is of every drawn trajectory: all wrong. Every drawn group was
        // equal; no group was kept, so nothing of the kept ones is logged.
        assert_eq!(num(m, "reward/mean"), 0.0);
        assert_eq!(num(m, "reward/accuracy"), 0.0);
        assert_eq!(num(m, "batch/equal_reward_group_fraction"), 1.0);
        assert!(m.get("kept/reward_mean").is_none(), "{m}");
        assert_eq!(trained_groups(m), 0.0);
        assert_eq!(num(m, "tokens/trained"), 0.0);
        // A step that trains nothing logs its counts, not zeros for figures of nothing.
        assert_eq!(num(m, "updates/applied"), 0.0);
        for key in [
            "entropy",
            "approx_kl",
            "clip_frac",
            "loss/policy",
            "lr",
            "grad_norm",
        ] {
            assert!(
                m.get(key).is_none(),
                "`{key}` logged by a step that trained nothing: {m}"
            );
        }
    }

    let off = common::workdir("dynamic_sampling", "off");
    train(&off, &sets(false), false);
    for m in &common::step_metrics(&off) {
        assert_eq!(num(m, "batch/equal_reward_group_fraction"), 1.0);
        assert_eq!(trained_groups(m), PROMPTS as f64);
        for key in [
            "rollout/drawn_groups",
            "rollout/skipped_groups",
            "rollout/draw_limit_hit",
        ] {
            assert!(m.get(key).is_none(), "`{key}` logged with the key off: {m}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&off);
}
