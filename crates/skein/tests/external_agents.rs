//! External agents for real: the trainer serves its policy, two processes of the example agent
//! (the official `openai` client) take each step's tasks, make their calls through the rollout
//! URLs and post rewards, and the trainer learns from the recorded token ids.

mod common;

use common::{assert_logprobs_agree, require_python_with_openai, step_metrics};
use skein::trainer::run::train;
use skein::trainer::TrainConfig;
use std::path::PathBuf;

/// The test config of an external-agents run in a fresh directory named after `name`: the
/// example agent's script, and the config with `workers` agents started by the trainer.
fn external_run(name: &str, workers: usize) -> (&'static str, TrainConfig, PathBuf) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/example_agent.py"
    );
    let mut cfg: TrainConfig = skein_config::load(None, "test", &[]).unwrap();
    let dir = std::env::temp_dir().join(format!("skein-external-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    cfg.run.dir = dir.display().to_string();
    cfg.eval.every = 0;
    cfg.agent.kind = skein::trainer::config::AgentKind::External;
    cfg.agent.api_key = "sk-test".into();
    cfg.agent.workers = workers;
    (script, cfg, dir)
}

#[test]
fn the_example_agent_trains_the_policy_through_the_server() {
    let python = require_python_with_openai();
    let (script, mut cfg, dir) = external_run("train", 2);
    cfg.trainer.steps = 2;
    cfg.rollout.prompts_per_step = 4;
    cfg.rollout.samples_per_prompt = 4;
    cfg.sft.steps = 5;
    cfg.eval.problems = 16;
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
        // The ids and log-probs the server recorded for the agents' calls are the policy's.
        assert_logprobs_agree(m);
    }
    assert_eq!(run.rewards.len(), 2);
}

/// Agent processes that exit at once (a missing module, a bad key) do not leave each step
/// waiting out `agent.rollout_timeout_s`, even with a helper of theirs left in their process
/// group: the step ends as soon as none is left (the helpers killed), its rollouts fail for
/// that reason (counted apart from timeouts), each step starts the agents again, and the run
/// stops after its steps in a row with nothing to train, naming the exit status.
#[test]
fn agents_that_exit_end_the_step_at_once_and_are_started_again() {
    use std::time::{Duration, Instant};
    let (_, mut cfg, dir) = external_run("exit", 2);
    cfg.trainer.steps = 5;
    (cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt) = (2, 2);
    (cfg.sft.steps, cfg.eval.problems) = (0, 4);
    cfg.agent.rollout_timeout_s = 300.0;
    // Each leaves a helper behind in its process group as it fails.
    let helper = format!("sleep 613.{}", std::process::id());
    let command = format!("{helper} & exit 3");
    cfg.agent.command = vec!["sh".into(), "-c".into(), command];
    let started = Instant::now();
    let err = format!(
        "{:#}",
        train(&cfg).expect_err("no agent ever closes a rollout")
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the steps waited for agents that had exited"
    );
    assert!(
        err.contains("steps in a row had no token to train"),
        "{err}"
    );
    assert!(
        err.contains("every agent process") && err.contains("exit status: 3"),
        "{err}"
    );
    let steps = step_metrics(&dir);
    assert_eq!(steps.len(), 3, "stopped after three steps in a row");
    for m in &steps {
        assert_eq!(m["agent/orphaned_rollouts"].as_f64(), Some(4.0), "{m}");
        assert_eq!(m["agent/timed_out_rollouts"].as_f64(), Some(0.0), "{m}");
        assert_eq!(m["agent/failed_rollouts"].as_f64(), Some(0.0), "{m}");
        assert_eq!(m["agent/restarted_workers"].as_f64(), Some(2.0), "{m}");
    }
    // A failed agent's group is killed with it: no helper is left running.
    let running = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|cmdline| String::from_utf8_lossy(cmdline).replace('\0', " ").trim() == helper)
        .count();
    assert_eq!(running, 0, "helpers of failed agents still run");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An agent that rewards each rollout without asking the model: nothing the policy wrote.
const UNCALLED_AGENT: &str = r#"
import json, os, time, urllib.request
server, key = os.environ["SKEIN_SERVER"], os.environ["SKEIN_API_KEY"]
def http(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(server + path, data, headers)) as r:
        return r.status, r.read()
while True:
    status, body = http("/tasks/next")
    if status == 204:
        time.sleep(0.05)
        continue
    http("/rollouts/%s/reward" % json.loads(body)["rollout_id"], {"reward": 1.0})
"#;

/// Rollouts an agent rewards without a model call fail (the policy wrote nothing to train on),
/// counted as `agent/uncalled_rollouts`, apart from the agent's own failures and time-outs.
#[test]
fn rollouts_rewarded_without_a_model_call_fail_and_are_counted() {
    let python = require_python_with_openai();
    let (_, mut cfg, dir) = external_run("uncalled", 1);
    cfg.trainer.steps = 1;
    (cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt) = (2, 2);
    (cfg.sft.steps, cfg.eval.problems) = (0, 4);
    cfg.agent.rollout_timeout_s = 120.0;
    cfg.agent.command = vec![python, "-c".into(), UNCALLED_AGENT.into()];
    train(&cfg).expect("a step of failed rollouts is a step");
    let steps = step_metrics(&dir);
    let m = &steps[0];
    assert_eq!(m["agent/uncalled_rollouts"].as_f64(), Some(4.0), "{m}");
    assert_eq!(m["batch/failed_trajectories"].as_f64(), Some(4.0), "{m}");
    assert_eq!(m["agent/failed_rollouts"].as_f64(), Some(0.0), "{m}");
    assert_eq!(m["agent/timed_out_rollouts"].as_f64(), Some(0.0), "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Trains two steps with one agent started by `launch(python, script)`, a shell command that
/// exits with status 0 once the agent is running in the background, and checks that the agent
/// served both steps: every rollout closed, none ended as if its agent had exited, and no
/// agent started again.
fn served_by_a_launched_agent(name: &str, launch: impl Fn(&str, &str) -> String) {
    let python = require_python_with_openai();
    let (script, mut cfg, dir) = external_run(name, 1);
    cfg.trainer.steps = 2;
    (cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt) = (2, 2);
    (cfg.sft.steps, cfg.eval.problems) = (5, 4);
    cfg.rollout.sampling.max_new_tokens = 6;
    cfg.agent.rollout_timeout_s = 120.0;
    cfg.agent.command = vec!["sh".to_string(), "-c".into(), launch(&python, script)];
    train(&cfg).expect("training with a launched agent");
    let steps = step_metrics(&dir);
    assert_eq!(steps.len(), 2);
    for m in &steps {
        assert_eq!(m["agent/calls_mean"].as_f64(), Some(2.0), "{m}");
        assert_eq!(m["agent/orphaned_rollouts"].as_f64(), Some(0.0), "{m}");
        assert_eq!(m["agent/timed_out_rollouts"].as_f64(), Some(0.0), "{m}");
        assert_eq!(m["agent/restarted_workers"].as_f64(), Some(0.0), "{m}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An `agent.command` that starts its agent in the background and exits at once (a launcher
/// script) is running as long as its agent is: the steps are served, not ended as if the
/// agents had exited. The agent finds the server in `SKEIN_SERVER` and `SKEIN_API_KEY`.
#[test]
fn a_launcher_that_leaves_its_agent_running_is_not_an_exited_agent() {
    served_by_a_launched_agent("launch", |python, script| {
        format!("'{python}' '{script}' --concurrency 4 & exit 0")
    });
}

/// A launcher that starts its agent outside its process group (`setsid`) and exits with
/// status 0 leaves nothing skein can watch: the steps are still served by that agent, not
/// ended as if it had exited, and no copy of it is started again each step. (The detached
/// agent ends when the trainer's server is gone.)
#[test]
fn a_launcher_that_detaches_its_agent_is_neither_ended_nor_restarted() {
    served_by_a_launched_agent("detach", |python, script| {
        format!("setsid '{python}' '{script}' --concurrency 4 >/dev/null 2>&1 </dev/null & exit 0")
    });
}

/// An agent that serves its tasks and quits with status 0 (here after four, `--max-tasks`)
/// is started again, and the steps after it are served: none waits out its timeout. (Its
/// start is delayed past the 5 s within which a clean exit is taken for a launcher's.)
#[test]
fn an_agent_that_quits_after_serving_is_started_again() {
    let python = require_python_with_openai();
    let (script, mut cfg, dir) = external_run("quit", 1);
    cfg.trainer.steps = 3;
    (cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt) = (2, 2);
    (cfg.sft.steps, cfg.eval.problems) = (5, 4);
    cfg.rollout.sampling.max_new_tokens = 6;
    cfg.agent.rollout_timeout_s = 120.0;
    let quits = format!("sleep 6; exec '{python}' '{script}' --concurrency 4 --max-tasks 4");
    cfg.agent.command = vec!["sh".to_string(), "-c".into(), quits];
    let _ = train(&cfg);
    let steps = step_metrics(&dir);
    assert_eq!(steps.len(), 3);
    let num = |m: &serde_json::Value, k: &str| m[k].as_f64().unwrap_or_else(|| panic!("{k}: {m}"));
    assert_eq!(num(&steps[0], "agent/calls_mean"), 2.0, "{}", steps[0]);
    let restarted: f64 = steps
        .iter()
        .map(|m| num(m, "agent/restarted_workers"))
        .sum();
    assert!(restarted >= 1.0, "{steps:?}");
    assert!(
        steps[1..].iter().any(|m| num(m, "agent/calls_mean") == 2.0),
        "no later step was served: {steps:?}"
    );
    for m in &steps {
        assert_eq!(num(m, "agent/timed_out_rollouts"), 0.0, "{m}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Ctrl-C at the terminal goes to the whole foreground process group. The agents the
/// trainer started sit in groups of their own, so they keep answering while the trainer
/// finishes its step, and the run stops at once with nothing timed out. Were they in the
/// trainer's group, they would die with the press, and the step would wait out
/// `agent.rollout_timeout_s` (here two minutes) for rollouts no one closes. Before the
/// press, the server's `/health` reports the policy version of the step being served.
#[test]
fn a_ctrl_c_at_the_terminal_leaves_the_agents_to_finish_the_step() {
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};
    let python = require_python_with_openai();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/example_agent.py"
    );
    let dir = common::workdir("external", "ctrl-c");
    let command = format!(
        "agent.command=[{python:?}, {script:?}, \"--server\", \"{{server}}\", \"--api-key\", \
         \"{{api_key}}\", \"--idle-exit\", \"600\", \"--concurrency\", \"8\", \"--max-tokens\", \"6\"]"
    );
    let sets = [
        format!("run.dir={:?}", dir.display().to_string()),
        "trainer.steps=500".into(),
        "rollout.prompts_per_step=4".into(),
        "rollout.samples_per_prompt=4".into(),
        "sft.steps=2".into(),
        "eval.problems=8".into(),
        "agent.kind=\"external\"".into(),
        "agent.api_key=\"sk-test\"".into(),
        "agent.workers=2".into(),
        "agent.rollout_timeout_s=120.0".into(),
        command,
    ];
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_skein"));
    cmd.arg("train");
    for s in common::TINY_RUN.iter().map(|s| s.to_string()).chain(sets) {
        cmd.args(["--set", &s]);
    }
    // A terminal of its own: the trainer leads a process group, as a shell's job does.
    let mut child = cmd
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("skein runs");
    // A failing assert must not leave the trainer (in a group of its own) training on.
    let _guard = KillGroupOnPanic(child.id());
    let stderr = child.stderr.take().unwrap();
    let printed = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let printed = printed.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let mut p = printed.lock().unwrap();
                p.push_str(&line);
                p.push('\n');
            }
        })
    };
    let started = Instant::now();
    let steps_done =
        || std::fs::read_to_string(dir.join("metrics.jsonl")).map_or(0, |t| t.lines().count());
    while steps_done() < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no step in 5 minutes"
        );
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The next step serves the policy its first update made.
    loop {
        let text = printed.lock().unwrap().clone();
        if served_version(&text).is_some_and(|v| v >= 1) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "/health never reported the version of a step after the first: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pressed = Instant::now();
    let group = format!("-{}", child.id());
    let sent = std::process::Command::new("kill")
        .args(["-INT", "--", &group])
        .status()
        .unwrap();
    assert!(sent.success());
    while child.try_wait().unwrap().is_none() {
        assert!(
            pressed.elapsed() < Duration::from_secs(60),
            "the step still waits a minute after Ctrl-C: the agents died with it"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let err = printed.lock().unwrap().clone();
    assert!(status.success(), "{err}");
    for m in step_metrics(&dir) {
        assert_eq!(
            m["agent/timed_out_rollouts"].as_f64(),
            Some(0.0),
            "{m}\n{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Kills a process group (SIGKILL) when dropped during a panic.
struct KillGroupOnPanic(u32);

impl Drop for KillGroupOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let group = format!("-{}", self.0);
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &group])
                .status();
        }
    }
}

/// The policy version `/health` reports, from the server whose URL the trainer printed;
/// None before it printed one or while the server does not answer.
fn served_version(printed: &str) -> Option<u64> {
    use std::io::{Read, Write};
    let url = printed
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .and_then(|rest| rest.split('/').next())?;
    let mut conn = std::net::TcpStream::connect(url).ok()?;
    let request = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    conn.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).ok()?;
    let body = answer.split("\r\n\r\n").nth(1)?;
    let health: serde_json::Value = serde_json::from_str(body).ok()?;
    health["version"].as_u64()
}
