//! A finished run's directory is never damaged: a second run refuses it (and `--overwrite`
//! replaces it on purpose), a resume falls back from a damaged checkpoint to the newest intact
//! one and, when none is intact, changes nothing, and paths the run cannot write stop it before
//! the first step. Every case runs the real `skein` binary.

mod common;

use common::TINY_RUN;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Two steps of a tiny run, a checkpoint after each.
const SMALL: &[&str] = &[
    "sft.steps=2",
    "sft.batch_size=8",
    "rollout.prompts_per_step=4",
    "rollout.samples_per_prompt=2",
    "trainer.steps=2",
    "trainer.checkpoint_every=1",
    "eval.problems=4",
];

fn workdir(name: &str) -> PathBuf {
    common::workdir("run-dir", name)
}

/// `skein train ARGS...` with the small run's settings and `extra` ones in `dir`.
fn train_command(dir: &Path, args: &[&str], extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_skein"));
    cmd.arg("train").args(args);
    let run_dir = format!("run.dir=\"{}\"", dir.display());
    for s in TINY_RUN.iter().chain(SMALL).chain(extra).copied() {
        cmd.args(["--set", s]);
    }
    if !args.contains(&"--resume") {
        cmd.args(["--set", &run_dir]);
    }
    cmd
}

/// [`train_command`], started in the background with its stderr dropped.
fn spawn_train(dir: &Path, args: &[&str], extra: &[&str]) -> std::process::Child {
    train_command(dir, args, extra)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("skein runs")
}

/// [`train_command`], run to its end; exit code and stderr.
fn skein_train(dir: &Path, args: &[&str], extra: &[&str]) -> (i32, String) {
    let out = train_command(dir, args, extra)
        .output()
        .expect("skein runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Every file below `dir`, with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

#[test]
fn a_second_run_refuses_a_finished_run_and_overwrite_replaces_it() {
    let dir = workdir("second");
    let (code, err) = skein_train(&dir, &[], &[]);
    assert_eq!(code, 0, "{err}");
    let finished = snapshot(&dir);
    assert!(finished.contains_key(&dir.join("checkpoint-2/trainer_state.json")));

    // A second run, and one that would fail at once on a bad model: both refused, nothing
    // changed.
    let (code, err) = skein_train(&dir, &[], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("`run.dir`") && err.contains("--resume") && err.contains("--overwrite"),
        "{err}"
    );
    assert!(
        snapshot(&dir) == finished,
        "a refused run changed {}",
        dir.display()
    );
    let (code, err) = skein_train(&dir, &[], &["model.path=\"/nonexistent/model\""]);
    assert_eq!(code, 2, "{err}");
    assert!(
        snapshot(&dir) == finished,
        "a failed run changed {}",
        dir.display()
    );
    // An --overwrite that fails before the first step (here the memory preflight, after
    // validation) removes nothing either.
    let huge = ["rollout.prompts_per_step=1000000000000"];
    let (code, err) = skein_train(&dir, &["--overwrite"], &huge);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("removing the previous run"), "{err}");
    assert!(
        snapshot(&dir) == finished,
        "a failed --overwrite changed {}",
        dir.display()
    );

    // An --overwrite that fails after it started writing (a warm-up that diverges) puts the
    // previous run back, byte for byte; only run.lock names its last owner.
    let without_lock = |s: BTreeMap<PathBuf, Vec<u8>>| -> BTreeMap<PathBuf, Vec<u8>> {
        s.into_iter()
            .filter(|(p, _)| !p.ends_with("run.lock"))
            .collect()
    };
    let (code, err) = skein_train(&dir, &["--overwrite"], &["sft.lr=1e30", "sft.steps=4"]);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("wait in") && err.contains("previous run is back"),
        "{err}"
    );
    assert!(
        without_lock(snapshot(&dir)) == without_lock(finished.clone()),
        "a failed --overwrite lost the previous run in {}: {err}",
        dir.display()
    );
    // A process killed after it set the previous run aside leaves it there, and the next run
    // refuses to start until it is put back or removed: nothing is lost.
    std::fs::create_dir(dir.join(".replaced")).unwrap();
    std::fs::write(dir.join(".replaced/metrics.jsonl"), "{\"step\":1}\n").unwrap();
    let (code, err) = skein_train(&dir, &["--overwrite"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("interrupted --overwrite"), "{err}");
    // A resume too: it would go on from one of the two runs while the other waits there.
    let before = snapshot(&dir);
    let (code, err) = skein_train(&dir, &["--resume", dir.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("interrupted --overwrite"), "{err}");
    assert!(without_lock(snapshot(&dir)) == without_lock(before));
    // Emptied by hand, as the advice says (its files moved back), it is nothing left: the
    // run below goes ahead.
    std::fs::remove_file(dir.join(".replaced/metrics.jsonl")).unwrap();

    // --overwrite replaces the run: the old numbered checkpoints go too.
    let (code, err) = skein_train(&dir, &["--overwrite"], &["trainer.checkpoint_every=0"]);
    assert_eq!(code, 0, "{err}");
    assert!(!dir.join("checkpoint-1").exists() && !dir.join("checkpoint-2").exists());
    assert!(dir.join("checkpoint/model.safetensors").is_file());
    assert!(
        !dir.join(".replaced").exists(),
        "the replaced run is gone once kept"
    );
}

/// A run's directory has one owner: while a run is in progress, a second run, an overwrite
/// and a resume in its directory are all refused, naming the process; once that process is
/// gone (killed, here), the directory is free again.
/// A run that fails as it starts (here its environment worker crashes on every step of the
/// warm-up's demonstrations) leaves its config and an empty log. That holds nothing to lose:
/// the next run in the directory replaces it without --overwrite, and says so.
#[test]
fn a_run_that_failed_before_logging_anything_is_replaced_without_overwrite() {
    let dir = workdir("failed-at-start");
    let python = common::python_with("json").unwrap_or_else(|| "python3".into());
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/env_worker_example.py"
    );
    let command = format!("agent.command=[{python:?}, {script:?}, \"--crash-every\", \"1\"]");
    let crashing = [
        "agent.kind=\"env-worker\"",
        &command,
        "agent.workers=1",
        "sft.steps=2",
    ];
    let (code, err) = skein_train(&dir, &[], &crashing);
    assert_eq!(code, 2, "{err}");
    let metrics = std::fs::metadata(dir.join("metrics.jsonl")).map(|m| m.len());
    assert!(
        dir.join("config.toml").is_file() && metrics.ok() == Some(0),
        "expected the files of a run that logged nothing: {err}"
    );
    let (code, err) = skein_train(&dir, &[], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("stopped before it logged anything"), "{err}");
    // A run that logged something is still refused.
    let (code, err) = skein_train(&dir, &[], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("holds another run"), "{err}");
}

#[test]
fn a_second_process_is_refused_while_a_run_owns_the_directory() {
    let dir = workdir("owned");
    let mut first = spawn_train(&dir, &[], &["trainer.steps=100000"]);
    let pid = first.id().to_string();
    // The owner names itself once it starts writing, and checkpoint-1 follows its first step.
    let started = std::time::Instant::now();
    while !dir.join("checkpoint-1/trainer_state.json").exists() {
        assert!(
            started.elapsed().as_secs() < 120,
            "the first run wrote no checkpoint"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let owner = std::fs::read_to_string(dir.join("run.lock")).unwrap();
    assert!(owner.contains(&pid), "{owner}");
    let resume = ["--resume", dir.to_str().unwrap()];
    for args in [&[][..], &["--overwrite"], &resume] {
        let (code, err) = skein_train(&dir, args, &[]);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("is in use by skein process") && err.contains(&pid),
            "{args:?}: {err}"
        );
    }
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first run goes on undisturbed"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    // The lock died with its process: the directory is free for another run now.
    let (code, err) = skein_train(&dir, &["--overwrite"], &[]);
    assert_eq!(code, 0, "{err}");
}

/// A run `--overwrite` replaces waits whole in `.replaced/` while the new run trains, its
/// diagnoses included: a process killed then leaves every file of it to move back.
#[test]
fn a_killed_overwrite_leaves_the_whole_previous_run_set_aside() {
    let dir = workdir("killed-overwrite");
    let (code, err) = skein_train(&dir, &[], &[]);
    assert_eq!(code, 0, "{err}");
    // A finished run that named a failure mode while it trained.
    let diagnosis = "{\"step\":2,\"name\":\"entropy-collapse\"}\n";
    std::fs::write(dir.join("diagnoses.jsonl"), diagnosis).unwrap();
    let finished: BTreeMap<PathBuf, Vec<u8>> = snapshot(&dir)
        .into_iter()
        .filter(|(p, _)| !p.ends_with("run.lock"))
        .collect();

    let long = ["trainer.steps=100000", "trainer.checkpoint_every=0"];
    let mut second = spawn_train(&dir, &["--overwrite"], &long);
    // Killed once it has logged an RL step: past every file it opens before its first step.
    let started = std::time::Instant::now();
    let logged_a_step = || {
        dir.join(".replaced/metrics.jsonl").exists()
            && std::fs::read_to_string(dir.join("metrics.jsonl"))
                .is_ok_and(|m| m.contains("\"rollout/trajectories\""))
    };
    while !logged_a_step() {
        assert!(
            started.elapsed().as_secs() < 120,
            "the second run logged no step"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    second.kill().unwrap();
    second.wait().unwrap();

    let set_aside = dir.join(".replaced");
    for (path, bytes) in &finished {
        let name = path.strip_prefix(&dir).unwrap();
        let kept = std::fs::read(set_aside.join(name))
            .unwrap_or_else(|e| panic!("{} is not set aside: {e}", name.display()));
        assert!(&kept == bytes, "{} changed", name.display());
    }
}

/// A resume cannot relabel a run's steps: fewer steps than its checkpoint has are refused
/// with nothing changed, and records missing from metrics.jsonl are reported.
#[test]
fn a_resume_refuses_fewer_steps_and_reports_missing_records() {
    let dir = workdir("resume-steps");
    let (code, err) = skein_train(&dir, &[], &[]);
    assert_eq!(code, 0, "{err}");
    let finished = snapshot(&dir);
    let resume = ["--resume", dir.to_str().unwrap()];
    let (code, err) = skein_train(&dir, &resume, &["trainer.steps=1"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("`trainer.steps` = 1") && err.contains("2 steps"),
        "{err}"
    );
    assert!(
        snapshot(&dir) == finished,
        "a refused resume changed the run"
    );
    // A path that is not a run says so, not which file it lacks.
    let empty = workdir("resume-empty");
    std::fs::create_dir_all(&empty).unwrap();
    for (path, says) in [
        (empty.join("nope"), "is not a directory"),
        (empty.clone(), "holds no run (no config.toml)"),
    ] {
        let (code, err) = skein_train(&dir, &["--resume", path.to_str().unwrap()], &[]);
        assert_ne!(code, 0, "{err}");
        assert!(
            err.contains("nothing to resume") && err.contains(says),
            "{err}"
        );
    }

    // Records deleted by hand: the resume goes on and says so.
    let metrics = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&metrics, lines[..lines.len() - 2].join("\n") + "\n").unwrap();
    let (code, err) = skein_train(&dir, &resume, &["trainer.steps=3"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("were removed since"), "{err}");
    assert!(
        !err.contains("stretches"),
        "a constant rate has no schedule to stretch: {err}"
    );
}

/// A resume that fails before its first step is written (here its remote engine cannot be
/// reached) leaves the finished run's records, diagnoses, trajectories and config as they
/// were: a resume cuts them back to its checkpoint only when it has a step to write.
#[test]
fn a_resume_that_fails_before_its_first_step_changes_no_record() {
    let dir = workdir("resume-fails");
    let (code, err) = skein_train(&dir, &[], &[]);
    assert_eq!(code, 0, "{err}");
    let results = |dir: &Path| {
        let mut files = snapshot(dir);
        files.retain(|p, _| {
            let name = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            name != "run.lock" && !name.starts_with("published")
        });
        files
    };
    let resume = ["--resume", dir.to_str().unwrap()];
    // The resume with `sets` fails, saying `says`, and leaves every file as it found it.
    let refused_unchanged = |sets: &[&str], says: &str| {
        let before = results(&dir);
        let (code, err) = skein_train(&dir, &resume, sets);
        assert_ne!(code, 0, "{err}");
        assert!(err.contains(says), "{err}");
        assert!(
            results(&dir) == before,
            "a failed resume changed the run's files"
        );
    };
    let unreachable = [
        "trainer.steps=3",
        "rollout.engine=\"remote\"",
        "rollout.remote.url=\"http://127.0.0.1:9\"",
    ];
    refused_unchanged(&unreachable, "rollout.remote");
    // A diagnoses.jsonl line it could not write back is refused before the first step too.
    let diagnoses = dir.join("diagnoses.jsonl");
    let kept = std::fs::read(&diagnoses).unwrap();
    std::fs::write(&diagnoses, [kept.as_slice(), b"{\"name\": 1}\n"].concat()).unwrap();
    refused_unchanged(&["trainer.steps=3"], "diagnoses.jsonl:");
    std::fs::write(&diagnoses, kept).unwrap();
    // So is a metrics.jsonl the resume could not cut back: missing, or, with TensorBoard
    // events to rebuild from it, with a line that does not parse.
    let metrics = dir.join("metrics.jsonl");
    let records = std::fs::read(&metrics).unwrap();
    std::fs::remove_file(&metrics).unwrap();
    refused_unchanged(&["trainer.steps=3"], "metrics.jsonl is missing");
    let first = records.iter().position(|&b| b == b'\n').unwrap() + 1;
    let broken = [&records[..first], b"not json\n", &records[first..]].concat();
    std::fs::write(&metrics, broken).unwrap();
    let tensorboard = [
        "trainer.steps=3",
        "run.tracking=[\"jsonl\", \"tensorboard\"]",
    ];
    refused_unchanged(&tensorboard, "metrics.jsonl:2");
    std::fs::write(&metrics, records).unwrap();
    // The same resume that can run cuts them back and goes on.
    let (code, err) = skein_train(&dir, &resume, &["trainer.steps=3"]);
    assert_eq!(code, 0, "{err}");
}

/// Going further than planned under a cosine schedule restarts its decay part way: the
/// resume says so, with both rates, before its first step.
#[test]
fn a_resume_past_the_plan_names_the_learning_rate_it_jumps_to() {
    let dir = workdir("resume-cosine");
    let cosine = ["optim.schedule=\"cosine\"", "optim.min_lr_ratio=0.1"];
    let (code, err) = skein_train(&dir, &[], &cosine);
    assert_eq!(code, 0, "{err}");
    let resume = ["--resume", dir.to_str().unwrap()];
    let (code, err) = skein_train(&dir, &resume, &["trainer.steps=4"]);
    assert_eq!(code, 0, "{err}");
    // Step 3 of 2 is past the end (0.1 × lr); of 4, half way down (0.55 × lr).
    assert!(
        err.contains("`trainer.steps` goes from 2 to 4") && err.contains("(5.50×"),
        "{err}"
    );
}

#[test]
fn a_resume_falls_back_from_a_damaged_checkpoint_and_changes_nothing_without_one() {
    let dir = workdir("resume");
    let (code, err) = skein_train(&dir, &[], &[]);
    assert_eq!(code, 0, "{err}");
    let resume = ["--resume", dir.to_str().unwrap()];

    // The newest checkpoint's optimizer state is damaged: the resume says so and continues
    // from checkpoint-1, redoing step 2.
    std::fs::write(
        dir.join("checkpoint-2/optimizer.safetensors"),
        b"not tensors",
    )
    .unwrap();
    let (code, err) = skein_train(&dir, &resume, &["trainer.steps=3"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("checkpoint-2 cannot be resumed") && err.contains("optimizer.safetensors"),
        "{err}"
    );
    assert!(err.contains("checkpoint-1 instead"), "{err}");

    // No intact checkpoint: an error, and the run's files stay as they were.
    for n in 1..=3 {
        let p = dir.join(format!("checkpoint-{n}/optimizer.safetensors"));
        if p.exists() {
            std::fs::write(&p, b"not tensors").unwrap();
        }
    }
    let before = snapshot(&dir);
    let (code, err) = skein_train(&dir, &resume, &["trainer.steps=4"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("no checkpoint in") && err.contains("can be resumed"),
        "{err}"
    );
    assert!(
        snapshot(&dir) == before,
        "a failed resume changed {}",
        dir.display()
    );
}

/// A checkpoint that lost a part it was written with (its KL reference), or its state file,
/// is damage: reported, and the resume falls back, rather than going on without a reference
/// or passing over the newest checkpoint in silence.
#[test]
fn a_checkpoint_missing_a_part_or_its_state_is_reported_as_damaged() {
    let dir = workdir("resume-parts");
    let (code, err) = skein_train(&dir, &[], &["algorithm.kl_coef=0.01"]);
    assert_eq!(code, 0, "{err}");
    let resume = ["--resume", dir.to_str().unwrap()];
    // What is lost, the steps the resume goes to, and what it must say.
    let cases = [
        (
            "checkpoint-2/reference",
            "trainer.steps=3",
            [
                "checkpoint-2 cannot be resumed",
                "reference is missing",
                "checkpoint-1 instead",
            ],
        ),
        (
            "checkpoint-3/trainer_state.json",
            "trainer.steps=4",
            [
                "checkpoint-3 cannot be resumed",
                "trainer_state.json",
                "checkpoint-2 instead",
            ],
        ),
    ];
    for (lost, steps, says) in cases {
        let lost = dir.join(lost);
        match lost.is_dir() {
            true => std::fs::remove_dir_all(&lost).unwrap(),
            false => std::fs::remove_file(&lost).unwrap(),
        }
        let (code, err) = skein_train(&dir, &resume, &[steps]);
        assert_eq!(code, 0, "{err}");
        for s in says {
            assert!(err.contains(s), "{s}: {err}");
        }
    }
}

#[test]
fn a_resume_that_needs_a_model_the_checkpoint_lacks_names_it() {
    let dir = workdir("critic");
    let (code, err) = skein_train(&dir, &[], &[]);
    assert_eq!(code, 0, "{err}");
    let before = snapshot(&dir);
    let resume = ["--resume", dir.to_str().unwrap()];
    // Given more steps: a finished run resumed for none would be refused for that.
    let (code, err) = skein_train(
        &dir,
        &resume,
        &["algorithm.estimator=\"gae\"", "trainer.steps=3"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("has no critic"), "{err}");
    assert!(
        snapshot(&dir) == before,
        "a failed resume changed {}",
        dir.display()
    );
}

#[test]
fn paths_the_run_cannot_write_stop_it_before_the_first_step() {
    let dir = workdir("outputs");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("checkpoint"), b"a file where the model goes").unwrap();
    let (code, err) = skein_train(&dir, &[], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("checkpoint is a file"), "{err}");
    assert!(!dir.join("metrics.jsonl").exists(), "it started anyway");

    let dir = workdir("plot");
    std::fs::create_dir_all(dir.join("plot.png")).unwrap();
    let (code, err) = skein_train(&dir, &[], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("plot.png is a directory"), "{err}");
    assert!(!dir.join("metrics.jsonl").exists(), "it started anyway");

    let (code, err) = skein_train(Path::new(""), &[], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`run.dir` is empty"), "{err}");
}

#[test]
fn a_resume_that_changes_the_model_task_data_or_seed_is_refused_and_changes_nothing() {
    let dir = workdir("fixed");
    let (code, err) = skein_train(&dir, &[], &[]);
    assert_eq!(code, 0, "{err}");
    let before = snapshot(&dir);
    let resume = ["--resume", dir.to_str().unwrap()];
    for (set, key) in [
        ("model.hidden_size=64", "`model.hidden_size`"),
        ("task.difficulty=3", "`task.difficulty`"),
        ("data.max_prompt_tokens=8", "`data.max_prompt_tokens`"),
        ("data.train_files=[\"moved.jsonl\"]", "`data.train_files`"),
        ("run.seed=7", "`run.seed`"),
    ] {
        let (code, err) = skein_train(&dir, &resume, &[set]);
        assert_eq!(code, 2, "{set}: {err}");
        assert!(err.contains(key) && err.contains("cannot change"), "{err}");
        // The run had no data files: a dataset now is no move, and no path is to correct.
        assert!(!err.contains("correct the paths"), "{err}");
    }
    assert!(snapshot(&dir) == before, "a refused resume changed the run");
}

/// `model.max_positions` in a run's config.toml.
fn recorded_positions(dir: &Path) -> i64 {
    let text = std::fs::read_to_string(dir.join("config.toml")).unwrap();
    let config: toml::Value = toml::from_str(&text).unwrap();
    config["model"]["max_positions"].as_integer().unwrap()
}

/// config.toml records the context the model is built with: the multi-turn minimum a
/// from-scratch `guess` model is raised to, or a loaded model's own, not the 64 asked for. A
/// resume from the original config, which asks for 64 still, is the same model and goes on.
#[test]
fn config_toml_records_the_context_the_model_is_built_with() {
    let dir = workdir("positions");
    let guess = ["task.name=\"guess\"", "task.difficulty=1"];
    let (code, err) = skein_train(&dir, &[], &guess);
    assert_eq!(code, 0, "{err}");
    assert_eq!(recorded_positions(&dir), 256);

    let empty = dir.join("original.toml");
    std::fs::write(&empty, "").unwrap();
    let (resume, config) = (dir.to_str().unwrap(), empty.to_str().unwrap());
    let args = ["--resume", resume, "--config", config];
    let (code, err) = skein_train(&dir, &args, &[&guess[..], &["trainer.steps=3"]].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(recorded_positions(&dir), 256);

    let loaded = workdir("positions-loaded");
    let model = format!("model.path=\"{}\"", dir.join("checkpoint").display());
    let extra = [&guess[..], &[&model, "sft.steps=0", "trainer.steps=0"]].concat();
    let (code, err) = skein_train(&loaded, &[], &extra);
    assert_eq!(code, 0, "{err}");
    assert_eq!(recorded_positions(&loaded), 256);
}

/// The benches that train several runs check every run directory before the first run: a
/// finished run in the last one is refused without `--overwrite`, and the first run never
/// starts.
#[test]
fn benches_refuse_a_finished_run_before_their_first_run() {
    for (bench, first, last) in [
        ("bench-partial", "sync", "partial"),
        ("bench-agents", "calculator", "guess-turn"),
    ] {
        let out = workdir(bench);
        std::fs::create_dir_all(out.join(last)).unwrap();
        std::fs::write(out.join(last).join("config.toml"), "# a finished run\n").unwrap();
        std::fs::write(out.join(last).join("metrics.jsonl"), "{\"step\":1}\n").unwrap();
        let finished = snapshot(&out);
        let run = Command::new(env!("CARGO_BIN_EXE_skein"))
            .args([bench, "--out", out.to_str().unwrap()])
            .output()
            .expect("skein runs");
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{bench}: {err}");
        assert!(
            err.contains(last) && err.contains("holds another run") && err.contains("--overwrite"),
            "{bench}: {err}"
        );
        assert!(!out.join(first).exists(), "{bench} started its first run");
        assert!(
            snapshot(&out) == finished,
            "{bench} changed {}",
            out.display()
        );
    }
}

/// The same benches check every run's config before the first run, and refuse a `--set` of a
/// key they set themselves: the first run never starts.
#[test]
fn benches_refuse_a_config_their_last_run_cannot_use_before_their_first_run() {
    for (bench, first, args, named) in [
        (
            "bench-partial",
            "sync",
            &["--max-staleness", "1"][..],
            "`rollout.partial.max_staleness`",
        ),
        (
            "bench-partial",
            "sync",
            &["--set", "rollout.partial.token_budget=4"][..],
            "--budget",
        ),
        (
            "bench-agents",
            "calculator",
            &["--set", "algorithm.estimator=\"gae\""][..],
            "`algorithm.step_group_weight`",
        ),
        (
            "bench-agents",
            "calculator",
            &["--set", "run.dir=\"x\""][..],
            "--out",
        ),
        // Keys the benches' own flags or run names stand for.
        (
            "bench-partial",
            "sync",
            &["--set", "trainer.steps=3"][..],
            "--steps",
        ),
        (
            "bench-partial",
            "sync",
            &["--set", "task.difficulty=1"][..],
            "--difficulty",
        ),
        (
            "bench-agents",
            "guess-trajectory",
            &["--runs", "guess", "--set", "algorithm.credit=\"turn\""][..],
            "both credit modes",
        ),
    ] {
        let out = workdir(&format!("{bench}-config"));
        let run = Command::new(env!("CARGO_BIN_EXE_skein"))
            .args([bench, "--out", out.to_str().unwrap()])
            .args(args)
            .output()
            .expect("skein runs");
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{bench} {args:?}: {err}");
        assert!(err.contains(named), "{bench} {args:?}: {err}");
        assert!(!out.join(first).exists(), "{bench} started its first run");
    }
}

/// An overlay of several runs is written only to a `.png` path: a slip of `--out` cannot
/// replace a run's config or metrics with an image; one run's figure goes to `--out` too, and
/// a `--keys` metric no run has is said rather than left out without a word.
#[test]
fn an_overlay_never_writes_over_a_runs_files() {
    let root = workdir("overlay");
    let runs: Vec<PathBuf> = ["a", "b"].iter().map(|n| root.join(n)).collect();
    for run in &runs {
        std::fs::create_dir_all(run).unwrap();
        std::fs::write(run.join("config.toml"), "# the run's config\n").unwrap();
        let metrics = "{\"step\":1,\"reward/mean\":0.25}\n{\"step\":2,\"reward/mean\":0.5}\n";
        std::fs::write(run.join("metrics.jsonl"), metrics).unwrap();
    }
    let before = snapshot(&root);
    let plot = |out: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_skein"))
            .arg("plot")
            .args(&runs)
            .arg("--out")
            .arg(out)
            .output()
            .expect("skein runs");
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, err) = plot(&runs[0].join("config.toml"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--out") && err.contains(".png"), "{err}");
    assert!(snapshot(&root) == before, "a refused overlay changed a run");
    let (code, err) = plot(&root.join("overlay.png"));
    assert_eq!(code, Some(0), "{err}");
    assert!(root.join("overlay.png").is_file());
    // One run with `--out`: the figure goes there, and the run's own files stay as they were.
    let before = snapshot(&runs[0]);
    let o = Command::new(env!("CARGO_BIN_EXE_skein"))
        .arg("plot")
        .arg(&runs[0])
        .args(["--keys", "reward/mean", "--out"])
        .arg(root.join("a-reward.png"))
        .output()
        .expect("skein runs");
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(root.join("a-reward.png").is_file());
    assert!(snapshot(&runs[0]) == before, "--out wrote into the run");
    assert!(o.stderr.is_empty(), "{o:?}");
    // A misspelt key is said, with the keys there are; the others are drawn.
    let o = Command::new(env!("CARGO_BIN_EXE_skein"))
        .arg("plot")
        .arg(&runs[0])
        .args(["--keys", "reward/mean,rewrd/mean", "--out"])
        .arg(root.join("a-typo.png"))
        .output()
        .expect("skein runs");
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no record has a value of `rewrd/mean`") && err.contains("reward/mean"),
        "{err}"
    );
}

/// The commands that read a run (plot, doctor, view) say what a path that is not one is: a
/// missing path, a file, a model directory, a run that has logged nothing yet.
#[test]
fn commands_that_read_a_run_name_what_a_non_run_is() {
    let root = workdir("non-runs");
    std::fs::create_dir_all(root.join("model")).unwrap();
    std::fs::write(root.join("model/config.json"), "{}").unwrap();
    std::fs::create_dir_all(root.join("fresh")).unwrap();
    std::fs::write(root.join("fresh/config.toml"), "").unwrap();
    std::fs::write(root.join("a-file"), "x").unwrap();
    for (path, says) in [
        ("missing", "does not exist"),
        ("a-file", "is a file"),
        ("model", "skein eval"),
        ("fresh", "logged nothing yet"),
    ] {
        for command in ["plot", "doctor", "view"] {
            let o = Command::new(env!("CARGO_BIN_EXE_skein"))
                .arg(command)
                .arg(root.join(path))
                .args(if command == "view" {
                    &["--port", "0"][..]
                } else {
                    &[]
                })
                .output()
                .expect("skein runs");
            let err = String::from_utf8_lossy(&o.stderr);
            assert_ne!(o.status.code(), Some(0), "{command} {path}: {err}");
            assert!(err.contains(says), "{command} {path}: {err}");
        }
    }
    std::fs::remove_dir_all(&root).ok();
}
