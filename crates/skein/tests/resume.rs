//! A run killed with SIGKILL after a checkpoint and resumed with `skein train --resume`
//! continues exactly: every metric of the following steps equals, bit for bit, that of an
//! uninterrupted run with the same seed. The run uses partial rollout and a KL reference, so
//! the rollout buffer (paused samples), the optimizer moments, the task sampler and the
//! reference model all have to survive the checkpoint for this to hold.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CONFIG: &str = r#"
[run]
threads = 1
[model]
hidden_size = 64
num_layers = 2
num_heads = 2
num_kv_heads = 1
intermediate_size = 128
max_positions = 64
[task]
name = "reverse"
difficulty = 1
[sft]
steps = 5
batch_size = 16
[rollout]
prompts_per_step = 8
samples_per_prompt = 4
[rollout.sampling]
max_new_tokens = 20
[rollout.partial]
enabled = true
token_budget = 4
max_staleness = 4
[algorithm]
kl_coef = 0.01
[trainer]
steps = 8
checkpoint_every = 3
keep_last = 2
[eval]
problems = 16
every = 0
"#;

/// Metrics that must match exactly (timings and throughputs cannot).
const EXACT: &[&str] = &[
    "reward/mean",
    "loss/policy",
    "grad_norm",
    "entropy",
    "approx_kl",
    "kl_ref",
    "clip_frac",
    "tokens/generated",
    "tokens/trained",
    "partial/paused",
    "partial/resumed",
    "rollout/prefill_tokens",
    "staleness/max",
    "is/weight_mean",
    "policy_version",
];

fn run_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skein-resume-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn skein(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_skein"));
    c.args(args).stdout(Stdio::null()).stderr(Stdio::null());
    c
}

fn write_config(dir: &Path) -> String {
    let path = dir.join("in.toml");
    std::fs::write(&path, CONFIG).unwrap();
    path.display().to_string()
}

fn rl_steps(dir: &Path) -> Vec<serde_json::Map<String, Value>> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|v| v.as_object().cloned())
        .filter(|m| m.contains_key("rollout/trajectories"))
        .collect()
}

/// A whole run, and the same run killed (SIGKILL) after a checkpoint and resumed; `sets` are
/// extra `--set`s for both. Returns both directories and the step the resume started from.
fn whole_and_resumed(name: &str, sets: &[&str]) -> (PathBuf, PathBuf, usize) {
    let run = |dir: &Path| {
        let cfg = write_config(dir);
        let mut args = vec![
            "train".to_string(),
            "--config".into(),
            cfg,
            "--set".into(),
            format!("run.dir={}", dir.display()),
        ];
        for s in sets {
            args.extend(["--set".to_string(), s.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        skein(&args)
    };
    let whole = run_dir(&format!("{name}-whole"));
    assert!(run(&whole).status().unwrap().success());

    let cut = run_dir(&format!("{name}-cut"));
    let mut child = run(&cut).spawn().unwrap();
    let started = Instant::now();
    while !cut.join("checkpoint-3/trainer_state.json").exists() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no checkpoint-3"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before it could be killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // The kill may land after checkpoint-6 too: resume starts from the newest.
    let from = if cut.join("checkpoint-6/trainer_state.json").exists() {
        6
    } else {
        3
    };
    // What the run had logged up to its checkpoint: a resume keeps these lines as they are
    // (timings included), where a run started again from step 0 would write them anew.
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(cut.join(format!("checkpoint-{from}/trainer_state.json")))
            .unwrap(),
    )
    .unwrap();
    let kept = state["metrics_lines"].as_u64().expect("metrics_lines") as usize;
    let logged = |dir: &Path| -> Vec<String> {
        std::fs::read_to_string(dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .take(kept)
            .map(String::from)
            .collect()
    };
    let before = logged(&cut);
    assert_eq!(before.len(), kept, "the checkpoint's lines were written");
    let cut_str = cut.display().to_string();
    let out = skein(&["train", "--resume", &cut_str])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let checkpoint = cut.join(format!("checkpoint-{from}"));
    let resuming = format!(
        "skein: resuming from {} (step {from}, ",
        checkpoint.display()
    );
    assert!(stderr.contains(&resuming), "no `{resuming}` in:\n{stderr}");
    assert_eq!(
        logged(&cut),
        before,
        "the steps up to the checkpoint were logged again"
    );
    (whole, cut, from)
}

/// Every [`EXACT`] metric of every step is the same in both runs.
fn assert_same_steps(whole: &Path, cut: &Path) {
    let (a, b) = (rl_steps(whole), rl_steps(cut));
    assert_eq!(a.len(), 8);
    assert_eq!(
        b.len(),
        8,
        "metrics.jsonl keeps the checkpoint's steps and gets the rest once"
    );
    for (x, y) in a.iter().zip(&b) {
        for key in EXACT {
            // A figure of nothing is not logged (a partial-rollout step that finished no
            // group has no reward mean): then the resumed step must not log it either.
            assert_eq!(y.get(*key), x.get(*key), "step {}: `{key}`", x["step"]);
        }
    }
    // Not vacuous: every figure was logged, and compared, on most steps.
    for key in EXACT {
        let logged = a.iter().filter(|x| x.get(*key).is_some()).count();
        assert!(
            logged >= a.len() / 2,
            "`{key}` on {logged} of {} steps",
            a.len()
        );
    }
    // The resumed run names the same failure modes at the same steps: its doctor replays the
    // steps up to the checkpoint, and the diagnoses after it are found again, once.
    let diagnoses = |dir: &Path| std::fs::read_to_string(dir.join("diagnoses.jsonl")).unwrap();
    let want = diagnoses(whole);
    assert!(!want.is_empty(), "this run raises diagnoses to compare");
    assert_eq!(diagnoses(cut), want);
}

#[test]
fn a_killed_run_resumes_exactly() {
    let (whole, cut, from) = whole_and_resumed("full", &[]);
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(cut.join(format!("checkpoint-{from}/trainer_state.json")))
            .unwrap(),
    )
    .unwrap();
    let paused = state["buffer"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["samples"].as_array().unwrap())
        .filter(|s| s.get("Paused").is_some())
        .count();
    assert!(paused > 0, "the checkpoint should carry paused samples");
    assert_same_steps(&whole, &cut);
    let b = rl_steps(&cut);
    // The buffer came back: the first resumed step continued the checkpoint's paused samples.
    assert_eq!(b[from]["partial/resumed"], Value::from(paused as f64));
    // Each of them prefilled its context again: its prompt and the 4 or more ids it had (a
    // context that samples of a group share counts once, so at least 6 tokens per 4 of them).
    let prefilled = b[from]["rollout/prefill_tokens"].as_f64().unwrap();
    assert!(prefilled >= paused as f64, "{prefilled} tokens");
    // keep_last = 2: only the two newest numbered checkpoints remain.
    let numbered = std::fs::read_dir(&cut)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("checkpoint-")
        })
        .count();
    assert!(numbered <= 2, "{numbered} numbered checkpoints");
    let _ = std::fs::remove_dir_all(&whole);
    let _ = std::fs::remove_dir_all(&cut);
}

/// A LoRA run on a bfloat16 base resumes exactly too: the checkpoint's base and adapters
/// come back bit for bit, with the adapters' moments, and the reference is the base again.
#[test]
fn a_killed_lora_run_on_a_bfloat16_base_resumes_exactly() {
    let sets = ["lora.rank=4", "model.dtype=\"bfloat16\"", "optim.lr=1e-3"];
    let (whole, cut, from) = whole_and_resumed("lora", &sets);
    assert!(cut
        .join(format!(
            "checkpoint-{from}/adapter/adapter_model.safetensors"
        ))
        .is_file());
    assert_same_steps(&whole, &cut);
    // The frozen base is written once: the later checkpoints link the first's file.
    let base = |ckpt: &str| whole.join(ckpt).join("base/model.safetensors");
    assert_same_file(&base("checkpoint-3"), &base("checkpoint-6"));
    assert_same_file(&base("checkpoint-3"), &base("checkpoint"));
    // Each checkpoint holds it whole all the same.
    std::fs::remove_dir_all(whole.join("checkpoint-3")).unwrap();
    assert!(base("checkpoint-6").is_file() && base("checkpoint").is_file());
    let _ = std::fs::remove_dir_all(&whole);
    let _ = std::fs::remove_dir_all(&cut);
}

/// `a` and `b` are links to one file (not equal copies).
fn assert_same_file(a: &Path, b: &Path) {
    use std::os::unix::fs::MetadataExt;
    let (x, y) = (std::fs::metadata(a).unwrap(), std::fs::metadata(b).unwrap());
    assert_eq!(
        (x.dev(), x.ino()),
        (y.dev(), y.ino()),
        "{} and {} are separate files",
        a.display(),
        b.display()
    );
}

/// A run with a critic (GAE) resumes exactly: the critic's weights, its optimizer's moments
/// and its step count come back from the checkpoint, so its value loss and explained variance
/// after the resume are the uninterrupted run's.
#[test]
fn a_killed_run_with_a_critic_resumes_exactly() {
    let (whole, cut, from) = whole_and_resumed("gae", &["algorithm.estimator=\"gae\""]);
    assert!(cut
        .join(format!("checkpoint-{from}/critic_optimizer.safetensors"))
        .is_file());
    assert_same_steps(&whole, &cut);
    let (a, b) = (rl_steps(&whole), rl_steps(&cut));
    for key in ["loss/value", "value/explained_variance"] {
        let logged = a.iter().filter(|x| x.get(key).is_some()).count();
        assert!(logged >= a.len() / 2, "`{key}` on {logged} steps");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(y.get(key), x.get(key), "step {}: `{key}`", x["step"]);
        }
    }
    let _ = std::fs::remove_dir_all(&whole);
    let _ = std::fs::remove_dir_all(&cut);
}

/// A LoRA run of a loaded bfloat16 model, whose warm-up trains the adapters, resumes exactly:
/// RL goes on training the warm-up's adapters, unfolded, and the KL reference (the base with
/// a frozen copy of them) comes back from the checkpoint's `reference_adapter/`. Before the
/// checkpoint, the two runs agree because a loaded model's adapters are drawn from the seed.
#[test]
fn a_killed_lora_run_of_a_warmed_up_loaded_model_resumes_exactly() {
    let base = run_dir("loaded-base");
    let cfg = write_config(&base);
    let run_dir_set = format!("run.dir={}", base.display());
    let made = skein(&[
        "train",
        "--config",
        &cfg,
        "--set",
        &run_dir_set,
        "--set",
        "trainer.steps=0",
        "--set",
        "sft.steps=1",
    ])
    .status()
    .unwrap();
    assert!(made.success(), "the base model is written");
    let model = format!(
        "model.path={:?}",
        base.join("checkpoint").display().to_string()
    );
    let sets = [
        model.as_str(),
        "lora.rank=4",
        "model.dtype=\"bfloat16\"",
        "optim.lr=1e-3",
    ];
    let (whole, cut, from) = whole_and_resumed("lora-loaded", &sets);
    assert!(cut
        .join(format!(
            "checkpoint-{from}/reference_adapter/adapter_model.safetensors"
        ))
        .is_file());
    assert_same_steps(&whole, &cut);
    for dir in [&base, &whole, &cut] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A bfloat16 run training every weight resumes exactly: the optimizer's float32 master
/// weights come back with the moments, and the KL reference in bfloat16.
#[test]
fn a_killed_bfloat16_run_training_every_weight_resumes_exactly() {
    let (whole, cut, from) = whole_and_resumed("bf16", &["model.dtype=\"bfloat16\""]);
    let optimizer =
        std::fs::read(cut.join(format!("checkpoint-{from}/optimizer.safetensors"))).unwrap();
    let header = String::from_utf8_lossy(&optimizer[..optimizer.len().min(1 << 16)]);
    assert!(
        header.contains("\"w.model.embed_tokens.weight\""),
        "no masters saved"
    );
    assert_same_steps(&whole, &cut);
    // The frozen KL reference is written once and linked by the later checkpoint.
    let reference = |ckpt: &str| whole.join(ckpt).join("reference/model.safetensors");
    assert_same_file(&reference("checkpoint-3"), &reference("checkpoint-6"));
    let _ = std::fs::remove_dir_all(&whole);
    let _ = std::fs::remove_dir_all(&cut);
}

/// The first Ctrl-C lets the step finish, writes a resumable checkpoint of it and exits with
/// success; the run then continues from there.
#[test]
fn ctrl_c_checkpoints_the_finished_step_and_exits_cleanly() {
    signal_checkpoints_the_finished_step("INT");
}

/// SIGTERM, what a scheduler preempting a job sends before its kill, is a Ctrl-C.
#[test]
fn sigterm_checkpoints_the_finished_step_as_ctrl_c_does() {
    signal_checkpoints_the_finished_step("TERM");
}

/// `skein train` of a new run of [`CONFIG`] in `dir`, with `sets`.
fn new_run(dir: &Path, sets: &[&str]) -> Vec<String> {
    let mut args = vec!["train".to_string(), "--config".into(), write_config(dir)];
    let set_dir = format!("run.dir={}", dir.display());
    for set in [set_dir.as_str()].iter().chain(sets) {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args
}

fn send(child: &std::process::Child, signal: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

fn signal_checkpoints_the_finished_step(signal: &str) {
    let dir = run_dir(&format!("interrupt-{signal}"));
    let args = new_run(
        &dir,
        &[
            "trainer.steps=500",
            "trainer.checkpoint_every=0",
            // Without numbered checkpoints the file's `keep_last` would do nothing: refused.
            "trainer.keep_last=0",
        ],
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !dir.join("metrics.jsonl").exists() || rl_steps(&dir).len() < 2 {
        assert!(started.elapsed() < Duration::from_secs(300), "no RL step");
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    send(&child, signal);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "still running after SIG{signal}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let done = rl_steps(&dir).len();
    assert!((2..500).contains(&done));
    assert!(dir
        .join(format!("checkpoint-{done}/trainer_state.json"))
        .is_file());
    let dir_str = dir.display().to_string();
    let more = format!("trainer.steps={}", done + 1);
    let status = skein(&["train", "--resume", &dir_str, "--set", &more])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(rl_steps(&dir).len(), done + 1);
    let _ = std::fs::remove_dir_all(&dir);
}

fn run_with_stderr(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(args)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A finished run is not resumed without more steps (which would redo its final evaluation
/// and rewrite its files), and one trained further, then stopped before its new end, is
/// evaluated at its newest weights, not at the `checkpoint/` it finished with before.
#[test]
fn a_finished_run_is_kept_and_a_run_trained_past_it_is_evaluated_at_its_newest_step() {
    let dir = run_dir("finished");
    let args = new_run(
        &dir,
        &[
            "trainer.steps=2",
            "trainer.checkpoint_every=1",
            "trainer.keep_last=0",
        ],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, err) = run_with_stderr(&args);
    assert!(ok, "{err}");
    let files = ["metrics.jsonl", "config.toml", "plot.png"];
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let before: Vec<Vec<u8>> = files.iter().map(|f| read(f)).collect();

    let dir_str = dir.display().to_string();
    let (ok, err) = run_with_stderr(&["train", "--resume", &dir_str]);
    assert!(!ok && err.contains("finished at step 2"), "{err}");
    let after: Vec<Vec<u8>> = files.iter().map(|f| read(f)).collect();
    assert!(before == after, "a refused resume changed the run's files");

    // Trained further, and stopped by Ctrl-C after at least one more step.
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(["train", "--resume", &dir_str, "--set", "trainer.steps=500"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while rl_steps(&dir).len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no third step"
        );
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    send(&child, "INT");
    assert!(child.wait().unwrap().success());
    let done = rl_steps(&dir).len();
    assert!((3..500).contains(&done));

    let (ok, err) = run_with_stderr(&["eval", &dir_str, "--problems", "4"]);
    assert!(ok, "{err}");
    let newest = dir.join(format!("checkpoint-{done}"));
    assert!(
        err.contains(&format!(
            "holds step 2 and the run went on to step {done}: its newest weights are those of \
             step {done}; evaluating {}",
            newest.display()
        )),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
