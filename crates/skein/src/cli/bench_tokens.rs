//! `skein bench train-tokens`: one PPO update of the same agentic batch (groups of samples
//! sharing a long prompt, long-tailed responses) in three layouts: one padded row per line,
//! packed rows, and packed rows with each group's prompt computed once. Each layout runs in
//! a child process of its own, so its peak resident memory is its own; the parent prints the
//! table. The loss of the first update (same weights, same batch) must agree across layouts.

use super::bench_args::{at_least_one, median, synchronize, BenchDtype, ModelShape, Placement};
use crate::trainer::batch::{RowOrigin, StepBatch, TrainRow};
use crate::trainer::config::{Batching, OffPolicy};
use crate::trainer::prepare::{prepare, Models, PrepareConfig};
use crate::trainer::update::optim::{OptimConfig, Optimizer};
use crate::trainer::update::policy_loss::LossConfig;
use crate::trainer::update::ranks::Replicas;
use crate::trainer::update::{ppo_update, UpdateConfig};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use skein_tasks::TaskRng;
use std::process::Command;
use std::time::Instant;

#[derive(clap::Args, Debug, Clone)]
pub struct TokenBenchArgs {
    #[arg(long, default_value_t = 8)]
    groups: usize,
    #[arg(long, default_value_t = 8)]
    samples: usize,
    /// Prompt tokens, shared by a group's samples.
    #[arg(long, default_value_t = 600)]
    prompt: usize,
    /// Response lengths: log-normal with this median, capped at `--max-response`.
    #[arg(long, default_value_t = 40)]
    median_response: usize,
    #[arg(long, default_value_t = 400)]
    max_response: usize,
    #[command(flatten)]
    model: ModelShape,
    #[command(flatten)]
    place: Placement,
    #[arg(long, default_value_t = 8192)]
    micro_batch_tokens: usize,
    /// Timed updates per layout (the median is reported), after one untimed.
    #[arg(long, default_value_t = 3)]
    iters: usize,
    /// Run one layout and print its result as JSON (what the parent runs in each child).
    #[arg(long, hide = true)]
    only: Option<Layout>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Padded,
    Packed,
    SharedPrefix,
}

impl Layout {
    const ALL: [Layout; 3] = [Layout::Padded, Layout::Packed, Layout::SharedPrefix];

    fn name(self) -> &'static str {
        match self {
            Layout::Padded => "padded",
            Layout::Packed => "packed",
            Layout::SharedPrefix => "shared-prefix",
        }
    }

    fn batching(self, micro_batch_tokens: usize) -> Batching {
        Batching {
            micro_batch_tokens,
            packing: self != Layout::Padded,
            shared_prefix: self == Layout::SharedPrefix,
        }
    }
}

/// One layout's figures.
#[derive(Debug, Serialize, Deserialize)]
struct Outcome {
    loss: f64,
    loss_tokens: usize,
    computed_tokens: usize,
    update_s: f64,
    peak_rss_mib: f64,
}

pub fn run(a: &TokenBenchArgs) -> Result<()> {
    check(a)?;
    if let Some(layout) = a.only {
        let out = measure(a, layout)?;
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    let device = a.place.start()?;
    println!(
        "batch: {} groups x {} samples, {}-token prompts, responses median {} / max {} tokens; \
         model hidden {}, {} layers; {}",
        a.groups,
        a.samples,
        a.prompt,
        a.median_response,
        a.max_response,
        a.model.hidden,
        a.model.layers,
        a.place.describe(device)
    );
    println!(
        "{:<14} {:>12} {:>16} {:>10} {:>9} {:>12} {:>14} {:>14}",
        "layout",
        "loss tokens",
        "computed tokens",
        "update s",
        "speed-up",
        "peak RSS MiB",
        "loss",
        "computed tok/s"
    );
    // Layouts add in different orders; half precision rounds each sum coarser.
    let tolerance = match a.place.dtype {
        BenchDtype::Float32 => 1e-4,
        _ => 2e-2,
    };
    let mut first: Option<Outcome> = None;
    for layout in Layout::ALL {
        let out = in_child(a, layout)?;
        let base = first.as_ref().unwrap_or(&out);
        println!(
            "{:<14} {:>12} {:>16} {:>10.3} {:>8.2}x {:>12.0} {:>14.8} {:>14.0}",
            layout.name(),
            out.loss_tokens,
            out.computed_tokens,
            out.update_s,
            base.update_s / out.update_s,
            out.peak_rss_mib,
            out.loss,
            out.computed_tokens as f64 / out.update_s
        );
        let rel = (out.loss - base.loss).abs() / base.loss.abs().max(1e-12);
        if rel > tolerance {
            bail!(
                "{} changed the loss: {} against {} (relative {rel:.1e})",
                layout.name(),
                out.loss,
                base.loss
            );
        }
        if first.is_none() {
            first = Some(out);
        }
    }
    Ok(())
}

/// The batch's flags and their values (to check them, or to pass them on).
fn batch_flags(a: &TokenBenchArgs) -> [(&'static str, usize); 7] {
    [
        ("--groups", a.groups),
        ("--samples", a.samples),
        ("--prompt", a.prompt),
        ("--median-response", a.median_response),
        ("--max-response", a.max_response),
        ("--micro-batch-tokens", a.micro_batch_tokens),
        ("--iters", a.iters),
    ]
}

fn check(a: &TokenBenchArgs) -> Result<()> {
    a.model.check()?;
    at_least_one(&batch_flags(a))?;
    if a.model.vocab < 2 {
        bail!("invalid value for `--vocab`: must be ≥ 2 (got 1)");
    }
    let rows = a.groups.checked_mul(a.samples);
    let tokens = rows.and_then(|r| r.checked_mul(a.prompt + a.max_response));
    if tokens.is_none_or(|t| t > 1 << 24) {
        bail!(
            "invalid batch: --groups x --samples x (--prompt + --max-response) must be at most \
             16,777,216 tokens"
        );
    }
    Ok(())
}

/// Runs `--only LAYOUT` in a fresh process and reads its JSON line.
fn in_child(a: &TokenBenchArgs, layout: Layout) -> Result<Outcome> {
    let exe = std::env::current_exe().context("locating the skein binary")?;
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "train-tokens", "--only", layout.name()]);
    for (flag, v) in batch_flags(a) {
        cmd.arg(flag).arg(v.to_string());
    }
    cmd.args(a.model.args()).args(a.place.args());
    let out = cmd
        .output()
        .with_context(|| format!("running the {} layout", layout.name()))?;
    if !out.status.success() {
        bail!(
            "the {} layout failed: {}",
            layout.name(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .with_context(|| format!("reading the {} layout's result: {line:?}", layout.name()))
}

/// The batch: each group one random prompt, each sample a log-normal response length.
fn rows(a: &TokenBenchArgs) -> Vec<TrainRow> {
    let mut rng = TaskRng::new(7);
    let token = |rng: &mut TaskRng| 1 + rng.below(a.model.vocab as u64 - 1) as u32;
    let mut rows = Vec::new();
    for _ in 0..a.groups {
        let prompt: Vec<u32> = (0..a.prompt).map(|_| token(&mut rng)).collect();
        for _ in 0..a.samples {
            let n = response_len(&mut rng, a.median_response, a.max_response);
            let mut tokens = prompt.clone();
            tokens.extend((0..n).map(|_| token(&mut rng)));
            let advantage = if rng.below(2) == 0 { 1.0 } else { -1.0 };
            rows.push(TrainRow {
                tokens,
                prompt_len: a.prompt,
                loss_mask: vec![1; n],
                behavior_logp: vec![-6.0; n],
                advantages: vec![advantage; n],
                versions: vec![0; n],
                ..Default::default()
            });
        }
    }
    let loss_tokens: usize = rows.iter().map(|r| r.loss_mask.len()).sum();
    for r in &mut rows {
        r.loss_weight = 1.0 / loss_tokens as f64;
    }
    rows
}

/// Log-normal with σ = 1 around `median` (Box-Muller), at least 1, at most `max`.
fn response_len(rng: &mut TaskRng, median: usize, max: usize) -> usize {
    let u1 = 1.0 - rng.f64();
    let u2 = rng.f64();
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    ((median as f64 * z.exp()).round() as usize).clamp(1, max)
}

fn measure(a: &TokenBenchArgs, layout: Layout) -> Result<Outcome> {
    let rows = rows(a);
    let cfg = a.model.config(a.prompt + a.max_response + 1);
    let policy = a.place.model(&cfg, 0)?;
    let batching = layout.batching(a.micro_batch_tokens);
    let update = UpdateConfig {
        loss: LossConfig::default(),
        epochs: 1,
        batching,
        temperature: 1.0,
        activation_checkpointing: false,
    };
    let optim = OptimConfig {
        lr: 1e-9,
        ..Default::default()
    };
    let mut opt = Optimizer::new(&policy.vs, &optim, a.iters + 1)?;
    let mut ranks = Replicas::new(&policy, 1)?;
    let prepare_cfg = PrepareConfig {
        batching,
        epochs: 1,
        temperature: 1.0,
        off_policy: OffPolicy::Tis,
        is_cap: 2.0,
        gamma: 1.0,
        lambda: 1.0,
        turn_gamma: None,
    };
    let models = Models {
        policy: &policy,
        reference: None,
        critic: None,
    };
    let (mut loss, mut computed, mut times) = (0.0, 0, Vec::new());
    for i in 0..=a.iters {
        let batch = StepBatch {
            plan: vec![vec![(0..rows.len()).collect()]],
            real_rows: rows.len(),
            row_tokens: rows.iter().map(|r| r.tokens.len()).sum(),
            rows: rows.clone(),
            origins: (0..rows.len())
                .map(|trajectory| RowOrigin {
                    trajectory,
                    transition: None,
                })
                .collect(),
            dropped_groups: 0,
            failed_trajectories: 0,
            padding_rows: 0,
            turns: Vec::new(),
            turn_metrics: Vec::new(),
        };
        let batch = prepare(batch, &models, 0, &prepare_cfg);
        let t = Instant::now();
        let stats = ppo_update(&policy, &mut ranks, &mut opt, &batch, &update)?;
        synchronize(policy.vs.device());
        if i == 0 {
            (loss, computed) = (stats.loss, stats.computed_tokens);
        } else {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(Outcome {
        loss,
        loss_tokens: rows.iter().map(|r| r.loss_mask.len()).sum(),
        computed_tokens: computed,
        update_s: median(times),
        peak_rss_mib: peak_rss_mib().unwrap_or(f64::NAN),
    })
}

/// This process's peak resident set (VmHWM), in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
