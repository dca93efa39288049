//! A run in which every trajectory fails trains nothing: it must stop with an error naming the
//! streak and the last failure once `MAX_UNTRAINED_STEPS` steps in a row trained no token, with
//! those steps in metrics.jsonl (it used to finish all its steps and exit 0). A binary of its
//! own: tests in one binary share libtorch's generator, and a whole run beside another changes
//! what the other's warm-up learns.

mod common;

use serde_json::Value;
use skein::trainer::rollout::stats::MAX_UNTRAINED_STEPS;
use skein::trainer::run::{resume, train};

/// A run in `dir` of `steps` RL steps, a checkpoint after each, whose every reward fails.
fn failing_run(dir: &std::path::Path, steps: usize) -> skein::trainer::TrainConfig {
    let text = format!(
        r#"
[run]
dir = "{}"
threads = 1
[sft]
steps = 0
[rollout]
prompts_per_step = 4
samples_per_prompt = 2
[trainer]
steps = {}
checkpoint_every = 1
[eval]
problems = 8
every = 0
{}
"#,
        dir.display(),
        steps,
        common::down_reward_service()
    );
    skein_config::load(Some(&text), "untrained", &[]).expect("test config loads")
}

#[test]
fn a_run_whose_every_trajectory_fails_stops_with_an_error() {
    let dir = std::env::temp_dir().join(format!("skein-untrained-{}", std::process::id()));
    let cfg = failing_run(&dir, MAX_UNTRAINED_STEPS + 3);
    let err = format!("{:#}", train(&cfg).expect_err("the run stops"));
    assert!(
        err.contains(&format!("stopping at step {MAX_UNTRAINED_STEPS}")),
        "{err}"
    );
    assert!(
        err.contains(&format!("{MAX_UNTRAINED_STEPS} steps in a row")),
        "{err}"
    );
    assert!(
        err.contains("reward service"),
        "the last failure says what failed: {err}"
    );
    let trained: Vec<f64> = common::step_metrics(&dir)
        .iter()
        .map(|m| {
            m.get("tokens/trained")
                .and_then(Value::as_f64)
                .expect("tokens/trained logged")
        })
        .collect();
    assert_eq!(trained, vec![0.0; MAX_UNTRAINED_STEPS]);
}

/// The streak goes on across a resume: a run that trained nothing in its one step, resumed
/// for more, stops at the same step as one that never stopped.
#[test]
fn a_resumed_run_stops_where_the_uninterrupted_one_does() {
    let dir = std::env::temp_dir().join(format!("skein-untrained-resumed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    train(&failing_run(&dir, 1)).expect("one untrained step is not yet a streak");
    let err = format!(
        "{:#}",
        resume(&failing_run(&dir, MAX_UNTRAINED_STEPS + 3)).expect_err("the resumed run stops")
    );
    assert!(
        err.contains(&format!("stopping at step {MAX_UNTRAINED_STEPS}:")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
