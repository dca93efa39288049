//! The `skein` command line: `train`, `plan`, `bench`, `plot`.

mod bench;
mod bench_partial;
mod bench_rewards;
mod eval;
mod serve;
mod serve_reward;
mod sft;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "skein",
    version,
    about = "Reinforcement-learning post-training of LLM agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a policy. With no arguments: the built-in default job (a tiny model learning
    /// arithmetic from scratch: SFT warm-up, then GRPO), end to end.
    Train {
        /// A TOML config; keys not given keep their defaults (see --print-config).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Override one key, e.g. --set trainer.steps=10 --set algorithm.estimator=rloo
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Print the resolved config as TOML and exit.
        #[arg(long)]
        print_config: bool,
        /// Continue the run in RUN_DIR from its newest checkpoint-N (its config.toml unless
        /// --config is given; --set still applies, e.g. more trainer.steps).
        #[arg(long, value_name = "RUN_DIR")]
        resume: Option<PathBuf>,
    },
    /// Plan PPO mini-batches for a JSON batch (file or stdin) and print the plan as JSON.
    Plan {
        /// Input file; `-` or nothing reads stdin.
        input: Option<PathBuf>,
    },
    /// Measure training-step time and decode throughput of a model size.
    Bench(bench::BenchArgs),
    /// Train the long-tail `reverse` task twice, synchronous then with partial rollout, and
    /// compare trained tokens per second, step-time spread and reward curves (one PNG).
    BenchPartial(bench_partial::PartialBenchArgs),
    /// Accuracy and pass@k of a model (or a run's checkpoint) on prompt files, the run's
    /// validation split, or the built-in task: greedy, or sampled with --n.
    Eval(eval::EvalArgs),
    /// Supervised fine-tuning on chat JSONL with assistant-only loss; writes a model directory
    /// to warm-start RL from (`model.path`).
    Sft(sft::SftArgs),
    /// Draw RUN_DIR/plot.png from RUN_DIR/metrics.jsonl, or overlay several runs in one PNG.
    Plot {
        /// One run directory, or several to overlay in one PNG (e.g. dp 1 against dp 2).
        #[arg(required = true)]
        run_dirs: Vec<PathBuf>,
        /// Metrics to draw, one panel each (several runs; default: reward/mean,
        /// eval/accuracy, time/step_s).
        #[arg(long, value_delimiter = ',')]
        keys: Vec<String>,
        /// Where the overlay goes (several runs).
        #[arg(long, default_value = "compare.png")]
        out: PathBuf,
    },
    /// Serve the sources of a `[reward]` config (e.g. a reward model) over HTTP, for a
    /// trainer's `kind = "remote"` source.
    ServeReward(serve_reward::ServeRewardArgs),
    /// Serve a model over an OpenAI-compatible HTTP API and record the token-exact rollouts of
    /// agents that call it (`/rollouts/{id}/v1`). No arguments: a random tiny model.
    Serve(serve::ServeArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train {
            config,
            overrides,
            print_config,
            resume,
        } => train(config, overrides, print_config, resume),
        Command::Plan { input } => return plan(input),
        Command::Bench(args) => bench::run(&args),
        Command::BenchPartial(args) => bench_partial::run(&args),
        Command::ServeReward(args) => serve_reward::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Eval(args) => eval::run(&args),
        Command::Sft(args) => sft::run(&args),
        Command::Plot {
            run_dirs,
            keys,
            out,
        } => plot(&run_dirs, &keys, &out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn train(
    config: Option<PathBuf>,
    mut overrides: Vec<String>,
    print_config: bool,
    resume: Option<PathBuf>,
) -> Result<()> {
    let config = config.or_else(|| resume.as_ref().map(|dir| dir.join("config.toml")));
    if let Some(dir) = &resume {
        // The resumed run stays in its own directory, whatever the config says.
        overrides.push(format!(
            "run.dir={}",
            toml_string(&dir.display().to_string())
        ));
    }
    let cfg = load_config(config.as_deref(), &overrides)?;
    if print_config {
        print!("{}", skein_config::to_toml_string(&cfg));
        return Ok(());
    }
    let summary = match resume {
        Some(_) => crate::trainer::run::resume(&cfg)?,
        None => crate::trainer::run::train(&cfg)?,
    };
    if summary.rank > 0 {
        // Another rank of an MPI job: rank 0 reports the run.
        return Ok(());
    }
    if summary.interrupted {
        println!(
            "interrupted after step {}: continue with `skein train --resume {}`",
            summary.rewards.len(),
            summary.dir.display()
        );
        return Ok(());
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let k = summary.rewards.len().min(5);
    println!(
        "training reward {:.3} → {:.3} (mean of the first and last {k} steps); held-out greedy accuracy {:.3} → {:.3}; run directory {}",
        mean(&summary.rewards[..k]),
        mean(&summary.rewards[summary.rewards.len() - k..]),
        summary.eval_before.accuracy,
        summary.eval_after.accuracy,
        summary.dir.display()
    );
    Ok(())
}

/// `skein plan`: one-line error and exit status 2 on bad input, never partial output.
fn plan(input: Option<PathBuf>) -> ExitCode {
    let text = match input.as_deref().filter(|p| p.as_os_str() != "-") {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))
        }
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map(|_| s)
                .map_err(|e| format!("reading stdin: {e}"))
        }
    };
    match text.and_then(|t| skein_plan::cli::plan_json(&t).map_err(|e| e.to_string())) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", e.replace('\n', " "));
            ExitCode::from(2)
        }
    }
}

/// A training config: the file at `path` (or the defaults) with `--set` overrides.
fn load_config(
    path: Option<&std::path::Path>,
    overrides: &[String],
) -> Result<crate::trainer::TrainConfig> {
    let text = match path {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading config {}", p.display()))?,
        ),
        None => None,
    };
    let source = path.map_or_else(|| "defaults".into(), |p| p.display().to_string());
    Ok(skein_config::load_with_defaults(
        text.as_deref(),
        &source,
        overrides,
    )?)
}

/// `s` as a TOML string literal, for an override value.
fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// `skein plot`: a run's own plot.png, or several runs overlaid in one PNG.
fn plot(run_dirs: &[PathBuf], keys: &[String], out: &std::path::Path) -> Result<()> {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    if let [dir] = run_dirs {
        let custom = (!keys.is_empty()).then_some(keys.as_slice());
        let png = skein_report::plot_run_dir(dir, custom)?;
        println!("{}", png.display());
        return Ok(());
    }
    let keys = if keys.is_empty() {
        skein_report::COMPARE_PANELS.to_vec()
    } else {
        keys
    };
    skein_report::compare_runs(run_dirs, &keys, out)?;
    println!("{}", out.display());
    Ok(())
}
