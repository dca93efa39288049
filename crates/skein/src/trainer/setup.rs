//! Everything built before the first step, in one function: [`start`] checks the config, opens
//! the run directory, builds or loads the policy, picks the rollout source, warms the policy
//! up and measures it, and builds the optimizer, reference, critic and data-parallel ranks. A
//! resumed run reads its checkpoint here and nowhere else.

use super::batch::StepBatchConfig;
use super::checkpoint::{self, TrainerState};
use super::config::{EngineKind, TrainConfig};
use super::metrics::extend;
use super::prepare::PreparedBatch;
use super::prepare::{Models, PrepareConfig};
use super::rollout::stats::StepRollout;
use super::rollout::tasks::Tasks;
use super::rollout::{EvalResult, StepContext, Workload};
use super::update::critic::ValueLossConfig;
use super::update::optim::{OptimConfig, Optimizer};
use super::update::ranks::{Backend, DataParallel};
use super::update::{critic_update, CriticStats};
use super::update::{serve_other_rank, UpdateConfig};
use super::{preflight, sft};
use crate::engine::{Engine, Generator, RemoteEngine, SamplingParams};
use crate::model::{Model, ValueModel};
use anyhow::{bail, Context, Result};
use skein_report::record;
use skein_report::MetricsLog;
use skein_text::Tokenizer;
use std::path::{Path, PathBuf};
use tch::Device;

/// A run ready for its first step (or its next one, when resumed).
pub struct Trainer<'a> {
    pub cfg: &'a TrainConfig,
    pub dir: PathBuf,
    pub log: MetricsLog,
    pub tokenizer: Tokenizer,
    pub policy: Model,
    /// The run's sampling settings, with the tokenizer's end-of-sequence token as the stop.
    pub sampling: SamplingParams,
    pub engine: Generator,
    pub workload: Box<dyn Workload>,
    /// The frozen KL reference (`algorithm.kl_coef` > 0).
    pub reference: Option<Model>,
    pub critic: Option<Critic>,
    pub opt: Optimizer,
    pub policy_ranks: Backend<Model>,
    pub batch_cfg: StepBatchConfig,
    pub prepare_cfg: PrepareConfig,
    pub update_cfg: UpdateConfig,
    /// The first step to run: 1, or the one after a resumed checkpoint's.
    pub first_step: usize,
    pub eval_before: EvalResult,
    /// Mean training reward of each step so far.
    pub rewards: Vec<f64>,
    /// Held while the run lives: in an MPI job, dropping it releases the other ranks.
    _dp: DataParallel,
}

/// The critic of PPO with `gae`: the value model, its optimizer and its ranks.
pub struct Critic {
    pub model: ValueModel,
    pub opt: Optimizer,
    pub ranks: Backend<ValueModel>,
    pub cfg: ValueLossConfig,
}

impl Critic {
    pub fn update(&mut self, batch: &PreparedBatch) -> Result<CriticStats> {
        critic_update(
            &self.model,
            &mut self.ranks,
            &mut self.opt,
            batch.rows(),
            batch.plan(),
            &self.cfg,
        )
    }
}

/// What [`start`] leads to.
pub enum Started<'a> {
    /// This process runs the training loop.
    Trainer(Box<Trainer<'a>>),
    /// Another rank of an MPI job: it served rank 0's updates, and the run is over.
    OtherRank { rank: usize },
}

/// Sets a run up; with `resume`, from the newest checkpoint of `run.dir`, exactly where it
/// stopped.
pub fn start(cfg: &TrainConfig, resume: bool) -> Result<Started<'_>> {
    super::config::validate::validate(cfg)?;
    let device = cfg.run.start_device()?;
    let dp = DataParallel::start(cfg)?;
    if dp.rank() > 0 {
        serve_other_rank(&dp, device)?;
        return Ok(Started::OtherRank { rank: dp.rank() });
    }
    let (dir, mut log, resumed) = open_run_dir(cfg, resume)?;

    // The task, the policy and the rollout source.
    let tasks = Tasks::from_config(cfg)?;
    let task_name = tasks.name().to_string();
    let (tokenizer, policy) = match &resumed {
        Some((ckpt, _)) => (Tokenizer::from_dir(ckpt)?, Model::load_dir(ckpt, device)?),
        None => build_policy(cfg, tasks.alphabet(), tasks.min_positions(), device)?,
    };
    let sampling = sampling_params(cfg, &tokenizer)?;
    let engine = rollout_engine(cfg, &policy)?;
    let resumed_workload = resumed.as_ref().map(|(_, s)| &s.workload);
    let mut workload = tasks.into_workload(cfg, &tokenizer, &policy, resumed_workload)?;
    eprintln!(
        "skein: {} model, {:.2}M parameters, task `{}` (difficulty {}), run directory {}",
        policy.net.config.model_type,
        policy.net.config.num_parameters() as f64 / 1e6,
        task_name,
        cfg.task.difficulty,
        dir.display()
    );

    // A fresh run warms the policy up on demonstrations; a remote engine then gets its
    // weights, and the policy is measured before RL.
    if cfg.sft.steps > 0 && resumed.is_none() {
        let mut demo = || workload.demonstration(&tokenizer, &sampling);
        let s = &cfg.sft;
        sft::warm_up(&policy, s.steps, s.batch_size, s.lr, &mut demo, &mut log)?;
    }
    publish_weights(&engine, &policy, &tokenizer, &sampling, &dir)?;
    let eval_before = match &resumed {
        Some((_, s)) => EvalResult {
            accuracy: s.eval_before_accuracy,
            mean_reward: s.eval_before_reward,
        },
        None => {
            let ctx = StepContext::new(&engine, &policy, &tokenizer, &sampling);
            measure_before(workload.as_ref(), &ctx, &mut log)?
        }
    };

    // The models the update needs beside the policy, then data-parallel ranks beyond the
    // first for the policy and the critic: built after everything else that draws random
    // numbers (each step reseeds the generator anyway).
    let (reference, opt, critic) = update_models(cfg, &policy, resumed.as_ref())?;
    dp.announce_models(&policy.net.config, critic.is_some())?;
    let policy_ranks = dp.backend(&policy)?;
    let critic = match critic {
        Some((model, opt)) => Some(Critic {
            ranks: dp.backend(&model)?,
            model,
            opt,
            cfg: ValueLossConfig {
                clip: cfg.algorithm.value_clip,
                epochs: cfg.trainer.ppo_epochs,
                micro_batch_tokens: cfg.trainer.micro_batch_tokens,
            },
        }),
        None => None,
    };
    let (first_step, rewards) = match &resumed {
        Some((_, s)) => (s.step + 1, s.rewards.clone()),
        None => (1, Vec::new()),
    };
    Ok(Started::Trainer(Box::new(Trainer {
        batch_cfg: StepBatchConfig::from_config(cfg, sampling.max_new_tokens),
        prepare_cfg: PrepareConfig::from_config(cfg, sampling.temperature),
        update_cfg: update_config(cfg, sampling.temperature),
        cfg,
        dir,
        log,
        tokenizer,
        policy,
        sampling,
        engine,
        workload,
        reference,
        critic,
        opt,
        policy_ranks,
        first_step,
        eval_before,
        rewards,
        _dp: dp,
    })))
}

impl Trainer<'_> {
    /// One step's rollout from the workload, with the policy at `version`.
    pub fn rollout(&mut self, version: u64, step: usize) -> Result<StepRollout> {
        let ctx = StepContext::new(&self.engine, &self.policy, &self.tokenizer, &self.sampling);
        self.workload.rollout(&ctx.at(version, step))
    }

    /// The models preparation runs, at the step's start.
    pub fn models(&self) -> Models<'_> {
        Models {
            policy: &self.policy,
            reference: self.reference.as_ref(),
            critic: self.critic.as_ref().map(|c| &c.model),
        }
    }

    /// Gives a remote engine the policy's current weights (nothing to do locally).
    pub fn publish(&self) -> Result<()> {
        publish_weights(
            &self.engine,
            &self.policy,
            &self.tokenizer,
            &self.sampling,
            &self.dir,
        )
    }

    /// Greedy accuracy and reward on the held-out problems.
    pub fn evaluate(&self) -> EvalResult {
        let ctx = StepContext::new(&self.engine, &self.policy, &self.tokenizer, &self.sampling);
        self.workload.evaluate(&ctx)
    }

    /// Writes `checkpoint-{step}` atomically and drops the ones `trainer.keep_last` lets go.
    pub fn save_checkpoint(&self, step: usize) -> Result<()> {
        let state = TrainerState {
            step,
            optimizer_steps: self.opt.steps_done,
            critic_optimizer_steps: self.critic.as_ref().map_or(0, |c| c.opt.steps_done),
            workload: self.workload.state(),
            metrics_lines: checkpoint::count_lines(&self.dir.join("metrics.jsonl")),
            eval_before_accuracy: self.eval_before.accuracy,
            eval_before_reward: self.eval_before.mean_reward,
            rewards: self.rewards.clone(),
        };
        let snapshot = checkpoint::Snapshot {
            policy: &self.policy,
            tokenizer: &self.tokenizer,
            sampling: &self.sampling,
            optimizer: &self.opt,
            reference: self.reference.as_ref(),
            critic: self.critic.as_ref().map(|c| (&c.model, &c.opt)),
            state: &state,
        };
        checkpoint::save(&self.dir.join(format!("checkpoint-{step}")), &snapshot)?;
        checkpoint::rotate(&self.dir, self.cfg.trainer.keep_last)
    }
}

/// The run's sampling settings, stopping at the tokenizer's end-of-sequence token.
fn sampling_params(cfg: &TrainConfig, tokenizer: &Tokenizer) -> Result<SamplingParams> {
    let eos = tokenizer
        .eos_token_ids()
        .first()
        .copied()
        .context("the tokenizer defines no end-of-sequence token")?;
    Ok(SamplingParams {
        stop_token_ids: vec![eos],
        ..cfg.rollout.sampling.clone()
    })
}

/// The engine rollouts run on, once the run is known to fit in memory (on the CPU, where
/// free memory can be read).
fn rollout_engine(cfg: &TrainConfig, policy: &Model) -> Result<Generator> {
    if policy.vs.device() == Device::Cpu {
        if let Some(available) = preflight::available_memory() {
            preflight::check(&preflight::estimate(cfg, &policy.net.config), available)?;
        }
    }
    Ok(match cfg.rollout.engine {
        EngineKind::Remote => Generator::Remote(RemoteEngine::new(&cfg.rollout.remote)),
        EngineKind::Local => Generator::Local(Engine::new(cfg.rollout.max_slots)),
    })
}

/// A checkpoint to resume from: its directory and trainer state.
type Resumed = (PathBuf, TrainerState);

/// The run directory: the resolved config written, the metrics log opened (cut back to the
/// checkpoint's step on resume), and the checkpoint to resume from.
fn open_run_dir(cfg: &TrainConfig, resume: bool) -> Result<(PathBuf, MetricsLog, Option<Resumed>)> {
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
    let log = MetricsLog::create(&metrics_path)?;
    Ok((dir, log, resumed))
}

/// Held-out accuracy before RL, logged as step 0 with the data's counts.
fn measure_before(
    workload: &dyn Workload,
    ctx: &StepContext,
    log: &mut MetricsLog,
) -> Result<EvalResult> {
    let e = workload.evaluate(ctx);
    let mut first = record(
        0,
        [
            ("eval/accuracy", e.accuracy),
            ("eval/reward", e.mean_reward),
        ],
    );
    extend(&mut first, workload.data_metrics(true));
    log.append(&first)?;
    eprintln!("skein: eval before RL: accuracy {:.3}", e.accuracy);
    Ok(e)
}

/// The policy's optimizer, and the critic's model and optimizer.
type UpdateModels = (Option<Model>, Optimizer, Option<(ValueModel, Optimizer)>);

/// The models the update needs beside the policy: the frozen reference (a copy of the
/// warmed-up policy, or the checkpoint's), the policy's optimizer, and the critic with its
/// own; moments and critic weights restored on resume.
fn update_models(
    cfg: &TrainConfig,
    policy: &Model,
    resumed: Option<&Resumed>,
) -> Result<UpdateModels> {
    let device = policy.vs.device();
    let reference = match (resumed, cfg.algorithm.kl_coef > 0.0) {
        (_, false) => None,
        (Some((ckpt, _)), true) => Some(checkpoint::load_reference(ckpt, device)?),
        (None, true) => {
            let mut r = Model::random(&policy.net.config, device, 0)?;
            r.copy_from(policy)?;
            Some(r)
        }
    };
    let t = &cfg.trainer;
    let total_opt_steps = t.steps * t.ppo_epochs * t.num_mini_batches;
    let mut opt = Optimizer::new(&policy.vs, &cfg.optim, total_opt_steps)?;
    let mut critic = if cfg.algorithm.estimator.needs_critic() {
        let model = ValueModel::from_policy(policy, device)?;
        let ocfg = OptimConfig {
            lr: cfg.algorithm.critic_lr,
            ..cfg.optim.clone()
        };
        let opt = Optimizer::new(&model.vs, &ocfg, total_opt_steps)?;
        Some((model, opt))
    } else {
        None
    };
    if let Some((ckpt, s)) = resumed {
        checkpoint::load_optimizer(ckpt, &mut opt, s.optimizer_steps, false)?;
        if let Some((model, copt)) = &mut critic {
            checkpoint::load_critic(ckpt, model)?;
            checkpoint::load_optimizer(ckpt, copt, s.critic_optimizer_steps, true)?;
        }
    }
    Ok((reference, opt, critic))
}

/// The policy update's settings.
fn update_config(cfg: &TrainConfig, temperature: f64) -> UpdateConfig {
    UpdateConfig {
        loss: cfg.algorithm.loss_config(),
        epochs: cfg.trainer.ppo_epochs,
        micro_batch_tokens: cfg.trainer.micro_batch_tokens,
        temperature,
    }
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
        state.workload.buffer.paused_samples()
    );
    Ok((ckpt, state))
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
