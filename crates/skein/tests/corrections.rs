//! The off-policy corrections on real partial-rollout runs of the `skein train` binary: tokens
//! carried across weight updates are stale, and each correction must weigh or mask them as
//! it says and count what it did in metrics.jsonl (and so in the plot) every step.

mod common;

use common::step_metrics;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A partial-rollout run of the tiny model with coin-flip rewards, a learning rate high enough
/// to move the policy between versions, and a band of [1/1.05, 1.05] so stale tokens leave
/// it; `off_policy` is the correction.
fn partial_run(off_policy: &str) -> PathBuf {
    let dir = common::workdir("corrections", off_policy);
    let worker =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/diagnosis_reward_worker.py");
    let python = common::python_with("json").unwrap_or_else(|| "python3".into());
    let sets = vec![
        "reward.sources.w.kind=\"worker\"".into(),
        format!(
            "reward.sources.w.command=[{:?}, {:?}, \"--coin\"]",
            python,
            worker.display().to_string()
        ),
        "reward.default_route.sources=[\"w\"]".into(),
        "sft.steps=0".into(),
        "eval.problems=8".into(),
        "rollout.prompts_per_step=8".into(),
        "rollout.samples_per_prompt=4".into(),
        "rollout.partial.enabled=true".into(),
        "rollout.partial.token_budget=4".into(),
        "rollout.partial.max_staleness=2".into(),
        "trainer.steps=5".into(),
        "optim.lr=0.05".into(),
        "algorithm.is_cap=1.05".into(),
        format!("algorithm.off_policy={off_policy:?}"),
    ];
    common::train_tiny(&dir, &sets);
    dir
}

/// The sum over the run's steps of `key`, which every step must have logged.
fn total(steps: &[Value], key: &str) -> f64 {
    steps
        .iter()
        .map(|m| {
            m.get(key)
                .and_then(Value::as_f64)
                .unwrap_or_else(|| panic!("a step without `{key}`: {m}"))
        })
        .sum()
}

/// The first step that trained stale tokens, and the one before it (all on-policy).
fn first_stale(steps: &[Value]) -> (&Value, &Value) {
    let at = steps
        .iter()
        .position(|m| m["is/off_policy_fraction"].as_f64().unwrap() > 0.0)
        .expect("a step with stale tokens");
    assert!(at > 0, "the first step cannot have stale tokens");
    (&steps[at - 1], &steps[at])
}

/// `tis` truncates and masks nothing; `mis` masks stale tokens one by one; `seq-mis` masks
/// whole sequences, so at the first stale step (until which the runs are the same: fresh
/// tokens weigh exactly 1 under both) it leaves out more rows whole than `mis`; `icepop`
/// weighs every token, so on an all-fresh step it weighs tokens (by their round-off ratio,
/// inside the band: none masked) where the others weigh none.
#[test]
fn each_correction_counts_what_it_weighted_and_masked_on_stale_tokens() {
    let mut runs = std::collections::BTreeMap::new();
    for mode in ["tis", "mis", "seq-mis", "icepop"] {
        let dir = partial_run(mode);
        let steps = step_metrics(&dir);
        assert_eq!(steps.len(), 5, "{mode}");
        assert!(dir.join("plot.png").is_file(), "{mode}: no plot");
        total(&steps, "is/weighted_tokens");
        total(&steps, "is/weighted_rows");
        if mode == "tis" {
            assert!(steps.iter().all(|m| m.get("is/masked_tokens").is_none()));
        } else {
            assert!(
                total(&steps, "is/masked_tokens") > 0.0,
                "{mode}: nothing masked"
            );
            total(&steps, "is/masked_rows");
        }
        runs.insert(mode, steps);
    }
    let at = |mode: &str, before: bool, key: &str| {
        let (fresh, stale) = first_stale(&runs[mode]);
        let m = if before { fresh } else { stale };
        m[key].as_f64().unwrap()
    };
    assert!(
        at("seq-mis", false, "is/masked_rows") > at("mis", false, "is/masked_rows"),
        "seq-mis left out {} rows whole, mis {}",
        at("seq-mis", false, "is/masked_rows"),
        at("mis", false, "is/masked_rows")
    );
    assert!(at("seq-mis", false, "is/masked_tokens") > at("mis", false, "is/masked_tokens"));
    assert_eq!(at("mis", true, "is/weighted_tokens"), 0.0);
    assert!(at("icepop", true, "is/weighted_tokens") > 0.0);
    assert_eq!(at("icepop", true, "is/masked_tokens"), 0.0);
}

/// Without partial rollout, `icepop` still weighs every token by π_old/π_behavior and masks
/// those outside its band, so each step logs what it weighted and masked as a partial run's
/// steps do: masked tokens must never train nothing unseen.
#[test]
fn icepop_without_partial_rollout_counts_what_it_did() {
    let dir = common::workdir("corrections", "icepop-synchronous");
    let sets = [
        "sft.steps=0",
        "eval.problems=8",
        "rollout.prompts_per_step=4",
        "rollout.samples_per_prompt=4",
        "trainer.steps=2",
        "algorithm.is_cap=1.05",
        "algorithm.off_policy=\"icepop\"",
    ]
    .map(String::from);
    common::train_tiny(&dir, &sets);
    let steps = step_metrics(&dir);
    assert_eq!(steps.len(), 2);
    total(&steps, "is/masked_tokens");
    total(&steps, "is/masked_rows");
    assert!(
        total(&steps, "is/weighted_tokens") > 0.0,
        "icepop weighs fresh tokens"
    );
    assert_eq!(total(&steps, "is/off_policy_fraction"), 0.0);
}
