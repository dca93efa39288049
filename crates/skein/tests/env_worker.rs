//! End to end: an environment written in Python (`agent.kind = "env-worker"`,
//! `scripts/env_worker_example.py`, the guessing game) trains through the built-in agent loop,
//! warm-up on its demonstrations included; a worker process that crashes or hangs fails only
//! the episodes it hosted, counted, and the run completes.

mod common;
use common::step_metrics;
use serde_json::Value;
use skein::trainer::config::AgentKind;
use skein::trainer::run::train;
use skein::trainer::TrainConfig;

/// The repository's Python, else the system's.
fn python() -> String {
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python");
    if std::path::Path::new(venv).is_file() {
        venv.into()
    } else {
        "python3".into()
    }
}

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scripts/env_worker_example.py"
);

fn config(name: &str, args: &[&str]) -> TrainConfig {
    let mut cfg: TrainConfig = skein_config::load(None, "test", &[]).unwrap();
    cfg.run.dir = common::workdir("env-worker", name).display().to_string();
    cfg.run.threads = 1;
    cfg.agent.kind = AgentKind::EnvWorker;
    cfg.agent.command = [python(), SCRIPT.into()]
        .into_iter()
        .chain(args.iter().map(|s| s.to_string()))
        .collect();
    cfg.agent.workers = WORKERS;
    cfg.trainer.steps = 3;
    cfg.rollout.prompts_per_step = 8;
    cfg.rollout.samples_per_prompt = 4;
    cfg.sft.steps = 0;
    cfg.sft.batch_size = 32;
    cfg.eval.problems = 16;
    cfg.eval.every = 0;
    cfg.model.hidden_size = 64;
    cfg.model.num_layers = 2;
    cfg.model.num_heads = 2;
    cfg.model.num_kv_heads = 1;
    cfg.model.intermediate_size = 128;
    cfg
}

const WORKERS: usize = 4;
const EPISODES: f64 = 32.0;

fn num(m: &Value, key: &str) -> f64 {
    m[key].as_f64().unwrap_or_else(|| panic!("no {key} in {m}"))
}

#[test]
fn a_python_environment_trains_through_the_built_in_loop() {
    let mut cfg = config("trains", &[]);
    cfg.sft.steps = 30;
    let run = train(&cfg).expect("a run on the Python guessing game");
    let steps = step_metrics(&run.dir);
    assert_eq!(steps.len(), 3);
    for m in &steps {
        // Several messages per episode with the game's replies between them, token-exact
        // (one merged row per episode), none failed, no worker trouble.
        assert!(num(m, "agent/turns_mean") > 1.5, "{m}");
        assert!(num(m, "agent/inserted_tokens") > 0.0, "{m}");
        assert_eq!(num(m, "batch/rows"), EPISODES, "{m}");
        assert_eq!(num(m, "batch/failed_trajectories"), 0.0, "{m}");
        for k in [
            "agent/env_worker_failures",
            "agent/env_worker_restarts",
            "agent/env_errors",
            "agent/env_timeouts",
        ] {
            assert_eq!(num(m, k), 0.0, "{k}: {m}");
        }
        assert!(num(m, "loss/policy").is_finite());
        assert!(num(m, "agent/reused_prefix_tokens") > 0.0, "KV reuse: {m}");
        // Reusing the cached prefix leaves the sampled tokens' log-probs the trainer's.
        common::assert_logprobs_agree(m);
    }
    // Warmed up on the worker's demonstrations, the policy finds secrets.
    let reward: f64 = steps.iter().map(|m| num(m, "reward/mean")).sum();
    assert!(reward > 0.0, "no reward in any step: {steps:?}");
    assert_eq!(run.rewards.len(), 3);
}

/// Every failed episode is one the worker failed (counted as a worker failure or a
/// timeout); no step loses more than the episodes one process hosts (a quarter of them);
/// some steps lose some; the run completes.
fn check_faults(steps: &[Value], timeouts_expected: bool) {
    assert_eq!(steps.len(), 3, "the run completes");
    let (mut failed, mut timeouts, mut restarts) = (0.0, 0.0, 0.0);
    for m in steps {
        let f = num(m, "batch/failed_trajectories");
        assert_eq!(
            f,
            num(m, "agent/env_worker_failures") + num(m, "agent/env_timeouts"),
            "{m}"
        );
        assert_eq!(num(m, "agent/env_errors"), 0.0, "{m}");
        assert!(
            f <= EPISODES / WORKERS as f64,
            "more than one process's episodes: {m}"
        );
        assert!(num(m, "loss/policy").is_finite(), "{m}");
        failed += f;
        timeouts += num(m, "agent/env_timeouts");
        restarts += num(m, "agent/env_worker_restarts");
    }
    assert!(failed > 0.0, "no episode failed: {steps:?}");
    assert!(restarts > 0.0, "the worker was not restarted: {steps:?}");
    assert_eq!(timeouts > 0.0, timeouts_expected, "{steps:?}");
}

#[test]
fn a_crashing_worker_fails_only_its_episodes() {
    let cfg = config("crash", &["--crash-every", "10", "--fault-worker", "0"]);
    let run = train(&cfg).expect("the run goes on past crashes");
    check_faults(&step_metrics(&run.dir), false);
}

#[test]
fn a_hanging_worker_fails_only_its_episodes() {
    let mut cfg = config("hang", &["--hang-every", "10", "--fault-worker", "0"]);
    cfg.agent.env_timeout_s = 0.5;
    let run = train(&cfg).expect("the run goes on past hangs");
    check_faults(&step_metrics(&run.dir), true);
}

/// One process answers every episode's requests in turn, each well within the time limit
/// but all of them together far beyond it: a request is timed from when the process takes
/// it, so waiting for a busy process fails nothing.
#[test]
fn a_busy_worker_times_each_request_not_its_queue() {
    let mut cfg = config("busy", &["--slow-ms", "60"]);
    cfg.agent.workers = 1;
    cfg.agent.env_timeout_s = 1.0;
    cfg.trainer.steps = 1;
    let run = train(&cfg).expect("a run on one slow worker");
    let steps = step_metrics(&run.dir);
    let m = &steps[0];
    // 32 resets alone keep the one process busy for about 2 s.
    assert_eq!(num(m, "agent/env_timeouts"), 0.0, "{m}");
    assert_eq!(num(m, "batch/failed_trajectories"), 0.0, "{m}");
}

/// An environment that reports an error now and then: a warm-up episode it fails is drawn
/// again, and a rollout episode fails alone, counted; the run completes.
#[test]
fn an_environment_error_fails_one_episode_in_the_warm_up_and_in_rollouts() {
    let mut cfg = config("errors", &["--error-every", "7"]);
    cfg.sft.steps = 5;
    cfg.trainer.steps = 1;
    let run = train(&cfg).expect("the run goes on past environment errors");
    let m = &step_metrics(&run.dir)[0];
    let failed = num(m, "batch/failed_trajectories");
    assert!(failed > 0.0, "{m}");
    assert_eq!(num(m, "agent/env_errors"), failed, "{m}");
}

/// Worker processes that crash on every fourth step they serve fail many demonstration
/// episodes (every one of four or more steps on a fresh process), several in a row at times:
/// the warm-up draws others and completes, as rollouts go on past the episodes they fail.
#[test]
fn a_warm_up_goes_on_past_demonstrations_a_crashing_worker_fails() {
    let mut cfg = config("crash-warm-up", &["--crash-every", "4"]);
    cfg.sft.steps = 2;
    cfg.trainer.steps = 1;
    let run = train(&cfg).expect("the warm-up goes on past crashed demonstrations");
    let m = &step_metrics(&run.dir)[0];
    assert!(num(m, "agent/env_worker_failures") > 0.0, "{m}");
}

#[test]
fn a_missing_script_is_a_config_error_naming_agent_command() {
    let mut cfg = config("missing", &[]);
    cfg.agent.command = vec![python(), "/nonexistent/env_worker.py".into()];
    let Err(e) = train(&cfg) else {
        panic!("a missing program or script was not refused")
    };
    let e = e.to_string();
    assert!(
        e.contains("`agent.command[1]`") && e.contains("/nonexistent/env_worker.py"),
        "{e}"
    );
    cfg.agent.command = vec!["/nonexistent/python".into(), SCRIPT.into()];
    cfg.agent.workers = 0;
    let Err(e) = train(&cfg) else {
        panic!("a missing program or script was not refused")
    };
    let e = e.to_string();
    assert!(
        e.contains("`agent.command`") && e.contains("does not exist"),
        "{e}"
    );
    assert!(e.contains("`agent.workers`"), "{e}");
}

/// `skein train` (the real binary) on the worker `script` with its `args`, a tiny model and
/// `extra` settings: exit code, stderr and the run directory.
fn skein_train(
    name: &str,
    script: &str,
    args: &[&str],
    extra: &[&str],
) -> (i32, String, std::path::PathBuf) {
    let dir = common::workdir("env-worker", name);
    let python = python();
    let command: Vec<&str> = [python.as_str(), script]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_skein"));
    cmd.arg("train");
    let sets = [
        "agent.kind=\"env-worker\"".to_string(),
        format!("agent.command={}", serde_json::to_string(&command).unwrap()),
        "agent.workers=2".into(),
        "sft.steps=0".into(),
        "eval.problems=4".into(),
        format!("run.dir=\"{}\"", dir.display()),
    ];
    let sets = common::TINY_RUN.iter().map(|s| s.to_string()).chain(sets);
    for s in sets.chain(extra.iter().map(|s| s.to_string())) {
        cmd.args(["--set", &s]);
    }
    let out = cmd.env("RUST_BACKTRACE", "0").output().expect("skein runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into(),
        dir,
    )
}

/// The run's first line names the worker and the environment its `info` describes, not the
/// unused `task.difficulty`; config.toml records the context the model is built with (a
/// multi-turn task raises it), not the smaller `model.max_positions` asked for.
#[test]
fn the_header_names_the_worker_and_config_toml_the_context_the_model_has() {
    let (code, err, dir) = skein_train("header", SCRIPT, &[], &["trainer.steps=0"]);
    assert_eq!(code, 0, "{err}");
    let header = err
        .lines()
        .find(|l| l.contains("parameters"))
        .unwrap_or_else(|| panic!("no header: {err}"));
    assert!(
        header.contains("environment worker `")
            && header.contains("env_worker_example.py`")
            && header.contains("(environment `guess`, 16 problems)"),
        "{header}"
    );
    assert!(!header.contains("difficulty"), "{header}");

    let model: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("checkpoint/config.json")).unwrap())
            .unwrap();
    let positions = model["max_position_embeddings"].as_u64().unwrap();
    assert_eq!(positions, 256, "the multi-turn minimum");
    let config: toml::Value =
        toml::from_str(&std::fs::read_to_string(dir.join("config.toml")).unwrap()).unwrap();
    assert_eq!(
        config["model"]["max_positions"].as_integer(),
        Some(positions as i64),
        "{config}"
    );
}

/// `skein eval` of a worker run plays the run's evaluation episodes through the worker again
/// and reports what the run's final evaluation did; the options of sampled single-turn
/// evaluation are refused by name. The run evaluates more seeds than the worker's 16 problems,
/// and says at start-up that some problems are evaluated several times.
#[test]
fn skein_eval_of_a_worker_run_plays_its_evaluation_episodes() {
    let sets = ["trainer.steps=1", "eval.problems=20"];
    let (code, err, dir) = skein_train("eval", SCRIPT, &[], &sets);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("draws 20 seeds of an environment of 16 problems")
            && err.contains("`eval/accuracy` weighs each by how many of its seeds were drawn"),
        "{err}"
    );
    let last_eval = std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .rfind(|m| m.get("eval/accuracy").is_some())
        .expect("the run's final evaluation");
    let eval = |flags: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_skein"))
            .args(["eval", dir.to_str().unwrap(), "--set", "run.threads=1"])
            .args(flags)
            .output()
            .unwrap()
    };
    let out = eval(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The episodes are counted as they end (plain lines off a terminal).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("episode 20/20"), "{stderr}");
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["eval/accuracy", "eval/turns_mean", "eval/failed"] {
        assert_eq!(line[key], last_eval[key], "{key}: {line} vs {last_eval}");
    }
    assert_eq!(
        line["problems"].as_f64(),
        last_eval["eval/problems"].as_f64()
    );
    assert!(
        line["data"]
            .as_str()
            .unwrap()
            .contains("environment worker"),
        "{line}"
    );

    let refused = eval(&["--n", "4"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("--n does not apply to a multi-turn run"),
        "{stderr}"
    );
}

/// A worker whose messages use characters outside the alphabet it declared: odd seeds open
/// with nothing else, even ones with one such character among known ones.
const STRANGER: &str = r#"
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if r["op"] == "close":
        continue
    if r["op"] == "info":
        a = {"name": "stranger", "alphabet": "0123456789 ", "max_turns": 1,
             "max_message_chars": 4, "problems": None}
    elif r["op"] == "reset":
        odd = r["task"]["seed"] % 2 == 1
        a = {"messages": [{"role": "user", "content": "¿¡" if odd else "12 ¿"}]}
    else:
        a = {"done": True, "reward": 1.0, "correct": True, "formatted": True}
    a["id"] = r["id"]
    print(json.dumps(a), flush=True)
"#;

/// Characters the tokenizer lacks are counted each step (`agent/unknown_chars`) and reported
/// once; an episode whose first prompt has nothing else fails as an environment error.
#[test]
fn characters_outside_the_vocabulary_are_counted_and_reported_once() {
    let dir = common::workdir("env-worker", "stranger-script");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("stranger.py");
    std::fs::write(&script, STRANGER).unwrap();
    let extra = [
        "trainer.steps=2",
        "rollout.prompts_per_step=8",
        "rollout.samples_per_prompt=2",
    ];
    let (code, err, run) = skein_train("stranger", script.to_str().unwrap(), &[], &extra);
    assert_eq!(code, 0, "{err}");
    let warnings = err.matches("environment `stranger` sent").count();
    assert_eq!(warnings, 1, "{err}");
    assert!(
        err.contains("outside the tokenizer's vocabulary ('¿'")
            && err.contains("agent/unknown_chars"),
        "{err}"
    );
    let steps = step_metrics(&run);
    assert_eq!(steps.len(), 2);
    for m in &steps {
        let failed = num(m, "batch/failed_trajectories");
        assert!(failed > 0.0 && failed < 16.0, "both kinds of seed: {m}");
        assert_eq!(num(m, "agent/env_errors"), failed, "{m}");
        // Two such characters in each failed episode, one in each other.
        let unknown = 2.0 * failed + (16.0 - failed);
        assert_eq!(num(m, "agent/unknown_chars"), unknown, "{m}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
