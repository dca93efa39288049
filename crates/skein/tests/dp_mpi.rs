//! "The loss does not depend on parallelism", across processes: the default job's first RL
//! step, run by `skein train` alone (dp 1) and by two MPI processes (`mpirun -np 2`, dp 2: rank
//! 0 rolls out and plans, rank 1 receives its rows, gradients are reduced over MPI), must leave
//! the same policy, in every loss-aggregation mode, with different micro-batch token budgets and
//! with a padding row in the batch; and with several mini-batches per step, the MPI ranks must
//! give exactly what the in-process thread ranks give. `tests/dp_invariance.rs` runs the layout
//! check in-process for dp 1, 2 and 4 and shows that a rank-local token mean fails it.
//!
//! Tolerance, as there: AdamW with `lr = eps = 1` and no clipping passes a gradient difference
//! to the parameters at no more than its own size, so rounding (the ranks' f32 gradients summed
//! in another order) stays far below 1e-4 of the step (measured: about 1e-6), while a missing
//! or doubled rank's gradient moves parameters by a large fraction of it. That bound holds for
//! one optimizer step; a second mini-batch's gradient, taken after a step of size ~1, amplifies
//! the first step's rounding (dp 1 alone, at budgets 48 and 4096, then differs by ~1e-3 of the
//! step), so the layout check uses one mini-batch and the two-mini-batch check compares the two
//! backends on one layout, where nothing may differ at all. Every run samples the same rollout:
//! rank 0 does all sampling with the run's seed, whatever the number of ranks.
#![cfg(feature = "mpi")]

mod common;

use skein::model::{Model, ModelConfig};
use skein::trainer::update::optim::{OptimConfig, Optimizer};
use skein::trainer::update::ranks::mpi::{Command as RankCommand, MpiGroup, MpiRanks};
use skein::trainer::update::ranks::DataParallel;
use skein::trainer::update::ranks::{Job, PassSums, Ranks};
use skein::trainer::update::{mini_batch_step, serve_other_rank};
use skein_plan::LossAggMode;
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tch::{Device, Kind, Tensor};

const REL_TOL: f64 = 1e-4;

fn skein() -> &'static str {
    env!("CARGO_BIN_EXE_skein")
}

/// One RL step of a small default job; checkpoint-1 holds the policy after it and, as the KL
/// reference, the policy before it.
fn settings(dir: &Path, mode: LossAggMode, budget: usize, mini_batches: usize) -> Vec<String> {
    [
        "trainer.steps=1".to_string(),
        "trainer.checkpoint_every=1".into(),
        format!("trainer.num_mini_batches={mini_batches}"),
        format!("trainer.micro_batch_tokens={budget}"),
        format!("algorithm.loss_agg_mode=\"{mode}\""),
        "algorithm.kl_coef=0.01".into(),
        // small_run's 7 prompts x 3 samples = 21 rows: the plan pads them to a multiple of the
        // ranks and mini-batches.
        "optim.lr=1".into(),
        "optim.eps=1".into(),
        "optim.weight_decay=0".into(),
        "optim.grad_clip=0".into(),
        "optim.warmup_steps=0".into(),
        "optim.schedule=\"constant\"".into(),
    ]
    .into_iter()
    .chain(small_run(dir))
    .flat_map(|s| ["--set".to_string(), s])
    .collect()
}

/// Settings every run here shares: a small rollout, a short eval, one thread, its directory.
fn small_run(dir: &Path) -> Vec<String> {
    vec![
        "task.difficulty=1".into(),
        "sft.steps=25".into(),
        "sft.lr=2e-3".into(),
        // The warm-up's passes apart from the update's budget: every run starts RL from the
        // same policy, bit for bit.
        "sft.micro_batch_tokens=4096".into(),
        "rollout.prompts_per_step=7".into(),
        "rollout.samples_per_prompt=3".into(),
        "eval.problems=8".into(),
        "run.threads=1".into(),
        format!("run.dir=\"{}\"", dir.display()),
    ]
}

/// Runs `cmd` to success; its stderr.
fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{err}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
    );
    err
}

fn mpirun(np: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    // Root is refused unless confirmed twice; harmless for other users.
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "--oversubscribe",
            "--bind-to",
            "none",
            "-np",
            &np.to_string(),
        ]);
    cmd
}

fn flat(model: &Model) -> Vec<f32> {
    let mut vars: Vec<(String, Tensor)> = model.vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let parts: Vec<Tensor> = vars
        .iter()
        .map(|(_, t)| t.to_kind(Kind::Float).view([-1]))
        .collect();
    Vec::<f32>::try_from(Tensor::cat(&parts, 0)).expect("f32 parameters")
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .fold(0.0, f64::max)
}

fn load(dir: &Path) -> Vec<f32> {
    flat(&Model::load_dir(dir, Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", dir.display())))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skein-dp-mpi-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn mpi_dp2(dir: &Path, mode: LossAggMode, budget: usize, mini_batches: usize) -> String {
    run(
        mpirun(2)
            .args([skein(), "train"])
            .args(settings(dir, mode, budget, mini_batches))
            .args(["--set", "trainer.dp_backend=\"mpi\""])
            .args(["--set", "trainer.dp_size=2"]),
        "mpirun -np 2 skein train (dp 2)",
    )
}

#[test]
fn two_mpi_processes_take_the_same_step_as_one() {
    for mode in LossAggMode::ALL {
        let one = tmp(&format!("{mode}-dp1"));
        run(
            Command::new(skein())
                .arg("train")
                .args(settings(&one, mode, 4096, 1)),
            "skein train (dp 1)",
        );
        let two = tmp(&format!("{mode}-mpi2"));
        let err = mpi_dp2(&two, mode, 48, 1);
        // Both processes on this machine: the memory check counted both replicas.
        assert!(
            err.contains("data-parallel over MPI: 2 processes, 2 of them on this machine"),
            "{err}"
        );
        let start = load(&one.join("checkpoint-1/reference"));
        assert_eq!(start, load(&two.join("checkpoint-1/reference")), "{mode}");
        let want = load(&one.join("checkpoint-1"));
        let got = load(&two.join("checkpoint-1"));
        let moved = max_abs_diff(&want, &start);
        let diff = max_abs_diff(&got, &want);
        eprintln!("{mode}: step {moved:.3e}, dp 2 over MPI differs by {diff:.2e}");
        assert!(moved > 1e-3, "{mode}: the step barely moved ({moved:e})");
        assert!(
            diff <= REL_TOL * moved,
            "{mode}: dp 2 over MPI differs from dp 1 by {diff:e} (step {moved:e})"
        );

        let m = &common::step_metrics(&two)[0];
        let rows_max = m["dp/rows_per_rank_max"]
            .as_f64()
            .expect("dp/rows_per_rank_max");
        assert_eq!(m["dp/rows_per_rank_mean"].as_f64(), Some(rows_max), "{m}");
        assert!(m["batch/padding_rows"].as_f64().unwrap() > 0.0, "{m}");
        // Two processes' compute times never agree to the nanosecond.
        assert!(m["dp/allreduce_wait_s"].as_f64().unwrap() > 0.0, "{m}");
        for dir in [one, two] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Two steps of PPO with a critic (`gae`), two mini-batches each, with GAE per token and per
/// turn (whose value loss trains one position per turn, named by the rows sent to the ranks):
/// the MPI ranks' policy and critic match the thread ranks' byte for byte.
#[test]
fn mpi_ranks_give_exactly_what_thread_ranks_give() {
    for credit in ["trajectory", "turn"] {
        let settings = |dir: &Path| -> Vec<String> {
            [
                "trainer.steps=2".to_string(),
                "trainer.checkpoint_every=2".into(),
                "trainer.dp_size=2".into(),
                "algorithm.estimator=\"gae\"".into(),
                format!("algorithm.credit=\"{credit}\""),
            ]
            .into_iter()
            .chain(small_run(dir))
            .flat_map(|s| ["--set".to_string(), s])
            .collect()
        };
        let threads = tmp(&format!("threads2-{credit}"));
        run(
            Command::new(skein()).arg("train").args(settings(&threads)),
            &format!("skein train (dp 2 on threads, credit {credit})"),
        );
        let mpi = tmp(&format!("mpi2-gae-{credit}"));
        run(
            mpirun(2)
                .args([skein(), "train"])
                .args(settings(&mpi))
                .args(["--set", "trainer.dp_backend=\"mpi\""]),
            &format!("mpirun -np 2 skein train (dp 2, gae, credit {credit})"),
        );
        for file in ["model.safetensors", "critic.safetensors"] {
            let read = |dir: &Path| std::fs::read(dir.join("checkpoint-2").join(file)).unwrap();
            assert!(
                read(&threads) == read(&mpi),
                "{file} differs (credit {credit})"
            );
        }
        assert_eq!(common::step_metrics(&mpi).len(), 2);
        for dir in [threads, mpi] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[test]
fn a_job_with_the_wrong_number_of_processes_says_how_to_launch() {
    let dir = tmp("wrong-np");
    let out = mpirun(1)
        .args([skein(), "train", "--set", "trainer.dp_backend=\"mpi\""])
        .args(["--set", "trainer.dp_size=2"])
        .args(["--set", &format!("run.dir=\"{}\"", dir.display())])
        .output()
        .expect("mpirun starts");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("trainer.dp_size") && err.contains("mpirun -np 2"),
        "{err}"
    );
    assert!(
        !dir.join("metrics.jsonl").exists(),
        "nothing is written before the check"
    );
}

/// The replica check across processes: rank 1 changes its weights inside its first pass (as a
/// rank whose copy went wrong would compute), and rank 0's update fails, naming the rank and
/// mini-batch. This test binary runs itself under `mpirun`, one rank per process.
#[test]
fn an_mpi_rank_that_computes_with_other_weights_fails_the_update() {
    const NAME: &str = "an_mpi_rank_that_computes_with_other_weights_fails_the_update";
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() {
        return diverging_ranks();
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = mpirun(2)
        .arg(exe)
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .output()
        .expect("mpirun starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("rank 1 ran mini-batch 1 of 2"), "{stdout}");
}

/// One rank's side of the test above: two mini-batches of a loss of the weights alone.
fn diverging_ranks() {
    let group = Rc::new(MpiGroup::start(2).expect("two MPI processes"));
    // Both processes run on this machine, so each one's rank on it is its rank in the job.
    assert_eq!(group.local_rank(), group.rank());
    let cfg = ModelConfig::tiny_qwen2(16, 32, 1, 2, 2, 64, 32);
    let model = Model::random(&cfg, Device::Cpu, 5).expect("tiny model");
    let pass = |m: &Model, rows: &[usize], _: &mut PassSums| -> f64 {
        let parts: Vec<Tensor> =
            m.vs.trainable_variables()
                .iter()
                .map(|p| p.square().sum(Kind::Float))
                .collect();
        let loss = Tensor::stack(&parts, 0).sum(Kind::Float) * rows.len() as f64;
        loss.backward();
        loss.double_value(&[])
    };
    if group.rank() == 0 {
        let plan = vec![vec![vec![0], vec![1, 2]]; 2];
        let mut ranks = MpiRanks::new(group.clone());
        let mut opt = Optimizer::new(&model.vs, &OptimConfig::default(), 10).unwrap();
        let job = Job {
            rows: &[],
            plan: &plan,
            pass: Vec::new(),
        };
        ranks.begin(&model, &job).unwrap();
        for mini_batch in &plan {
            mini_batch_step(&model, &mut ranks, &mut opt, mini_batch, pass).unwrap();
        }
        let err = Ranks::<Model>::finish(&mut ranks, &model).expect_err("rank 1 diverged");
        println!("rank 0: {err}");
        return;
    }
    let (RankCommand::Update { plan, .. }, _) = group.receive_command().unwrap() else {
        panic!("rank 0 sends an update first");
    };
    let perturbed = Cell::new(false);
    group
        .serve_update(
            &model,
            &plan,
            1,
            |m: &Model, rows: &[usize], s: &mut PassSums| {
                if !perturbed.replace(true) {
                    tch::no_grad(|| {
                        for mut p in m.vs.trainable_variables() {
                            let _ = p.g_add_scalar_(1e-3);
                        }
                    });
                }
                pass(m, rows, s)
            },
        )
        .unwrap();
    let (stop, _) = group.receive_command().unwrap();
    assert!(matches!(stop, RankCommand::Stop));
}

/// A rank other than 0 that fails ends the whole job with its error printed, instead of
/// leaving rank 0 waiting forever inside a collective: here rank 0 sends an update whose pass
/// rank 1 cannot decode (and no models before it), then waits in the weights' broadcast that
/// rank 1 never joins. The job must end, fail, and say which rank failed and why, within a
/// minute; a rank 1 that returned its error instead of aborting would hang it.
#[test]
fn a_failing_mpi_rank_stops_every_rank_with_its_error() {
    const NAME: &str = "a_failing_mpi_rank_stops_every_rank_with_its_error";
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() {
        return failing_rank();
    }
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = mpirun(2)
        .arg(exe)
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mpirun starts");
    let started = Instant::now();
    while child.try_wait().expect("mpirun runs").is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the job still runs a minute after rank 1 failed: rank 0 was left waiting");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("mpirun's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("skein: error on rank 1: decoding the update from rank 0")
            && stderr.contains("stopping every rank"),
        "{stderr}"
    );
    assert!(!stdout.contains("rank 0 went on"), "{stdout}");
}

/// One rank's side of the test above.
fn failing_rank() {
    let group = Rc::new(MpiGroup::start(2).expect("two MPI processes"));
    if group.rank() != 0 {
        let served = serve_other_rank(&DataParallel::Mpi(group), Device::Cpu);
        panic!("a failing rank aborts the job rather than return: {served:?}");
    }
    let cfg = ModelConfig::tiny_qwen2(16, 32, 1, 2, 2, 64, 32);
    let model = Model::random(&cfg, Device::Cpu, 5).expect("tiny model");
    let plan = vec![vec![vec![0], vec![1]]];
    let job = Job {
        rows: &[],
        plan: &plan,
        pass: b"not a pass".to_vec(),
    };
    let mut ranks = MpiRanks::new(group);
    let begun = ranks.begin(&model, &job);
    println!("rank 0 went on: {begun:?}");
}
