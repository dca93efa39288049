//! `skein bench-partial`: the same training run twice on the long-tail `reverse` task — a
//! synchronous rollout, then partial rollout — with the same model, seed and number of steps.
//! Reports trained tokens per second and the spread of step times, and draws both runs'
//! curves in one PNG.

use super::bench_args::{refuse_owned_keys, whole_run};
use crate::trainer::run::{check_new_run, train_new};
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
    /// Replace the runs already in `OUT/sync` and `OUT/partial`; without it, a directory that
    /// holds a run is refused before either run starts.
    #[arg(long)]
    overwrite: bool,
}

/// Both runs' settings, before `rollout.partial.*`.
fn base_config(a: &PartialBenchArgs) -> Result<TrainConfig> {
    // Checked before either run spends its warm-up: a run of no step has nothing to compare.
    anyhow::ensure!(
        a.steps > 0,
        "--steps must be at least 1: the bench compares the two runs' RL steps"
    );
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
        // The default warm-up solves `reverse` before RL starts, and its responses have no
        // tail to cut; a fifth of it leaves a policy with something to learn and responses of
        // 3 to 56 tokens.
        "sft.steps=300".into(),
    ];
    refuse_owned_keys(
        "skein bench-partial",
        &a.overrides,
        &[
            ("run.dir", "--out"),
            ("rollout.partial", "--budget and --max-staleness"),
            ("trainer.steps", "--steps"),
            ("task.difficulty", "--difficulty"),
            ("task.name", "`skein train` for another task"),
        ],
    )?;
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
    let configs = [("sync", false), ("partial", true)].map(|(name, partial)| {
        let mut cfg = base.clone();
        cfg.run.dir = a.out.join(name).display().to_string();
        // The sync run leaves `rollout.partial` alone: its keys would do nothing there.
        if partial {
            cfg.rollout.partial.enabled = true;
            cfg.rollout.partial.token_budget = a.budget;
            cfg.rollout.partial.max_staleness = a.max_staleness;
        }
        (name, cfg)
    });
    // Both configs and directories are checked before the first run spends any time.
    for (_, cfg) in &configs {
        check_new_run(cfg, a.overwrite)?;
    }
    let mut runs = Vec::new();
    for (name, cfg) in &configs {
        eprintln!("skein bench-partial: {name} run");
        whole_run(train_new(cfg, a.overwrite)?, "skein bench-partial", name)?;
        let metrics = a.out.join(name).join("metrics.jsonl");
        let records = rl_records(&metrics)?;
        let figures =
            figures(&records).with_context(|| format!("reading {}", metrics.display()))?;
        runs.push((name, figures, records));
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

/// The records of RL steps (those with a step time) of a run's metrics.jsonl.
fn rl_records(metrics: &Path) -> Result<Vec<Map<String, Value>>> {
    Ok(read_metrics(metrics)?
        .into_iter()
        .filter(|r| r.contains_key("time/step_s"))
        .collect())
}

/// A run's figures; an error names the step and metric when a record lacks one.
fn figures(records: &[Map<String, Value>]) -> Result<RunFigures> {
    anyhow::ensure!(!records.is_empty(), "no RL step was logged");
    let column = |k: &str| -> Result<Vec<f64>> {
        records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                r.get(k)
                    .and_then(Value::as_f64)
                    .with_context(|| format!("RL step {} has no number `{k}`", i + 1))
            })
            .collect()
    };
    let times = column("time/step_s")?;
    let n = times.len() as f64;
    let mean = times.iter().sum::<f64>() / n;
    let var = times.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / n;
    // A step whose every trajectory failed has no training reward to average.
    let rewards: Vec<f64> = records
        .iter()
        .filter_map(|r| r.get("reward/mean").and_then(Value::as_f64))
        .collect();
    anyhow::ensure!(!rewards.is_empty(), "no RL step logged a `reward/mean`");
    let k = rewards.len().min(5);
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    Ok(RunFigures {
        trained_tokens: column("tokens/trained")?.iter().sum(),
        seconds: times.iter().sum::<f64>().max(1e-9),
        step_mean: mean,
        step_std: var.sqrt(),
        reward_first: avg(&rewards[..k]),
        reward_last: avg(&rewards[rewards.len() - k..]),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(step_s: f64, reward: f64, tokens: Option<f64>) -> Map<String, Value> {
        let mut r = Map::new();
        r.insert("time/step_s".into(), json!(step_s));
        r.insert("reward/mean".into(), json!(reward));
        if let Some(t) = tokens {
            r.insert("tokens/trained".into(), json!(t));
        }
        r
    }

    #[test]
    fn no_steps_is_refused_before_either_run() {
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            bench: PartialBenchArgs,
        }
        let args = <Command as clap::Parser>::parse_from(["bench-partial", "--steps", "0"]);
        let err = base_config(&args.bench).unwrap_err().to_string();
        assert!(err.contains("--steps must be at least 1"), "{err}");
    }

    #[test]
    fn figures_come_from_every_step() {
        let f = figures(&[record(1.0, 0.2, Some(10.0)), record(3.0, 0.6, Some(30.0))]).unwrap();
        assert_eq!((f.trained_tokens, f.seconds), (40.0, 4.0));
        assert_eq!((f.step_mean, f.step_std), (2.0, 1.0));
        assert!((f.reward_first - 0.4).abs() < 1e-12 && (f.reward_last - 0.4).abs() < 1e-12);
    }

    #[test]
    fn a_missing_metric_is_an_error_not_a_zero() {
        let records = [record(1.0, 0.2, Some(10.0)), record(1.0, 0.3, None)];
        let err = figures(&records)
            .err()
            .expect("a step without tokens/trained");
        assert!(
            err.to_string()
                .contains("RL step 2 has no number `tokens/trained`"),
            "{err}"
        );
        assert!(figures(&[]).is_err(), "no steps, no figures");
    }
}
