//! A whole training run, readable top to bottom: build or load the policy, warm it up with SFT,
//! evaluate, then RL steps (rollout → score → advantages → plan → PPO update), evaluate again,
//! save the checkpoint and plot the curves.

use super::checkpoint::{self, Snapshot, TrainerState};
use super::config::TrainConfig;
use super::critic::{apply_gae, compute_values, critic_update, ValueLossConfig};
use super::dp::DataParallel;
use super::eval::{evaluate, EvalResult};
use super::interrupt;
use super::loss::LossConfig;
use super::microbatch::TrainRow;
use super::offpolicy::{importance_weights, OffPolicy};
use super::optim::{OptimConfig, Optimizer};
use super::partial::{IterationConfig, OnStale, Rollout, RolloutBuffer};
use super::ranks::{self, Ranks};
use super::rollout::PromptBatch;
use super::sft::{sft_row, sft_step};
use super::step_batch::{build_step_batch, StepBatchConfig};
use super::update::{ppo_update, recompute_logprobs, UpdateConfig};
use crate::engine::{Engine, Generator, RemoteEngine, SamplingParams};
use crate::model::{Model, ValueModel};
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use skein_report::{MetricsLog, StepProgress};
use skein_tasks::{Task, TaskRng};
use skein_text::Tokenizer;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tch::Device;

/// What a finished run reports (also written to metrics.jsonl and the plot).
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub dir: PathBuf,
    pub eval_before: EvalResult,
    pub eval_after: EvalResult,
    /// Mean training reward of each RL step.
    pub rewards: Vec<f64>,
    /// Stopped by Ctrl-C after a step and its checkpoint: resume to continue.
    pub interrupted: bool,
    /// This process's data-parallel rank: anything but 0 only served rank 0's updates.
    pub rank: usize,
}

pub fn parse_device(s: &str) -> Result<Device> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::cuda_if_available()),
        other => match other.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(n) => Ok(Device::Cuda(n)),
            None => bail!("invalid value `{other}` for `run.device` (allowed: cpu, cuda, cuda:N)"),
        },
    }
}

pub fn train(cfg: &TrainConfig) -> Result<RunSummary> {
    run(cfg, false)
}

/// Continues the run in `cfg.run.dir` from its newest `checkpoint-N`, exactly where it stopped.
pub fn resume(cfg: &TrainConfig) -> Result<RunSummary> {
    run(cfg, true)
}

fn run(cfg: &TrainConfig, resume: bool) -> Result<RunSummary> {
    super::validate::validate(cfg)?;
    let device = parse_device(&cfg.run.device)?;
    if cfg.run.threads > 0 {
        tch::set_num_threads(cfg.run.threads as i32);
    }
    let dp = DataParallel::start(cfg)?;
    if dp.rank() > 0 {
        // Another rank of an MPI job: rank 0 runs the loop and sends this one its rows.
        dp.serve(device)?;
        return Ok(RunSummary {
            dir: PathBuf::from(&cfg.run.dir),
            eval_before: EvalResult::default(),
            eval_after: EvalResult::default(),
            rewards: Vec::new(),
            interrupted: false,
            rank: dp.rank(),
        });
    }
    let dir = PathBuf::from(&cfg.run.dir);
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating run directory {}", dir.display()))?;
    std::fs::write(dir.join("config.toml"), skein_config::to_toml_string(cfg))?;
    let metrics_path = dir.join("metrics.jsonl");
    let resumed = if resume {
        Some(find_checkpoint(&dir)?)
    } else {
        None
    };
    match &resumed {
        Some((_, state)) => checkpoint::truncate_lines(&metrics_path, state.metrics_lines)?,
        None => {
            let _ = std::fs::remove_file(&metrics_path);
        }
    }
    let mut log = MetricsLog::create(&metrics_path)?;

    // A multi-turn task runs episodes; anything else answers single prompts.
    let agent_task = super::agent_step::agent_task(cfg)?;
    let (task, data) = match &agent_task {
        Some(_) => (None, None),
        None => {
            let (t, d) = super::dataset_task::task_from_config(cfg)?;
            (Some(t), d)
        }
    };
    if let (Some(d), Some((_, s))) = (&data, &resumed) {
        d.train.seek(s.data_position);
    }
    let (alphabet, task_name, min_positions) = match (&task, &agent_task) {
        (Some(t), _) => (t.alphabet(), t.name().to_string(), 0),
        (None, Some(a)) => (
            a.alphabet(),
            a.name().to_string(),
            super::agent_step::MIN_AGENT_POSITIONS,
        ),
        (None, None) => bail!("no task to train on"),
    };
    let (tokenizer, policy) = match &resumed {
        Some((ckpt, _)) => (Tokenizer::from_dir(ckpt)?, Model::load_dir(ckpt, device)?),
        None => build_policy(cfg, alphabet, min_positions, device)?,
    };
    let agent = match agent_task {
        Some(a) => Some(super::agent_step::AgentWork::new(
            cfg,
            a,
            &tokenizer,
            policy.net.max_positions() as usize,
        )?),
        None => None,
    };
    let eos = tokenizer
        .eos_token_ids()
        .first()
        .copied()
        .context("the tokenizer defines no end-of-sequence token")?;
    let sampling = SamplingParams {
        stop_token_ids: vec![eos],
        ..cfg.rollout.sampling.clone()
    };
    if device == Device::Cpu {
        if let Some(available) = super::preflight::available_memory() {
            super::preflight::check(
                &super::preflight::estimate(cfg, &policy.net.config),
                available,
            )?;
        }
    }
    let engine = match cfg.rollout.engine.as_str() {
        "remote" => Generator::Remote(RemoteEngine::new(&cfg.rollout.remote)),
        _ => Generator::Local(Engine::new(cfg.rollout.max_slots)),
    };
    let rewarder = super::dataset_task::rewarder(cfg, data.as_ref(), device)?;
    eprintln!(
        "skein: {} model, {:.2}M parameters, task `{}` (difficulty {}), run directory {}",
        policy.net.config.model_type,
        policy.net.config.num_parameters() as f64 / 1e6,
        task_name,
        cfg.task.difficulty,
        dir.display()
    );

    // External agents get the task's problems over HTTP and call this policy.
    let mut external = match cfg.agent.kind.as_str() {
        "external" => Some(super::external::ExternalAgents::start(
            cfg, &tokenizer, &policy,
        )?),
        _ => None,
    };
    let mut rng = TaskRng::new(resumed.as_ref().map_or(cfg.run.seed, |(_, s)| s.task_rng));
    let eval_seed = super::dataset_task::eval_seed(cfg.run.seed);
    let mut eval_rng = TaskRng::new(eval_seed);
    let eval_set = match (&data, &task, &agent) {
        (Some(d), _, _) => {
            EvalSet::Prompts(d.eval_batch(&tokenizer, cfg.eval.problems, eval_seed)?)
        }
        (None, Some(t), _) => EvalSet::Prompts(prompt_batch(
            t.as_ref(),
            &tokenizer,
            &mut eval_rng,
            cfg.eval.problems,
        )?),
        (None, None, Some(a)) => EvalSet::Episodes(
            (0..cfg.eval.problems)
                .map(|_| a.task.sample(&mut eval_rng))
                .collect(),
        ),
        (None, None, None) => bail!("no task to evaluate"),
    };

    if cfg.sft.steps > 0 && resumed.is_none() {
        let mut demo = || -> Result<TrainRow> {
            match (&task, &agent) {
                (Some(t), _) => single_demo_row(t.as_ref(), &tokenizer, eos, &mut rng),
                (None, Some(a)) => a.demonstration_row(&tokenizer, &sampling, eos, &mut rng),
                (None, None) => bail!("no task to demonstrate"),
            }
        };
        warm_up(cfg, &policy, &mut demo, &mut log)?;
    }
    // A remote engine generates with the weights it was last given: the warmed-up (or resumed)
    // policy first, then the policy after every step.
    let publish = || publish_weights(&engine, &policy, &tokenizer, &sampling, &dir);
    publish()?;
    let held_out_eval = || match (&eval_set, &task, &agent) {
        (EvalSet::Prompts(batch), Some(t), _) => evaluate(
            &engine,
            &policy,
            t.as_ref(),
            &tokenizer,
            batch,
            &sampling,
            rewarder.as_ref(),
        ),
        (EvalSet::Episodes(problems), _, Some(a)) => {
            a.evaluate(&engine, &policy, &tokenizer, &sampling, problems)
        }
        _ => EvalResult {
            accuracy: 0.0,
            mean_reward: 0.0,
        },
    };
    let eval_before = match &resumed {
        Some((_, s)) => EvalResult {
            accuracy: s.eval_before_accuracy,
            mean_reward: s.eval_before_reward,
        },
        None => {
            let eval_before = held_out_eval();
            let mut first = record(
                0,
                [
                    ("eval/accuracy", eval_before.accuracy),
                    ("eval/reward", eval_before.mean_reward),
                ],
            );
            for (k, v) in data.iter().flat_map(|d| d.counts.metrics()) {
                first.insert(k.into(), json!(v));
            }
            log.append(&first)?;
            eprintln!(
                "skein: eval before RL: accuracy {:.3}",
                eval_before.accuracy
            );
            eval_before
        }
    };

    let reference = match (&resumed, cfg.algorithm.kl_coef > 0.0) {
        (_, false) => None,
        (Some((ckpt, _)), true) => Some(checkpoint::load_reference(ckpt, device)?),
        (None, true) => {
            let mut r = Model::random(&policy.net.config, device, 0)?;
            r.copy_from(&policy)?;
            Some(r)
        }
    };
    let steps = cfg.trainer.steps;
    let total_opt_steps = steps * cfg.trainer.ppo_epochs * cfg.trainer.num_mini_batches;
    let mut opt = Optimizer::new(&policy.vs, &cfg.optim, total_opt_steps)?;
    let update_cfg = UpdateConfig {
        loss: LossConfig {
            clip_low: cfg.algorithm.clip_low,
            clip_high: cfg.algorithm.clip_high,
            dual_clip: cfg.algorithm.dual_clip,
            kl_coef: cfg.algorithm.kl_coef,
            kl_estimator: cfg.algorithm.kl_estimator,
            entropy_coef: cfg.algorithm.entropy_coef,
        },
        epochs: cfg.trainer.ppo_epochs,
        micro_batch_tokens: cfg.trainer.micro_batch_tokens,
        temperature: sampling.temperature,
    };
    let batch_cfg = StepBatchConfig::from_config(cfg, sampling.max_new_tokens)?;
    let mut critic = if batch_cfg.critic {
        let model = ValueModel::from_policy(&policy, device)?;
        let ocfg = OptimConfig {
            lr: cfg.algorithm.critic_lr,
            ..cfg.optim.clone()
        };
        let opt = Optimizer::new(&model.vs, &ocfg, total_opt_steps)?;
        Some((model, opt))
    } else {
        None
    };
    if let Some((ckpt, s)) = &resumed {
        checkpoint::load_optimizer(ckpt, &mut opt, s.optimizer_steps, false)?;
        if let Some((model, copt)) = &mut critic {
            checkpoint::load_critic(ckpt, model)?;
            checkpoint::load_optimizer(ckpt, copt, s.critic_optimizer_steps, true)?;
        }
    }
    let first_step = resumed.as_ref().map_or(1, |(_, s)| s.step + 1);
    // Data-parallel ranks beyond the first, for the policy and the critic. Built after
    // everything else that draws random numbers; each step reseeds the generator anyway.
    dp.announce_models(&policy.net.config, critic.is_some())?;
    let mut policy_ranks = dp.backend(&policy)?;
    let mut critic_ranks = match &critic {
        Some((model, _)) => Some(dp.backend(model)?),
        None => None,
    };
    let value_cfg = ValueLossConfig {
        clip: cfg.algorithm.value_clip,
        epochs: cfg.trainer.ppo_epochs,
        micro_batch_tokens: cfg.trainer.micro_batch_tokens,
    };
    // Consecutive updates skipped for a non-finite loss or gradient.
    let mut skip_streak = 0;
    let mut interrupted = false;
    interrupt::install();
    let mut progress = StepProgress::new(steps as u64);
    let mut rewards = resumed
        .as_ref()
        .map_or_else(Vec::new, |(_, s)| s.rewards.clone());

    let iteration = iteration_config(cfg);
    let mut buffer = resumed
        .as_ref()
        .map_or_else(RolloutBuffer::default, |(_, s)| s.buffer.clone());
    let off_policy = OffPolicy::parse(&cfg.algorithm.off_policy)
        .context("`algorithm.off_policy` was validated")?;

    for step in first_step..=steps {
        // Sampling draws from libtorch's global generator: seeding it per step makes a step's
        // rollout independent of how the run got there, so a resumed run samples exactly what
        // the uninterrupted one did.
        tch::manual_seed(step_seed(cfg.run.seed, step));
        let t0 = Instant::now();
        let version = opt.steps_done as u64;
        let mut agent_stats = None;
        let mut external_stats = None;
        let rollouts = match (&task, &agent, &mut external, &engine) {
            (Some(task), _, Some(ext), Generator::Local(local)) => {
                let (r, stats) = ext.step(
                    local,
                    &policy,
                    version,
                    task.as_ref(),
                    &mut rng,
                    step,
                    cfg.rollout.prompts_per_step,
                    cfg.rollout.samples_per_prompt,
                )?;
                external_stats = Some(stats);
                r
            }
            (Some(task), _, None, _) => {
                let mut next_prompt = || -> Result<_> {
                    let problem = task.sample(&mut rng);
                    let ids = tokenizer.encode(&problem.prompt, false)?;
                    Ok((problem, ids))
                };
                let rollout = Rollout {
                    engine: &engine,
                    policy: &policy,
                    version,
                    task: task.as_ref(),
                    tokenizer: &tokenizer,
                    params: &sampling,
                    rewarder: rewarder.as_ref(),
                };
                buffer.collect_step(&rollout, &iteration, &mut next_prompt)?
            }
            (None, Some(a), _, _) => {
                let (r, stats) = a.step(
                    &engine,
                    &policy,
                    version,
                    &tokenizer,
                    &sampling,
                    &mut rng,
                    step,
                    cfg.rollout.prompts_per_step,
                    cfg.rollout.samples_per_prompt,
                );
                agent_stats = Some(stats);
                r
            }
            _ => bail!("no task to roll out (external agents need rollout.engine = \"local\")"),
        };
        let t_rollout = t0.elapsed().as_secs_f64();

        let t1 = Instant::now();
        let mut batch = build_step_batch(&rollouts.trajectories, &batch_cfg, step as u64)?;
        recompute_logprobs(&policy, reference.as_ref(), &mut batch.rows, &update_cfg);
        let is_stats =
            importance_weights(&mut batch.rows, version, off_policy, cfg.algorithm.is_cap);
        if let Some((model, _)) = &critic {
            compute_values(model, &mut batch.rows, cfg.trainer.micro_batch_tokens);
            apply_gae(
                &mut batch.rows,
                &batch.row_rewards,
                cfg.algorithm.gamma,
                cfg.algorithm.lambda,
            );
        }
        let t_prepare = t1.elapsed().as_secs_f64();

        let t2 = Instant::now();
        let upd = ppo_update(
            &policy,
            &mut policy_ranks,
            reference.is_some(),
            &mut opt,
            &batch.rows,
            &batch.plan,
            &update_cfg,
        )?;
        let value_loss = match (&mut critic, &mut critic_ranks) {
            (Some((model, copt)), Some(ranks)) => {
                critic_update(model, ranks, copt, &batch.rows, &batch.plan, &value_cfg)?
            }
            _ => 0.0,
        };
        publish()?;
        let t_update = t2.elapsed().as_secs_f64();
        skip_streak = if upd.optimizer_steps > 0 {
            0
        } else {
            skip_streak
        } + upd.skipped_updates;
        if upd.skipped_updates > 0 {
            eprintln!(
                "skein: step {step}: {} update(s) skipped (NaN or infinite loss or gradient)",
                upd.skipped_updates
            );
        }

        let part = &rollouts.stats;
        let n = rollouts.trajectories.len().max(1) as f64;
        let reward_mean = rollouts.trajectories.iter().map(|t| t.reward).sum::<f64>() / n;
        let accuracy = rollouts.correct.iter().filter(|&&c| c).count() as f64 / n;
        let response_len = rollouts
            .trajectories
            .iter()
            .map(|t| {
                t.transitions
                    .iter()
                    .map(|x| x.response.len())
                    .sum::<usize>() as f64
            })
            .sum::<f64>()
            / n;
        let elapsed = t0.elapsed().as_secs_f64();
        rewards.push(reward_mean);
        let mut m = record(
            step,
            [
                ("reward/mean", reward_mean),
                ("reward/accuracy", accuracy),
                ("response_len/mean", response_len),
                ("loss/policy", upd.loss),
                ("clip_frac", upd.clip_frac),
                ("approx_kl", upd.approx_kl),
                ("entropy", upd.entropy),
                ("grad_norm", upd.grad_norm),
                ("updates/skipped", upd.skipped_updates as f64),
                ("lr", upd.lr),
                ("policy_version", opt.steps_done as f64),
                ("batch/dropped_groups", batch.dropped_groups as f64),
                (
                    "batch/failed_trajectories",
                    batch.failed_trajectories as f64,
                ),
                ("batch/padding_rows", batch.padding_rows as f64),
                ("batch/rows", batch.real_rows as f64),
                ("tokens/generated", part.generated_tokens as f64),
                ("tokens/trained", part.trained_tokens as f64),
                (
                    "throughput/trained_tokens_per_s",
                    part.trained_tokens as f64 / elapsed.max(1e-9),
                ),
                (
                    "throughput/generated_tokens_per_s",
                    rollouts.engine.generated_tokens as f64 / t_rollout.max(1e-9),
                ),
                (
                    "throughput/trained_tokens_per_s_incl_padding",
                    batch.total_tokens as f64 / t_update.max(1e-9),
                ),
                ("time/rollout_s", t_rollout),
                ("time/prepare_s", t_prepare),
                ("time/update_s", t_update),
                ("time/step_s", elapsed),
            ],
        );
        // Terms of parts that are switched off are not logged, so no flat zero curves appear.
        if cfg.rollout.partial.enabled {
            for (k, v) in [
                ("partial/paused", part.paused as f64),
                ("partial/resumed", part.resumed as f64),
                ("partial/dropped_stale", part.dropped_stale as f64),
                ("partial/budget_hit_fraction", part.budget_hit_fraction()),
                ("partial/waiting_groups", part.waiting_groups as f64),
                ("partial/rounds", part.rounds as f64),
                ("staleness/mean", part.staleness_mean),
                ("staleness/max", part.staleness_max as f64),
                ("is/weight_mean", is_stats.weight_mean),
                ("is/truncated_fraction", is_stats.truncated_fraction),
                ("is/off_policy_fraction", is_stats.off_policy_fraction),
            ] {
                m.insert(k.into(), json!(v));
            }
        }
        if let Some(r) = &rewarder {
            rollouts.rewards.log(r, &mut m);
        }
        if matches!(engine, Generator::Remote(_)) {
            m.insert(
                "rollout/engine_failed".into(),
                json!(rollouts.engine.failed),
            );
        }
        let n_rollouts = rollouts.trajectories.len();
        for (k, v) in external_stats.iter().flat_map(|e| e.metrics(n_rollouts)) {
            m.insert(k.into(), json!(v));
        }
        for (k, v) in agent_stats.iter().flat_map(|a| a.metrics()) {
            m.insert(k.into(), json!(v));
        }
        if agent_stats.is_some() {
            m.insert(
                "agent/prefill_tokens".into(),
                json!(rollouts.engine.prefill_tokens),
            );
            m.insert(
                "agent/reused_prefix_tokens".into(),
                json!(rollouts.engine.reused_tokens),
            );
        }
        if critic.is_some() {
            m.insert("loss/value".into(), json!(value_loss));
        }
        if policy_ranks.size() > 1 {
            let l = ranks::layout(&batch.rows, &batch.plan);
            for (k, v) in [
                ("dp/rows_per_rank_max", l.rows_max),
                ("dp/rows_per_rank_mean", l.rows_mean),
                ("dp/tokens_per_rank_max", l.tokens_max),
                ("dp/tokens_per_rank_mean", l.tokens_mean),
                ("dp/balance", l.balance),
                ("dp/allreduce_wait_s", upd.rank_wait_s),
            ] {
                m.insert(k.into(), json!(v));
            }
        }
        if reference.is_some() {
            m.insert("kl_ref".into(), json!(upd.ref_kl));
        }
        if let Some(d) = &data {
            m.insert("data/epoch".into(), json!(d.train.epoch()));
        }
        if cfg.eval.every > 0 && step % cfg.eval.every == 0 && step != steps {
            let e = held_out_eval();
            m.insert("eval/accuracy".into(), json!(e.accuracy));
            m.insert("eval/reward".into(), json!(e.mean_reward));
        }
        log.append(&m)?;
        let every = cfg.trainer.checkpoint_every;
        interrupted = interrupt::requested();
        if (every > 0 && step % every == 0) || interrupted {
            let state = TrainerState {
                step,
                optimizer_steps: opt.steps_done,
                critic_optimizer_steps: critic.as_ref().map_or(0, |(_, o)| o.steps_done),
                task_rng: rng.state(),
                data_position: data.as_ref().map_or(0, |d| d.train.position()),
                buffer: buffer.clone(),
                metrics_lines: checkpoint::count_lines(&metrics_path),
                eval_before_accuracy: eval_before.accuracy,
                eval_before_reward: eval_before.mean_reward,
                rewards: rewards.clone(),
            };
            let snapshot = Snapshot {
                policy: &policy,
                tokenizer: &tokenizer,
                sampling: &sampling,
                optimizer: &opt,
                reference: reference.as_ref(),
                critic: critic.as_ref().map(|(m, o)| (m, o)),
                state: &state,
            };
            checkpoint::save(&dir.join(format!("checkpoint-{step}")), &snapshot)?;
            checkpoint::rotate(&dir, cfg.trainer.keep_last)?;
        }
        progress.update(
            step as u64,
            &[
                ("reward", reward_mean),
                ("acc", accuracy),
                (
                    "gen tok/s",
                    rollouts.engine.generated_tokens as f64 / t_rollout.max(1e-9),
                ),
            ],
        );
        if skip_streak >= cfg.trainer.max_consecutive_skips {
            let last_good = checkpoint::latest(&dir)?
                .map(|(_, p)| p.display().to_string())
                .unwrap_or_else(|| "none (trainer.checkpoint_every is 0)".into());
            bail!(
                "stopping at step {step}: {skip_streak} consecutive updates had a NaN or infinite \
                 loss or gradient (limit `trainer.max_consecutive_skips`); the last good \
                 checkpoint is {last_good}. Lower `optim.lr`, keep `optim.grad_clip` > 0, and \
                 check the rewards for non-finite values before resuming."
            );
        }
        if interrupted {
            break;
        }
    }
    progress.finish();
    if interrupted {
        let plot = skein_report::plot_run_dir(&dir, None)?;
        let step = rewards.len();
        eprintln!(
            "skein: interrupted after step {step}; checkpoint {} written, curves {}. \
             Continue with: skein train --resume {}",
            dir.join(format!("checkpoint-{step}")).display(),
            plot.display(),
            dir.display()
        );
        return Ok(RunSummary {
            dir,
            eval_before,
            eval_after: eval_before,
            rewards,
            interrupted: true,
            rank: 0,
        });
    }

    let eval_after = held_out_eval();
    log.append(&record(
        steps,
        [
            ("eval/accuracy", eval_after.accuracy),
            ("eval/reward", eval_after.mean_reward),
        ],
    ))?;
    eprintln!(
        "skein: eval after RL: accuracy {:.3} (before: {:.3})",
        eval_after.accuracy, eval_before.accuracy
    );

    let ckpt = dir.join("checkpoint");
    checkpoint::save_model_dir(&policy, &tokenizer, &sampling, &ckpt)?;
    let plot = skein_report::plot_run_dir(&dir, None)?;
    eprintln!(
        "skein: checkpoint {} (HF layout), curves {}",
        ckpt.display(),
        plot.display()
    );
    Ok(RunSummary {
        dir,
        eval_before,
        eval_after,
        rewards,
        interrupted: false,
        rank: 0,
    })
}

/// Gives a remote engine the policy's current weights: written as a Hugging Face directory
/// (`RUN_DIR/published`) that the server loads before it answers. Nothing to do locally.
fn publish_weights(
    engine: &Generator,
    policy: &Model,
    tokenizer: &Tokenizer,
    sampling: &SamplingParams,
    run_dir: &Path,
) -> Result<()> {
    let Generator::Remote(remote) = engine else {
        return Ok(());
    };
    let dir = run_dir.join("published");
    checkpoint::save_model_dir(policy, tokenizer, sampling, &dir)?;
    remote
        .reload(&dir)
        .context("giving the remote engine the new weights (rollout.remote)")?;
    Ok(())
}

/// The newest resumable checkpoint of a run directory, and its trainer state.
fn find_checkpoint(dir: &Path) -> Result<(PathBuf, TrainerState)> {
    let Some((_, ckpt)) = checkpoint::latest(dir)? else {
        bail!(
            "nothing to resume in {}: it has no checkpoint-N directory with {} \
             (runs write them every `trainer.checkpoint_every` steps)",
            dir.display(),
            checkpoint::STATE_FILE
        );
    };
    let state = checkpoint::load_state(&ckpt)?;
    eprintln!(
        "skein: resuming from {} (step {}, {} paused samples in the rollout buffer)",
        ckpt.display(),
        state.step,
        state.buffer.paused_samples()
    );
    Ok((ckpt, state))
}

/// The libtorch seed of one step.
fn step_seed(seed: u64, step: usize) -> i64 {
    (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ step as u64) as i64
}

/// The policy: a model directory, or a from-scratch model over a character-level tokenizer of
/// the task's `alphabet` with at least `min_positions` positions.
fn build_policy(
    cfg: &TrainConfig,
    alphabet: &str,
    min_positions: usize,
    device: Device,
) -> Result<(Tokenizer, Model)> {
    if cfg.model.path.is_empty() {
        let tokenizer = Tokenizer::char_level(alphabet)?;
        let mc = cfg.model.tiny_config(
            tokenizer.vocab_size(),
            cfg.model.max_positions.max(min_positions),
        );
        let model = Model::random(&mc, device, cfg.run.seed as i64)?;
        Ok((tokenizer, model))
    } else {
        let path = Path::new(&cfg.model.path);
        let tokenizer = Tokenizer::from_dir(path)?;
        Ok((tokenizer, Model::load_dir(path, device)?))
    }
}

fn prompt_batch(
    task: &dyn Task,
    tokenizer: &Tokenizer,
    rng: &mut TaskRng,
    n: usize,
) -> Result<PromptBatch> {
    let problems: Vec<_> = (0..n).map(|_| task.sample(rng)).collect();
    super::dataset_task::prompt_batch(problems, tokenizer)
}

/// Held-out problems: prompts answered once, or episodes of a multi-turn task.
enum EvalSet {
    Prompts(PromptBatch),
    Episodes(Vec<skein_tasks::Problem>),
}

/// A supervised row of a single-turn task: prompt, then a demonstrated answer and `eos`.
fn single_demo_row(
    task: &dyn Task,
    tokenizer: &Tokenizer,
    eos: u32,
    rng: &mut TaskRng,
) -> Result<TrainRow> {
    let problem = task.sample(rng);
    let demo = task.demonstration(&problem, rng);
    let mut response = tokenizer.encode(&demo, false)?;
    response.push(eos);
    Ok(sft_row(
        &tokenizer.encode(&problem.prompt, false)?,
        &response,
    ))
}

/// Supervised warm-up on `sft.steps` batches of demonstrations.
fn warm_up(
    cfg: &TrainConfig,
    policy: &Model,
    demo: &mut dyn FnMut() -> Result<TrainRow>,
    log: &mut MetricsLog,
) -> Result<()> {
    let ocfg = OptimConfig {
        lr: cfg.sft.lr,
        warmup_steps: cfg.sft.steps / 10,
        schedule: super::optim::Schedule::Cosine,
        ..OptimConfig::default()
    };
    let mut opt = Optimizer::new(&policy.vs, &ocfg, cfg.sft.steps)?;
    let mut progress = StepProgress::new(cfg.sft.steps as u64);
    for step in 1..=cfg.sft.steps {
        let rows = (0..cfg.sft.batch_size)
            .map(|_| demo())
            .collect::<Result<Vec<_>>>()?;
        let loss = sft_step(policy, &mut opt, &rows);
        log.append(&record(step, [("sft/loss", loss)]))?;
        progress.update(step as u64, &[("sft loss", loss)]);
    }
    progress.finish();
    Ok(())
}

/// How each step's rollout runs: synchronous (every sample to its end) unless partial rollout
/// is on.
fn iteration_config(cfg: &TrainConfig) -> IterationConfig {
    let p = &cfg.rollout.partial;
    let groups = cfg.rollout.prompts_per_step;
    IterationConfig {
        samples: cfg.rollout.samples_per_prompt,
        new_groups: groups,
        min_groups: if p.enabled && p.min_groups > 0 {
            p.min_groups
        } else {
            groups
        },
        token_budget: p.enabled.then_some(p.token_budget),
        max_staleness: p.max_staleness,
        on_stale: OnStale::parse(&p.on_stale).unwrap_or(OnStale::FinishFirst),
        versions_per_step: (cfg.trainer.num_mini_batches * cfg.trainer.ppo_epochs) as u64,
    }
}

fn record<const N: usize>(step: usize, values: [(&str, f64); N]) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("step".into(), json!(step));
    for (k, v) in values {
        m.insert(k.into(), json!(v));
    }
    m
}
