//! `skein bench memory`: one GRPO update step (forward, backward and AdamW over the trainable
//! weights, through the trainer's own `mini_batch_step` and `rank_pass`) on a model of real
//! shape, in five setups: full float32 fine-tuning, full bfloat16 (float32 master weights),
//! LoRA, LoRA on a bfloat16 base, and that with activation checkpointing. Each setup runs in a child process of its own, so the peak
//! resident memory it reports (VmHWM) is that setup's alone; beside it stands the trainer's
//! preflight estimate of the same update, from the same functions, so the estimate's error
//! is measured rather than guessed.
//!
//! `--device cuda` runs the same on a GPU: there the peak is the GPU memory in use after the
//! steps (the CUDA context and what libtorch's caching allocator reserved, which it keeps:
//! its peak), read from the driver ([`crate::gpu_memory`]), and the start is that once CUDA is
//! up, before the model. Each setup fixes its own dtype, so the bench has no `--dtype`.

use super::bench_args::{at_least_one, median, synchronize};
use crate::model::{Dtype, LoraConfig, Model, ModelConfig, ModelOptions};
use crate::trainer::batch::TrainRow;
use crate::trainer::config::Batching;
use crate::trainer::preflight::{self, UpdateShape};
use crate::trainer::update::optim::{OptimConfig, Optimizer};
use crate::trainer::update::policy_loss::LossConfig;
use crate::trainer::update::ranks::Replicas;
use crate::trainer::update::{mini_batch_step, rank_pass, UpdateConfig};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::process::{Command, Stdio};
use std::time::Instant;
use tch::Device;

const MIB: f64 = 1024.0 * 1024.0;

/// Positions of the tiny shape: `--tokens` up to it.
const TINY_POSITIONS: usize = 1024;

/// Tokens of all sequences together: their rows are built up front, and far more than any
/// measurement needs.
const MAX_TOKENS: usize = 1 << 24;

#[derive(clap::Args, Debug, Clone)]
pub struct MemoryBenchArgs {
    /// The model: Qwen2.5-0.5B's configuration with random weights, or a tiny one that runs
    /// all five setups in seconds (for tests).
    #[arg(long, value_enum, default_value_t = Shape::Qwen2_5_0_5b)]
    shape: Shape,
    /// A model's shape from its Hugging Face directory (`config.json`) instead of `--shape`,
    /// e.g. a pretrained model with a real vocabulary (random weights: the memory of an
    /// update does not depend on their values).
    #[arg(long, value_name = "DIR", conflicts_with = "shape")]
    model: Option<std::path::PathBuf>,
    /// Sequences in the update, one per micro-batch.
    #[arg(long, default_value_t = 4)]
    sequences: usize,
    /// Tokens per sequence (a quarter of them prompt, the rest response).
    #[arg(long, default_value_t = 256)]
    tokens: usize,
    /// Timed update steps per setup (the median is reported).
    #[arg(long, default_value_t = 1)]
    steps: usize,
    /// Untimed steps before them, which take the first-touch page faults of the gradients and
    /// libtorch's kernel setup (they matter for steps of a second, not of minutes).
    #[arg(long, default_value_t = 1)]
    warmup_steps: usize,
    /// libtorch threads (0 keeps its default).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// `cpu`, `cuda` or `cuda:N` (`skein devices` lists what this machine has).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Run one setup and print its figures as JSON (what the parent runs in each child).
    #[arg(long, value_enum, hide = true)]
    only: Option<Setup>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    #[value(name = "qwen2.5-0.5b")]
    Qwen2_5_0_5b,
    Tiny,
}

impl MemoryBenchArgs {
    /// The measured model's name and configuration: `--model`'s, else `--shape`'s.
    fn model_config(&self) -> Result<(String, ModelConfig)> {
        match &self.model {
            Some(dir) => {
                let cfg = ModelConfig::from_file(&dir.join("config.json"))
                    .with_context(|| format!("reading the shape of --model {}", dir.display()))?;
                Ok((dir.display().to_string(), cfg))
            }
            None => Ok((self.shape.name().to_string(), self.shape.config())),
        }
    }
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Qwen2_5_0_5b => "qwen2.5-0.5b",
            Shape::Tiny => "tiny",
        }
    }

    /// The model's configuration. The tiny one is just large enough that its weights, not
    /// the process, separate the setups (about 6M parameters, an 8192-token vocabulary).
    fn config(self) -> ModelConfig {
        match self {
            Shape::Qwen2_5_0_5b => ModelConfig::qwen2_5_0_5b(),
            Shape::Tiny => ModelConfig::tiny_qwen2(8192, 256, 4, 4, 2, 1024, TINY_POSITIONS),
        }
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    Full,
    FullBf16,
    Lora,
    LoraBf16,
    LoraBf16Ckpt,
}

impl Setup {
    const ALL: [Setup; 5] = [
        Setup::Full,
        Setup::FullBf16,
        Setup::Lora,
        Setup::LoraBf16,
        Setup::LoraBf16Ckpt,
    ];

    fn flag(self) -> &'static str {
        match self {
            Setup::Full => "full",
            Setup::FullBf16 => "full-bf16",
            Setup::Lora => "lora",
            Setup::LoraBf16 => "lora-bf16",
            Setup::LoraBf16Ckpt => "lora-bf16-ckpt",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Setup::Full => "full float32",
            Setup::FullBf16 => "full bfloat16, float32 masters",
            Setup::Lora => "LoRA r16",
            Setup::LoraBf16 => "LoRA r16 + bfloat16",
            Setup::LoraBf16Ckpt => "LoRA r16 + bfloat16 + checkpointing",
        }
    }

    /// Rank 16 on all seven projections for the LoRA setups.
    fn options(self) -> ModelOptions {
        let lora = LoraConfig {
            rank: 16,
            ..Default::default()
        };
        match self {
            Setup::Full => ModelOptions::default(),
            Setup::FullBf16 => ModelOptions {
                dtype: Dtype::Bfloat16,
                ..Default::default()
            },
            Setup::Lora => ModelOptions {
                dtype: Dtype::Float32,
                lora,
            },
            Setup::LoraBf16 | Setup::LoraBf16Ckpt => ModelOptions {
                dtype: Dtype::Bfloat16,
                lora,
            },
        }
    }

    fn checkpointing(self) -> bool {
        self == Setup::LoraBf16Ckpt
    }

    /// The update as the preflight sizes it.
    fn update_shape(self, tokens: usize, device: Device) -> UpdateShape {
        UpdateShape {
            options: self.options(),
            micro_batch_tokens: tokens,
            checkpointing: self.checkpointing(),
            cuda: device.is_cuda(),
        }
    }
}

/// One setup's figures, measured in its child.
#[derive(Debug, Serialize, Deserialize)]
struct Outcome {
    trainable: usize,
    /// Resident memory once libtorch had initialised, before the model (on a GPU: the GPU's
    /// memory in use once CUDA is up).
    start_mib: f64,
    /// Peak resident memory of the whole child (VmHWM; on a GPU, the GPU's memory in use
    /// after the steps, which the caching allocator keeps at its peak).
    peak_mib: f64,
    step_s: f64,
}

pub fn run(a: &MemoryBenchArgs) -> Result<()> {
    check(a)?;
    if let Some(setup) = a.only {
        let out = measure(a, setup)?;
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    let (name, cfg) = a.model_config()?;
    eprintln!(
        "bench memory: {} ({:.1}M parameters), {} sequences x {} tokens, one per micro-batch, \
         on {}; each setup in its own process",
        name,
        cfg.parameter_count() / 1e6,
        a.sequences,
        a.tokens,
        crate::devices::describe(a.start_device()?)
    );
    let mut results = Vec::new();
    for setup in Setup::ALL {
        eprintln!("bench memory: {} ...", setup.label());
        let out = in_child(a, setup)?;
        eprintln!(
            "bench memory: {}: peak {:.0} MiB, step {:.2} s",
            setup.label(),
            out.peak_mib,
            out.step_s
        );
        results.push((setup, out));
    }
    print_table(a, &cfg, &results);
    print_goals(a, &cfg, &results);
    Ok(())
}

impl MemoryBenchArgs {
    /// The device `--device` names, refused with its reason when this machine lacks it.
    fn start_device(&self) -> Result<Device> {
        crate::trainer::config::start_device(&self.device, self.threads)
            .map_err(|e| anyhow::anyhow!("{e:#}").context("--device"))
    }
}

fn check(a: &MemoryBenchArgs) -> Result<()> {
    at_least_one(&[("--sequences", a.sequences), ("--steps", a.steps)])?;
    let device = a.start_device()?;
    if let Device::Cuda(n) = device {
        crate::gpu_memory::used_bytes(n)
            .map_err(|e| anyhow::anyhow!("--device {}: {e}", a.device))?;
    }
    let (name, cfg) = a.model_config()?;
    let positions = cfg.max_position_embeddings;
    if a.tokens < 4 || a.tokens > positions {
        bail!(
            "invalid value for `--tokens`: must be between 4 and the {} model's {positions} \
             positions (got {})",
            name,
            a.tokens
        );
    }
    if a.sequences
        .checked_mul(a.tokens)
        .is_none_or(|t| t > MAX_TOKENS)
    {
        bail!(
            "invalid value for `--sequences`: --sequences x --tokens must be at most {MAX_TOKENS} \
             tokens (got {} x {})",
            a.sequences,
            a.tokens
        );
    }
    if a.warmup_steps.checked_add(a.steps).is_none() {
        bail!("invalid values for `--steps` and `--warmup-steps`: their sum overflows");
    }
    let max = crate::trainer::config::max_threads();
    if a.threads > max {
        bail!("invalid value for `--threads`: at most {max} on this machine (0 keeps the default)");
    }
    check_fits(a, &name, &cfg, device)
}

/// The largest setup's update, as the preflight estimates it, fits in the free memory: a
/// child that cannot allocate would be killed rather than report.
fn check_fits(a: &MemoryBenchArgs, name: &str, cfg: &ModelConfig, device: Device) -> Result<()> {
    let setups = a.only.map_or(Setup::ALL.to_vec(), |s| vec![s]);
    let need = setups
        .into_iter()
        .map(|s| estimate(a, cfg, s, device))
        .fold(0.0, f64::max);
    if let Some(free) = crate::memory::available_on(device).filter(|&free| need > free) {
        bail!(
            "a {}-token update of {} needs about {:.1} GiB, but {:.1} GiB of memory is free: \
             lower --tokens",
            a.tokens,
            name,
            need / crate::memory::GIB,
            free / crate::memory::GIB
        );
    }
    Ok(())
}

/// The preflight's estimate of `setup`'s update on `device`, in bytes.
fn estimate(a: &MemoryBenchArgs, cfg: &ModelConfig, setup: Setup, device: Device) -> f64 {
    let shape = setup.update_shape(a.tokens, device);
    preflight::total(&preflight::update_parts(cfg, &shape, device, false))
}

fn print_table(a: &MemoryBenchArgs, cfg: &ModelConfig, results: &[(Setup, Outcome)]) {
    let device = a.start_device().unwrap_or(Device::Cpu);
    println!(
        "| setup | trainable params | RSS at start (MiB) | measured peak (MiB) | preflight \
         estimate (MiB) | estimate / measured | step (s) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (setup, out) in results {
        let est = estimate(a, cfg, *setup, device) / MIB;
        println!(
            "| {} | {:.2}M | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |",
            setup.label(),
            out.trainable as f64 / 1e6,
            out.start_mib,
            out.peak_mib,
            est,
            est / out.peak_mib,
            out.step_s
        );
    }
}

/// The three goals, each with its measured figure.
fn print_goals(a: &MemoryBenchArgs, cfg: &ModelConfig, results: &[(Setup, Outcome)]) {
    let get = |s: Setup| results.iter().find(|(x, _)| *x == s).map(|(_, o)| o);
    let (Some(full), Some(plain), Some(ckpt)) = (
        get(Setup::Full),
        get(Setup::LoraBf16),
        get(Setup::LoraBf16Ckpt),
    ) else {
        return;
    };
    let verdict = |ok: bool| if ok { "met" } else { "not met" };
    let device = a.start_device().unwrap_or(Device::Cpu);
    let share = ckpt.peak_mib / full.peak_mib;
    let worst = results
        .iter()
        .map(|(s, o)| (estimate(a, cfg, *s, device) / MIB / o.peak_mib - 1.0).abs())
        .fold(0.0, f64::max);
    let slowdown = ckpt.step_s / plain.step_s;
    println!();
    println!(
        "- LoRA + bfloat16 + checkpointing peak / full float32 peak: {share:.3} (goal ≤ 0.25): {}",
        verdict(share <= 0.25)
    );
    println!(
        "- largest preflight error: {:.1}% (goal ≤ 25%): {}",
        100.0 * worst,
        verdict(worst <= 0.25)
    );
    println!(
        "- step time with checkpointing / without: {slowdown:.2} (goal ≤ 1.4): {}",
        verdict(slowdown <= 1.4)
    );
}

/// Runs `--only SETUP` in a fresh process and reads its JSON line; its progress goes to this
/// process's stderr.
fn in_child(a: &MemoryBenchArgs, setup: Setup) -> Result<Outcome> {
    let exe = std::env::current_exe().context("locating the skein binary")?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "bench",
        "memory",
        "--only",
        setup.flag(),
        "--device",
        &a.device,
    ]);
    match &a.model {
        Some(dir) => cmd.arg("--model").arg(dir),
        None => cmd.args(["--shape", a.shape.name()]),
    };
    for (flag, v) in [
        ("--sequences", a.sequences),
        ("--tokens", a.tokens),
        ("--steps", a.steps),
        ("--warmup-steps", a.warmup_steps),
        ("--threads", a.threads),
    ] {
        cmd.arg(flag).arg(v.to_string());
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running the {} setup", setup.label()))?;
    if !out.status.success() {
        bail!("the {} setup failed ({})", setup.label(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .with_context(|| format!("reading the {} setup's result: {line:?}", setup.label()))
}

/// The update's rows: `sequences` of `tokens` tokens, a quarter prompt, advantages of both
/// signs, no π_old (a step's first update, where the ratio is 1 and every token has a
/// gradient).
fn rows(a: &MemoryBenchArgs, vocab: usize) -> Vec<TrainRow> {
    let prompt = a.tokens / 4;
    let n = a.tokens - prompt;
    (0..a.sequences)
        .map(|b| TrainRow {
            tokens: (0..a.tokens)
                .map(|i| ((i * 31 + b * 17 + 1) % vocab) as u32)
                .collect(),
            prompt_len: prompt,
            loss_mask: vec![1; n],
            behavior_logp: vec![-5.0; n],
            advantages: (0..n)
                .map(|i| if (i + b) % 2 == 0 { 1.0 } else { -1.0 })
                .collect(),
            loss_weight: 1.0 / (a.sequences * n) as f64,
            ..Default::default()
        })
        .collect()
}

/// One setup, in this process: resident memory once libtorch is up, then the model, a
/// warm-up step and the timed steps, then the peak.
fn measure(a: &MemoryBenchArgs, setup: Setup) -> Result<Outcome> {
    let device = a.start_device()?;
    // libtorch (and CUDA) set themselves up on the first operation.
    let _ = tch::Tensor::zeros([1], (tch::Kind::Float, device)).sum(tch::Kind::Float);
    let start_mib = in_use_mib(device)?;
    let (_, cfg) = a.model_config()?;
    let policy = Model::random_with(&cfg, &setup.options(), device, 0)?;
    let rows = rows(a, cfg.vocab_size);
    let update = UpdateConfig {
        loss: LossConfig::default(),
        epochs: 1,
        batching: Batching::padded(a.tokens),
        temperature: 1.0,
        activation_checkpointing: setup.checkpointing(),
    };
    let total = a.warmup_steps + a.steps;
    let mut opt = Optimizer::new(&policy.vs, &OptimConfig::default(), total)?;
    let mut ranks = Replicas::new(&policy, 1)?;
    let mini_batch = vec![(0..rows.len()).collect::<Vec<usize>>()];
    let mut times = Vec::new();
    for i in 0..a.warmup_steps + a.steps {
        let t = Instant::now();
        let (_, step) = mini_batch_step(&policy, &mut ranks, &mut opt, &mini_batch, |m, r, s| {
            rank_pass(m, false, &rows, r, &update, s)
        })?;
        step.context("the update was skipped: its loss or gradient was not finite")?;
        // On a GPU the optimizer's kernels are still queued: the step ends when they do.
        synchronize(device);
        let secs = t.elapsed().as_secs_f64();
        let warm_up = i < a.warmup_steps;
        let what = if warm_up { "warm-up step" } else { "step" };
        eprintln!("  {}: {what} {:.2} s", setup.flag(), secs);
        if !warm_up {
            times.push(secs);
        }
    }
    Ok(Outcome {
        trainable: crate::model::sorted_trainable(&policy.vs)
            .iter()
            .map(|(_, t)| t.numel())
            .sum(),
        start_mib,
        peak_mib: peak_mib(device)?,
        step_s: median(times),
    })
}

/// Memory in use now: this process's resident memory, or the GPU's memory in use.
fn in_use_mib(device: Device) -> Result<f64> {
    match device {
        Device::Cuda(n) => gpu_mib(n),
        _ => proc_status_mib("VmRSS").context("reading /proc/self/status"),
    }
}

/// The peak so far: this process's peak resident memory, or the GPU's memory in use (the
/// caching allocator keeps its peak reservation; the work is waited for first).
fn peak_mib(device: Device) -> Result<f64> {
    match device {
        Device::Cuda(n) => {
            tch::Cuda::synchronize(n as i64);
            gpu_mib(n)
        }
        _ => proc_status_mib("VmHWM").context("reading /proc/self/status"),
    }
}

fn gpu_mib(n: usize) -> Result<f64> {
    crate::gpu_memory::used_bytes(n)
        .map(|b| b as f64 / MIB)
        .map_err(|e| anyhow::anyhow!(e))
}

/// A `kB` field of /proc/self/status (`VmRSS`, `VmHWM`), in MiB.
fn proc_status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status
        .lines()
        .find(|l| l.split(':').next() == Some(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
