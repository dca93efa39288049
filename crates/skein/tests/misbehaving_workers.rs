//! Workers that misbehave, against the real `skein train` binary and real worker processes:
//! an environment worker that answers a request twice fails that episode and is restarted
//! instead of shifting every later answer onto the next request; a reward worker that hangs
//! costs one timeout per batch and is given up on, instead of one timeout per request for
//! ever; and no worker outlives skein, however it is stopped (SIGTERM, two Ctrl-C, SIGKILL).

mod common;

use common::{step_metrics, TINY_RUN};
use serde_json::Value;
use skein_report::trajectories::{list_steps, read_step, Status};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn script(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
        .display()
        .to_string()
}

/// The repository's Python, else the system's.
fn python() -> String {
    common::python_with("json").unwrap_or_else(|| "python3".into())
}

/// A TOML array of strings, for `--set key=[…]`.
fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// The example environment worker (the guessing game) with `args` for its script.
fn example_env_worker(args: &[&str]) -> Vec<String> {
    let mut command = vec![python(), script("env_worker_example.py")];
    command.extend(args.iter().map(|s| s.to_string()));
    command
}

/// `--set`s of a run on environment worker `command`, two processes of it.
fn env_worker_run(command: &[String]) -> Vec<String> {
    vec![
        "agent.kind=\"env-worker\"".into(),
        format!("agent.command={}", toml_list(command)),
        "agent.workers=2".into(),
        "sft.steps=0".into(),
        "rollout.prompts_per_step=8".into(),
        "rollout.samples_per_prompt=4".into(),
        "eval.problems=8".into(),
    ]
}

/// Everything a running `skein train` wrote to stderr so far (its workers' stderr included).
#[derive(Clone, Default)]
struct Stderr(Arc<Mutex<String>>);

impl Stderr {
    fn text(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// `skein train` in `dir` with the tiny model and `sets`; its stderr is collected by a thread
/// that is never joined (a worker that outlives skein keeps the pipe open).
fn start(dir: &Path, sets: &[String]) -> (Child, Stderr) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_skein"));
    cmd.arg("train");
    for s in TINY_RUN
        .iter()
        .map(|s| s.to_string())
        .chain(sets.iter().cloned())
    {
        cmd.args(["--set", &s]);
    }
    cmd.args(["--set", &format!("run.dir={:?}", dir.display().to_string())]);
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("skein runs");
    let stderr = Stderr::default();
    let pipe = child.stderr.take().expect("piped stderr");
    let sink = stderr.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut text = sink.0.lock().unwrap_or_else(|e| e.into_inner());
            text.push_str(&line);
            text.push('\n');
        }
    });
    (child, stderr)
}

/// The exit status of `child`, waiting at most `limit`.
fn exit_within(child: &mut Child, stderr: &Stderr, limit: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("skein's status") {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("skein did not exit within {limit:?}: {}", stderr.text());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The run in `dir` with `sets`, to its end (at most `limit`): its exit status and stderr.
fn run_to_end(dir: &Path, sets: &[String], limit: Duration) -> (std::process::ExitStatus, String) {
    let (mut child, stderr) = start(dir, sets);
    let status = exit_within(&mut child, &stderr, limit);
    (status, stderr.text())
}

fn num(m: &Value, key: &str) -> f64 {
    m[key].as_f64().unwrap_or_else(|| panic!("no {key} in {m}"))
}

fn sum(steps: &[Value], key: &str) -> f64 {
    steps.iter().map(|m| num(m, key)).sum()
}

/// Every trajectory the run logged.
fn trajectories(dir: &Path) -> Vec<skein_report::trajectories::TrajectoryRecord> {
    list_steps(dir)
        .expect("trajectory logs")
        .into_iter()
        .flat_map(|(_, path)| read_step(&path).expect("a readable step log"))
        .collect()
}

/// One process of two writes every 5th step's answer twice. The next request that process
/// gets reads an answer with the wrong id: that episode fails (a worker failure, with the
/// reason in the trajectory log), the process is restarted, and the run completes; without
/// ids every later answer of the process went to the request after its own, unnoticed.
#[test]
fn an_env_worker_that_answers_twice_fails_that_episode_and_is_restarted() {
    let dir = common::workdir("misbehaving-workers", "twice");
    let command = example_env_worker(&["--answer-twice-every", "5", "--fault-worker", "0"]);
    let mut sets = env_worker_run(&command);
    sets.push("trainer.steps=3".into());
    let (status, err) = run_to_end(&dir, &sets, Duration::from_secs(300));
    assert!(status.success(), "{status}: {err}");
    let steps = step_metrics(&dir);
    assert_eq!(steps.len(), 3, "{err}");
    for m in &steps {
        assert_eq!(
            num(m, "batch/failed_trajectories"),
            num(m, "agent/env_worker_failures") + num(m, "agent/env_timeouts"),
            "{m}"
        );
        assert_eq!(num(m, "agent/env_errors"), 0.0, "{m}");
        assert!(num(m, "loss/policy").is_finite(), "{m}");
    }
    assert!(sum(&steps, "agent/env_worker_failures") > 0.0, "{steps:?}");
    assert!(sum(&steps, "agent/env_worker_restarts") > 0.0, "{steps:?}");
    let records = trajectories(&dir);
    let out_of_step: Vec<_> = records
        .iter()
        .filter(|r| r.status == Status::Failed)
        .filter_map(|r| r.reason.as_deref())
        .filter(|why| why.contains("answered one twice"))
        .collect();
    assert!(
        !out_of_step.is_empty(),
        "no failure names the repeated answer: {:?}",
        records.iter().map(|r| &r.reason).collect::<Vec<_>>()
    );
    assert!(
        out_of_step[0].contains("process 1 of 2"),
        "{}",
        out_of_step[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--set`s routing every reward to the example reward worker run with `args`, timing out
/// after 300 ms (plus 300 ms for a new process's first answer).
fn reward_worker_run(args: &[&str]) -> Vec<String> {
    let mut command = vec![python(), script("reward_worker_example.py")];
    command.extend(args.iter().map(|s| s.to_string()));
    vec![
        "reward.sources.py.kind=\"worker\"".into(),
        format!("reward.sources.py.command={}", toml_list(&command)),
        "reward.sources.py.timeout_ms=300".into(),
        "reward.sources.py.start_timeout_ms=300".into(),
        "reward.sources.py.batch_size=4".into(),
        "reward.default_route.sources=[\"py\"]".into(),
        "rollout.prompts_per_step=4".into(),
        "rollout.samples_per_prompt=4".into(),
        "eval.problems=8".into(),
        "trainer.steps=2".into(),
    ]
}

/// A reward worker that never answers. Each of its processes fails the batch it holds at
/// once, after one timeout; after three such processes in a row the source is given up on,
/// said once on stderr with what to check, and every later request fails at once. Before,
/// each of the run's 48 requests waited its own timeout plus a new process's start-up
/// allowance, and restarted the worker.
#[test]
fn a_hung_reward_worker_costs_one_timeout_per_process_and_is_given_up_on() {
    let dir = common::workdir("misbehaving-workers", "hung-reward");
    let sets = reward_worker_run(&["--hang-every", "1"]);
    let started = Instant::now();
    let (status, err) = run_to_end(&dir, &sets, Duration::from_secs(300));
    let took = started.elapsed();
    assert!(status.success(), "{status}: {err}");
    let steps = step_metrics(&dir);
    assert_eq!(steps.len(), 2, "{err}");
    let last = &steps[1];
    // Three processes (the first and two restarts) each failed once; nothing was retried.
    assert_eq!(num(last, "reward/worker_restarts"), 2.0, "{last}");
    assert_eq!(
        num(last, "reward/failed"),
        num(last, "reward/requests"),
        "{last}"
    );
    assert_eq!(num(last, "batch/failed_trajectories"), 16.0, "{last}");
    let waited = sum(&steps, "time/reward_wait_s");
    assert!(waited < 3.0, "{waited} s waiting for rewards: {steps:?}");
    // Said once on a line of its own (the warnings of steps that trained nothing quote it).
    let given_up: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("skein: reward source") && l.contains("given up"))
        .collect();
    assert_eq!(given_up.len(), 1, "said once: {err}");
    for part in [
        "reward_worker_example.py",
        "`reward.sources.py.timeout_ms`",
        "stderr",
    ] {
        assert!(given_up[0].contains(part), "{part}: {}", given_up[0]);
    }
    let reasons: Vec<_> = trajectories(&dir)
        .into_iter()
        .filter_map(|r| r.reason)
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("given up")),
        "{reasons:?}"
    );
    eprintln!("a run with a hung reward worker took {took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits at most `limit` for `ready`, failing the test if the run ends first.
fn wait_until(child: &mut Child, stderr: &Stderr, limit: Duration, ready: impl Fn() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < limit, "never ready: {}", stderr.text());
        if let Ok(Some(status)) = child.try_wait() {
            panic!("skein ended early ({status}): {}", stderr.text());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pids of the processes descended from `ancestor`.
fn descendants_of(ancestor: u32) -> Vec<u32> {
    let mut parents = vec![ancestor];
    let mut found = Vec::new();
    while let Some(parent) = parents.pop() {
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if process_state(pid).is_some_and(|(_, ppid)| ppid == parent) {
                found.push(pid);
                parents.push(pid);
            }
        }
    }
    found
}

/// A process's state letter and parent, from /proc (None once it is gone).
fn process_state(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether `pid` has ended (gone, or a zombie left for init to reap).
fn ended(pid: u32) -> bool {
    process_state(pid).is_none_or(|(state, _)| state == 'Z')
}

/// Kills, when the test ends however it ends, the processes it found, so a failure leaves no
/// sleeping worker behind.
struct Leftovers(Vec<u32>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if !ended(pid) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
}

/// The workers of `pids` still alive `grace` after skein exited, with their state and parent.
fn survivors(pids: &[u32], grace: Duration) -> Vec<(u32, Option<(char, u32)>)> {
    let deadline = Instant::now() + grace;
    while pids.iter().any(|&p| !ended(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    pids.iter()
        .filter(|&&p| !ended(p))
        .map(|&p| (p, process_state(p)))
        .collect()
}

fn signal(child: &Child, name: &str) {
    let sent = Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
}

/// `--set`s of a run whose first environment-worker process hangs (sleeps, reading nothing
/// more) at its third step. `wrapped`: each worker runs inside a shell that sleeps on once
/// the worker is done, as a wrapper script that outlives its stdin does.
fn hanging_worker_run(wrapped: bool, env_timeout_s: f64) -> Vec<String> {
    let mut command = example_env_worker(&["--hang-every", "3", "--fault-worker", "0"]);
    if wrapped {
        let shell = ["sh", "-c", "\"$0\" \"$@\"; sleep 3600"].map(String::from);
        command.splice(0..0, shell);
    }
    let mut sets = env_worker_run(&command);
    sets.extend([
        format!("agent.env_timeout_s={env_timeout_s}"),
        "trainer.steps=1000".into(),
    ]);
    sets
}

/// Starts the run of `sets`, waits until its worker hangs, sends `signals` (waiting after
/// each for skein to say `acknowledged`, where given), and checks that every process skein
/// had started is gone right after it exits. Skein's exit code and stderr.
fn stop_while_a_worker_hangs(
    test: &str,
    sets: &[String],
    signals: &[(&str, Option<&str>)],
) -> (Option<i32>, String) {
    let dir = common::workdir("misbehaving-workers", test);
    let (mut child, stderr) = start(&dir, sets);
    let mut leftovers = Leftovers(Vec::new());
    wait_until(&mut child, &stderr, Duration::from_secs(120), || {
        stderr.text().contains("hanging at step")
    });
    let workers = descendants_of(child.id());
    leftovers.0.extend(&workers);
    assert!(workers.len() >= 2, "two worker processes: {workers:?}");
    for (name, acknowledged) in signals {
        signal(&child, name);
        if let Some(said) = acknowledged {
            wait_until(&mut child, &stderr, Duration::from_secs(30), || {
                stderr.text().contains(said)
            });
        }
    }
    let status = exit_within(&mut child, &stderr, Duration::from_secs(60));
    let alive = survivors(&workers, Duration::from_secs(2));
    assert!(
        alive.is_empty(),
        "after {signals:?} ({status}), processes outlived skein (pid, (state, parent)): \
         {alive:?}\n{}",
        stderr.text()
    );
    let _ = std::fs::remove_dir_all(&dir);
    (status.code(), stderr.text())
}

/// SIGTERM, what a scheduler preempting a job sends before its kill, is a first Ctrl-C: the
/// step finishes (the hung episode is cut off by `agent.env_timeout_s`), its checkpoint is
/// written, and the hung worker and its wrapper, and the other worker, go with skein.
#[test]
fn sigterm_while_an_env_worker_hangs_checkpoints_and_leaves_no_worker_behind() {
    let sets = hanging_worker_run(true, 3.0);
    let term = [("TERM", Some("interrupt: finishing this step"))];
    let (code, err) = stop_while_a_worker_hangs("sigterm", &sets, &term);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("interrupted after step"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Ctrl-C twice: the first lets the step finish (the hung episode is cut off by
/// `agent.env_timeout_s`), the second stops the run at the end of the rollout, through
/// `process::exit`, which runs no destructor; the workers still go.
#[test]
fn ctrl_c_twice_while_an_env_worker_hangs_leaves_no_worker_behind() {
    let sets = hanging_worker_run(true, 3.0);
    let presses = [
        ("INT", Some("interrupt: finishing this step")),
        ("INT", Some("second interrupt")),
    ];
    let (code, err) = stop_while_a_worker_hangs("sigint", &sets, &presses);
    // 130 when the second press stopped it; 0 when the step and its checkpoint were done
    // first.
    assert!(matches!(code, Some(130) | Some(0)), "{code:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Ctrl-C three times while the hung episode still has most of its 600 s timeout to run: the
/// first two presses wait on the rollout, the third stops the run at once (status 130), and
/// the workers go with it.
#[test]
fn a_third_ctrl_c_stops_at_once_while_an_env_worker_hangs() {
    let sets = hanging_worker_run(true, 600.0);
    let presses = [
        ("INT", Some("interrupt: finishing this step")),
        ("INT", Some("second interrupt")),
        ("INT", None),
    ];
    let (code, err) = stop_while_a_worker_hangs("third-press", &sets, &presses);
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("third interrupt: stopped at once"), "{err}");
}

/// SIGKILL cannot be handled: the parent-death signal the workers were started with ends
/// the hung worker when skein dies.
#[test]
fn sigkill_while_an_env_worker_hangs_takes_the_hung_worker_too() {
    let sets = hanging_worker_run(false, 600.0);
    let (code, err) = stop_while_a_worker_hangs("sigkill", &sets, &[("KILL", None)]);
    assert_eq!(code, None, "{err}");
}
