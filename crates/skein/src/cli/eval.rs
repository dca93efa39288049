//! `skein eval`: accuracy and pass@k of a model on prompt files, on a run's validation split,
//! or on the built-in task's held-out problems; greedy by default, sampled with `--n`. A run's
//! config brings its judge of correctness (`eval.correct_by`) and its `[reward]`, so
//! `eval/accuracy` and `eval/reward` mean what they meant in its training. A multi-turn run
//! is evaluated by its episodes (`eval_episodes.rs`).

use super::eval_episodes::{self, Loaded};
use crate::engine::{Engine, Generator, SamplingParams};
use crate::model::{Dtype, Model, ModelOptions};
use crate::trainer::config::correct_by::{builtin_checker, DATASET_CHECKER};
use crate::trainer::rollout::dataset::{
    eval_seed, fit_split, prompt_batch, read_split, what_fits_more, Data, DatasetTask, Renderer,
};
use crate::trainer::rollout::judge::{answer_prompts_with, Answering, Answers, PromptBatch};
use crate::trainer::rollout::reward::build_rewarder;
use crate::trainer::rollout::routes::check_rows_are_routed;
use crate::trainer::rollout::tasks::is_multi_turn;
use crate::trainer::rollout::{eval_failure, evaluation_problems, EvalResult};
use crate::trainer::{final_checkpoint, TrainConfig};
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use skein_plan::Status;
use skein_report::StepProgress;
use skein_tasks::Task;
use skein_text::Tokenizer;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct EvalArgs {
    /// A model directory (Hugging Face layout) or a run directory (its `checkpoint/` is
    /// evaluated, with its `config.toml`).
    pub model: PathBuf,
    /// Prompt files (.jsonl or .parquet, verl layout), every row evaluated. Default: the
    /// config's held-out problems, as its run evaluates them: the first `eval.problems` rows
    /// of `data.val_files`, else as many distinct training problems drawn with the
    /// evaluation's seed, else the built-in task's (a multi-turn task's, or environment
    /// workers', played as episodes).
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
    /// Problems to evaluate (default: every row of `--data` files; else `eval.problems`).
    #[arg(long)]
    pub problems: Option<usize>,
    /// Also append the metrics line to this JSONL file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write every sample to this JSONL file (a new file; an existing one is refused): its
    /// problem and sample number, prompt, ground truth, response text, verdict, reward and
    /// whether it was cut at `rollout.sampling.max_new_tokens`, to read what the model said
    /// or score it another way.
    #[arg(long, value_name = "FILE")]
    pub samples: Option<PathBuf>,
}

/// Most samples one evaluation answers (problems × --n); each is held in memory to the end.
const MAX_SAMPLES: usize = 1 << 20;

/// Checks the paths it writes, then evaluates. The `--samples` file appears only once it is
/// complete, so a failed or interrupted evaluation leaves its path free for the same command.
pub fn run(args: &EvalArgs) -> Result<()> {
    let ks = pass_ks(args)?;
    if let Some(out) = &args.out {
        check_appendable(out)?;
    }
    if let Some(path) = &args.samples {
        SamplesFile::check(path)?;
    }
    evaluate(args, &ks)
}

fn evaluate(args: &EvalArgs, ks: &[usize]) -> Result<()> {
    let (model_dir, cfg) = resolve(args)?;
    // A multi-turn run's evaluation is episodes, unless prompt files are named.
    let episodes = args.data.is_empty() && is_multi_turn(&cfg);
    if episodes {
        refuse_sampling_options(args)?;
    }
    let device = cfg.run.start_device()?;
    let mut tokenizer = Tokenizer::from_dir(&model_dir)?;
    tokenizer.treat_as_added_stops(&cfg.rollout.sampling.stop_token_ids);
    let policy = Model::load_dir_with(&model_dir, &evaluated_as(&cfg), device)?;
    let mut engine = Engine::new(cfg.rollout.max_slots);
    // A run that decoded through CUDA graphs, evaluated on the CPU, decodes the ordinary way.
    engine.cuda_graphs = cfg.rollout.cuda_graphs && device.is_cuda();
    let engine = Generator::Local(engine);
    let loaded = Loaded {
        model_dir: &model_dir,
        engine: &engine,
        policy: &policy,
        tokenizer: &tokenizer,
    };
    let (mut line, samples) = if episodes {
        (eval_episodes::evaluate(args.problems, cfg, &loaded)?, None)
    } else {
        answer(args, ks, &cfg, &loaded)?
    };
    line.insert("dtype".into(), json!(policy.options.dtype.name()));
    let text = Value::Object(line).to_string();
    println!("{text}");
    if let Some(out) = &args.out {
        append_line(out, &text)?;
    }
    samples.map_or(Ok(()), SamplesFile::publish)
}

/// The options of a sampled, single-turn evaluation, refused by name for a multi-turn run.
fn refuse_sampling_options(args: &EvalArgs) -> Result<()> {
    let given = [
        (args.n != 1, "--n"),
        (args.temperature.is_some_and(|t| t != 0.0), "--temperature"),
        (!args.k.is_empty(), "--k"),
        (args.samples.is_some(), "--samples"),
    ];
    if let Some((_, flag)) = given.iter().find(|(given, _)| *given) {
        bail!(
            "{flag} does not apply to a multi-turn run: its evaluation plays one greedy episode \
             per problem, as its training did; leave {flag} out (or give --data to evaluate \
             single-turn prompt files)"
        );
    }
    Ok(())
}

/// The metrics line of `--n` answers to each single-turn problem, and the samples written
/// for `--samples`, to be put in place once the line is out.
fn answer(
    args: &EvalArgs,
    ks: &[usize],
    cfg: &TrainConfig,
    loaded: &Loaded,
) -> Result<(Map<String, Value>, Option<SamplesFile>)> {
    let Loaded {
        model_dir,
        engine,
        policy,
        tokenizer,
    } = *loaded;
    let correct_by = cfg.correct_by().map_err(anyhow::Error::msg)?;
    let device = policy.vs.device();
    let EvalSet {
        task,
        scorer,
        problems,
        source,
        checker,
    } = problems(args, cfg, tokenizer)?;
    if problems.len().saturating_mul(args.n) > MAX_SAMPLES {
        bail!(
            "--n {} × {} problems is more than {MAX_SAMPLES} samples, which are held in memory: \
             lower --n or --problems",
            args.n,
            problems.len()
        );
    }
    let batch = prompt_batch(problems, tokenizer, task.as_ref())?;
    // The run's reward sources, as its evaluations had them (their `task` scorer is the
    // task these problems come from).
    let rewarder = match &cfg.reward {
        Some(reward) => Some(build_rewarder(
            reward,
            &cfg.reward_models,
            Some(scorer),
            device,
        )?),
        None => None,
    };
    let params = sampling_params(args, cfg, tokenizer)?;
    tch::manual_seed(cfg.run.seed as i64);
    let answering = Answering {
        engine,
        policy,
        version: 0,
        task: task.as_ref(),
        tokenizer,
        params: &params,
        rewarder: rewarder.as_ref(),
        correct_by: &correct_by,
    };
    let mut progress =
        StepProgress::counting(batch.problems.len() as u64 * args.n as u64, "sample");
    let mut answered = 0;
    let r = answer_prompts_with(&answering, &batch, args.n, "eval", || {
        answered += 1;
        progress.update(answered, &[]);
    });
    progress.finish();
    let mut line = Map::new();
    line.insert("model".into(), json!(model_dir.display().to_string()));
    line.insert("data".into(), json!(source));
    line.insert("problems".into(), json!(batch.problems.len()));
    line.insert("n".into(), json!(args.n));
    line.insert("temperature".into(), json!(params.temperature));
    line.insert("max_new_tokens".into(), json!(params.max_new_tokens));
    line.insert("correct_by".into(), json!(correct_by.describe(&checker)));
    insert_scores(&mut line, &r, args.n, ks);
    let cut = truncated_fraction(&r);
    line.insert("eval/truncated_fraction".into(), json!(cut));
    if let Some(warning) = truncation_warning(cut, params.max_new_tokens) {
        eprintln!("{warning}");
    }
    let samples = match &args.samples {
        Some(path) => Some(SamplesFile::write(path, |out| {
            write_samples(out, &r, &batch, args.n, tokenizer)
        })?),
        None => None,
    };
    Ok((line, samples))
}

/// The evaluation's sampling: greedy for one sample a problem unless --temperature says
/// otherwise, else the config's temperature; stopping where a run's samples stop (each of the
/// tokenizer's end-of-sequence ids and the config's `stop_token_ids`).
fn sampling_params(
    args: &EvalArgs,
    cfg: &TrainConfig,
    tokenizer: &Tokenizer,
) -> Result<SamplingParams> {
    if tokenizer.eos_token_ids().is_empty() {
        bail!("the tokenizer defines no end-of-sequence token");
    }
    let temperature = args.temperature.unwrap_or(if args.n == 1 {
        0.0
    } else {
        cfg.rollout.sampling.temperature
    });
    if !(temperature.is_finite() && temperature >= 0.0) {
        bail!("--temperature {temperature}: must be a finite number ≥ 0 (0 is greedy)");
    }
    Ok(SamplingParams {
        temperature,
        ..cfg
            .rollout
            .sampling
            .stopping_at(&tokenizer.stop_token_ids())
    })
}

/// The fraction of samples cut at the new-token budget (`rollout.sampling.max_new_tokens`)
/// before they ended: each is scored as it stands, its answer perhaps never written.
fn truncated_fraction(r: &Answers) -> f64 {
    let cut = r
        .trajectories
        .iter()
        .filter(|t| t.status == Status::Truncated)
        .count();
    cut as f64 / r.trajectories.len().max(1) as f64
}

/// Most samples cut at the budget: their scores are of answers the model did not finish.
fn truncation_warning(cut: f64, budget: usize) -> Option<String> {
    (cut > 0.5).then(|| {
        format!(
            "skein: warning: {:.0}% of the samples reached the limit of {budget} new tokens \
             (`rollout.sampling.max_new_tokens`) before they ended, and are scored cut there \
             (`eval/truncated_fraction`): raise it, e.g. --set \
             rollout.sampling.max_new_tokens=512",
            cut * 100.0
        )
    })
}

/// `eval/accuracy`, `eval/reward` and `eval/pass@k` of the answers, `n` per problem.
fn insert_scores(line: &mut Map<String, Value>, r: &Answers, n: usize, ks: &[usize]) {
    let scores = EvalResult::of(r.trajectories.iter().zip(r.correct.iter().copied()));
    for (key, value) in scores.scores() {
        line.insert(key.into(), json!(value));
    }
    // `answer_prompts` numbers samples problem-major: sample k of problem p is p·n + k.
    let per_problem: Vec<usize> = r
        .correct
        .chunks(n)
        .map(|c| c.iter().filter(|&&x| x).count())
        .collect();
    for &k in ks {
        let p = per_problem.iter().map(|&c| pass_at_k(n, c, k)).sum::<f64>()
            / per_problem.len().max(1) as f64;
        line.insert(format!("eval/pass@{k}"), json!(p));
    }
}

/// Appends one line to `out` (`--out`), creating it.
fn append_line(out: &std::path::Path, text: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .with_context(|| format!("opening {}", out.display()))?;
    writeln!(f, "{text}").with_context(|| format!("writing {}", out.display()))
}

/// `--out`, checked before any model is loaded: a file it can append to, or a new file in an
/// existing directory (an evaluation's minutes are not spent to find it cannot be written).
fn check_appendable(out: &std::path::Path) -> Result<()> {
    if out.is_dir() {
        bail!("--out {} is a directory: name a JSONL file", out.display());
    }
    if out.exists() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(out)
            .with_context(|| format!("--out {}: cannot append to it", out.display()))?;
        return Ok(());
    }
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty());
    if parent.is_some_and(|p| !p.is_dir()) {
        bail!(
            "--out {}: its directory does not exist: create it, or name another file",
            out.display()
        );
    }
    Ok(())
}

/// `--samples`, written beside its path under a hidden name and put in place only when
/// complete: an interrupted evaluation (Ctrl-C) leaves no file to block the same command, and
/// an existing file is never overwritten.
struct SamplesFile {
    written: PathBuf,
    path: PathBuf,
}

impl SamplesFile {
    /// Checked before any model is loaded: the path is new, and its directory takes a file.
    fn check(path: &Path) -> Result<()> {
        let cannot = || format!("--samples {}: cannot create it", path.display());
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path);
        match created {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => bail!(
                "--samples {}: the file exists, and an existing file is not overwritten: give a \
                 new path, or move it away",
                path.display()
            ),
            Err(_)
                if path
                    .parent()
                    .is_some_and(|p| !p.as_os_str().is_empty() && !p.is_dir()) =>
            {
                bail!(
                    "--samples {}: its directory does not exist: create it, or name another file",
                    path.display()
                )
            }
            Err(e) => return Err(e).with_context(cannot),
        }
        std::fs::remove_file(path).with_context(cannot)
    }

    /// The samples `write` writes, held under a hidden name beside `path`.
    fn write(path: &Path, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<Self> {
        let name = path
            .file_name()
            .map_or_else(|| "samples".into(), |n| n.to_string_lossy().into_owned());
        let written = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let file = SamplesFile {
            written,
            path: path.to_path_buf(),
        };
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(&file.written)
                .with_context(|| format!("creating {}", file.written.display()))?,
        );
        write(&mut out)
            .and_then(|()| out.flush().map_err(Into::into))
            .with_context(|| format!("writing {}", file.written.display()))?;
        Ok(file)
    }

    /// Puts the samples at their path: linked there, which fails rather than replace a file
    /// that appeared meanwhile (on a filesystem without links, renamed once the path is seen
    /// to be free).
    fn publish(self) -> Result<()> {
        let linked = match std::fs::hard_link(&self.written, &self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists && !self.path.exists() => {
                std::fs::rename(&self.written, &self.path)
            }
            linked => linked,
        };
        linked.with_context(|| {
            format!(
                "--samples {}: cannot create it (an existing file is not overwritten)",
                self.path.display()
            )
        })
    }
}

impl Drop for SamplesFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.written);
    }
}

/// One JSON line per sample, in `answer_prompts`' problem-major order (sample k of problem p
/// is p·n + k).
fn write_samples(
    out: &mut dyn Write,
    r: &Answers,
    batch: &PromptBatch,
    n: usize,
    tokenizer: &Tokenizer,
) -> Result<()> {
    for (i, (t, correct)) in r.trajectories.iter().zip(&r.correct).enumerate() {
        let (p, k) = (i / n.max(1), i % n.max(1));
        let problem = &batch.problems[p];
        let response: Vec<u32> = t
            .transitions
            .iter()
            .flat_map(|x| x.response.iter().copied())
            .collect();
        let mut line = json!({
            "problem": p,
            "sample": k,
            "prompt": problem.prompt,
            "ground_truth": problem.ground_truth,
            "response": crate::trainer::rollout::judge::response_text(tokenizer, &response)?,
            "correct": correct,
            "reward": t.reward,
            "truncated": t.status == Status::Truncated,
        });
        // A failed answer (a reward service that did not answer, a reward out of range) earned
        // no reward: null, and why, as `eval/reward` leaves it out rather than counting a 0.
        if let Some(why) = eval_failure(t) {
            line["reward"] = Value::Null;
            line["failed"] = Value::from(why);
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// How the model is loaded: in `model.dtype`, so a run's evaluation computes what the run's
/// own did, in the memory it took. A LoRA run's checkpoint holds its merged weights in float32,
/// where its updates are kept, and is loaded so: rounded to a bfloat16 `model.dtype`, most of
/// them would be lost.
fn evaluated_as(cfg: &TrainConfig) -> ModelOptions {
    let dtype = if cfg.lora.enabled() {
        Dtype::Float32
    } else {
        cfg.model.dtype
    };
    ModelOptions {
        dtype,
        lora: Default::default(),
    }
}

/// The model directory and the config: a run directory brings its own config and its newest
/// weights (`checkpoint/`, or a later `checkpoint-N`: [`final_checkpoint::newest`]), whose
/// tokenizer and chat template are the run's; a model directory is rendered with its own chat
/// template.
fn resolve(args: &EvalArgs) -> Result<(PathBuf, TrainConfig)> {
    let run_config = args.model.join("config.toml");
    let run_weights = match run_config.is_file() {
        true => final_checkpoint::newest(&args.model)?,
        false => None,
    };
    if run_config.is_file() && run_weights.is_none() && !args.model.join("config.json").is_file() {
        bail!(
            "{} is a run directory with no weights yet: it stopped before it wrote `checkpoint/` \
             or a `checkpoint-N` (`trainer.checkpoint_every`)",
            args.model.display()
        );
    }
    let is_run = run_weights.is_some();
    let config = args.config.clone().or_else(|| is_run.then_some(run_config));
    let mut overrides = args.overrides.clone();
    if !is_run {
        overrides.push(format!(
            "model.path={}",
            super::train::toml_string(&args.model.display().to_string())
        ));
    }
    let mut cfg = super::train::load_config(config.as_deref(), &overrides)?;
    crate::trainer::config::validate::validate_for_eval(&cfg)?;
    let dir = match run_weights {
        Some(weights) => {
            if let Some(note) = &weights.note {
                eprintln!("skein: {note}; evaluating {}", weights.dir.display());
            }
            if args.config.is_none() {
                // Its paths were relative to where the run started, which may not be here.
                super::eval_run::resolve_paths(
                    &mut cfg,
                    &args.model,
                    &weights.dir,
                    &overrides,
                    args.data.is_empty(),
                )?;
            }
            weights.dir
        }
        None => args.model.clone(),
    };
    if !dir.join("config.json").is_file() {
        bail!(
            "{} is neither a model directory (no config.json) nor a run directory (config.toml \
             and checkpoint/ or checkpoint-N)",
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

/// What one evaluation answers, and who checks it.
struct EvalSet {
    /// The task whose checker scores each response.
    task: Box<dyn Task>,
    /// The same task again, for the `[reward]` sources' `task` scorer.
    scorer: Box<dyn Task>,
    problems: Vec<skein_tasks::Problem>,
    /// Where the problems come from, in words.
    source: String,
    /// The task's own checker, in words.
    checker: String,
}

/// The problems to evaluate, the task that scores them, and a description of both. Without
/// `--data`, the config's held-out problems exactly as its run evaluated them (the same rows,
/// or draws, and `eval.problems` of them); with it, every row of the files.
fn problems(args: &EvalArgs, cfg: &TrainConfig, tokenizer: &Tokenizer) -> Result<EvalSet> {
    if !args.data.is_empty() {
        let files: Vec<String> = args.data.iter().map(|p| p.display().to_string()).collect();
        return dataset_rows(cfg, &files, args.problems, tokenizer);
    }
    let n = args.problems.unwrap_or(cfg.eval.problems);
    if !cfg.data.val_files.is_empty() {
        // The run's held-out set: its validation rows as it read, fitted and kept them
        // (without the prompts training also has, each once).
        let data = Data::load(cfg)?;
        let problems: Vec<_> = data.val.into_iter().take(n).collect();
        let rendered = data.train.prompt_is_rendered();
        let task = DatasetTask::new("eval".into(), problems.clone(), "", &cfg.data, rendered);
        return Ok(EvalSet {
            scorer: Box::new(task.clone()),
            task: Box::new(task),
            problems,
            source: format!("{} (held-out problems)", cfg.data.val_files.join(", ")),
            checker: DATASET_CHECKER.to_string(),
        });
    }
    let seed = eval_seed(cfg.run.seed);
    if !cfg.data.train_files.is_empty() {
        // Without validation files the run evaluated training rows drawn with a seed of their
        // own: the same draw, from the rows as the run read and fitted them.
        let data = Data::load(cfg)?;
        let problems = data.eval_batch(tokenizer, n, seed)?.problems;
        return Ok(EvalSet {
            task: Box::new(data.train.clone()),
            scorer: Box::new(data.train),
            problems,
            source: format!("{} (train-set problems)", cfg.data.train_files.join(", ")),
            checker: DATASET_CHECKER.to_string(),
        });
    }
    let task = skein_tasks::task_by_name(&cfg.task.name, cfg.task.difficulty)?;
    let (problems, held_out) =
        evaluation_problems(task.name(), task.problem_count(), n, seed, |r| {
            task.sample(r)
        })?;
    let split = if held_out { "held-out" } else { "train-set" };
    let source = format!(
        "task {} (difficulty {}, {split} problems)",
        cfg.task.name, cfg.task.difficulty
    );
    Ok(EvalSet {
        scorer: skein_tasks::task_by_name(&cfg.task.name, cfg.task.difficulty)?,
        task,
        problems,
        source,
        checker: builtin_checker(&cfg.task.name),
    })
}

/// The rows of prompt `files` (the first `limit`, if given), held to `data.max_prompt_tokens`
/// as a run holds its validation split.
fn dataset_rows(
    cfg: &TrainConfig,
    files: &[String],
    limit: Option<usize>,
    tokenizer: &Tokenizer,
) -> Result<EvalSet> {
    let renderer = Renderer::for_config(cfg)?;
    let (problems, read) = read_split(&cfg.data, files, "val", "--data", &renderer)?;
    let start = renderer.start_ids(tokenizer).len();
    let fitted = fit_split(problems, tokenizer, &cfg.data, "val", start)?;
    let (mut problems, counts) = (fitted.problems, fitted.counts);
    // Rows are skipped as bad when read (a malformed row, a template that fails) and when
    // tokenized (an empty prompt, one of unknown characters only).
    let skipped = read.skipped_rows + counts.skipped_rows;
    if skipped + counts.filtered_prompts + counts.truncated_prompts > 0 {
        eprintln!(
            "skein: {skipped} bad rows skipped, {} prompts filtered, {} truncated",
            counts.filtered_prompts, counts.truncated_prompts
        );
    }
    if counts.filtered_prompts + counts.truncated_prompts > 0 {
        eprintln!(
            "skein: prompts are held to `data.max_prompt_tokens` = {} (`data.truncation` = {}) \
             as the run held its own; `--set data.max_prompt_tokens=0` evaluates every row whole",
            cfg.data.max_prompt_tokens, cfg.data.truncation
        );
    }
    if let Some(n) = limit {
        problems.truncate(n);
    }
    if problems.is_empty() {
        bail!(
            "no problem to evaluate in {}: {} bad rows skipped, {} prompts over \
             `data.max_prompt_tokens` = {} filtered; {}",
            files.join(", "),
            skipped,
            counts.filtered_prompts,
            cfg.data.max_prompt_tokens,
            what_fits_more(cfg.data.truncation)
        );
    }
    if let Some(reward) = &cfg.reward {
        check_rows_are_routed(reward, &problems)?;
    }
    let rendered = renderer.is_template();
    let task = DatasetTask::new("eval".into(), problems.clone(), "", &cfg.data, rendered);
    Ok(EvalSet {
        scorer: Box::new(task.clone()),
        task: Box::new(task),
        problems,
        source: files.join(", "),
        checker: DATASET_CHECKER.to_string(),
    })
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
    use super::{pass_at_k, truncation_warning};

    /// Most samples cut at the budget is said on stderr, naming the key that raises it.
    #[test]
    fn most_samples_cut_at_the_budget_are_warned_of() {
        let warning = truncation_warning(0.75, 8).unwrap();
        assert!(warning.contains("75% of the samples"), "{warning}");
        assert!(warning.contains("limit of 8 new tokens"), "{warning}");
        assert!(
            warning.contains("--set rollout.sampling.max_new_tokens="),
            "{warning}"
        );
        assert_eq!(truncation_warning(0.5, 8), None);
    }

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
