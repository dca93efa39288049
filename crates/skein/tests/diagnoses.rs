//! Runs that really have a known problem, against the real `skein train` binary: each is made
//! to show one failure mode (a task far too hard, a token limit of one, a learning rate far
//! too high, a reward worker that pays for length, crashes or goes out of range, …), and the
//! run must name it — one line on stderr when it starts, a line of `diagnoses.jsonl` with the
//! right evidence — and `skein doctor` must find the same in the run directory and exit 1.
//! Each names its own diagnosis and no other (`only`): a rule that fires beside it is a false
//! alarm.

mod common;

use common::TINY_RUN;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn skein() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skein"))
}

/// A TOML array of strings, for `--set key=[…]`.
fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// `--set`s routing every reward to the fixture worker with `args`.
fn reward_worker(args: &[&str]) -> Vec<String> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/diagnosis_reward_worker.py");
    let python = common::python_with("json").unwrap_or_else(|| "python3".into());
    let mut command = vec![python, script.display().to_string()];
    command.extend(args.iter().map(|s| s.to_string()));
    vec![
        "reward.sources.w.kind=\"worker\"".into(),
        format!("reward.sources.w.command={}", toml_list(&command)),
        "reward.default_route.sources=[\"w\"]".into(),
    ]
}

/// Trains a tiny model from scratch with `sets` in a fresh directory; returns the directory
/// and the run's stderr. The run must exit 0.
fn train(name: &str, sets: &[String]) -> (PathBuf, String) {
    let (dir, err, ok) = try_train(name, sets);
    assert!(ok, "{name}: the run failed\n{err}");
    (dir, err)
}

/// [`train`], whether or not the run succeeds.
fn try_train(name: &str, sets: &[String]) -> (PathBuf, String, bool) {
    let dir = common::workdir("diagnoses", name);
    let mut cmd = skein();
    cmd.args(["train", "--overwrite", "--set"])
        .arg(format!("run.dir={:?}", dir.display().to_string()));
    // A short warm-up teaches the tiny model to end its answers: an untrained one never
    // writes its end-of-sequence token, so every run would also show `truncation`.
    let base = [
        "sft.steps=60",
        "eval.problems=8",
        "rollout.prompts_per_step=8",
        "rollout.samples_per_prompt=4",
    ];
    for s in TINY_RUN
        .iter()
        .chain(&base)
        .map(|s| s.to_string())
        .chain(sets.iter().cloned())
    {
        cmd.args(["--set", &s]);
    }
    let out = cmd.output().expect("skein train runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (dir, err, out.status.success())
}

/// The run's diagnoses as written, one JSON object each.
fn diagnoses(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("diagnoses.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// The diagnosis `name` of the run: announced once on stderr, written to diagnoses.jsonl, and
/// found again by `skein doctor` (exit 1). Returns its line of diagnoses.jsonl.
fn diagnosed(dir: &Path, err: &str, name: &str) -> Value {
    let all = diagnoses(dir);
    let names: Vec<&str> = all.iter().filter_map(|d| d["name"].as_str()).collect();
    let d = all
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no {name} among {names:?}\n{err}"))
        .clone();
    let announced = err
        .lines()
        .filter(|l| l.starts_with("skein: diagnosis at step") && l.contains(&format!(": {name} (")))
        .count();
    assert_eq!(announced, 1, "announced once when it started:\n{err}");
    let out = skein()
        .arg("doctor")
        .arg(dir)
        .output()
        .expect("skein doctor runs");
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains(&format!("  {name} (")), "{report}");
    // The file says how long it lasted, as the replay does (`skein view` reads the file).
    let out = skein()
        .args(["doctor", "--json"])
        .arg(dir)
        .output()
        .expect("skein doctor runs");
    let replayed: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let again = replayed
        .iter()
        .find(|r| r["name"] == name && r["step"] == d["step"])
        .unwrap_or_else(|| panic!("skein doctor --json lacks {name}: {replayed:?}"));
    assert_eq!(
        again["until"], d["until"],
        "{name}: file {d}, replay {again}"
    );
    assert_eq!(
        again["examples"], d["examples"],
        "{name}: file {d}, replay {again}"
    );
    d
}

/// The run named exactly the diagnoses `expected` and no other: a made-sick run names what
/// it was made to show, and a rule that fires beside it on the same run is a false alarm.
fn only(dir: &Path, err: &str, expected: &[&str]) {
    only_but_maybe(dir, err, expected, &[]);
}

/// As `only`, where the diagnoses in `may_also` may fire beside the expected ones or not: they
/// are true of some of the runs a seed and a machine's arithmetic lead to, and false of others.
fn only_but_maybe(dir: &Path, err: &str, expected: &[&str], may_also: &[&str]) {
    let mut names: Vec<String> = diagnoses(dir)
        .iter()
        .filter_map(|d| d["name"].as_str().map(str::to_string))
        .filter(|name| !may_also.contains(&name.as_str()))
        .collect();
    names.sort();
    names.dedup();
    let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(names, want, "the run's diagnoses\n{err}");
}

fn evidence(d: &Value) -> &str {
    d["evidence"].as_str().expect("evidence")
}

fn sets(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The hardest additions for a model that has learnt nothing: every answer is wrong, every
/// group's rewards are equal, no advantage anywhere.
#[test]
fn a_task_far_too_hard_has_no_learning_signal() {
    let (dir, err) = train("too-hard", &sets(&["task.difficulty=5", "trainer.steps=3"]));
    let d = diagnosed(&dir, &err, "no-learning-signal");
    only(&dir, &err, &["no-learning-signal"]);
    assert_eq!(d["step"], 3, "{d}");
    assert!(
        evidence(&d).starts_with("1.00 of the groups had one reward"),
        "{d}"
    );
    assert!(
        evidence(&d).contains("0 such groups were all right and 8 all wrong"),
        "{d}"
    );
    assert!(!d["examples"].as_array().unwrap().is_empty(), "{d}");
}

/// A run that keeps some of each step's trajectories (`trajectories.keep`) is diagnosed from
/// those, during the run and by `skein doctor` after it: the same evidence, counted over the
/// kept ones and saying so, and examples that are in the step files.
#[test]
fn a_run_keeping_some_trajectories_is_diagnosed_from_those_alike_later() {
    let (dir, err) = train(
        "keep-some",
        &sets(&[
            "task.difficulty=5",
            "trainer.steps=3",
            "trajectories.keep=8",
        ]),
    );
    let d = diagnosed(&dir, &err, "no-learning-signal");
    assert!(
        evidence(&d).contains(
            "at step 3 among the 8 kept trajectories (trajectories.keep) 0 such groups were \
             all right and 2 all wrong"
        ),
        "{d}"
    );
    let out = skein()
        .args(["doctor", "--json"])
        .arg(&dir)
        .output()
        .expect("skein doctor runs");
    let replayed = String::from_utf8_lossy(&out.stdout);
    assert!(replayed.contains(evidence(&d)), "{replayed}");
    use skein_report::trajectories::{read_step, step_path};
    let kept: Vec<String> = read_step(&step_path(&dir, 3))
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    for e in d["examples"].as_array().unwrap() {
        assert!(
            kept.contains(&e["id"].as_str().unwrap().to_string()),
            "{e} not kept"
        );
    }
}

/// One new token per response: every response is cut off.
#[test]
fn a_token_limit_of_one_truncates_every_response() {
    let (dir, err) = train(
        "truncation",
        &sets(&["rollout.sampling.max_new_tokens=1", "trainer.steps=2"]),
    );
    let d = diagnosed(&dir, &err, "truncation");
    only(&dir, &err, &["truncation"]);
    assert_eq!(d["step"], 2, "{d}");
    // All but the few whose one token was the end of the answer.
    let share: f64 = evidence(&d)[..4].parse().unwrap();
    assert!(share > 0.9, "{d}");
    assert!(evidence(&d).contains("mean response 1.0 tokens"), "{d}");
    let example = &d["examples"][0];
    assert_eq!(example["step"], 2, "{d}");
    // The example is a trajectory of that step's file, cut off.
    let records =
        skein_report::trajectories::read_step(&skein_report::trajectories::step_path(&dir, 2))
            .unwrap();
    let r = records
        .iter()
        .find(|r| r.id == example["id"].as_str().unwrap())
        .unwrap();
    assert_eq!(r.status, skein_report::trajectories::Status::Truncated);
}

/// A worker that pays for length alone, and a learning rate that lets the policy find it:
/// responses grow, nothing gets more right.
#[test]
fn a_reward_that_pays_for_length_is_exploited() {
    let mut s = reward_worker(&["--pay-for-length"]);
    s.extend(sets(&[
        "rollout.sampling.max_new_tokens=64",
        "model.max_positions=128",
        "optim.lr=1e-2",
        "trainer.steps=8",
        // A model that has learnt nothing: no answer is right, whatever its length.
        "sft.steps=0",
    ]));
    let (dir, err) = train("length", &s);
    let d = diagnosed(&dir, &err, "length-exploitation");
    // Its own consequence shows too, and is true: responses grow until the token limit cuts
    // them off.
    only(&dir, &err, &["length-exploitation", "truncation"]);
    assert!(
        evidence(&d).starts_with("mean response length grew from"),
        "{d}"
    );
    assert!(
        evidence(&d).contains("while accuracy went from 0.00 to 0.00"),
        "{d}"
    );
    // The example is the step's longest wrong answer.
    assert_eq!(d["examples"].as_array().unwrap().len(), 1, "{d}");
}

/// A reward of coin flips (nothing to learn) and a learning rate far too high: every step
/// leaves PPO's trust region, and the policy's entropy collapses onto noise.
#[test]
fn a_learning_rate_far_too_high_drifts_and_collapses_entropy() {
    let mut s = reward_worker(&["--coin"]);
    // From a model that has learnt nothing, which never ends a response: every one is cut off
    // until the policy collapses. Where it collapses onto the end token, responses end early
    // and `truncation` stays quiet; elsewhere it fires, and is true. Which of the two a run
    // takes depends on the machine's float reductions at this learning rate.
    s.extend(sets(&["optim.lr=0.3", "trainer.steps=4", "sft.steps=0"]));
    let (dir, err) = train("lr-too-high", &s);
    let drift = diagnosed(&dir, &err, "policy-drift");
    assert_eq!(drift["step"], 2, "{drift}");
    assert!(evidence(&drift).contains("approx_kl"), "{drift}");
    let collapse = diagnosed(&dir, &err, "entropy-collapse");
    only_but_maybe(
        &dir,
        &err,
        &["policy-drift", "entropy-collapse"],
        &["truncation"],
    );
    assert!(
        evidence(&collapse).starts_with("entropy fell from"),
        "{collapse}"
    );
}

/// A reward worker that crashes on every second request: half the reward calls fail.
#[test]
fn a_crashing_reward_worker_is_reward_trouble() {
    let mut s = reward_worker(&["--crash-every", "2"]);
    s.extend(sets(&["trainer.steps=1"]));
    let (dir, err) = train("crashing-reward", &s);
    let d = diagnosed(&dir, &err, "reward-failures");
    // Half the step's trajectories are lost with them, and that is named too.
    let lost = diagnosed(&dir, &err, "failed-trajectories");
    only(&dir, &err, &["reward-failures", "failed-trajectories"]);
    assert_eq!(d["step"], 1, "{d}");
    assert!(
        evidence(&d).starts_with("16 of 32 reward calls failed at step 1"),
        "{d}"
    );
    assert_eq!(d["examples"].as_array().unwrap().len(), 2, "{d}");
    assert!(
        evidence(&lost).starts_with(
            "0.50 of the trajectories failed at step 1 (16 of 32); counted as \
             reward/step_failed 16"
        ),
        "{lost}"
    );
}

/// A reward worker that crashes on every request: every trajectory of the step fails, so the
/// step logs no reward mean; the replay still reads its trajectories for the examples.
#[test]
fn a_reward_worker_that_always_crashes_fails_every_trajectory() {
    let mut s = reward_worker(&["--crash-every", "1"]);
    s.extend(sets(&["trainer.steps=1"]));
    let (dir, err) = train("always-crashing-reward", &s);
    let d = diagnosed(&dir, &err, "reward-failures");
    assert!(
        evidence(&d).starts_with("32 of 32 reward calls failed at step 1"),
        "{d}"
    );
    assert_eq!(d["examples"].as_array().unwrap().len(), 2, "{d}");
    // The step trained nothing, named with the counter that explains it and a reason.
    let lost = diagnosed(&dir, &err, "failed-trajectories");
    assert!(
        evidence(&lost).starts_with(
            "1.00 of the trajectories failed at step 1 (32 of 32); counted as \
             reward/step_failed 32; one failed for: reward ("
        ),
        "{lost}"
    );
}

/// A reward function with a bug: after three steps of 0/1 coin flips, every other reward is
/// 1000. Without the standard deviation's normalisation the advantages follow it, and so does
/// the gradient norm.
#[test]
fn a_reward_outlier_is_out_of_range_and_spikes_the_gradient() {
    let mut s = reward_worker(&["--coin", "--outlier-after", "130"]);
    s.extend(sets(&["algorithm.normalize_std=false", "trainer.steps=5"]));
    let (dir, err) = train("outlier", &s);
    let d = diagnosed(&dir, &err, "reward-out-of-range");
    assert_eq!(
        evidence(&d),
        "a reward of 1000 at step 4 after 3 steps within 0–1",
        "{d}"
    );
    let id = d["examples"][0]["id"].as_str().unwrap();
    let records =
        skein_report::trajectories::read_step(&skein_report::trajectories::step_path(&dir, 4))
            .unwrap();
    assert_eq!(records.iter().find(|r| r.id == id).unwrap().reward, 1000.0);
    let spike = diagnosed(&dir, &err, "unstable-updates");
    only(&dir, &err, &["reward-out-of-range", "unstable-updates"]);
    assert_eq!(spike["step"], 4, "{spike}");
    assert!(
        evidence(&spike).starts_with("the gradient norm was"),
        "{spike}"
    );
}

/// Rewards of 1e37 overflow the loss: updates are skipped.
#[test]
fn rewards_that_overflow_the_loss_skip_updates() {
    // Coin flips before the outliers, so groups have signal and only the overflow shows.
    let mut s = reward_worker(&["--coin", "--outlier-after", "130", "--outlier", "1e37"]);
    s.extend(sets(&[
        "algorithm.normalize_std=false",
        "trainer.steps=5",
        "trainer.max_consecutive_skips=10",
    ]));
    let (dir, err) = train("overflow", &s);
    let d = diagnosed(&dir, &err, "unstable-updates");
    // A reward of 1e37 is also far outside the range seen, and is named so.
    only(&dir, &err, &["unstable-updates", "reward-out-of-range"]);
    assert!(
        evidence(&d).contains("skipped for a NaN or infinite loss"),
        "{d}"
    );
}

/// Updates that keep overflowing stop the run, and its error names what there is to go back
/// to: no checkpoint yet, with when one would have been written, so nothing to resume. The
/// curves up to the stop are drawn.
#[test]
fn updates_that_keep_overflowing_stop_the_run_naming_no_checkpoint_yet() {
    let mut s = reward_worker(&["--coin", "--outlier-after", "0", "--outlier", "1e37"]);
    s.extend(sets(&[
        "algorithm.normalize_std=false",
        "trainer.steps=6",
        "trainer.max_consecutive_skips=2",
        "trainer.checkpoint_every=50",
    ]));
    let (dir, err, ok) = try_train("overflow-stop", &s);
    assert!(!ok, "{err}");
    assert!(
        err.contains("The curves so far") && dir.join("plot.png").is_file(),
        "{err}"
    );
    assert!(
        err.contains("2 consecutive updates")
            && err.contains("none yet (one is written every 50 steps")
            && err.contains("before starting again"),
        "{err}"
    );
}

/// A critic whose learning rate is far too high overshoots: its values explain less than a
/// constant would.
#[test]
fn a_critic_with_a_learning_rate_far_too_high_learns_nothing() {
    let mut s = reward_worker(&["--pay-for-length"]);
    s.extend(sets(&[
        "algorithm.estimator=\"gae\"",
        "algorithm.critic_lr=0.1",
        "trainer.steps=5",
    ]));
    let (dir, err) = train("critic", &s);
    let d = diagnosed(&dir, &err, "critic-not-learning");
    only(&dir, &err, &["critic-not-learning"]);
    assert_eq!(d["steps"], serde_json::json!([1, 2, 3, 4, 5]), "{d}");
}

/// Partial rollout with a budget of 4 tokens for responses of up to 8 and the tightest cap:
/// every carried token is at the cap.
#[test]
fn partial_rollout_with_a_tiny_budget_runs_at_its_staleness_cap() {
    // Coin-flip rewards give the groups signal; a model that has learnt nothing writes to the
    // token limit, which is what fills the budget (and is named too: `truncation`).
    let mut s = reward_worker(&["--coin"]);
    s.extend(sets(&[
        "sft.steps=0",
        "rollout.partial.enabled=true",
        "rollout.partial.token_budget=4",
        "rollout.partial.max_staleness=2",
        "trainer.steps=6",
    ]));
    let (dir, err) = train("partial", &s);
    let d = diagnosed(&dir, &err, "stale-partial-rollout");
    only(&dir, &err, &["stale-partial-rollout", "truncation"]);
    assert!(
        evidence(&d).contains("of the carried-over tokens were at the staleness cap"),
        "{d}"
    );
}

/// An environment worker that crashes every third step: episodes fail in the environment.
#[test]
fn a_crashing_environment_worker_fails_episodes() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/env_worker_example.py");
    let python = common::python_with("json").unwrap_or_else(|| "python3".into());
    let command = vec![
        python,
        script.display().to_string(),
        "--crash-every".into(),
        "3".into(),
    ];
    let mut s = sets(&[
        "agent.kind=\"env-worker\"",
        "agent.workers=2",
        "trainer.steps=2",
        // No warm-up: its demonstrations would come from the crashing worker.
        "sft.steps=0",
    ]);
    s.push(format!("agent.command={}", toml_list(&command)));
    let (dir, err) = train("env-crash", &s);
    let d = diagnosed(&dir, &err, "env-failures");
    // Each episode is on a worker when it crashes, so every one fails and the steps train
    // nothing: named too, and true.
    let lost = diagnosed(&dir, &err, "failed-trajectories");
    only(&dir, &err, &["env-failures", "failed-trajectories"]);
    assert!(
        evidence(&lost).contains("counted as agent/env_worker_failures"),
        "{lost}"
    );
    assert!(
        evidence(&d).contains("episodes failed in the environment at step 1"),
        "{d}"
    );
    assert!(evidence(&d).contains("env_worker_failures"), "{d}");
}

/// An external agent that exits at once (here a program that only fails; as an agent whose
/// imports break would): each step ends with every rollout left open, and no update is
/// applied. Its metrics alone look quiet (no reward, no loss), so the run must not be called
/// healthy.
#[test]
fn an_external_agent_that_exits_at_once_fails_every_rollout() {
    let python = common::python_with("json").unwrap_or_else(|| "python3".into());
    let command = vec![python, "-c".into(), "import sys; sys.exit(1)".into()];
    let mut s = sets(&[
        "agent.kind=\"external\"",
        "agent.workers=1",
        "trainer.steps=2",
        "sft.steps=0",
    ]);
    s.push(format!("agent.command={}", toml_list(&command)));
    let (dir, err) = train("external-exits", &s);
    let d = diagnosed(&dir, &err, "failed-trajectories");
    let agent = diagnosed(&dir, &err, "env-failures");
    only(&dir, &err, &["failed-trajectories", "env-failures"]);
    assert_eq!(
        (d["step"].as_u64(), d["until"].as_u64()),
        (Some(1), Some(2)),
        "{d}"
    );
    assert!(
        evidence(&d).starts_with(
            "1.00 of the trajectories failed at step 1 (32 of 32); counted as \
             agent/orphaned_rollouts 32; one failed for: every agent process"
        ),
        "{d}"
    );
    assert_eq!(d["examples"].as_array().unwrap().len(), 2, "{d}");
    assert!(
        evidence(&agent).starts_with("32 of 32 rollouts failed in the external agent at step 1"),
        "{agent}"
    );
}

/// Two turns for a guessing game a model that has learnt nothing never wins.
#[test]
fn a_turn_limit_of_two_ends_every_guessing_game() {
    let (dir, err) = train(
        "turn-limit",
        &sets(&[
            "task.name=\"guess\"",
            "agent.max_turns=2",
            "trainer.steps=2",
            // A model that has learnt nothing never wins in two turns.
            "sft.steps=0",
        ]),
    );
    let d = diagnosed(&dir, &err, "turn-limit");
    only(&dir, &err, &["turn-limit"]);
    // Nearly all: a lucky guess wins now and then, and which one depends on which episodes
    // shared a decode step, which the environment's timing decides.
    let share: f64 = evidence(&d)
        .split_once(" of the episodes ended at the turn limit")
        .and_then(|(share, _)| share.parse().ok())
        .unwrap_or_else(|| panic!("no share in {d}"));
    assert!(share >= 0.9, "{d}");
    assert!(!d["examples"].as_array().unwrap().is_empty(), "{d}");
}

/// `skein doctor --json` prints the same diagnoses as the run wrote, one per line with the
/// run's directory; a directory without a run is an error (exit 2) that the runs after it do
/// not share.
#[test]
fn skein_doctor_prints_json_lines_and_refuses_a_directory_without_a_run() {
    let (dir, _) = train(
        "doctor-json",
        &sets(&["rollout.sampling.max_new_tokens=1", "trainer.steps=2"]),
    );
    let out = skein()
        .args(["doctor", "--json"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let written = diagnoses(&dir);
    assert_eq!(lines.len(), written.len());
    for (l, w) in lines.iter().zip(&written) {
        assert_eq!(
            (&l["name"], &l["step"], &l["evidence"]),
            (&w["name"], &w["step"], &w["evidence"])
        );
        assert_eq!(l["run"], dir.display().to_string());
    }
    let empty = common::workdir("diagnoses", "not-a-run");
    std::fs::create_dir_all(&empty).unwrap();
    let out = skein().arg("doctor").arg(&empty).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no metrics.jsonl"));
    // A directory that is not a run, then a run: the run is still reported.
    let out = skein()
        .args(["doctor", "--json"])
        .arg(&empty)
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&empty.display().to_string()), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        written.len()
    );
    // A damaged line is skipped, and named on stderr beside the JSON lines.
    let metrics = dir.join("metrics.jsonl");
    let mut text = std::fs::read_to_string(&metrics).unwrap();
    text.push_str("{\"step\": 3, \"reward/me\n");
    std::fs::write(&metrics, &text).unwrap();
    let out = skein()
        .args(["doctor", "--json"])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let line = text.lines().count();
    assert!(
        err.contains(&format!(
            "1 unreadable metrics lines skipped (the first: metrics.jsonl:{line})"
        )),
        "{err}"
    );
}

/// The calculator agent after a warm-up too short to learn the call format: it writes tool
/// calls, about half of them malformed.
#[test]
fn an_agent_warmed_up_too_briefly_writes_malformed_tool_calls() {
    let (dir, err) = train(
        "tool-calls",
        &sets(&[
            "task.name=\"calculator\"",
            "sft.steps=150",
            "rollout.sampling.max_new_tokens=70",
            "trainer.steps=2",
        ]),
    );
    let d = diagnosed(&dir, &err, "tool-call-errors");
    only(&dir, &err, &["tool-call-errors"]);
    assert!(
        evidence(&d).contains("malformed tool calls per episode on steps 1–2"),
        "{d}"
    );
}
