//! `skein bench-partial`: the same training run twice on the long-tail `reverse` task — a
//! synchronous rollout, then partial rollout — with the same model, seed and number of steps.
//! Reports trained tokens per second and the spread of step times, and draws both runs'
//! curves in one PNG.

use crate::trainer::run::train_overwriting;
use crate::trainer::TrainConfig;
use anyhow::{Context, Result};
use serde_json::{json, Map, Value};
use skein_report::read_metrics;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct PartialBenchArgs {
    /// RL steps of each run.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// `reverse` difficulty: long prompts have 8·d to 16·d digits.
    #[arg(long, default_value_t = 3)]
    difficulty: u32,
    /// `rollout.partial.token_budget` of the partial run.
    #[arg(long, default_value_t = 8)]
    budget: usize,
    /// `rollout.partial.max_staleness` of the partial run: room for a long answer to span
    /// several steps at this budget, rather than being finished first in the next one.
    #[arg(long, default_value_t = 16)]
    max_staleness: u64,
    /// Where the two run directories and the comparison plot go.
    #[arg(long, default_value = "runs/bench-partial")]
    out: PathBuf,
    /// Further `KEY=VALUE` overrides applied to both runs.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

/// Both runs' settings, before `rollout.partial.*`.
fn base_config(a: &PartialBenchArgs) -> Result<TrainConfig> {
    let longest = 16 * a.difficulty as usize;
    let mut sets = vec![
        "task.name=reverse".to_string(),
        format!("task.difficulty={}", a.difficulty),
        format!("trainer.steps={}", a.steps),
        format!("rollout.sampling.max_new_tokens={}", longest + 8),
        format!("model.max_positions={}", 2 * longest + 16),
        "rollout.prompts_per_step=16".into(),
        "trainer.micro_batch_tokens=2048".into(),
        "eval.problems=64".into(),
        "eval.every=0".into(),
    ];
    sets.extend(a.overrides.iter().cloned());
    Ok(skein_config::load_with_defaults(
        None,
        "skein bench-partial",
        &sets,
    )?)
}

struct RunFigures {
    trained_tokens: f64,
    seconds: f64,
    step_mean: f64,
    step_std: f64,
    reward_first: f64,
    reward_last: f64,
}

pub fn run(a: &PartialBenchArgs) -> Result<()> {
    let base = base_config(a)?;
    let mut runs = Vec::new();
    for (name, partial) in [("sync", false), ("partial", true)] {
        let mut cfg = base.clone();
        cfg.run.dir = a.out.join(name).display().to_string();
        cfg.rollout.partial.enabled = partial;
        cfg.rollout.partial.token_budget = a.budget;
        cfg.rollout.partial.max_staleness = a.max_staleness;
        eprintln!("skein bench-partial: {name} run");
        train_overwriting(&cfg)?;
        let records = rl_records(&a.out.join(name))?;
        runs.push((name, figures(&records), records));
    }
    println!(
        "{:<8} {:>14} {:>16} {:>12} {:>12} {:>16}",
        "rollout",
        "trained tokens",
        "trained tok/s",
        "step mean s",
        "step std s",
        "reward first→last"
    );
    for (name, f, _) in &runs {
        println!(
            "{:<8} {:>14} {:>16.1} {:>12.2} {:>12.2} {:>9.3} → {:.3}",
            name,
            f.trained_tokens,
            f.trained_tokens / f.seconds,
            f.step_mean,
            f.step_std,
            f.reward_first,
            f.reward_last
        );
    }
    let (s, p) = (&runs[0].1, &runs[1].1);
    println!(
        "partial / sync: {:.2}× trained tokens per second, step-time std {:.2}×",
        (p.trained_tokens / p.seconds) / (s.trained_tokens / s.seconds),
        p.step_std / s.step_std.max(1e-9)
    );
    let png = a.out.join("partial-vs-sync.png");
    plot_both(&runs[0].2, &runs[1].2, &png)?;
    println!("curves of both runs: {}", png.display());
    Ok(())
}

/// The records of RL steps (those with a step time).
fn rl_records(dir: &Path) -> Result<Vec<Map<String, Value>>> {
    Ok(read_metrics(&dir.join("metrics.jsonl"))?
        .into_iter()
        .filter(|r| r.contains_key("time/step_s"))
        .collect())
}

fn figures(records: &[Map<String, Value>]) -> RunFigures {
    let get = |r: &Map<String, Value>, k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let times: Vec<f64> = records.iter().map(|r| get(r, "time/step_s")).collect();
    let n = times.len().max(1) as f64;
    let mean = times.iter().sum::<f64>() / n;
    let var = times.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / n;
    let rewards: Vec<f64> = records.iter().map(|r| get(r, "reward/mean")).collect();
    let k = rewards.len().clamp(1, 5);
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    RunFigures {
        trained_tokens: records.iter().map(|r| get(r, "tokens/trained")).sum(),
        seconds: times.iter().sum::<f64>().max(1e-9),
        step_mean: mean,
        step_std: var.sqrt(),
        reward_first: avg(&rewards[..k.min(rewards.len())]),
        reward_last: avg(&rewards[rewards.len().saturating_sub(k)..]),
    }
}

/// One record per step with each run's metrics under `<metric> (<run>)`, so each panel
/// overlays the two runs.
fn plot_both(
    sync: &[Map<String, Value>],
    partial: &[Map<String, Value>],
    png: &Path,
) -> Result<()> {
    const KEYS: [&str; 4] = [
        "reward/mean",
        "time/step_s",
        "tokens/trained",
        "response_len/mean",
    ];
    let mut merged: Vec<Map<String, Value>> = Vec::new();
    for (run, records) in [("sync", sync), ("partial", partial)] {
        for (i, r) in records.iter().enumerate() {
            if merged.len() <= i {
                let mut m = Map::new();
                m.insert(
                    "step".into(),
                    r.get("step").cloned().unwrap_or(json!(i + 1)),
                );
                merged.push(m);
            }
            for key in KEYS {
                if let Some(v) = r.get(key) {
                    merged[i].insert(format!("{key} ({run})"), v.clone());
                }
            }
        }
    }
    let panels: Vec<String> = KEYS
        .iter()
        .map(|k| format!("{k} (sync)|{k} (partial)"))
        .collect();
    let panels: Vec<&str> = panels.iter().map(String::as_str).collect();
    skein_report::plot_metrics(
        &merged,
        &panels,
        "step",
        "partial rollout vs synchronous rollout (reverse task, same seed)",
        png,
    )
    .with_context(|| format!("drawing {}", png.display()))
}
