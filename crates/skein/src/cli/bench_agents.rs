//! `skein bench-agents`: the multi-turn runs behind the README's learning figures, from the
//! configs shipped in `configs/`. The calculator agent learns when its tool pays; the guessing
//! game runs once per credit mode with the same seed. Each run's greedy evaluation before and
//! after RL goes in one table, and its curves in a PNG.

use super::bench_args::{refuse_owned_keys, whole_run};
use crate::trainer::run::{check_new_run, train_new, RunSummary};
use crate::trainer::TrainConfig;
use anyhow::Result;
use serde_json::{Map, Value};
use skein_report::read_metrics;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The shipped configs, compiled in so the benchmark runs from any directory.
const CALCULATOR: (&str, &str) = (
    "configs/calculator.toml",
    include_str!("../../../../configs/calculator.toml"),
);
const GUESS: (&str, &str) = (
    "configs/guess.toml",
    include_str!("../../../../configs/guess.toml"),
);

#[derive(clap::Args, Debug)]
pub struct AgentsBenchArgs {
    /// Which runs: the calculator, the guessing game under both credit modes, or all three.
    #[arg(long, value_enum, default_value_t = Which::All)]
    runs: Which,
    /// Where the run directories and the plots go.
    #[arg(long, default_value = "runs/bench-agents")]
    out: PathBuf,
    /// Further `KEY=VALUE` overrides applied to every run.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Replace the runs already in the run directories under `OUT`; without it, a directory
    /// that holds a run is refused before the first run starts.
    #[arg(long)]
    overwrite: bool,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    All,
    Calculator,
    Guess,
}

/// One run of the benchmark: its name, config file and the overrides that make it.
struct Spec {
    name: &'static str,
    config: (&'static str, &'static str),
    sets: &'static [&'static str],
}

const RUNS: [Spec; 3] = [
    Spec {
        name: "calculator",
        config: CALCULATOR,
        sets: &[],
    },
    Spec {
        name: "guess-trajectory",
        config: GUESS,
        sets: &[
            "algorithm.credit=\"trajectory\"",
            "algorithm.step_group_weight=0.0",
        ],
    },
    Spec {
        name: "guess-turn",
        config: GUESS,
        sets: &[],
    },
];

/// What the table shows of one finished run.
struct Figures {
    name: &'static str,
    summary: RunSummary,
    /// Greedy turns per solved episode and tool calls per episode, before and after RL.
    solved_turns: (f64, f64),
    tool_calls: (f64, f64),
    minutes: f64,
}

pub fn run(a: &AgentsBenchArgs) -> Result<()> {
    let chosen: Vec<&Spec> = RUNS
        .iter()
        .filter(|s| match a.runs {
            Which::All => true,
            Which::Calculator => s.name == "calculator",
            Which::Guess => s.name.starts_with("guess"),
        })
        .collect();
    // Every config and run directory is checked before the first run spends any time.
    // The runs are named by their task and credit mode: a key that changes those is refused.
    refuse_owned_keys(
        "skein bench-agents",
        &a.overrides,
        &[
            ("run.dir", "--out"),
            ("task.name", "`skein train --config` for another task"),
            (
                "algorithm.credit",
                "--runs guess (it runs both credit modes)",
            ),
            (
                "algorithm.step_group_weight",
                "--runs guess (it runs both credit modes)",
            ),
        ],
    )?;
    let configs = chosen
        .iter()
        .map(|s| config(s, &a.overrides, &a.out))
        .collect::<Result<Vec<_>>>()?;
    for cfg in &configs {
        check_new_run(cfg, a.overwrite)?;
    }
    let mut done = Vec::new();
    for (spec, cfg) in chosen.iter().zip(&configs) {
        eprintln!("skein bench-agents: {} ({})", spec.name, spec.config.0);
        let start = Instant::now();
        let summary = whole_run(
            train_new(cfg, a.overwrite)?,
            "skein bench-agents",
            spec.name,
        )?;
        let records = read_metrics(&summary.dir.join("metrics.jsonl"))?;
        done.push(Figures {
            name: spec.name,
            solved_turns: first_last(&records, "eval/solved_turns_mean"),
            tool_calls: first_last(&records, "eval/tool_calls_mean"),
            summary,
            minutes: start.elapsed().as_secs_f64() / 60.0,
        });
    }
    print_table(&done);
    plot(&done, &a.out)
}

/// A run's config: its file, its own overrides, then the caller's, in `out/NAME`.
fn config(spec: &Spec, overrides: &[String], out: &Path) -> Result<TrainConfig> {
    let mut sets: Vec<String> = spec.sets.iter().map(|s| s.to_string()).collect();
    sets.extend(overrides.iter().cloned());
    let mut cfg: TrainConfig =
        skein_config::load_with_defaults(Some(spec.config.1), spec.config.0, &sets)?;
    cfg.run.dir = out.join(spec.name).display().to_string();
    Ok(cfg)
}

/// A metric's first and last values in a run's records (NaN where it never appears).
fn first_last(records: &[Map<String, Value>], key: &str) -> (f64, f64) {
    let mut values = records.iter().filter_map(|r| r.get(key)?.as_f64());
    let first = values.next().unwrap_or(f64::NAN);
    (first, values.next_back().unwrap_or(first))
}

fn print_table(runs: &[Figures]) {
    println!(
        "{:<18} {:>22} {:>22} {:>22} {:>20} {:>8}",
        "run",
        "greedy success",
        "turns per solved",
        "tool calls per ep.",
        "sampled reward",
        "minutes"
    );
    let pair = |(a, b): (f64, f64)| format!("{a:.3} → {b:.3}");
    for f in runs {
        let s = &f.summary;
        // Steps whose every trajectory failed have no reward to average.
        let rewards: Vec<f64> = s.rewards.iter().flatten().copied().collect();
        let k = rewards.len().clamp(1, 5);
        let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let first = avg(&rewards[..k.min(rewards.len())]);
        let last = avg(&rewards[rewards.len().saturating_sub(k)..]);
        println!(
            "{:<18} {:>22} {:>22} {:>22} {:>20} {:>8.1}",
            f.name,
            pair((s.eval_before.accuracy, s.eval_after.accuracy)),
            pair(f.solved_turns),
            pair(f.tool_calls),
            pair((first, last)),
            f.minutes
        );
    }
    if let Some(f) = runs.iter().find(|f| f.name == "calculator") {
        let kind = if f.summary.held_out {
            "held-out"
        } else {
            "training"
        };
        println!("(the calculator's greedy success is on {kind} problems; sampled reward: mean of the first and last 5 steps)");
    }
}

/// The calculator's curves, and both guess runs overlaid.
fn plot(runs: &[Figures], out: &Path) -> Result<()> {
    for f in runs.iter().filter(|f| f.name == "calculator") {
        let keys = [
            "reward/mean",
            "eval/accuracy",
            "agent/tool_calls_mean",
            "agent/turns_mean",
        ];
        let png = skein_report::plot_run_dir(&f.summary.dir, Some(&keys))?;
        println!("calculator curves: {}", png.display());
    }
    let guess: Vec<PathBuf> = runs
        .iter()
        .filter(|f| f.name.starts_with("guess"))
        .map(|f| f.summary.dir.clone())
        .collect();
    if guess.len() == 2 {
        let keys = [
            "reward/mean",
            "eval/accuracy",
            "eval/solved_turns_mean",
            "agent/solved_turns_mean",
        ];
        let png = out.join("guess-credit.png");
        skein_report::compare_runs(&guess, &keys, &png)?;
        println!("guess curves, both credit modes: {}", png.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped configs load and pass the trainer's checks, so a typo in them fails here
    /// rather than minutes into the benchmark.
    #[test]
    fn the_shipped_configs_are_valid() {
        for spec in &RUNS {
            let cfg = config(spec, &[], Path::new("/tmp/unused")).expect(spec.name);
            crate::trainer::config::validate::validate(&cfg).expect(spec.name);
        }
    }
}
