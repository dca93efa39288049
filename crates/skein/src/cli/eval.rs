//! `skein eval`: accuracy and pass@k of a model on prompt files, on a run's validation split,
//! or on the built-in task's held-out problems; greedy by default, sampled with `--n`.

use crate::engine::{Engine, Generator, SamplingParams};
use crate::model::Model;
use crate::trainer::rollout::dataset::{
    eval_seed, fit_split, prompt_batch, read_split, DatasetTask, Renderer,
};
use crate::trainer::rollout::evaluation_problems;
use crate::trainer::rollout::judge::{answer_prompts, Answering};
use crate::trainer::TrainConfig;
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use skein_tasks::Task;
use skein_text::Tokenizer;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct EvalArgs {
    /// A model directory (Hugging Face layout) or a run directory (its `checkpoint/` is
    /// evaluated, with its `config.toml`).
    pub model: PathBuf,
    /// Prompt files (.jsonl or .parquet, verl layout). Default: the config's
    /// `data.val_files`, else the built-in task's held-out problems.
    #[arg(long = "data", value_name = "FILE")]
    pub data: Vec<PathBuf>,
    /// A TOML config (default: the run's config.toml; else the defaults).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override one config key, e.g. --set rollout.sampling.max_new_tokens=512
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Samples per problem.
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// Sampling temperature (default: 0, greedy, when --n is 1; else the config's
    /// `rollout.sampling.temperature`).
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f64>,
    /// The k of pass@k, comma-separated, each at most --n (default: 1 and --n).
    #[arg(long, value_delimiter = ',')]
    pub k: Vec<usize>,
    /// Problems to evaluate (default: every row of the files; `eval.problems` for the task).
    #[arg(long)]
    pub problems: Option<usize>,
    /// Also append the metrics line to this JSONL file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Most samples one evaluation answers (problems × --n); each is held in memory to the end.
const MAX_SAMPLES: usize = 1 << 20;

pub fn run(args: &EvalArgs) -> Result<()> {
    let ks = pass_ks(args)?;
    let (model_dir, cfg) = resolve(args)?;
    let device = cfg.run.start_device()?;
    let tokenizer = Tokenizer::from_dir(&model_dir)?;
    let policy = Model::load_dir(&model_dir, device)?;
    let (task, problems, source) = problems(args, &cfg, &tokenizer)?;
    if problems.len().saturating_mul(args.n) > MAX_SAMPLES {
        bail!(
            "--n {} × {} problems is more than {MAX_SAMPLES} samples, which are held in memory: \
             lower --n or --problems",
            args.n,
            problems.len()
        );
    }
    let batch = prompt_batch(problems, &tokenizer)?;
    let eos = *tokenizer
        .eos_token_ids()
        .first()
        .context("the tokenizer defines no end-of-sequence token")?;
    let temperature = args.temperature.unwrap_or(if args.n == 1 {
        0.0
    } else {
        cfg.rollout.sampling.temperature
    });
    if !(temperature.is_finite() && temperature >= 0.0) {
        bail!("--temperature {temperature}: must be a finite number ≥ 0 (0 is greedy)");
    }
    let params = SamplingParams {
        temperature,
        stop_token_ids: vec![eos],
        ..cfg.rollout.sampling.clone()
    };
    tch::manual_seed(cfg.run.seed as i64);
    let engine = Generator::Local(Engine::new(cfg.rollout.max_slots));
    let answering = Answering {
        engine: &engine,
        policy: &policy,
        version: 0,
        task: task.as_ref(),
        tokenizer: &tokenizer,
        params: &params,
        rewarder: None,
    };
    let r = answer_prompts(&answering, &batch, args.n, "eval");
    let n_problems = batch.problems.len();
    let total = r.trajectories.len().max(1) as f64;
    let mut line = Map::new();
    line.insert("model".into(), json!(model_dir.display().to_string()));
    line.insert("data".into(), json!(source));
    line.insert("problems".into(), json!(n_problems));
    line.insert("n".into(), json!(args.n));
    line.insert("temperature".into(), json!(temperature));
    let correct = r.correct.iter().filter(|&&c| c).count() as f64;
    line.insert("eval/accuracy".into(), json!(correct / total));
    let reward = r.trajectories.iter().map(|t| t.reward).sum::<f64>() / total;
    line.insert("eval/reward".into(), json!(reward));
    // `answer_prompts` numbers samples problem-major: sample k of problem p is p·n + k.
    let per_problem: Vec<usize> = r
        .correct
        .chunks(args.n)
        .map(|c| c.iter().filter(|&&x| x).count())
        .collect();
    for k in ks {
        let p = per_problem
            .iter()
            .map(|&c| pass_at_k(args.n, c, k))
            .sum::<f64>()
            / per_problem.len().max(1) as f64;
        line.insert(format!("eval/pass@{k}"), json!(p));
    }
    let text = Value::Object(line).to_string();
    println!("{text}");
    if let Some(out) = &args.out {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)
            .with_context(|| format!("opening {}", out.display()))?;
        writeln!(f, "{text}").with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

/// The model directory and the config: a run directory brings its own config and
/// `checkpoint/`; a model directory is rendered with its own chat template.
fn resolve(args: &EvalArgs) -> Result<(PathBuf, TrainConfig)> {
    let run_config = args.model.join("config.toml");
    let is_run = run_config.is_file() && args.model.join("checkpoint").is_dir();
    let config = args.config.clone().or_else(|| is_run.then_some(run_config));
    let mut overrides = args.overrides.clone();
    if !is_run {
        overrides.push(format!(
            "model.path={}",
            super::train::toml_string(&args.model.display().to_string())
        ));
    }
    let cfg = super::train::load_config(config.as_deref(), &overrides)?;
    let dir = if is_run {
        args.model.join("checkpoint")
    } else {
        args.model.clone()
    };
    if !dir.join("config.json").is_file() {
        bail!(
            "{} is neither a model directory (no config.json) nor a run directory (config.toml \
             and checkpoint/)",
            args.model.display()
        );
    }
    Ok((dir, cfg))
}

fn pass_ks(args: &EvalArgs) -> Result<Vec<usize>> {
    if args.n == 0 {
        bail!("--n must be at least 1");
    }
    if args.problems == Some(0) {
        bail!("--problems must be at least 1 (leave it out to evaluate every problem)");
    }
    if args.n > MAX_SAMPLES || args.problems.is_some_and(|p| p > MAX_SAMPLES) {
        bail!("--n and --problems must be at most {MAX_SAMPLES}: samples are held in memory");
    }
    let mut ks = if args.k.is_empty() {
        vec![1, args.n]
    } else {
        args.k.clone()
    };
    ks.sort_unstable();
    ks.dedup();
    if let Some(&k) = ks.iter().find(|&&k| k == 0 || k > args.n) {
        bail!("--k {k}: each k must be between 1 and --n ({})", args.n);
    }
    Ok(ks)
}

/// The problems to evaluate, the task that scores them, and a description of their source.
fn problems(
    args: &EvalArgs,
    cfg: &TrainConfig,
    tokenizer: &Tokenizer,
) -> Result<(Box<dyn Task>, Vec<skein_tasks::Problem>, String)> {
    let files: Vec<String> = if args.data.is_empty() {
        cfg.data.val_files.clone()
    } else {
        args.data.iter().map(|p| p.display().to_string()).collect()
    };
    if files.is_empty() {
        let task = skein_tasks::task_by_name(&cfg.task.name, cfg.task.difficulty)?;
        let n = args.problems.unwrap_or(cfg.eval.problems);
        let seed = eval_seed(cfg.run.seed);
        let (problems, held_out) =
            evaluation_problems(task.name(), task.problem_count(), n, seed, |r| {
                task.sample(r)
            })?;
        let split = if held_out { "held-out" } else { "train-set" };
        let source = format!(
            "task {} (difficulty {}, {split} problems)",
            cfg.task.name, cfg.task.difficulty
        );
        return Ok((task, problems, source));
    }
    let renderer = Renderer::for_config(cfg)?;
    let (problems, read) = read_split(&cfg.data, &files, "val", &renderer)?;
    let (mut problems, fitted) = fit_split(problems, tokenizer, &cfg.data, "val")?;
    if read.skipped_rows + fitted.filtered_prompts + fitted.truncated_prompts > 0 {
        eprintln!(
            "skein: {} bad rows skipped, {} prompts filtered, {} truncated",
            read.skipped_rows, fitted.filtered_prompts, fitted.truncated_prompts
        );
    }
    if let Some(n) = args.problems {
        problems.truncate(n);
    }
    let task = DatasetTask::new("eval".into(), problems.clone(), "", &cfg.data);
    Ok((Box::new(task), problems, files.join(", ")))
}

/// The unbiased pass@k estimate for one problem with `c` of `n` samples correct:
/// 1 − C(n−c, k) / C(n, k), as a product so it stays exact for large n.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if n - c < k {
        return 1.0;
    }
    let fail: f64 = (n - c + 1..=n).map(|i| 1.0 - k as f64 / i as f64).product();
    1.0 - fail
}

#[cfg(test)]
mod tests {
    use super::pass_at_k;

    #[test]
    fn pass_at_k_matches_the_combinatorial_formula() {
        // n = 5, c = 2, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10.
        assert!((pass_at_k(5, 2, 2) - 0.7).abs() < 1e-12);
        assert_eq!(pass_at_k(5, 0, 3), 0.0);
        assert_eq!(pass_at_k(5, 4, 2), 1.0);
        // pass@1 is the fraction correct.
        assert!((pass_at_k(8, 3, 1) - 3.0 / 8.0).abs() < 1e-12);
    }
}
