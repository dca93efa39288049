//! End to end: the multi-turn built-in tasks train through the whole pipeline (demonstration
//! episodes for SFT, episodes with environment replies and tool calls, the PPO update on
//! merged token-exact rows), and their metrics say what the episodes did.

mod common;
use common::step_metrics;
use skein::trainer::run::train;
use skein::trainer::TrainConfig;

fn config(task: &str, sft_steps: usize) -> TrainConfig {
    let mut cfg: TrainConfig = skein_config::load(None, "test", &[]).unwrap();
    cfg.run.dir = std::env::temp_dir()
        .join(format!("skein-agents-{task}-{}", std::process::id()))
        .display()
        .to_string();
    cfg.task.name = task.into();
    cfg.task.difficulty = 1;
    cfg.trainer.steps = 3;
    cfg.rollout.prompts_per_step = 8;
    cfg.rollout.samples_per_prompt = 4;
    cfg.sft.steps = sft_steps;
    cfg.sft.batch_size = 32;
    cfg.eval.problems = 16;
    cfg.eval.every = 0;
    // A small model keeps the test quick; learning is shown by the README's run.
    cfg.model.hidden_size = 64;
    cfg.model.num_layers = 2;
    cfg.model.num_heads = 2;
    cfg.model.num_kv_heads = 1;
    cfg.model.intermediate_size = 128;
    cfg
}

#[test]
fn the_calculator_task_trains_with_tool_calls() {
    let mut cfg = config("calculator", 80);
    cfg.rollout.sampling.max_new_tokens = 96;
    // Enough capacity and warm-up to copy the tool-call format from the demonstrations.
    cfg.model.hidden_size = 128;
    cfg.model.num_heads = 4;
    cfg.model.num_kv_heads = 2;
    cfg.model.intermediate_size = 256;
    cfg.sft.lr = 3e-3;
    // A second warm-up stage in which half the demonstrations answer without the tool.
    cfg.sft.direct_steps = 10;
    cfg.sft.direct_share = 0.5;
    let run = train(&cfg).expect("calculator run");
    let steps = step_metrics(&run.dir);
    assert_eq!(steps.len(), 3);
    let sum = |k: &str| steps.iter().map(|m| m[k].as_f64().unwrap()).sum::<f64>();
    // After SFT on demonstrations the policy calls the tool; every reply is a tool message.
    assert!(sum("agent/tool_calls") > 0.0, "no tool calls: {steps:?}");
    assert!(sum("agent/inserted_tokens") > 0.0);
    assert_eq!(sum("agent/env_errors") + sum("agent/env_timeouts"), 0.0);
    // One merged row per episode (token-exact turns), none failed.
    for m in &steps {
        assert_eq!(m["batch/rows"].as_f64(), Some(32.0), "{m}");
        assert_eq!(m["batch/failed_trajectories"].as_f64(), Some(0.0));
        assert!(m["agent/turns_mean"].as_f64().unwrap() >= 1.0);
        // Tool calls per episode: the count over the step's 32 episodes.
        let per_episode = m["agent/tool_calls"].as_f64().unwrap() / 32.0;
        assert_eq!(
            m["agent/tool_calls_mean"].as_f64(),
            Some(per_episode),
            "{m}"
        );
    }
    // The greedy evaluations before and after RL say how the agent went about it: no episode
    // takes more than the task's 3 turns.
    let evals: Vec<serde_json::Value> = std::fs::read_to_string(run.dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|m: &serde_json::Value| m.get("eval/accuracy").is_some())
        .collect();
    assert_eq!(evals.len(), 2, "{evals:?}");
    // Both warm-up stages are logged, the second numbered on from the first.
    let sft_steps: Vec<u64> = std::fs::read_to_string(run.dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|m| m.get("sft/loss").is_some())
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(sft_steps, (1..=90).collect::<Vec<u64>>());
    for e in &evals {
        let turns = e["eval/turns_mean"].as_f64().unwrap();
        assert!((1.0..=3.0).contains(&turns), "{e}");
        // A tool call is a message the tool answered, so there are at most as many as turns.
        assert!(e["eval/tool_calls_mean"].as_f64().unwrap() <= turns, "{e}");
        match e.get("eval/solved_turns_mean") {
            Some(t) => assert!((1.0..=3.0).contains(&t.as_f64().unwrap()), "{e}"),
            None => assert_eq!(e["eval/accuracy"].as_f64(), Some(0.0), "{e}"),
        }
    }
    assert!(run.dir.join("plot.png").is_file());
}

#[test]
fn the_guessing_game_trains_over_several_turns() {
    let run = train(&config("guess", 30)).expect("guess run");
    let steps = step_metrics(&run.dir);
    assert_eq!(steps.len(), 3);
    for m in &steps {
        // Several messages per episode, with the game's answers between them.
        assert!(m["agent/turns_mean"].as_f64().unwrap() > 1.5, "{m}");
        assert!(m["agent/inserted_tokens"].as_f64().unwrap() > 0.0);
        assert_eq!(m["agent/tool_calls"].as_f64(), Some(0.0));
        // It trained: every step applied its optimizer steps to tokens of its episodes (a
        // step with no update logs no loss at all).
        let num = |k: &str| m[k].as_f64().unwrap_or_else(|| panic!("no `{k}` in {m}"));
        assert!(num("updates/applied") >= 1.0, "{m}");
        assert!(num("tokens/trained") > 0.0, "{m}");
        assert!(num("loss/policy").is_finite(), "{m}");
        // The merged rows' sampled tokens carry the engine's log-probs of the policy.
        common::assert_logprobs_agree(m);
    }
    // The weights moved step after step, and some group had rewards that differ: there was
    // a signal to train on, not only finite arithmetic on zero advantages.
    let versions: Vec<f64> = steps
        .iter()
        .map(|m| m["policy_version"].as_f64().unwrap())
        .collect();
    assert!(versions.windows(2).all(|w| w[1] > w[0]), "{versions:?}");
    assert!(
        steps
            .iter()
            .any(|m| m["batch/equal_reward_group_fraction"].as_f64() < Some(1.0)),
        "every group of every step had one reward: {steps:?}"
    );
    assert_eq!(run.rewards.len(), 3);

    // The checkpoint, loaded back through `model.path`, plays as it did at the end of the run:
    // a built-in model keeps the plain turns it learned, though its tokenizer carries ChatML.
    let mut again = config("guess", 0);
    again.run.dir = format!("{}-reloaded", run.dir.display());
    again.model.path = run.dir.join("checkpoint").display().to_string();
    again.trainer.steps = 0;
    let reloaded = train(&again).expect("run from the checkpoint");
    eprintln!(
        "after RL {:?}; reloaded {:?}",
        run.eval_after, reloaded.eval_before
    );
    assert!(run.eval_after.accuracy > 0.0, "{:?}", run.eval_after);
    assert_eq!(reloaded.eval_before.accuracy, run.eval_after.accuracy);
    assert_eq!(
        reloaded.eval_before.metrics(),
        run.eval_after.metrics(),
        "the same episodes, turn for turn"
    );

    // `skein eval` of the run plays the same greedy episodes as its final evaluation.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(["eval", run.dir.to_str().unwrap(), "--set", "run.threads=1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (key, value) in run.eval_after.metrics() {
        if key != "eval/problems" {
            assert_eq!(line[key].as_f64(), Some(value), "{key}: {line}");
        }
    }
    assert_eq!(line["problems"], 16, "{line}");
}
