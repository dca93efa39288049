//! The `skein` command line, one file per command: `train`, `plan`, `plan-memory`, `bench`
//! (and `bench rewards`, `bench train-tokens`, `bench memory`), `bench-partial`, `eval`,
//! `sft`, `plot`, `doctor`, `serve-reward`, `serve`, `view`, `export`, `devices`.

mod bench;
mod bench_agents;
mod bench_args;
mod bench_memory;
mod bench_partial;
mod bench_rewards;
mod bench_tokens;
mod doctor;
mod eval;
mod eval_episodes;
mod eval_run;
mod export;
mod plan;
mod plan_memory;
mod plot;
mod serve;
mod serve_reward;
mod sft;
mod sft_memory;
mod train;
mod view;

use clap::{Parser, Subcommand};
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
        /// Replace the run in `run.dir`: its files are set aside in `.replaced/`, removed once
        /// this run writes its first checkpoint, and put back if it fails before. Without it, a
        /// run directory that holds another run is refused.
        #[arg(long, conflicts_with = "resume")]
        overwrite: bool,
    },
    /// Plan PPO mini-batches for a JSON batch (file or stdin) and print the plan as JSON.
    Plan {
        /// Input file; `-` or nothing reads stdin.
        input: Option<PathBuf>,
    },
    /// The memory a training config needs on a device, part by part, and whether it fits:
    /// a model directory or just its config.json, `--set` as `train` takes it.
    PlanMemory(plan_memory::PlanMemoryArgs),
    /// Measure training-step time and decode throughput of a model size.
    Bench(bench::BenchArgs),
    /// Train the long-tail `reverse` task twice, synchronous then with partial rollout, and
    /// compare trained tokens per second, step-time spread and reward curves (one PNG).
    BenchPartial(bench_partial::PartialBenchArgs),
    /// The multi-turn learning runs of `configs/`: the calculator agent, and the guessing
    /// game under each credit mode; greedy success, turns and tool calls before and after RL
    /// in one table, and their curves as PNGs.
    BenchAgents(bench_agents::AgentsBenchArgs),
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
        /// Where the figure goes, a file ending in .png (default: one run's own plot.png;
        /// several runs' overlay in compare.png).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Name what went wrong in runs: replays each run's metrics and trajectories through the
    /// diagnoses (docs/diagnoses.md) and reports them. Exit status 0: healthy; 1: a diagnosis
    /// held; 2: a run could not be read.
    Doctor(doctor::DoctorArgs),
    /// Serve the sources of a `[reward]` config (e.g. a reward model) over HTTP, for a
    /// trainer's `kind = "remote"` source.
    ServeReward(serve_reward::ServeRewardArgs),
    /// Serve a model over an OpenAI-compatible HTTP API and record the token-exact rollouts of
    /// agents that call it (`/rollouts/{id}/v1`). No arguments: a random tiny model.
    Serve(serve::ServeArgs),
    /// Read runs in a browser: their curves, each step's trajectories (sortable, filterable),
    /// one trajectory token by token coloured by mask, advantage, staleness or importance
    /// weight, and its group side by side. Serves one local page and prints its address.
    View(view::ViewArgs),
    /// Fold a LoRA adapter (PEFT's layout) into its base model and write a plain Hugging Face
    /// model directory: `skein export --merge --adapter RUN_DIR/checkpoint/adapter OUT`.
    Export(export::ExportArgs),
    /// The devices this build can compute on (`run.device`), and why a GPU is not seen when
    /// it is not: no CUDA in the libtorch it was built against, or no driver.
    Devices,
}

pub fn main() -> ExitCode {
    // Before anything asks libtorch about CUDA: it answers once per process.
    crate::devices::load_cuda();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train {
            config,
            overrides,
            print_config,
            resume,
            overwrite,
        } => train::run(config, overrides, print_config, resume, overwrite),
        Command::Plan { input } => return plan::run(input),
        Command::Doctor(args) => return doctor::run(&args),
        Command::PlanMemory(args) => plan_memory::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::BenchPartial(args) => bench_partial::run(&args),
        Command::BenchAgents(args) => bench_agents::run(&args),
        Command::ServeReward(args) => serve_reward::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::View(args) => view::run(&args),
        Command::Export(args) => export::run(&args),
        Command::Devices => {
            println!("{}", crate::devices::report());
            println!("{}", crate::engine::cuda_graph::report());
            Ok(())
        }
        Command::Eval(args) => eval::run(&args),
        Command::Sft(args) => sft::run(&args),
        Command::Plot {
            run_dirs,
            keys,
            out,
        } => plot::run(&run_dirs, &keys, out.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
