//! External agents for real: the trainer serves its policy, two processes of the example agent
//! (the official `openai` client) take each step's tasks, make their calls through the rollout
//! URLs and post rewards, and the trainer learns from the recorded token ids.

mod common;

use common::{require_python_with_openai, step_metrics};
use skein::trainer::run::train;
use skein::trainer::TrainConfig;

#[test]
fn the_example_agent_trains_the_policy_through_the_server() {
    let python = require_python_with_openai();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/example_agent.py"
    );
    let mut cfg: TrainConfig = skein_config::load(None, "test", &[]).unwrap();
    let dir = std::env::temp_dir().join(format!("skein-external-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    cfg.run.dir = dir.display().to_string();
    cfg.trainer.steps = 2;
    cfg.rollout.prompts_per_step = 4;
    cfg.rollout.samples_per_prompt = 4;
    cfg.sft.steps = 5;
    cfg.eval.problems = 16;
    cfg.eval.every = 0;
    cfg.agent.kind = skein::trainer::config::AgentKind::External;
    cfg.agent.api_key = "sk-test".into();
    cfg.agent.workers = 2;
    cfg.agent.rollout_timeout_s = 120.0;
    cfg.agent.command = [
        python.as_str(),
        script,
        "--server",
        "{server}",
        "--api-key",
        "{api_key}",
        "--idle-exit",
        "600",
        "--concurrency",
        "8",
        "--max-tokens",
        "6",
    ]
    .map(String::from)
    .to_vec();
    let run = train(&cfg).expect("training with external agents");
    let steps = step_metrics(&dir);
    assert_eq!(steps.len(), 2);
    for m in &steps {
        // Every rollout came back: two calls each (question, then the tool's result), none
        // failed or timed out, and each became one merged row when its second prompt extends
        // the first call token for token (one row per call otherwise).
        assert_eq!(m["agent/calls_mean"].as_f64(), Some(2.0), "{m}");
        assert_eq!(m["agent/failed_rollouts"].as_f64(), Some(0.0), "{m}");
        assert_eq!(m["agent/timed_out_rollouts"].as_f64(), Some(0.0), "{m}");
        assert_eq!(m["batch/failed_trajectories"].as_f64(), Some(0.0), "{m}");
        let rows = m["batch/rows"].as_f64().unwrap();
        assert!((16.0..=32.0).contains(&rows), "{m}");
        assert!(m["tokens/trained"].as_f64().unwrap() > 0.0);
        assert!(m["loss/policy"].as_f64().unwrap().is_finite());
    }
    assert_eq!(run.rewards.len(), 2);
}
