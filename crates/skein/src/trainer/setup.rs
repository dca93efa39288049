//! Everything built before the first step, in one function: [`start`] checks the config and
//! the run directory, builds or loads the policy, picks the rollout source, warms the policy
//! up and measures it, and builds the optimizer, reference, critic and data-parallel ranks. A
//! resumed run reads its checkpoint here and nowhere else, all of it before writing anything.

use super::batch::StepBatchConfig;
use super::batch::TrainRow;
use super::checkpoint::{self, Restore, StopStreaks, TrainerState};
use super::config::{EngineKind, TrainConfig};
use super::final_checkpoint;
use super::metrics::extend;
use super::prepare::PreparedBatch;
use super::prepare::{Models, PrepareConfig};
use super::rollout::stats::StepRollout;
use super::rollout::tasks::Tasks;
use super::rollout::{eval_kind, eval_metrics, EvalResult, StepContext, Workload};
use super::run_dir::RunDir;
use super::step_files::{ResumedFiles, StepFiles};
use super::update::critic::ValueLossConfig;
use super::update::optim::{OptimConfig, Optimizer};
use super::update::ranks::{Backend, DataParallel};
use super::update::{critic_update, ppo_update, CriticStats, UpdateStats};
use super::update::{serve_other_rank, UpdateConfig};
use super::{preflight, sft};
use crate::engine::{Engine, Generator, RemoteEngine, SamplingParams};
use crate::model::{Dtype, Model, ValueModel};
use anyhow::{bail, Context, Result};
use preflight::held_bytes;
use skein_report::record;
use skein_report::MetricsLog;
use skein_text::Tokenizer;
use std::path::{Path, PathBuf};
use tch::Device;

/// A run ready for its first step (or its next one, when resumed).
pub struct Trainer<'a> {
    pub cfg: &'a TrainConfig,
    pub dir: PathBuf,
    /// The metrics log, trajectories and diagnoses: open from the start of a new run, and
    /// from the first record of a resumed one ([`Trainer::files`]).
    files: Option<StepFiles>,
    /// A resumed run's files, until they open.
    resumed_files: Option<ResumedFiles>,
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
    pub rewards: Vec<Option<f64>>,
    /// The streaks that stop the run: a resumed checkpoint's at the start, and the step
    /// loop's before each checkpoint it writes.
    pub streaks: StopStreaks,
    /// The newest checkpoint this process wrote, whose frozen parts the next one links.
    pub last_checkpoint: Option<PathBuf>,
    /// The directory, locked while the run lives, with the run `--overwrite` replaces until
    /// this one has a checkpoint ([`ReplacedRun`]): dropped after the fields that write into
    /// the directory.
    run_dir: RunDir,
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
    fn new(
        cfg: &TrainConfig,
        dp: &DataParallel,
        model: ValueModel,
        opt: Optimizer,
    ) -> Result<Self> {
        Ok(Critic {
            ranks: dp.backend(&model)?,
            model,
            opt,
            cfg: ValueLossConfig {
                clip: cfg.algorithm.value_clip,
                epochs: cfg.trainer.ppo_epochs,
                batching: cfg.trainer.batching(),
                activation_checkpointing: cfg.trainer.activation_checkpointing,
            },
        })
    }

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

/// Sets a run up: new, overwriting, or resumed from the newest intact checkpoint of
/// `run.dir`, exactly where it stopped.
/// How a run begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// A new run; a `run.dir` that holds another run is refused.
    New,
    /// A new run that first removes another run's files from `run.dir`.
    Overwrite,
    /// The run in `run.dir`, from its newest intact checkpoint.
    Resume,
}

pub fn start(cfg: &TrainConfig, begin: Begin) -> Result<Started<'_>> {
    super::interrupt::install();
    super::config::validate::validate(cfg)?;
    let device = cfg.run.start_device()?;
    let dp = match join_ranks(cfg, device)? {
        Ok(dp) => dp,
        Err(rank) => return Ok(Started::OtherRank { rank }),
    };
    let (mut run_dir, loaded) = run_dir_and_checkpoint(cfg, begin, device)?;

    // The task, the policy and the rollout source.
    let tasks = Tasks::from_config(cfg)?;
    let trains_on = tasks.describe(cfg);
    let (mut tokenizer, mut policy, restore) = match loaded {
        Some(l) => (l.tokenizer, l.policy, Some(l.rest)),
        None => {
            let (t, p) = build_policy(cfg, tasks.alphabet(), tasks.min_positions(), device)?;
            (t, p, None)
        }
    };
    let sampling = sampling_params(cfg, &mut tokenizer)?;
    let longest = tasks.longest_loaded_prompt();
    let engine = rollout_engine(cfg, &policy, restore.as_ref(), longest, dp.ranks_here())?;
    let resumed_workload = restore.as_ref().map(|r| &r.state.workload);
    let mut workload = tasks.into_workload(cfg, &tokenizer, &policy, resumed_workload)?;
    check_context(cfg, workload.as_ref(), &policy)?;
    announce(
        &policy,
        cfg.model.dtype,
        &trains_on,
        &run_dir.path,
        workload.held_out(),
    );
    let (first_step, rewards, streaks) = going_on_from(restore.as_ref());

    // A fresh run starts writing now: the warm-up on demonstrations, the weights to a remote
    // engine, the policy measured before RL, then the models the update needs beside it. A
    // resume restores those models first and writes only once all of its checkpoint is in place.
    let recorded = as_built(cfg, &policy);
    let (files, resumed_files, eval_before, (reference, opt, critic)) = match restore {
        None => {
            let mut log = run_dir.open(&recorded, None)?;
            let mut demos = TaskDemonstrations {
                workload: workload.as_mut(),
                engine: &engine,
                tokenizer: &tokenizer,
                sampling: &sampling,
                direct_share: 0.0,
            };
            announce_warm_up_of_loaded_model(cfg);
            warm_up(cfg, &policy, &mut demos, &mut log)?;
            lora_after_warm_up(cfg, &mut policy)?;
            publish_weights(&engine, &policy, &tokenizer, &sampling, &run_dir.path)?;
            let ctx = StepContext::new(&engine, &policy, &tokenizer, &sampling);
            let eval_before = measure_before(workload.as_ref(), &ctx, &mut log)?;
            super::interrupt::exit_if_urgent("the first evaluation");
            let files = StepFiles::after_log(log, &run_dir, cfg, &tokenizer, first_step)?;
            let models = update_models(cfg, &policy, None)?;
            (Some(files), None, eval_before, models)
        }
        Some(mut r) => {
            let models = update_models(cfg, &policy, Some(&mut r))?;
            publish_weights(&engine, &policy, &tokenizer, &sampling, &run_dir.path)?;
            let resumed = ResumedFiles::after(recorded, r.state.metrics_lines);
            (None, Some(resumed), announce_resume(&r), models)
        }
    };

    // `lora.dropout` is for the warm-up: RL's ratio needs π and π_old from the same function.
    policy.net.stop_adapter_dropout();

    let (policy_ranks, critic) = update_ranks(cfg, &dp, &policy, critic)?;
    Ok(Started::Trainer(Box::new(Trainer {
        batch_cfg: StepBatchConfig::from_config(cfg, sampling.max_new_tokens),
        prepare_cfg: PrepareConfig::from_config(cfg, sampling.temperature),
        update_cfg: update_config(cfg, sampling.temperature),
        cfg,
        dir: run_dir.path.clone(),
        files,
        resumed_files,
        run_dir,
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
        streaks,
        last_checkpoint: None,
        _dp: dp,
    })))
}

/// Joins the run's data-parallel ranks. An MPI job's rank other than 0 serves rank 0's
/// updates here until it is stopped, and gets its rank back as `Err`; rank 0 gets the ranks,
/// having said how an MPI job's processes are placed.
fn join_ranks(
    cfg: &TrainConfig,
    device: Device,
) -> Result<std::result::Result<DataParallel, usize>> {
    let dp = DataParallel::start(cfg)?;
    if dp.rank() > 0 {
        serve_other_rank(&dp, device)?;
        return Ok(Err(dp.rank()));
    }
    if let Some(placement) = dp.placement() {
        eprintln!("skein: {placement}");
    }
    Ok(Ok(dp))
}

/// Where the run goes on from: its first step, the rewards and stop streaks so far (a fresh
/// run's, or its checkpoint's).
fn going_on_from(restore: Option<&Restore>) -> (usize, Vec<Option<f64>>, StopStreaks) {
    restore.map_or((1, Vec::new(), StopStreaks::default()), |r| {
        (r.state.step + 1, r.state.rewards.clone(), r.state.streaks)
    })
}

/// Data-parallel ranks beyond the first, for the policy and the critic: built after
/// everything else that draws random numbers (each step reseeds the generator anyway).
fn update_ranks(
    cfg: &TrainConfig,
    dp: &DataParallel,
    policy: &Model,
    critic: Option<(ValueModel, Optimizer)>,
) -> Result<(Backend<Model>, Option<Critic>)> {
    dp.announce_models(
        &policy.net.config,
        &policy.replica_options(),
        critic.is_some(),
    )?;
    let policy_ranks = dp.backend(policy)?;
    let critic = match critic {
        Some((model, opt)) => Some(Critic::new(cfg, dp, model, opt)?),
        None => None,
    };
    Ok((policy_ranks, critic))
}

/// Says where a resumed run picks up, and returns its evaluation before RL (kept in the
/// checkpoint: the run measured it once, at its start).
fn announce_resume(r: &Restore) -> EvalResult {
    eprintln!(
        "skein: resuming from {} (step {}, {} paused samples in the rollout buffer)",
        r.dir.display(),
        r.state.step,
        r.state.workload.buffer.paused_samples()
    );
    EvalResult {
        accuracy: r.state.eval_before_accuracy,
        mean_reward: r.state.eval_before_reward.unwrap_or(f64::NAN),
        failed: 0,
        problems: 0,
        agent: None,
    }
}

impl Trainer<'_> {
    /// One step's rollout from the workload, with the policy at `version`.
    pub fn rollout(&mut self, version: u64, step: usize) -> Result<StepRollout> {
        let ctx = StepContext::new(&self.engine, &self.policy, &self.tokenizer, &self.sampling);
        let mut rollout = self.workload.rollout(&ctx.at(version, step))?;
        rollout.fail_longer_than(self.policy.net.max_positions() as usize);
        rollout.fail_rewards_out_of_range();
        Ok(rollout)
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

    /// The metrics log, trajectories and diagnoses, for a record about to be written: a
    /// resumed run's open now, cut back to its checkpoint ([`ResumedFiles::open`]).
    pub fn files(&mut self) -> Result<&mut StepFiles> {
        let files = match (self.files.take(), self.resumed_files.take()) {
            (Some(files), _) => files,
            (None, Some(resumed)) => resumed.open(
                &mut self.run_dir,
                self.cfg,
                &self.tokenizer,
                self.first_step,
            )?,
            (None, None) => bail!("the run's files were neither opened nor pending"),
        };
        Ok(self.files.insert(files))
    }

    /// Writes `checkpoint-{step}` atomically and drops the ones `trainer.keep_last` lets go.
    /// The run has something to keep (a checkpoint, or its end): the run `--overwrite`
    /// replaced is removed for good.
    pub fn keep_over_replaced_run(&mut self) -> Result<()> {
        match self.run_dir.set_aside.take() {
            Some(r) => r.commit(),
            None => Ok(()),
        }
    }

    /// Writes `checkpoint-{step}`, after which the run has something to keep.
    pub fn save_checkpoint(&mut self, step: usize) -> Result<()> {
        // A checkpoint's steps have their trajectories on disk.
        if let Some(files) = &self.files {
            files.trajectories.flush();
        }
        let state = TrainerState {
            step,
            optimizer_steps: self.opt.steps_done,
            critic_optimizer_steps: self.critic.as_ref().map_or(0, |c| c.opt.steps_done),
            workload: self.workload.state(),
            metrics_lines: checkpoint::count_lines(&self.dir.join("metrics.jsonl")),
            eval_before_accuracy: self.eval_before.accuracy,
            eval_before_reward: Some(self.eval_before.mean_reward).filter(|r| r.is_finite()),
            rewards: self.rewards.clone(),
            streaks: self.streaks,
            saved_parts: None,
        };
        let snapshot = checkpoint::Snapshot {
            policy: &self.policy,
            tokenizer: &self.tokenizer,
            sampling: &self.sampling,
            optimizer: &self.opt,
            // LoRA's reference is the policy's base, saved with the policy, and the warm-up's
            // adapters when it has them (a few tensors of their own).
            reference: self
                .reference
                .as_ref()
                .filter(|r| !self.cfg.lora.enabled() || r.options.lora.enabled()),
            critic: self.critic.as_ref().map(|c| (&c.model, &c.opt)),
            state: &state,
            previous: self.last_checkpoint.as_deref(),
        };
        let dir = self.dir.join(format!("checkpoint-{step}"));
        checkpoint::save(&dir, &snapshot)?;
        self.last_checkpoint = Some(dir);
        checkpoint::rotate(&self.dir, self.cfg.trainer.keep_last, step)?;
        self.keep_over_replaced_run()
    }

    /// One step's update: the learning rates scheduled at `step`, the policy's PPO epochs,
    /// the critic's, then the new weights published to a remote engine.
    pub fn update(
        &mut self,
        step: usize,
        batch: &PreparedBatch,
    ) -> Result<(UpdateStats, Option<CriticStats>)> {
        self.opt.schedule_at(step - 1);
        if let Some(c) = &mut self.critic {
            c.opt.schedule_at(step - 1);
        }
        let policy = ppo_update(
            &self.policy,
            &mut self.policy_ranks,
            &mut self.opt,
            batch,
            &self.update_cfg,
        )?;
        let critic = match &mut self.critic {
            Some(c) => Some(c.update(batch)?),
            None => None,
        };
        self.publish()?;
        Ok((policy, critic))
    }
}

/// The run directory, checked before anything is written; a resume also reads its whole
/// checkpoint first.
fn run_dir_and_checkpoint(
    cfg: &TrainConfig,
    begin: Begin,
    device: Device,
) -> Result<(RunDir, Option<checkpoint::Loaded>)> {
    Ok(match begin {
        Begin::Resume => {
            let dir = RunDir::for_resume(cfg)?;
            // The resume rewrites diagnoses.jsonl at its first record: a line it cannot read
            // is refused now, before any work, rather than after the first step.
            let diagnoses = dir.path.join(skein_doctor::FILE);
            if diagnoses.exists() {
                skein_doctor::read_diagnoses(&diagnoses)?;
            }
            dir.check_records_for_resume(cfg)?;
            refuse_finished(&dir, cfg)?;
            let loaded = checkpoint::load_newest(&dir.path, device, &cfg.model_options())?;
            let done = loaded.rest.state.step;
            if cfg.trainer.steps < done {
                anyhow::bail!(
                    "`trainer.steps` = {} is below the {done} steps {} already has: a resume \
                     continues the run, so give at least {done} (the run's own is in its \
                     config.toml)",
                    cfg.trainer.steps,
                    loaded.rest.dir.display()
                );
            }
            (dir, Some(loaded))
        }
        Begin::New => (RunDir::for_new_run(cfg, false)?, None),
        Begin::Overwrite => (RunDir::for_new_run(cfg, true)?, None),
    })
}

/// A resume of a finished run that gives it no more steps, refused before its checkpoint is
/// read: there is nothing to train, and going on would evaluate it again and rewrite its files.
fn refuse_finished(dir: &RunDir, cfg: &TrainConfig) -> Result<()> {
    let steps = cfg.trainer.steps;
    let newest = checkpoint::latest(&dir.path)?.map(|(n, _)| n);
    if newest == Some(steps) && final_checkpoint::step(&dir.path) == Some(steps) {
        anyhow::bail!(
            "{} finished at step {steps}, and its {}/ holds the weights it ended with: a resume \
             trains a run further only when given more steps (`--set trainer.steps=N` with N > \
             {steps})",
            dir.path.display(),
            final_checkpoint::DIR
        );
    }
    Ok(())
}

/// The run's first line: the model, its dtype and device, what it trains on ([`Tasks::describe`]) and where the
/// run writes; then whether the evaluation can be on held-out problems. A model built from
/// scratch warms up in float32 and takes `dtype` after the warm-up, and the line says so.
fn announce(policy: &Model, dtype: Dtype, trains_on: &str, dir: &Path, held_out: bool) {
    let now = crate::devices::dtype_name(policy.net.kind());
    let later = if now == dtype.name() {
        String::new()
    } else {
        format!(" ({} after the warm-up)", dtype.name())
    };
    eprintln!(
        "skein: {} model, {:.2}M parameters, {now}{later} on {}, {trains_on}, run directory {}",
        policy.net.config.model_type,
        policy.net.config.num_parameters() as f64 / 1e6,
        crate::devices::describe(policy.vs.device()),
        dir.display()
    );
    if !held_out {
        eprintln!(
            "skein: evaluation is on problems training also draws (train-set accuracy): the \
             task has fewer than {} distinct problems to hold some out, or the dataset has no \
             `data.val_files`",
            skein_tasks::split::MIN_SPLIT_PROBLEMS
        );
    }
}

/// The config as the run's model is built, which config.toml records: `model.max_positions` is
/// the policy's own context (raised to what a multi-turn task needs, or a loaded model's).
fn as_built(cfg: &TrainConfig, policy: &Model) -> TrainConfig {
    let mut built = cfg.clone();
    built.model.max_positions = policy.net.max_positions() as usize;
    built
}

/// The run's sampling settings, stopping at each of the tokenizer's stop ids (its
/// end-of-sequence ids, and the stops a checkpoint's run added) and at the config's
/// `stop_token_ids`, which the tokenizer takes as added stops (an older checkpoint lists them
/// as ends of sequence).
fn sampling_params(cfg: &TrainConfig, tokenizer: &mut Tokenizer) -> Result<SamplingParams> {
    tokenizer.treat_as_added_stops(&cfg.rollout.sampling.stop_token_ids);
    if tokenizer.eos_token_ids().is_empty() {
        anyhow::bail!("the tokenizer defines no end-of-sequence token");
    }
    let vocab = tokenizer.vocab_size();
    if let Some(id) = cfg
        .rollout
        .sampling
        .stop_token_ids
        .iter()
        .find(|&&id| id as usize >= vocab)
    {
        anyhow::bail!(
            "`rollout.sampling.stop_token_ids` has {id}, which is no token of the model's \
             tokenizer (ids 0..{vocab}): a sample would never stop there"
        );
    }
    Ok(cfg
        .rollout
        .sampling
        .stopping_at(&tokenizer.stop_token_ids()))
}

/// The task's prompts and `max_new_tokens` fit in the model's positions; else most
/// trajectories would fail, every step, from the first.
fn check_context(cfg: &TrainConfig, workload: &dyn Workload, policy: &Model) -> Result<()> {
    let positions = policy.net.max_positions() as usize;
    let (prompt, new) = (
        workload.longest_prompt(),
        cfg.rollout.sampling.max_new_tokens,
    );
    if prompt > 0 && prompt + new > positions {
        anyhow::bail!(
            "the task's prompts reach {prompt} tokens, and with `rollout.sampling.max_new_tokens` \
             = {new} a sample needs {} positions, more than the model's {positions}: raise \
             `model.max_positions` (a model built from scratch) or lower \
             `rollout.sampling.max_new_tokens`",
            prompt + new
        );
    }
    Ok(())
}

/// The engine rollouts run on, once the run is known to fit in memory (on the CPU, where
/// free memory can be read). `restore` is a resumed run's, its KL reference already loaded;
/// `loaded_prompt` a loaded dataset's longest prompt in tokens; `ranks_here` the
/// data-parallel ranks on this machine, whose replicas share its memory.
fn rollout_engine(
    cfg: &TrainConfig,
    policy: &Model,
    restore: Option<&Restore>,
    loaded_prompt: Option<usize>,
    ranks_here: usize,
) -> Result<Generator> {
    let device = policy.vs.device();
    // Counted as held only where the run uses it (the estimate counts it then); otherwise it
    // is dropped before the update's models are built.
    let uses_reference = cfg.algorithm.kl_coef > 0.0 && !cfg.lora.enabled();
    let reference = restore
        .and_then(|r| r.reference.as_ref())
        .filter(|_| uses_reference);
    // The policy's weights, and a resumed run's reference (moved into the trainer, never
    // copied), are in the estimate and already loaded: free memory alone would count them
    // twice. (A resumed run's raw moments and critic are held too, but they are copied into
    // tensors of their own, both alive at once: they are not counted as usable.)
    if let Some(free) = crate::memory::available_on(device) {
        let available = free + held_bytes(policy) + reference.map_or(0.0, held_bytes);
        let parts = preflight::estimate(cfg, &policy.net.config, device, ranks_here, loaded_prompt);
        preflight::check(&parts, available)?;
    }
    Ok(match cfg.rollout.engine {
        EngineKind::Remote => Generator::Remote(RemoteEngine::new(
            &cfg.rollout.remote,
            policy.net.config.vocab_size,
            usize::try_from(policy.net.max_positions()).unwrap_or(usize::MAX),
        )),
        EngineKind::Local => {
            let mut engine = Engine::new(cfg.rollout.max_slots);
            engine.cuda_graphs = cfg.rollout.cuda_graphs;
            Generator::Local(engine)
        }
    })
}

/// Held-out accuracy before RL, logged as step 0 with the data's counts.
fn measure_before(
    workload: &dyn Workload,
    ctx: &StepContext,
    log: &mut MetricsLog,
) -> Result<EvalResult> {
    let e = workload.evaluate(ctx);
    let mut first = record(0, []);
    extend(&mut first, eval_metrics(&e, workload.held_out()));
    extend(&mut first, workload.data_metrics(true));
    log.append(&first)?;
    let kind = eval_kind(workload.held_out());
    eprintln!(
        "skein: eval before RL: {kind} accuracy {:.3}{}",
        e.accuracy,
        e.failures_note()
    );
    Ok(e)
}

/// The policy's optimizer, and the critic's model and optimizer.
type UpdateModels = (Option<Model>, Optimizer, Option<(ValueModel, Optimizer)>);

/// The models the update needs beside the policy: the frozen reference (a copy of the
/// warmed-up policy, or the checkpoint's), the policy's optimizer, and the critic with its
/// own; a resume restores the moments, the reference and the critic from `restore`.
fn update_models(
    cfg: &TrainConfig,
    policy: &Model,
    mut restore: Option<&mut Restore>,
) -> Result<UpdateModels> {
    let device = policy.vs.device();
    if cfg.algorithm.kl_coef == 0.0 {
        // A checkpoint's reference this run does not use is freed before the moments and the
        // critic are built: the memory check did not count it.
        if let Some(r) = restore.as_deref_mut() {
            r.reference = None;
        }
    }
    let reference = if cfg.algorithm.kl_coef > 0.0 && cfg.lora.enabled() {
        // The frozen base is the reference: no second copy of the model. Where a warm-up
        // trained the adapters of a loaded model, a frozen copy of them rides on it, so the
        // reference is the warmed-up policy.
        Some(
            match restore.as_deref_mut().and_then(|r| r.reference.take()) {
                Some(warmed_up) => warmed_up,
                None if restore.is_none() && cfg.warm_up_trains_adapters() => policy.frozen_copy(),
                None => policy.base_only(),
            },
        )
    } else if cfg.algorithm.kl_coef > 0.0 {
        Some(match restore.as_deref_mut() {
            Some(r) => r.reference.take().with_context(|| {
                format!(
                    "{} has no reference model (its run trained without a KL term): resume \
                     with `algorithm.kl_coef = 0`",
                    r.dir.display()
                )
            })?,
            None => {
                // In the policy's dtype, so the KL term starts at zero.
                let mut r = Model::random_with(&policy.net.config, &policy.options, device, 0)?;
                r.copy_from(policy)?;
                r
            }
        })
    } else {
        None
    };
    let t = &cfg.trainer;
    // The schedule counts RL steps (`Optimizer::schedule_at`, set by the step loop).
    let mut opt = Optimizer::new(&policy.vs, &cfg.optim, t.steps)?;
    let mut critic = if cfg.algorithm.estimator.needs_critic() {
        let model = ValueModel::from_policy(policy, device)?;
        let ocfg = OptimConfig {
            lr: cfg.algorithm.critic_lr,
            ..cfg.optim.clone()
        };
        let opt = Optimizer::new(&model.vs, &ocfg, t.steps)?;
        Some((model, opt))
    } else {
        None
    };
    if let Some(r) = restore {
        let at = r.dir.display();
        opt.restore(&r.optimizer, r.state.optimizer_steps)
            .with_context(|| format!("restoring the optimizer of {at}"))?;
        if let Some((model, copt)) = &mut critic {
            let Some((weights, moments)) = &r.critic else {
                bail!(
                    "{at} has no critic (its run trained without `algorithm.estimator = \
                     \"gae\"`): resume with the estimator it was trained with"
                );
            };
            checkpoint::copy_into(&model.vs, weights, &format!("the critic of {at}"))?;
            copt.restore(moments, r.state.critic_optimizer_steps)
                .with_context(|| format!("restoring the critic's optimizer of {at}"))?;
        }
    }
    Ok((reference, opt, critic))
}

/// The policy update's settings.
fn update_config(cfg: &TrainConfig, temperature: f64) -> UpdateConfig {
    UpdateConfig {
        loss: cfg.algorithm.loss_config(),
        epochs: cfg.trainer.ppo_epochs,
        batching: cfg.trainer.batching(),
        temperature,
        activation_checkpointing: cfg.trainer.activation_checkpointing,
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
    let mut dir = run_dir.join("published");
    if remote.publishes_adapters() {
        // The frozen base once, then only the adapters, which name it.
        let base = dir.join(checkpoint::BASE_DIR);
        if !base.join("config.json").is_file() {
            policy.save_base_dir(&base)?;
        }
        let base = base.canonicalize()?.display().to_string();
        dir = dir.join(checkpoint::ADAPTER_DIR);
        policy.save_adapter(&dir, &base)?;
    } else {
        checkpoint::save_model_dir(policy, tokenizer, sampling, &dir)?;
    }
    remote
        .reload(&dir)
        .context("giving the remote engine the new weights (rollout.remote)")?;
    Ok(())
}

/// RL's adapters, and its KL reference, start from the warmed-up model: a model built from
/// scratch (nothing pretrained for an adapter to adapt) trained every weight in the warm-up, in
/// float32, and is cast to `model.dtype` and gets its adapters now; a loaded one trained its
/// adapters, which RL goes on training. They are not folded into the base: in bfloat16 an
/// update below half a weight's last digit would round away.
fn lora_after_warm_up(cfg: &TrainConfig, policy: &mut Model) -> Result<()> {
    if cfg.model.path.is_empty() {
        policy.adapt(&cfg.model_options())
    } else {
        Ok(())
    }
}

/// The warm-up's defaults suit a model built from scratch; a loaded model gets them too unless
/// told otherwise, so it is told what it is about to go through.
fn announce_warm_up_of_loaded_model(cfg: &TrainConfig) {
    let s = &cfg.sft;
    if cfg.model.path.is_empty() || !s.warms_up() {
        return;
    }
    eprintln!(
        "skein: warming up the loaded model first on the task's demonstrations: {} supervised \
         steps at lr {} and {} direct-answer steps at lr {} (`sft.steps = 0` and \
         `sft.direct_steps = 0` start RL from the model as it is)",
        s.steps, s.lr, s.direct_steps, s.direct_lr
    );
}

/// The supervised warm-up on the task's demonstrations: `sft.steps`, then the
/// `sft.direct_steps` in which a share of them answer without tools.
fn warm_up(
    cfg: &TrainConfig,
    policy: &Model,
    demos: &mut TaskDemonstrations,
    log: &mut MetricsLog,
) -> Result<()> {
    let s = &cfg.sft;
    let stages = [
        (s.steps, s.lr, 0.0),
        (s.direct_steps, s.direct_lr, s.direct_share),
    ];
    let mut first = 1;
    let last = stages.iter().rposition(|&(steps, ..)| steps > 0);
    for (i, (steps, lr, share)) in stages.into_iter().enumerate() {
        if steps == 0 {
            continue;
        }
        demos.direct_share = share;
        let stage = sft::Stage {
            steps,
            batch_size: s.batch_size,
            lr,
            first,
            // A remote engine has the policy's weights only once the warm-up is over.
            eval_every: match demos.engine {
                Generator::Local(_) => s.eval_every,
                Generator::Remote(_) => 0,
            },
            eval_last: Some(i) != last,
            weight_decay: s.weight_decay,
            micro_batch_tokens: s.pass_tokens(&cfg.trainer),
            checkpointing: cfg.trainer.activation_checkpointing,
        };
        match s.demonstrations {
            0 => sft::warm_up(policy, &stage, demos, log)?,
            n => {
                let mut pool = sft::Pool::new(demos, n, cfg.run.seed ^ 0xdede);
                sft::warm_up(policy, &stage, &mut pool, log)?
            }
        }
        first += steps;
    }
    Ok(())
}

/// The task's demonstrations, and its held-out evaluation, for the warm-up.
struct TaskDemonstrations<'a> {
    workload: &'a mut dyn Workload,
    engine: &'a Generator,
    tokenizer: &'a Tokenizer,
    sampling: &'a SamplingParams,
    direct_share: f64,
}

impl sft::Demonstrations for TaskDemonstrations<'_> {
    fn next(&mut self) -> Result<TrainRow> {
        self.workload
            .demonstration(self.tokenizer, self.sampling, self.direct_share)
    }

    fn evaluate(&mut self, policy: &Model) -> Result<f64> {
        let ctx = StepContext::new(self.engine, policy, self.tokenizer, self.sampling);
        Ok(self.workload.evaluate(&ctx).accuracy)
    }
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
        // Trained in full by the warm-up; LoRA's adapters come after it.
        let model = Model::random(&mc, device, cfg.run.seed as i64)?;
        Ok((tokenizer, model))
    } else {
        let path = Path::new(&cfg.model.path);
        let tokenizer = Tokenizer::from_dir(path)?;
        // LoRA's `A` matrices are drawn as the model loads: from the run's seed, or each run
        // of the same config would start its adapters, and all that follows, elsewhere.
        tch::manual_seed(cfg.run.seed as i64);
        let model = Model::load_dir_with(path, &cfg.model_options(), device)?;
        Ok((tokenizer, model))
    }
}
