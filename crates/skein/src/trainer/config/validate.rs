//! Start-up checks of a training config: every problem names its key and the allowed values,
//! and all of them are reported together.
//!
//! Keys with a fixed set of values are enums and checked when the config is read; this checks
//! ranges, combinations and paths.

use super::{AgentKind, CreditMode, DpBackend, EngineKind, Tracking, TrainConfig};
use crate::engine::sampling::MIN_SAMPLING_TEMPERATURE;
use crate::trainer::update::policy_loss::{KlEstimator, LossConfig, PolicyLoss};
use anyhow::Result;
use skein_config::Validator;
use skein_plan::LossAggMode;

pub fn validate(cfg: &TrainConfig) -> Result<()> {
    let mut v = Validator::new();
    validate_run(cfg, &mut v);
    validate_rollout(cfg, &mut v);
    validate_dynamic_sampling(cfg, &mut v);
    validate_equal_group_skipping(cfg, &mut v);
    validate_algorithm(cfg, &mut v);
    validate_trainer(cfg, &mut v);
    if let Err(problem) = cfg.correct_by() {
        v.problem(problem);
    }
    validate_model(cfg, &mut v);
    validate_reward(cfg, &mut v);
    validate_data(cfg, &mut v);
    validate_task(cfg, &mut v);
    validate_agent(cfg, &mut v);
    super::inert::validate_inert_keys(cfg, is_multi_turn(cfg), &mut v);
    Ok(v.finish()?)
}

/// Keys that belong to one estimator: a value set for another would be silently ignored, and
/// `dr-grpo` is Dr. GRPO's loss only with its aggregation (token sums over a constant).
fn validate_estimator_keys(a: &super::AlgorithmConfig, v: &mut Validator) {
    use super::Estimator;
    let estimator = serde_json::to_value(a.estimator)
        .ok()
        .and_then(|e| e.as_str().map(str::to_string))
        .unwrap_or_default();
    v.check(
        a.estimator != Estimator::DrGrpo || a.loss_agg_mode == LossAggMode::SeqMeanTokenSumNorm,
        "algorithm.loss_agg_mode",
        "must be `seq-mean-token-sum-norm` with `algorithm.estimator = \"dr-grpo\"`: Dr. GRPO \
         removes both the std normalisation and the per-response length normalisation \
         (for the std alone: `grpo` with `algorithm.normalize_std = false`)",
        a.loss_agg_mode.as_str(),
    )
    .check(
        a.normalize_std || a.estimator == Estimator::Grpo,
        "algorithm.normalize_std",
        &format!("is used by `grpo` only, not `{estimator}`: remove it"),
        a.normalize_std,
    )
    .check(
        a.gamma == 1.0 || (a.estimator == Estimator::Gae && a.credit == CreditMode::Trajectory),
        "algorithm.gamma",
        "is the per-token discount of `gae` with `credit = \"trajectory\"` only (per turn: \
         `algorithm.turn_gamma`): remove it",
        a.gamma,
    );
}

/// Keys that belong to one policy loss, refused set with another (they would be silently
/// ignored), and GSPO's aggregation.
fn validate_policy_loss_keys(a: &super::AlgorithmConfig, v: &mut Validator) {
    let loss = a.policy_loss.as_str();
    let defaults = LossConfig::default();
    v.check(
        a.policy_loss == PolicyLoss::Ppo || a.dual_clip == defaults.dual_clip,
        "algorithm.dual_clip",
        &format!(
            "bounds PPO's clipped surrogate of a negative advantage, and `algorithm.policy_loss = \"{loss}\"` has none: remove it"
        ),
        a.dual_clip,
    )
    .check(
        a.policy_loss != PolicyLoss::Gspo || a.loss_agg_mode == LossAggMode::SeqMeanTokenMean,
        "algorithm.loss_agg_mode",
        "must be `seq-mean-token-mean` with `algorithm.policy_loss = \"gspo\"`: GSPO's \
         objective is a mean over sequences of one clipped term each, which is its per-token \
         terms averaged within each sequence, then over sequences",
        a.loss_agg_mode.as_str(),
    );
    for (key, set) in [
        ("algorithm.clip_low", a.clip_low.is_some()),
        ("algorithm.clip_high", a.clip_high.is_some()),
    ] {
        v.check(
            a.policy_loss != PolicyLoss::Sapo || !set,
            key,
            "does not apply to `algorithm.policy_loss = \"sapo\"`, whose soft gate replaces the \
             clip (its width is `algorithm.sapo_tau_pos`/`sapo_tau_neg`): remove it",
            "set",
        );
    }
    for (key, value, default) in [
        (
            "algorithm.sapo_tau_pos",
            a.sapo_tau_pos,
            defaults.sapo_tau_pos,
        ),
        (
            "algorithm.sapo_tau_neg",
            a.sapo_tau_neg,
            defaults.sapo_tau_neg,
        ),
    ] {
        v.check(
            value > 0.0 && value.is_finite(),
            key,
            "must be a finite number > 0",
            value,
        )
        .check(
            a.policy_loss == PolicyLoss::Sapo || value == default,
            key,
            &format!("is `sapo`'s only, not `{loss}`'s: remove it"),
            value,
        );
    }
    v.check(
        a.dppo_kl_coef >= 0.0 && a.dppo_kl_coef.is_finite(),
        "algorithm.dppo_kl_coef",
        "must be a finite number >= 0",
        a.dppo_kl_coef,
    )
    .check(
        a.policy_loss == PolicyLoss::Dppo || a.dppo_kl_coef == defaults.dppo_kl_coef,
        "algorithm.dppo_kl_coef",
        &format!(
            "is `dppo`'s only, not `{loss}`'s (a KL term to the reference for any loss: \
             `algorithm.kl_coef`): remove it"
        ),
        a.dppo_kl_coef,
    );
}

/// `task.dropped_carries`: a probability, for the task whose demonstrations have carries.
fn validate_task(cfg: &TrainConfig, v: &mut Validator) {
    // The rows, or the worker's environment, are the problems: a task named beside them would
    // be recorded in config.toml as what the run trained on, and never drawn from.
    let replaced_by = if !cfg.data.train_files.is_empty() {
        Some("`data.train_files` (the rows are the problems)")
    } else if cfg.agent.kind == AgentKind::EnvWorker {
        Some("`agent.kind = \"env-worker\"` (its environment poses the problems)")
    } else {
        None
    };
    if let Some(by) = replaced_by {
        let default = super::TaskConfig::default();
        v.check(
            cfg.task.name == default.name,
            "task.name",
            &format!("is not used with {by}: remove it"),
            &cfg.task.name,
        )
        .check(
            cfg.task.difficulty == default.difficulty,
            "task.difficulty",
            &format!("is not used with {by}: remove it"),
            cfg.task.difficulty,
        );
    }
    let Some(p) = cfg.task.dropped_carries else {
        return;
    };
    let unused = if !cfg.data.train_files.is_empty() {
        "is not used with `data.train_files` (the rows are the problems): remove it"
    } else if is_multi_turn(cfg) {
        "applies only to task `arithmetic` at difficulty 1 to 3 (additions): remove it"
    } else {
        if let Err(e) = skein_tasks::task_with_teacher(&cfg.task.name, cfg.task.difficulty, Some(p))
        {
            v.problem(e.to_string());
        }
        return;
    };
    v.check(p == 0.0, "task.dropped_carries", unused, p);
}

/// `[run]` and `[sft]`: a device this machine has, a thread count it can run, metrics.jsonl
/// among the trackers, and a warm-up that has rows to train on.
fn validate_run(cfg: &TrainConfig, v: &mut Validator) {
    if let Err(e) = cfg.run.device() {
        v.problem(e.to_string());
    }
    v.check(
        cfg.run.tracking.contains(&Tracking::Jsonl),
        "run.tracking",
        "must list \"jsonl\": resume, plot.png and `skein plot` read metrics.jsonl, so every \
         run writes it (allowed: jsonl, tensorboard; e.g. [\"jsonl\", \"tensorboard\"])",
        serde_json::to_string(&cfg.run.tracking).unwrap_or_default(),
    );
    let max = super::max_threads();
    v.check(
        cfg.run.threads <= max,
        "run.threads",
        &format!(
            "must be at most {max} ({} per core of this machine's {}; 0 keeps libtorch's default)",
            super::MAX_THREADS_PER_CORE,
            max / super::MAX_THREADS_PER_CORE
        ),
        cfg.run.threads,
    );
    let s = &cfg.sft;
    if s.warms_up() {
        v.in_range("sft.batch_size", s.batch_size, 1, 1 << 16)
            .check(
                s.lr > 0.0 && s.lr.is_finite(),
                "sft.lr",
                "must be a finite number > 0",
                s.lr,
            )
            .check(
                s.direct_steps == 0 || (s.direct_lr > 0.0 && s.direct_lr.is_finite()),
                "sft.direct_lr",
                "must be a finite number > 0",
                s.direct_lr,
            )
            .check(
                (0.0..=1.0).contains(&s.direct_share),
                "sft.direct_share",
                "must be a share from 0 to 1",
                s.direct_share,
            )
            .check(
                s.weight_decay >= 0.0 && s.weight_decay.is_finite(),
                "sft.weight_decay",
                "must be a finite number ≥ 0",
                s.weight_decay,
            )
            // The warm-up keeps its demonstrations in memory.
            .in_range("sft.demonstrations", s.demonstrations, 0, 1 << 20);
    }
    if s.direct_share > 0.0 {
        v.check(
            s.direct_steps > 0,
            "sft.direct_steps",
            "is 0, so `sft.direct_share` has no stage to act in: give the stage steps \
             (e.g. 200), or set `sft.direct_share = 0`",
            s.direct_steps,
        );
    }
}

/// Evaluation problems are drawn, tokenized and answered up front, all at once.
const MAX_EVAL_PROBLEMS: usize = 1 << 20;

/// `[rollout]`: sizes, sampling, partial rollout and the remote engine.
fn validate_rollout(cfg: &TrainConfig, v: &mut Validator) {
    let (r, s) = (&cfg.rollout, &cfg.rollout.sampling);
    v.check(
        r.remote.publish != crate::engine::Publish::Adapter || cfg.lora.enabled(),
        "rollout.remote.publish",
        "\"adapter\" publishes LoRA adapters, and `lora.rank` is 0: set `lora.rank` or publish \
         \"merged\"",
        "adapter",
    );
    validate_sampling_sizes(cfg, v);
    // Greedy decoding is top-k 1: the engine takes the argmax while the trainer's π is the
    // whole distribution, and under a group estimator every sample of a prompt is the same.
    v.check(
        s.temperature >= MIN_SAMPLING_TEMPERATURE && s.temperature.is_finite(),
        "rollout.sampling.temperature",
        "must be a finite number >= 1e-5 in training: below it (0 included) decoding is \
         greedy, which draws from a one-token distribution while the importance ratio uses \
         the whole one (off-policy, uncorrected), and makes every sample of a prompt the \
         same (no group signal); greedy is for `skein eval` (its default with --n 1) and \
         `skein serve`",
        s.temperature,
    );
    // Truncated sampling stays on-policy only where the engine records what it kept and the
    // trainer computes π over the same ids: skein's own engine running its own episodes. A
    // remote engine or an external agent's server returns tokens without their kept sets.
    let records_kept = r.engine == EngineKind::Local && cfg.agent.kind != AgentKind::External;
    for (key, truncates, value) in [
        ("rollout.sampling.top_p", s.top_p < 1.0, s.top_p.to_string()),
        ("rollout.sampling.top_k", s.top_k > 0, s.top_k.to_string()),
    ] {
        v.check(
            records_kept || !truncates,
            key,
            "truncates the sampling distribution, which stays on-policy only with skein's own \
             engine and agents (they record the ids kept, and the trainer computes π over \
             them); with `rollout.engine = \"remote\"` or `agent.kind = \"external\"` leave it \
             at its default (top_p 1, top_k 0)",
            value,
        );
    }
    if r.cuda_graphs {
        let cuda = cfg.run.device().is_ok_and(|d| d.is_cuda());
        v.check(
            cuda && r.engine == EngineKind::Local,
            "rollout.cuda_graphs",
            "replays the embedded engine's decode steps as CUDA graphs, so it needs \
             `run.device = \"cuda\"` and `rollout.engine = \"local\"`: set it to false \
             elsewhere",
            true,
        );
        if cuda {
            if let Err(why) = crate::engine::cuda_graph::available() {
                v.problem(format!("`rollout.cuda_graphs` = true: {why}"));
            }
        }
    }
    validate_partial(cfg, v);
    if r.engine == EngineKind::Remote {
        let rm = &r.remote;
        v.check(
            rm.url.starts_with("http://") && rm.url.len() > "http://".len(),
            "rollout.remote.url",
            "must be the plain http:// base URL of an OpenAI-compatible server, e.g. \
             http://127.0.0.1:8000 (start one with `skein serve --model DIR`)",
            format!("{:?}", rm.url),
        )
        .check(
            rm.reload_path.starts_with('/'),
            "rollout.remote.reload_path",
            "must be a path starting with /",
            format!("{:?}", rm.reload_path),
        )
        .at_least("rollout.remote.timeout_ms", rm.timeout_ms, 1)
        .at_least("rollout.remote.concurrency", rm.concurrency, 1);
    }
}

/// The sizes every command that samples uses: the batch, the engine's slots, how sampling is
/// cut, and the evaluation's problems (the temperature is checked apart: training and
/// evaluation allow different ones).
fn validate_sampling_sizes(cfg: &TrainConfig, v: &mut Validator) {
    let (r, s) = (&cfg.rollout, &cfg.rollout.sampling);
    v.at_least("rollout.prompts_per_step", r.prompts_per_step, 1)
        .at_least("rollout.samples_per_prompt", r.samples_per_prompt, 1)
        .at_least("rollout.max_slots", r.max_slots, 1)
        .check(
            s.top_p > 0.0 && s.top_p <= 1.0,
            "rollout.sampling.top_p",
            "must be in (0, 1] (1: no nucleus truncation)",
            s.top_p,
        )
        .at_least("rollout.sampling.max_new_tokens", s.max_new_tokens, 1);
    v.in_range("eval.problems", cfg.eval.problems, 1, MAX_EVAL_PROBLEMS);
}

/// The checks of a config `skein eval` samples with (a run's, with `--set` overrides): its
/// sizes and sampling, and what judges an answer. Paths and the training keys are not its
/// business: a finished run's data may have moved.
pub fn validate_for_eval(cfg: &TrainConfig) -> Result<()> {
    let mut v = Validator::new();
    validate_sampling_sizes(cfg, &mut v);
    if let Err(problem) = cfg.correct_by() {
        v.problem(problem);
    }
    Ok(v.finish()?)
}

/// The checks of a config `skein plan-memory` sizes a training step of: every size `skein
/// train` refuses, without its paths or this machine's devices (the plan may be for another).
pub fn validate_for_memory_plan(cfg: &TrainConfig) -> Result<()> {
    let mut v = Validator::new();
    validate_sampling_sizes(cfg, &mut v);
    validate_trainer(cfg, &mut v);
    Ok(v.finish()?)
}

/// `[rollout.partial]`, when it is on: a budget that pauses samples, and a cap they can
/// resume within.
fn validate_partial(cfg: &TrainConfig, v: &mut Validator) {
    let (p, t) = (&cfg.rollout.partial, &cfg.trainer);
    if !p.enabled {
        return;
    }
    // A version step of one training step: a sample paused now resumes that much later.
    let per_step = (t.num_mini_batches * t.ppo_epochs) as u64;
    v.at_least("rollout.partial.token_budget", p.token_budget, 1)
        .check(
            p.token_budget < cfg.rollout.sampling.max_new_tokens,
            "rollout.partial.token_budget",
            &format!(
                "must be below `rollout.sampling.max_new_tokens` = {}: a sample stops at \
                 that limit before it reaches the budget, so none would ever pause and \
                 partial rollout would do nothing; lower the budget or raise the limit",
                cfg.rollout.sampling.max_new_tokens
            ),
            p.token_budget,
        )
        .check(
            p.max_staleness >= per_step,
            "rollout.partial.max_staleness",
            &format!(
                "must be at least trainer.num_mini_batches × trainer.ppo_epochs = {per_step} \
                 (the versions one step advances), or no paused sample could ever resume"
            ),
            p.max_staleness,
        );
}

/// Skipping groups whose rewards are all equal (`rollout.skip_zero_variance_groups`) or
/// dropping them (`algorithm.drop_equal_reward_groups`) loses nothing only where a group
/// baseline gives such a group an advantage of zero ([`equal_groups_carry_signal`]). Elsewhere
/// those groups carry signal, and skipping them would throw it away and shift the batch's
/// whitening.
fn validate_equal_group_skipping(cfg: &TrainConfig, v: &mut Validator) {
    let key = if cfg.rollout.skip_zero_variance_groups {
        "rollout.skip_zero_variance_groups"
    } else if cfg.algorithm.drop_equal_reward_groups {
        "algorithm.drop_equal_reward_groups"
    } else {
        return;
    };
    if let Some(signal) = equal_groups_carry_signal(cfg) {
        v.check(
            false,
            signal.key,
            &format!(
                "{}, so `{key} = true` would throw that signal away and change the rest: \
                 set `{key} = false`, or use an estimator with a group baseline (grpo, dr-grpo, \
                 rloo, reinforce++-baseline) with `algorithm.credit = \"trajectory\"`",
                signal.why
            ),
            &signal.value,
        );
    }
}

/// The setting that gives a group whose rewards are all equal a non-zero advantage, its value
/// as the config writes it, and why.
struct EqualGroupSignal {
    key: &'static str,
    value: String,
    why: String,
}

/// Where a group whose rewards are all equal still has a non-zero advantage: everywhere but
/// grpo, dr-grpo, rloo and reinforce++-baseline with trajectory credit and without step groups
/// whose returns tell its episodes apart (discounted ones, or an environment worker's, which
/// may add per-step rewards). (reinforce++-baseline whitens over the groups kept, as it would
/// had the others never been drawn.)
fn equal_groups_carry_signal(cfg: &TrainConfig) -> Option<EqualGroupSignal> {
    use super::Estimator;
    let a = &cfg.algorithm;
    // On an environment worker, whose per-step rewards enter the returns, an undiscounted
    // return does not make an equal group signal-free either.
    let way_out = if cfg.agent.kind == AgentKind::EnvWorker {
        "`algorithm.step_group_weight = 0` gives such a group no advantage"
    } else {
        "`algorithm.step_group_weight = 0` or `algorithm.turn_gamma = 1` gives such a group no \
         advantage"
    };
    let (key, value, why): (&'static str, String, String) = match (a.estimator, a.credit) {
        (Estimator::ReinforcePP, _) => (
            "algorithm.estimator",
            "\"reinforce++\"".into(),
            "reinforce++ whitens rewards over the batch with no group baseline, so a group whose \
             rewards are all equal still has a non-zero advantage (an all-correct group a \
             positive one)"
                .into(),
        ),
        (Estimator::Gae, _) => (
            "algorithm.estimator",
            "\"gae\"".into(),
            "gae takes its advantages from the critic, which are non-zero whatever a group's \
             rewards are"
                .into(),
        ),
        (_, CreditMode::Turn) => (
            "algorithm.credit",
            "\"turn\"".into(),
            "turn credit gives each turn its own discounted return, which differs between the \
             turns and episodes of a group whose final rewards are equal"
                .into(),
        ),
        _ if a.step_group_weight > 0.0 && a.turn_gamma < 1.0 => (
            "algorithm.step_group_weight",
            a.step_group_weight.to_string(),
            format!(
                "GiGPO's step groups compare turns by their returns discounted by \
                 `algorithm.turn_gamma` < 1, which differ between episodes of unequal length in \
                 a group whose final rewards are equal ({way_out})"
            ),
        ),
        _ if a.step_group_weight > 0.0 && cfg.agent.kind == AgentKind::EnvWorker => (
            "algorithm.step_group_weight",
            a.step_group_weight.to_string(),
            "GiGPO's step groups compare turns by returns that add an environment worker's \
             per-step rewards, which can differ between episodes of a group whose final \
             rewards are equal"
                .into(),
        ),
        _ => return None,
    };
    Some(EqualGroupSignal { key, value, why })
}

/// `rollout.skip_zero_variance_groups` and its bound: groups that can have variance, and the
/// one source that can draw more of them within a step (single-turn prompts answered by the
/// trainer's engine, every group finished in the step it is drawn).
fn validate_dynamic_sampling(cfg: &TrainConfig, v: &mut Validator) {
    let r = &cfg.rollout;
    if !r.skip_zero_variance_groups {
        v.check(
            r.max_draws_per_step == 0,
            "rollout.max_draws_per_step",
            "bounds the draws of `rollout.skip_zero_variance_groups`, which is false: remove it, \
             or set `rollout.skip_zero_variance_groups = true`",
            r.max_draws_per_step,
        );
        return;
    }
    const KEY: &str = "rollout.skip_zero_variance_groups";
    v.check(
        r.max_draws_per_step == 0 || r.max_draws_per_step >= r.prompts_per_step,
        "rollout.max_draws_per_step",
        &format!(
            "must be 0 ({} × rollout.prompts_per_step) or at least rollout.prompts_per_step = {} \
             (the groups a step draws first)",
            super::DEFAULT_DRAWS_PER_GROUP,
            r.prompts_per_step
        ),
        r.max_draws_per_step,
    )
    .check(
        r.samples_per_prompt >= 2,
        "rollout.samples_per_prompt",
        &format!(
            "must be at least 2 with `{KEY} = true`: a group of one sample has no reward \
             variance, so every group would be skipped"
        ),
        r.samples_per_prompt,
    )
    .check(
        !r.partial.enabled,
        "rollout.partial.enabled",
        &format!(
            "cannot be combined with `{KEY} = true`: partial rollout carries unfinished groups \
             into later steps, so a step cannot draw more groups to replace the ones it skips; \
             turn one of them off"
        ),
        true,
    )
    .check(
        cfg.agent.kind != AgentKind::External,
        "agent.kind",
        &format!(
            "cannot be \"external\" with `{KEY} = true`: a step's tasks are handed out to the \
             agents once, and no more are drawn to replace skipped groups; set `{KEY} = false`"
        ),
        "external",
    )
    .check(
        !cfg.algorithm.drop_equal_reward_groups,
        "algorithm.drop_equal_reward_groups",
        &format!(
            "has no effect with `{KEY} = true` (every group a step keeps has rewards that \
             differ): remove it"
        ),
        true,
    );
    if is_multi_turn(cfg) {
        let (key, value) = match cfg.agent.kind {
            AgentKind::EnvWorker => ("agent.kind", "\"env-worker\"".to_string()),
            _ => ("task.name", format!("\"{}\"", cfg.task.name)),
        };
        v.check(
            false,
            key,
            &format!(
                "names a multi-turn task, and `{KEY} = true` applies to single-turn prompts \
                 only (a step's episodes are not topped up with more); set `{KEY} = false`"
            ),
            value,
        );
    }
}

/// `[algorithm]`: clip ranges, coefficients and the off-policy cap.
fn validate_algorithm(cfg: &TrainConfig, v: &mut Validator) {
    let a = &cfg.algorithm;
    validate_estimator_keys(a, v);
    validate_policy_loss_keys(a, v);
    let loss = a.loss_config();
    let probability = a.policy_loss == PolicyLoss::Dppo;
    // CISPO's weight may go unbounded below, as its paper trains it: a lower bound of 0.
    let unbounded_low = a.policy_loss == PolicyLoss::Cispo;
    v.check(
        (0.0..1.0).contains(&loss.clip_low)
            || ((probability || unbounded_low) && loss.clip_low == 1.0),
        "algorithm.clip_low",
        if probability {
            "must be in [0, 1] (a change of probability)"
        } else if unbounded_low {
            "must be in [0, 1] (1: no lower bound on the weight)"
        } else {
            "must be in [0, 1)"
        },
        loss.clip_low,
    )
    .check(
        if probability {
            (0.0..=1.0).contains(&loss.clip_high)
        } else {
            (0.0..=1000.0).contains(&loss.clip_high)
        },
        "algorithm.clip_high",
        if probability {
            "must be in [0, 1] (a change of probability)"
        } else {
            "must be in [0, 1000]"
        },
        loss.clip_high,
    )
    // The update's settings cross to MPI ranks as JSON, which has no infinity: each is
    // finite, a large value doing what infinity would.
    .check(
        a.dual_clip == 0.0 || (a.dual_clip > 1.0 && a.dual_clip.is_finite()),
        "algorithm.dual_clip",
        "must be 0 (off) or a finite number > 1",
        a.dual_clip,
    )
    .check(
        a.turn_gamma > 0.0 && a.turn_gamma <= 1.0,
        "algorithm.turn_gamma",
        "must be in (0, 1]",
        a.turn_gamma,
    )
    .check(
        a.step_group_weight >= 0.0 && a.step_group_weight.is_finite(),
        "algorithm.step_group_weight",
        "must be a finite number >= 0 (0: no step groups)",
        a.step_group_weight,
    )
    .check(
        a.step_group_weight == 0.0 || !a.estimator.needs_critic(),
        "algorithm.step_group_weight",
        "step groups add to the group estimators' advantages (grpo, dr-grpo, rloo, \
         reinforce++, reinforce++-baseline); with `gae` the critic's advantages replace those, \
         so use 0 (for credit per turn with a critic, set credit = \"turn\": turn-level GAE)",
        a.step_group_weight,
    )
    .in_range("algorithm.gamma", a.gamma, 0.0, 1.0)
    .in_range("algorithm.lambda", a.lambda, 0.0, 1.0)
    .check(
        a.value_clip > 0.0 && a.value_clip.is_finite(),
        "algorithm.value_clip",
        "must be a finite number > 0 (a large one, e.g. 1e6, clips nothing)",
        a.value_clip,
    )
    .check(
        a.critic_lr > 0.0 && a.critic_lr.is_finite(),
        "algorithm.critic_lr",
        "must be a finite number > 0",
        a.critic_lr,
    )
    .check(
        a.kl_coef >= 0.0 && a.kl_coef.is_finite(),
        "algorithm.kl_coef",
        "must be a finite number ≥ 0",
        a.kl_coef,
    )
    .check(
        a.kl_coef == 0.0 || a.kl_estimator != KlEstimator::K1,
        "algorithm.kl_estimator",
        "cannot be \"k1\" with `kl_coef` > 0: as a loss term k1's gradient is 0 in \
         expectation, so the KL term would do nothing; use \"k2\" (the gradient of \
         KL(policy || reference)) or \"k3\" (GRPO's, the gradient of KL(reference || policy))",
        "k1",
    )
    .check(
        a.is_cap > 1.0 && a.is_cap.is_finite(),
        "algorithm.is_cap",
        "must be a finite number > 1",
        a.is_cap,
    );
}

/// How many of `trainer.unit` a step plans, how the config sets that number, and the unit's
/// name.
fn step_units(cfg: &TrainConfig) -> (usize, String, &'static str) {
    let r = &cfg.rollout;
    match cfg.trainer.unit {
        skein_plan::Unit::Group => (
            r.prompts_per_step,
            format!("rollout.prompts_per_step = {} groups", r.prompts_per_step),
            "group",
        ),
        skein_plan::Unit::Trajectory => {
            let n = r.prompts_per_step * r.samples_per_prompt;
            let how = format!(
                "{n} trajectories (rollout.prompts_per_step × rollout.samples_per_prompt = {} × {})",
                r.prompts_per_step, r.samples_per_prompt
            );
            (n, how, "trajectory")
        }
    }
}

/// `[trainer]` and `[optim]`.
fn validate_trainer(cfg: &TrainConfig, v: &mut Validator) {
    let (t, o) = (&cfg.trainer, &cfg.optim);
    let (units, units_set_by, unit) = step_units(cfg);
    v.at_least("trainer.ppo_epochs", t.ppo_epochs, 1)
        .at_least("trainer.num_mini_batches", t.num_mini_batches, 1)
        .check(
            t.num_mini_batches <= units,
            "trainer.num_mini_batches",
            &format!(
                "must be at most the {units_set_by} a step has with trainer.unit = \"{unit}\" (a \
                 {unit} is never split over mini-batches, so a step of fewer would take fewer \
                 optimizer steps than asked)"
            ),
            t.num_mini_batches,
        )
        .at_least("trainer.dp_size", t.dp_size, 1)
        .check(
            t.dp_backend != DpBackend::Mpi || cfg!(feature = "mpi"),
            "trainer.dp_backend",
            "needs a skein built with MPI: `cargo build --release --features mpi` (OpenMPI and \
             libclang installed: `scripts/setup-mpi.sh`), then `mpirun -np <dp_size> \
             target/release/skein train ...`",
            "mpi",
        )
        .at_least("trainer.micro_batch_tokens", t.micro_batch_tokens, 1)
        .check(
            t.packing || !t.shared_prefix,
            "trainer.shared_prefix",
            "needs `trainer.packing = true` (a shared prompt and its continuations are packed \
             into one line); set both, or set `trainer.shared_prefix = false`",
            t.shared_prefix,
        )
        .at_least("trainer.max_consecutive_skips", t.max_consecutive_skips, 1)
        .check(
            o.lr > 0.0 && o.lr.is_finite(),
            "optim.lr",
            "must be a finite number > 0",
            o.lr,
        )
        .at_least("optim.grad_clip", o.grad_clip, 0.0)
        .check(
            (0.0..1.0).contains(&o.beta1),
            "optim.beta1",
            "must be in [0, 1)",
            o.beta1,
        )
        .check(
            (0.0..1.0).contains(&o.beta2),
            "optim.beta2",
            "must be in [0, 1)",
            o.beta2,
        )
        .check(
            o.weight_decay >= 0.0 && o.weight_decay.is_finite(),
            "optim.weight_decay",
            "must be a finite number >= 0 (0: none)",
            o.weight_decay,
        )
        .check(
            o.eps > 0.0 && o.eps.is_finite(),
            "optim.eps",
            "must be a finite number > 0 (it keeps AdamW's division away from 0)",
            o.eps,
        )
        .check(
            (0.0..=1.0).contains(&o.min_lr_ratio),
            "optim.min_lr_ratio",
            "must be in [0, 1] (the cosine schedule's floor, as a fraction of `optim.lr`)",
            o.min_lr_ratio,
        )
        .check(
            cfg.algorithm.entropy_coef.is_finite(),
            "algorithm.entropy_coef",
            "must be a finite number (0: no entropy bonus)",
            cfg.algorithm.entropy_coef,
        );
}

/// `[model]` of a from-scratch model: shapes that fit together and room for a response.
fn validate_model(cfg: &TrainConfig, v: &mut Validator) {
    let m = &cfg.model;
    let device = cfg.run.device().unwrap_or(tch::Device::Cpu);
    if let Err(e) = cfg.model_options().check(device) {
        v.problem(e.to_string());
    }
    if m.path.is_empty() {
        // Each size names itself when it is zero; the divisibility rules only apply to sizes
        // that are not, so a zero is never blamed on another key.
        v.at_least("model.hidden_size", m.hidden_size, 1)
            .at_least("model.num_layers", m.num_layers, 1)
            .at_least("model.num_heads", m.num_heads, 1)
            .at_least("model.num_kv_heads", m.num_kv_heads, 1)
            .at_least("model.intermediate_size", m.intermediate_size, 1)
            .check(
                m.num_heads == 0 || m.hidden_size.is_multiple_of(m.num_heads),
                "model.hidden_size",
                "must be a multiple of model.num_heads",
                m.hidden_size,
            )
            .check(
                m.num_kv_heads == 0 || m.num_heads.is_multiple_of(m.num_kv_heads),
                "model.num_kv_heads",
                "must divide model.num_heads",
                m.num_kv_heads,
            )
            .check(
                m.max_positions.max(min_positions(cfg)) > cfg.rollout.sampling.max_new_tokens,
                "model.max_positions",
                "must exceed rollout.sampling.max_new_tokens",
                m.max_positions,
            )
            .check(
                m.num_heads == 0 || (m.hidden_size / m.num_heads).is_multiple_of(2),
                "model.hidden_size",
                "÷ model.num_heads must be even (rotary embeddings turn pairs of dimensions)",
                m.hidden_size,
            )
            .check(
                m.max_positions <= crate::model::MAX_POSITIONS,
                "model.max_positions",
                &format!("must be at most {}", crate::model::MAX_POSITIONS),
                m.max_positions,
            );
        if m.num_heads > 0 && m.num_kv_heads > 0 {
            validate_model_memory(m, v);
        }
    } else {
        let dir = std::path::Path::new(&m.path);
        let problem = if !dir.exists() {
            Some("no such directory")
        } else if !dir.is_dir() {
            Some("is a file, not a model directory (Hugging Face layout)")
        } else if !dir.join("config.json").is_file() {
            Some("is not a model directory: it has no config.json")
        } else {
            None
        };
        v.check(
            problem.is_none(),
            "model.path",
            problem.unwrap_or(""),
            &m.path,
        );
    }
}

/// A from-scratch model's weights, gradients and two AdamW moments (float32: 16 bytes per
/// parameter) fit in the memory that is free; else building it would abort the process.
fn validate_model_memory(m: &super::ModelSection, v: &mut Validator) {
    let built = m.tiny_config(0, m.max_positions.min(crate::model::MAX_POSITIONS));
    let bytes = 16.0 * built.parameter_count();
    if let Some(free) = crate::memory::available().filter(|&free| bytes > free) {
        v.problem(format!(
            "`model.hidden_size`, `model.num_layers` and `model.intermediate_size` make a model \
             of {:.3e} parameters: {:.1} GiB with gradients and AdamW moments, but {:.1} GiB of \
             memory is free; lower them",
            built.parameter_count(),
            bytes / crate::memory::GIB,
            free / crate::memory::GIB
        ));
    }
}

/// The multi-turn task the config names: Ok(None) when it names none, an error when it names
/// one that cannot be built (reported where the task is loaded).
fn multi_turn_task(cfg: &TrainConfig) -> anyhow::Result<Option<Box<dyn skein_tasks::AgentTask>>> {
    crate::trainer::rollout::tasks::multi_turn_task(cfg)
}

fn is_multi_turn(cfg: &TrainConfig) -> bool {
    crate::trainer::rollout::tasks::is_multi_turn(cfg)
}

/// Positions a from-scratch model gets at least (more for multi-turn episodes).
fn min_positions(cfg: &TrainConfig) -> usize {
    if is_multi_turn(cfg) {
        crate::trainer::rollout::multi_turn::MIN_AGENT_POSITIONS
    } else {
        0
    }
}

/// `[agent]`, and what multi-turn tasks do not combine with.
fn validate_agent(cfg: &TrainConfig, v: &mut Validator) {
    let a = &cfg.agent;
    v.check(
        a.env_timeout_s > 0.0 && a.env_timeout_s <= MAX_TIMEOUT_S,
        "agent.env_timeout_s",
        "must be a number of seconds in (0, 1e9]",
        a.env_timeout_s,
    );
    if a.kind == AgentKind::External {
        v.check(
            !is_multi_turn(cfg),
            "agent.kind",
            "`external` hands out a single-turn task's problems (arithmetic, reverse or \
             data.train_files); the agents make the turns",
            &cfg.task.name,
        )
        .check(
            cfg.rollout.engine == EngineKind::Local,
            "rollout.engine",
            "must be `local` with external agents (they call the trainer's own engine)",
            "remote",
        )
        .check(
            !cfg.rollout.partial.enabled,
            "rollout.partial.enabled",
            "must be false with external agents",
            true,
        )
        .check(
            a.rollout_timeout_s > 0.0 && a.rollout_timeout_s <= MAX_TIMEOUT_S,
            "agent.rollout_timeout_s",
            "must be a number of seconds in (0, 1e9]",
            a.rollout_timeout_s,
        )
        .check(
            cfg.reward.is_none(),
            "reward",
            "is not used to train with external agents (each posts its rollout's reward), and \
             would score only the held-out evaluations, so the two would measure different \
             things: remove the section and have the agents compute the reward",
            "[reward]",
        );
        if a.workers > 0 {
            v.command(
                "agent.command",
                &a.command,
                "the agent program when agent.workers > 0, e.g. [\".venv/bin/python\", \
                 \"scripts/example_agent.py\", \"--server\", \"{server}\"]",
            );
        }
    }
    if a.kind == AgentKind::EnvWorker {
        validate_env_worker(cfg, v);
    }
    if let Ok(Some(task)) = multi_turn_task(cfg) {
        // A demonstrated message and its stop token must fit in one turn's new tokens.
        let need = task.max_message_chars() + 1;
        v.check(
            cfg.rollout.sampling.max_new_tokens >= need || !cfg.model.path.is_empty(),
            "rollout.sampling.max_new_tokens",
            &format!(
                "must be at least {need} for task `{}` (its longest message plus the stop token), \
                 or a message is cut off mid-way",
                task.name()
            ),
            cfg.rollout.sampling.max_new_tokens,
        );
    }
    if is_multi_turn(cfg) {
        v.check(
            !cfg.rollout.partial.enabled,
            "rollout.partial.enabled",
            "must be false for a multi-turn task (episodes run to their end)",
            true,
        );
        v.check(
            cfg.reward.is_none(),
            "reward",
            "is not used by a multi-turn task (its environment scores each episode): remove the section",
            "[reward]",
        );
    }
}

/// Longest an `agent.*_timeout_s` may be (about 32 years): beyond it a duration overflows,
/// and no run waits that long.
const MAX_TIMEOUT_S: f64 = 1e9;

/// Most environment worker processes (each is a process of its own).
const MAX_ENV_WORKERS: usize = 1024;

/// `agent.kind = "env-worker"`: a command that can start, and a run shape it fits. What the
/// worker itself says (its alphabet, limits, demonstrations) is checked once it answers, at
/// start-up.
fn validate_env_worker(cfg: &TrainConfig, v: &mut Validator) {
    let a = &cfg.agent;
    v.command(
        "agent.command",
        &a.command,
        "the environment worker's program and arguments, e.g. [\"python3\", \"scripts/env_worker_example.py\"]",
    );
    v.in_range("agent.workers", a.workers, 1, MAX_ENV_WORKERS)
        .check(
            a.start_timeout_s > 0.0 && a.start_timeout_s <= MAX_TIMEOUT_S,
            "agent.start_timeout_s",
            "must be a number of seconds in (0, 1e9]",
            a.start_timeout_s,
        )
        .check(
            cfg.data.train_files.is_empty(),
            "data.train_files",
            "must be empty with agent.kind = \"env-worker\" (the environment makes its own \
             problems)",
            format!("{:?}", cfg.data.train_files),
        )
        .check(
            cfg.sft.direct_share == 0.0 || cfg.sft.direct_steps == 0,
            "sft.direct_share",
            "must be 0 with agent.kind = \"env-worker\": a worker's demonstrations have no \
             answer without its tools, so the direct-answer stage would train on ordinary \
             ones",
            cfg.sft.direct_share,
        );
}

/// `[data]`: files that exist with a known extension.
fn validate_data(cfg: &TrainConfig, v: &mut Validator) {
    let d = &cfg.data;
    v.check(
        d.val_files.is_empty() || !d.train_files.is_empty(),
        "data.val_files",
        "needs `data.train_files` (a validation split of the built-in task does not exist)",
        format!("{:?}", d.val_files),
    );
    for (key, files) in [
        ("data.train_files", &d.train_files),
        ("data.val_files", &d.val_files),
    ] {
        for (i, f) in files.iter().enumerate() {
            let path = std::path::Path::new(f);
            let known = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "jsonl" | "json" | "parquet"));
            v.check(
                known,
                &format!("{key}[{i}]"),
                "must end in .jsonl, .json or .parquet",
                f,
            );
            let problem = if path.is_dir() {
                "is a directory: list the files in it"
            } else {
                "no such file"
            };
            v.check(path.is_file(), &format!("{key}[{i}]"), problem, f);
        }
    }
}

/// `[reward]` and `[reward_models]`: the reward config's own checks, model directories, and
/// routes that name data sources the task produces.
fn validate_reward(cfg: &TrainConfig, v: &mut Validator) {
    crate::trainer::rollout::reward::check_reward_models(
        cfg.reward.as_ref(),
        &cfg.reward_models,
        v,
    );
    let Some(reward) = &cfg.reward else {
        if !cfg.reward_models.is_empty() {
            v.problem(
                "`reward_models` needs a `[reward]` section with `kind = \"scorer\"` sources \
                 that use them",
            );
        }
        return;
    };
    if let Err(e) = reward.validate("reward") {
        for p in e.problems() {
            v.problem(p.clone());
        }
    }
    if !is_multi_turn(cfg) {
        refuse_inert_overlong(reward, cfg.rollout.sampling.max_new_tokens, v);
    }
    // A dataset names its data sources per row: its routes are checked once the rows are
    // loaded (rollout::routes).
    if !cfg.data.train_files.is_empty() {
        return;
    }
    // The task's own data source (its problems all share one).
    let Ok(task) = skein_tasks::task_by_name(&cfg.task.name, cfg.task.difficulty) else {
        return;
    };
    let source = task.sample(&mut skein_tasks::TaskRng::new(0)).data_source;
    for name in reward.routes.keys() {
        if *name != source {
            v.problem(format!(
                "invalid key `reward.routes.{name}`: unknown data source `{name}` (task `{}` \
                 produces: {source})",
                cfg.task.name
            ));
        }
    }
    if !reward.routes.contains_key(&source) && reward.default_route.sources.is_empty() {
        v.problem(format!(
            "`reward.default_route.sources` is empty and there is no `reward.routes.{source}`: \
             the task's responses would have no reward source"
        ));
    }
}

/// An `overlong` source whose penalty starts beyond the longest response the run samples
/// (`max_new_tokens`) would score 0 on every response: a setting with no effect.
fn refuse_inert_overlong(
    reward: &skein_reward::RewardConfig,
    max_new_tokens: usize,
    v: &mut Validator,
) {
    use skein_reward::{OverlongShaping, RewardFn, SourceConfig};
    for (name, source) in &reward.sources {
        let SourceConfig::Function(RewardFn::Overlong(OverlongShaping {
            max_response_tokens,
            overlong_buffer,
            ..
        })) = source
        else {
            continue;
        };
        let start = max_response_tokens.saturating_sub(*overlong_buffer);
        if start >= max_new_tokens {
            // The buffer may not exceed max_response_tokens: lowering that alone may not do.
            let buffer_too = if *overlong_buffer > max_new_tokens {
                format!(" and `reward.sources.{name}.overlong_buffer` below it")
            } else {
                String::new()
            };
            v.problem(format!(
                "`reward.sources.{name}.max_response_tokens`: its penalty starts after {start} \
                 response tokens (max_response_tokens − overlong_buffer), but \
                 `rollout.sampling.max_new_tokens` = {max_new_tokens} ends every response \
                 before that, so it would score 0 on all of them: set max_response_tokens to \
                 {max_new_tokens} (the response limit) or lower{buffer_too}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config as `--set` overrides make it.
    fn load(overrides: &[&str]) -> Result<TrainConfig, skein_config::ConfigError> {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        skein_config::load_with_defaults(None, "defaults", &overrides)
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let mut cfg = TrainConfig::default();
        assert!(validate(&cfg).is_ok());
        let err = load(&["algorithm.estimator=\"ppo2\""])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`algorithm.estimator`") && err.contains("rloo"),
            "{err}"
        );
        cfg.optim.lr = -1.0;
        cfg.run.device = "gpu".into();
        let err = validate(&cfg).unwrap_err().to_string();
        assert!(err.contains("`optim.lr`"), "{err}");
        assert!(err.contains("`run.device`"), "{err}");
    }

    /// Values that used to reach libtorch and panic are refused, each naming its own key.
    #[test]
    fn sizes_devices_and_threads_that_cannot_work_name_their_keys() {
        let problems = |set: &dyn Fn(&mut TrainConfig)| {
            let mut cfg = TrainConfig::default();
            set(&mut cfg);
            validate(&cfg).unwrap_err().to_string()
        };
        let e = problems(&|c| c.sft.batch_size = 0);
        assert!(e.contains("`sft.batch_size`"), "{e}");
        let e = problems(&|c| c.sft.weight_decay = f64::NAN);
        assert!(e.contains("`sft.weight_decay`"), "{e}");
        let e = problems(&|c| c.sft.demonstrations = usize::MAX);
        assert!(e.contains("`sft.demonstrations`"), "{e}");
        for share in [-0.1, 1.5, f64::NAN] {
            let e = problems(&|c| c.sft.direct_share = share);
            assert!(
                e.contains("`sft.direct_share`: must be a share from 0 to 1"),
                "{e}"
            );
        }
        let e = problems(&|c| c.sft.direct_share = 0.5);
        assert!(e.contains("`sft.direct_steps`: is 0"), "{e}");
        let e = problems(&|c| c.model.intermediate_size = 0);
        assert!(e.contains("`model.intermediate_size`"), "{e}");
        let e = problems(&|c| c.model.hidden_size = 0);
        assert!(e.contains("`model.hidden_size`"), "{e}");
        let e = problems(&|c| c.model.num_heads = 0);
        assert!(e.contains("`model.num_heads`: must be ≥ 1"), "{e}");
        assert!(
            !e.contains("model.hidden_size"),
            "a zero head count blamed on: {e}"
        );
        let e = problems(&|c| c.run.threads = 1 << 20);
        assert!(e.contains("`run.threads`") && e.contains("per core"), "{e}");
        let e = problems(&|c| c.rollout.cuda_graphs = true);
        assert!(
            e.contains("`rollout.cuda_graphs`") && e.contains("`run.device = \"cuda\"`"),
            "{e}"
        );
        if !tch::Cuda::is_available() {
            let e = problems(&|c| c.run.device = "cuda:0".into());
            assert!(e.contains("`run.device`") && e.contains("has 0"), "{e}");
            let e = problems(&|c| c.run.device = "cuda".into());
            assert!(e.contains("`run.device`") && e.contains("use cpu"), "{e}");
        }
    }

    #[test]
    fn estimator_keys_are_refused_where_they_would_be_ignored() {
        let problem = |set: &[&str]| validate(&load(set).unwrap()).err().map(|e| e.to_string());
        let e = problem(&["algorithm.estimator=\"dr-grpo\""]).unwrap();
        assert!(e.contains("`algorithm.loss_agg_mode`") && e.contains("seq-mean-token-sum-norm"));
        assert!(problem(&[
            "algorithm.estimator=\"dr-grpo\"",
            "algorithm.loss_agg_mode=\"seq-mean-token-sum-norm\""
        ])
        .is_none());
        let e = problem(&[
            "algorithm.estimator=\"rloo\"",
            "algorithm.normalize_std=false",
        ]);
        assert!(e.unwrap().contains("`algorithm.normalize_std`"));
        assert!(problem(&["algorithm.normalize_std=false"]).is_none());
        let e = problem(&["algorithm.gamma=0.9"]).unwrap();
        assert!(e.contains("`algorithm.gamma`"), "{e}");
        let gae = ["algorithm.estimator=\"gae\"", "algorithm.gamma=0.9"];
        assert!(problem(&gae).is_none());
        let e = problem(&[gae[0], gae[1], "algorithm.credit=\"turn\""]).unwrap();
        assert!(e.contains("`algorithm.turn_gamma`"), "{e}");
    }

    /// k1 as a loss term has a zero expected gradient: refused with a KL term on, with the
    /// two estimators that do pull named; without one the estimator is unused, so refused.
    #[test]
    fn k1_is_refused_as_a_loss_term() {
        let problem = |set: &[&str]| validate(&load(set).unwrap()).err().map(|e| e.to_string());
        let k1 = "algorithm.kl_estimator=\"k1\"";
        let e = problem(&[k1, "algorithm.kl_coef=0.1"]).unwrap();
        assert!(
            e.contains("`algorithm.kl_estimator`") && e.contains("\"k2\""),
            "{e}"
        );
        assert!(problem(&["algorithm.kl_estimator=\"k2\"", "algorithm.kl_coef=0.1"]).is_none());
        let e = problem(&[k1]).unwrap();
        assert!(e.contains("`algorithm.kl_coef` > 0"), "{e}");
    }

    /// A group stays in one mini-batch, so a step cannot have more mini-batches than groups;
    /// nor more than trajectories, by trajectory.
    #[test]
    fn more_mini_batches_than_units_are_refused() {
        let set = ["rollout.prompts_per_step=2", "trainer.num_mini_batches=4"];
        let e = validate(&load(&set).unwrap()).unwrap_err().to_string();
        assert!(
            e.contains("`trainer.num_mini_batches`") && e.contains("prompts_per_step = 2 groups"),
            "{e}"
        );
        let by_trajectory = [set[0], set[1], "trainer.unit=\"trajectory\""];
        assert!(validate(&load(&by_trajectory).unwrap()).is_ok());
        let too_many = [set[0], "trainer.num_mini_batches=17", by_trajectory[2]];
        let e = validate(&load(&too_many).unwrap()).unwrap_err().to_string();
        assert!(
            e.contains("`trainer.num_mini_batches`") && e.contains("16 trajectories"),
            "{e}"
        );
    }

    /// Values the optimizer would use as given (a negative decay grows the weights, a floor
    /// above 1 climbs) and timeouts a duration cannot hold are refused, naming the key.
    /// External agents post their rollouts' rewards: a `[reward]` table would score only the
    /// held-out evaluations, so it is refused rather than left to measure something else.
    #[test]
    fn external_agents_refuse_a_reward_table() {
        let external = "agent.kind=\"external\"";
        let cfg = load(&[external, "reward.default_route.sources=[]"]).unwrap();
        let e = validate(&cfg).unwrap_err().to_string();
        assert!(
            e.contains("`reward`: is not used to train with external agents"),
            "{e}"
        );
        let e = validate(&load(&[external]).unwrap())
            .err()
            .map(|e| e.to_string());
        assert!(!e.unwrap_or_default().contains("`reward`"));
    }

    /// An agent skein starts is checked as an environment worker is: a misspelt script would
    /// otherwise fail every rollout of the run, found only once it trains nothing.
    #[test]
    fn an_external_agent_command_is_checked_when_skein_starts_it() {
        let external = "agent.kind=\"external\"";
        let problem = |set: &[&str]| validate(&load(set).unwrap()).err().map(|e| e.to_string());
        let e = problem(&[
            external,
            "agent.workers=1",
            "agent.command=[\"python3\", \"scripts/example_agnt.py\"]",
        ])
        .unwrap_or_default();
        assert!(e.contains("`agent.command[1]`: no such file"), "{e}");
        // Agents started by hand (`workers = 0`) need no command.
        assert_eq!(problem(&[external, "agent.workers=0"]), None);
    }

    #[test]
    fn optimizer_values_and_timeouts_out_of_range_are_refused() {
        let problem = |set: &[&str]| validate(&load(set).unwrap()).err().map(|e| e.to_string());
        for (set, key) in [
            (&["optim.weight_decay=-0.1"][..], "`optim.weight_decay`"),
            (&["optim.eps=0.0"], "`optim.eps`"),
            (
                &["optim.schedule=\"cosine\"", "optim.min_lr_ratio=5.0"],
                "`optim.min_lr_ratio`",
            ),
            (&["algorithm.entropy_coef=nan"], "`algorithm.entropy_coef`"),
            // Settings that cross to MPI ranks as JSON, which has no infinity.
            (&["algorithm.dual_clip=inf"], "`algorithm.dual_clip`"),
            (&["algorithm.kl_coef=inf"], "`algorithm.kl_coef`"),
            (
                &["algorithm.estimator=\"gae\"", "algorithm.value_clip=inf"],
                "`algorithm.value_clip`",
            ),
            // A critic stepped by infinity fails every later update without naming the key.
            (
                &["algorithm.estimator=\"gae\"", "algorithm.critic_lr=inf"],
                "`algorithm.critic_lr`",
            ),
            (
                &["task.name=\"guess\"", "agent.env_timeout_s=1e20"],
                "`agent.env_timeout_s`",
            ),
        ] {
            let e = problem(set).unwrap_or_else(|| panic!("{set:?} was accepted"));
            assert!(e.contains(key), "{set:?}: {e}");
        }
        assert_eq!(
            problem(&["optim.weight_decay=0.01", "optim.eps=1e-6"]),
            None
        );
    }

    #[test]
    fn truncated_sampling_trains_only_where_the_kept_sets_are_recorded() {
        for (set, key) in [
            ("rollout.sampling.top_p=0.9", "`rollout.sampling.top_p`"),
            ("rollout.sampling.top_k=5", "`rollout.sampling.top_k`"),
        ] {
            let cfg = load(&[set]).unwrap();
            assert!(validate(&cfg).is_ok(), "{set}: {:?}", validate(&cfg));
            let mut cfg = cfg;
            cfg.rollout.engine = EngineKind::Remote;
            let e = validate(&cfg).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("remote"), "{e}");
        }
        let e = validate(&load(&["rollout.sampling.top_p=0.0"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`rollout.sampling.top_p`") && e.contains("(0, 1]"),
            "{e}"
        );
    }

    #[test]
    fn a_careless_teacher_is_refused_where_nothing_has_carries() {
        assert!(validate(&load(&["task.dropped_carries=0.5"]).unwrap()).is_ok());
        for set in [
            &["task.dropped_carries=1.5"][..],
            &["task.dropped_carries=0.5", "task.difficulty=4"],
            &["task.dropped_carries=0.5", "task.name=\"guess\""],
            &["task.dropped_carries=0.5", "data.train_files=[\"x.jsonl\"]"],
        ] {
            let e = validate(&load(set).unwrap()).unwrap_err().to_string();
            assert!(e.contains("`task.dropped_carries`"), "{set:?}: {e}");
        }
        // Unset, it is the task's own default, whatever the task.
        assert!(validate(&load(&["task.name=\"guess\""]).unwrap()).is_ok());
    }

    /// A task named beside a dataset or an environment worker is never drawn from: refused,
    /// rather than recorded in config.toml as what the run trained on.
    #[test]
    fn a_task_that_something_else_replaces_is_refused() {
        let rows = "data.train_files=[\"x.jsonl\"]";
        let worker = "agent.kind=\"env-worker\"";
        for (set, key) in [
            (&[rows, "task.name=\"guess\""][..], "`task.name`"),
            (&[rows, "task.difficulty=3"], "`task.difficulty`"),
            (
                &[worker, "agent.command=[\"w\"]", "task.difficulty=3"],
                "`task.difficulty`",
            ),
        ] {
            let e = validate(&load(set).unwrap()).unwrap_err().to_string();
            assert!(
                e.contains(key) && e.contains("is not used with"),
                "{set:?}: {e}"
            );
        }
        let e = validate(&load(&[rows]).unwrap())
            .err()
            .map(|e| e.to_string());
        assert!(
            !e.is_some_and(|e| e.contains("`task.")),
            "the defaults pass"
        );
    }

    #[test]
    fn turn_credit_names_its_values_and_step_groups_refuse_the_critic() {
        let err = load(&["algorithm.credit=\"step\""])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`algorithm.credit`") && err.contains("trajectory, turn"),
            "{err}"
        );
        let mut cfg = TrainConfig::default();
        cfg.algorithm.credit = CreditMode::Turn;
        assert!(validate(&cfg).is_ok());
        cfg.algorithm.turn_gamma = 0.0;
        let err = validate(&cfg).unwrap_err().to_string();
        assert!(err.contains("`algorithm.turn_gamma`"), "{err}");
        cfg.algorithm.turn_gamma = 1.0;
        cfg.algorithm.step_group_weight = -1.0;
        let err = validate(&cfg).unwrap_err().to_string();
        assert!(err.contains("`algorithm.step_group_weight`"), "{err}");
        cfg.algorithm.step_group_weight = 0.5;
        assert!(validate(&cfg).is_ok());
        cfg.algorithm.estimator = super::super::Estimator::Gae;
        let err = validate(&cfg).unwrap_err().to_string();
        assert!(
            err.contains("`algorithm.step_group_weight`") && err.contains("gae"),
            "{err}"
        );
        // Credit per turn with a critic is turn-level GAE.
        cfg.algorithm.step_group_weight = 0.0;
        assert!(validate(&cfg).is_ok());
    }

    #[test]
    fn tracking_names_its_values_and_keeps_jsonl() {
        let err = load(&["run.tracking=[\"jsonl\", \"wandb\"]"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`run.tracking[1]`: `wandb` (allowed: jsonl, tensorboard)"),
            "{err}"
        );
        let cfg = load(&["run.tracking=[\"jsonl\", \"tensorboard\"]"]).unwrap();
        assert_eq!(cfg.run.tracking, [Tracking::Jsonl, Tracking::Tensorboard]);
        assert!(validate(&cfg).is_ok());
        for tracking in ["[\"tensorboard\"]", "[]"] {
            let cfg = load(&[&format!("run.tracking={tracking}")]).unwrap();
            let err = validate(&cfg).unwrap_err().to_string();
            assert!(
                err.contains("`run.tracking`: must list \"jsonl\"")
                    && err.contains(&format!("(got {tracking})")),
                "{err}"
            );
        }
    }

    #[test]
    fn dp_backend_names_its_values_and_what_mpi_needs() {
        let err = load(&["trainer.dp_backend=\"nccl\""])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`trainer.dp_backend`") && err.contains("threads, mpi"),
            "{err}"
        );
        let mut cfg = TrainConfig::default();
        cfg.trainer.dp_backend = DpBackend::Mpi;
        let checked = validate(&cfg);
        if cfg!(feature = "mpi") {
            assert!(checked.is_ok(), "{checked:?}");
        } else {
            let err = checked.unwrap_err().to_string();
            assert!(err.contains("--features mpi"), "{err}");
        }
    }

    /// An environment worker's command is checked before anything starts: the program, and
    /// scripts among its arguments, must exist.
    #[test]
    fn env_worker_keys_are_checked_before_start() {
        let err = load(&["agent.kind=\"worker\""]).unwrap_err().to_string();
        assert!(
            err.contains("`agent.kind`") && err.contains("env-worker"),
            "{err}"
        );
        let cfg = load(&["agent.kind=\"env-worker\""]).unwrap();
        assert_eq!(cfg.agent.kind, AgentKind::EnvWorker);
        let err = validate(&cfg).unwrap_err().to_string();
        assert!(err.contains("`agent.command`: must name"), "{err}");
        assert!(err.contains("`agent.workers`"), "{err}");
        let mut cfg = cfg;
        cfg.agent.workers = 2;
        cfg.agent.command = vec!["sh".into(), "-x".into(), "/nonexistent/env.py".into()];
        cfg.agent.start_timeout_s = 0.0;
        cfg.data.train_files = vec!["train.jsonl".into()];
        cfg.rollout.partial.enabled = true;
        cfg.sft.direct_share = 0.5;
        cfg.sft.direct_steps = 10;
        let err = validate(&cfg).unwrap_err().to_string();
        for key in [
            "`sft.direct_share`: must be 0 with agent.kind = \"env-worker\"",
            "`agent.command[2]`: no such file",
            "`agent.start_timeout_s`",
            "`data.train_files`: must be empty with agent.kind = \"env-worker\"",
            "`rollout.partial.enabled`",
        ] {
            assert!(err.contains(key), "missing {key:?} in {err}");
        }
        assert!(!err.contains("`agent.command`:"), "sh exists: {err}");
        cfg.agent.command = vec!["no-such-program-anywhere".into()];
        let err = validate(&cfg).unwrap_err().to_string();
        assert!(
            err.contains("`agent.command`") && err.contains("PATH"),
            "{err}"
        );
    }

    #[test]
    fn reward_problems_name_their_keys() {
        let mut cfg = TrainConfig::default();
        let mut reward = skein_reward::RewardConfig::default();
        reward.executor.threads = 0;
        reward.sources.insert(
            "rm".into(),
            skein_reward::SourceConfig::Service(skein_reward::ServiceConfig::Scorer {}),
        );
        reward.sources.insert(
            "judge".into(),
            skein_reward::SourceConfig::Service(skein_reward::ServiceConfig::Scorer {}),
        );
        reward.routes.insert(
            "gsm8k".into(),
            skein_reward::RouteConfig {
                sources: vec!["math".into()],
                weights: vec![1.0, 2.0],
            },
        );
        cfg.reward = Some(reward);
        cfg.reward_models
            .insert("rm".into(), "/nonexistent/model".into());
        let err = validate(&cfg).unwrap_err().to_string();
        for needle in [
            "`reward.executor.threads`: must be ≥ 1 (got 0)",
            "`reward_models.rm`: the directory `/nonexistent/model` does not exist",
            "`reward.sources.judge`: kind = \"scorer\" needs `reward_models.judge",
            "`reward.routes.gsm8k`: unknown data source `gsm8k` (task `arithmetic` produces: arithmetic)",
            "`reward.routes.gsm8k.weights`: needs one weight per source",
        ] {
            assert!(err.contains(needle), "missing {needle:?} in {err}");
        }
        // The task's checker is always available as a scorer source.
        let mut ok = TrainConfig::default();
        let mut reward = skein_reward::RewardConfig::default();
        reward.sources.insert(
            "task".into(),
            skein_reward::SourceConfig::Service(skein_reward::ServiceConfig::Scorer {}),
        );
        reward.default_route.sources = vec!["task".into(), "math".into()];
        ok.reward = Some(reward);
        // Both judge answers: `eval.correct_by` says which one decides accuracy.
        let err = validate(&ok).unwrap_err().to_string();
        assert!(err.contains("`eval.correct_by` is not set"), "{err}");
        ok.eval.correct_by = Some("math".into());
        assert!(validate(&ok).is_ok(), "{:?}", validate(&ok));
    }

    /// An `overlong` source whose penalty could never start under the response limit is
    /// refused by name; one whose soft zone the responses reach is accepted.
    #[test]
    fn an_overlong_penalty_beyond_the_response_limit_is_refused() {
        let with_overlong = |max_response_tokens: usize| {
            let mut cfg = TrainConfig::default();
            let mut reward = skein_reward::RewardConfig::default();
            reward.sources.insert(
                "len".into(),
                skein_reward::SourceConfig::Function(skein_reward::RewardFn::Overlong(
                    skein_reward::OverlongShaping {
                        max_response_tokens,
                        overlong_buffer: 4,
                        penalty: 1.0,
                    },
                )),
            );
            reward.default_route.sources = vec!["math".into(), "len".into()];
            cfg.reward = Some(reward);
            cfg
        };
        let limit = TrainConfig::default().rollout.sampling.max_new_tokens;
        let err = validate(&with_overlong(limit + 4)).unwrap_err().to_string();
        assert!(
            err.contains("`reward.sources.len.max_response_tokens`")
                && err.contains(&format!("`rollout.sampling.max_new_tokens` = {limit}")),
            "{err}"
        );
        let reached = with_overlong(limit + 3);
        assert!(validate(&reached).is_ok(), "{:?}", validate(&reached));
        assert!(!err.contains("overlong_buffer` below it"), "{err}");
    }

    /// CISPO is a policy loss of its own: accepted with the clip range (by default none
    /// below), refused with a dual-clip constant set, which it would ignore.
    #[test]
    fn cispo_takes_the_clip_range_and_refuses_dual_clip() {
        let cfg = load(&["algorithm.policy_loss=\"cispo\"", "algorithm.clip_high=4.0"]).unwrap();
        assert!(validate(&cfg).is_ok(), "{:?}", validate(&cfg));
        assert_eq!(
            cfg.algorithm.loss_config().kind,
            crate::trainer::update::policy_loss::PolicyLoss::Cispo
        );
        // Unbounded below by default, as MiniMax-M1 trains it (a weight of 0.5 stays 0.5);
        // a lower bound of 0 is PPO's to refuse.
        assert_eq!(cfg.algorithm.loss_config().clip_low, 1.0);
        let cfg = load(&["algorithm.policy_loss=\"cispo\"", "algorithm.clip_low=1.0"]).unwrap();
        assert!(validate(&cfg).is_ok(), "{:?}", validate(&cfg));
        let e = validate(&load(&["algorithm.clip_low=1.0"]).unwrap()).unwrap_err();
        assert!(e.to_string().contains("`algorithm.clip_low`"), "{e}");
        let cfg = load(&["algorithm.policy_loss=\"cispo\"", "algorithm.dual_clip=5.0"]).unwrap();
        let e = validate(&cfg).unwrap_err().to_string();
        assert!(
            e.contains("`algorithm.dual_clip`") && e.contains("cispo"),
            "{e}"
        );
        let e = load(&["algorithm.policy_loss=\"trpo\""])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("algorithm.policy_loss") && e.contains("cispo"),
            "{e}"
        );
    }

    /// Each loss's own keys are refused with another (they would be ignored), GSPO needs the
    /// aggregation its objective implies, SAPO has no clip to set, and unset clip ranges take
    /// each loss's own defaults.
    #[test]
    fn each_policy_loss_takes_its_own_keys_and_refuses_the_others() {
        use crate::trainer::update::policy_loss::PolicyLoss;
        let ok = |sets: &[&str]| {
            let cfg = load(sets).unwrap();
            assert!(validate(&cfg).is_ok(), "{sets:?}: {:?}", validate(&cfg));
            cfg.algorithm.loss_config()
        };
        let refused = |sets: &[&str], needles: &[&str]| {
            let e = validate(&load(sets).unwrap()).unwrap_err().to_string();
            for n in needles {
                assert!(e.contains(n), "{sets:?}: missing {n:?} in {e}");
            }
        };
        let gspo = ok(&[
            "algorithm.policy_loss=\"gspo\"",
            "algorithm.loss_agg_mode=\"seq-mean-token-mean\"",
        ]);
        assert_eq!(
            (gspo.kind, gspo.clip_low, gspo.clip_high),
            (PolicyLoss::Gspo, 3e-4, 4e-4)
        );
        refused(
            &["algorithm.policy_loss=\"gspo\""],
            &["`algorithm.loss_agg_mode`", "seq-mean-token-mean", "gspo"],
        );
        let ppo = ok(&[]);
        assert_eq!((ppo.clip_low, ppo.clip_high), (0.2, 0.28));
        let sapo = ok(&[
            "algorithm.policy_loss=\"sapo\"",
            "algorithm.sapo_tau_neg=2.0",
        ]);
        assert_eq!((sapo.sapo_tau_pos, sapo.sapo_tau_neg), (1.0, 2.0));
        refused(
            &["algorithm.policy_loss=\"sapo\"", "algorithm.clip_high=0.3"],
            &["`algorithm.clip_high`", "sapo"],
        );
        refused(
            &["algorithm.sapo_tau_pos=2.0"],
            &["`algorithm.sapo_tau_pos`", "`ppo`"],
        );
        refused(
            &[
                "algorithm.policy_loss=\"sapo\"",
                "algorithm.sapo_tau_pos=0.0",
            ],
            &["`algorithm.sapo_tau_pos`", "> 0"],
        );
        let dppo = ok(&[
            "algorithm.policy_loss=\"dppo\"",
            "algorithm.dppo_kl_coef=0.01",
        ]);
        assert_eq!(
            (dppo.clip_low, dppo.clip_high, dppo.dppo_kl_coef),
            (0.2, 0.2, 0.01)
        );
        refused(
            &["algorithm.policy_loss=\"dppo\"", "algorithm.clip_high=1.5"],
            &["`algorithm.clip_high`", "change of probability"],
        );
        refused(
            &["algorithm.dppo_kl_coef=0.01"],
            &["`algorithm.dppo_kl_coef`", "kl_coef"],
        );
        refused(
            &["algorithm.policy_loss=\"dppo\"", "algorithm.dual_clip=4.0"],
            &["`algorithm.dual_clip`", "dppo"],
        );
    }

    /// Greedy decoding draws from a one-token distribution the ratio does not use, and gives a
    /// group identical samples: training refuses it, naming the key.
    #[test]
    fn training_refuses_greedy_sampling() {
        // 1e-6: a server rounds it to greedy, while the trainer would divide by it.
        for t in ["0", "0.0", "-0.5", "nan", "1e-6"] {
            let cfg = load(&[&format!("rollout.sampling.temperature={t}")]).unwrap();
            let e = validate(&cfg).unwrap_err().to_string();
            assert!(
                e.contains("`rollout.sampling.temperature`: must be a finite number >= 1e-5"),
                "{t}: {e}"
            );
        }
        let cfg = load(&["rollout.sampling.temperature=0.7"]).unwrap();
        assert!(validate(&cfg).is_ok(), "{:?}", validate(&cfg));
    }

    /// A budget at or over the response limit never pauses a sample: partial rollout would
    /// log its counters at zero and change nothing, so the setting is refused.
    #[test]
    fn a_partial_rollout_budget_must_be_below_the_response_limit() {
        let on = "rollout.partial.enabled=true";
        for budget in ["8", "16"] {
            let set = format!("rollout.partial.token_budget={budget}");
            let cfg = load(&[on, &set, "rollout.sampling.max_new_tokens=8"]).unwrap();
            let e = validate(&cfg).unwrap_err().to_string();
            assert!(
                e.contains(
                    "`rollout.partial.token_budget`: must be below \
                     `rollout.sampling.max_new_tokens` = 8"
                ) && e.contains(&format!("(got {budget})")),
                "{e}"
            );
        }
        let cfg = load(&[on, "rollout.partial.token_budget=7"]).unwrap();
        assert!(validate(&cfg).is_ok(), "{:?}", validate(&cfg));
    }

    /// Skipping or dropping equal-reward groups is refused where such groups carry signal
    /// (reinforce++'s batch whitening, gae's critic, turn credit), naming the key that makes
    /// it so, and accepted under every estimator with a group baseline.
    #[test]
    fn equal_reward_groups_are_skipped_only_where_their_advantage_is_zero() {
        let skip = "rollout.skip_zero_variance_groups=true";
        let drop = "algorithm.drop_equal_reward_groups=true";
        for on in [skip, drop] {
            let key = on.split('=').next().unwrap();
            for estimator in ["grpo", "rloo", "reinforce++-baseline"] {
                let cfg = load(&[on, &format!("algorithm.estimator=\"{estimator}\"")]).unwrap();
                assert!(
                    validate(&cfg).is_ok(),
                    "{on} {estimator}: {:?}",
                    validate(&cfg)
                );
            }
            for (set, named) in [
                (
                    "algorithm.estimator=\"reinforce++\"",
                    "`algorithm.estimator`",
                ),
                ("algorithm.estimator=\"gae\"", "`algorithm.estimator`"),
                ("algorithm.credit=\"turn\"", "`algorithm.credit`"),
                (
                    "algorithm.step_group_weight=0.5",
                    "`algorithm.step_group_weight`",
                ),
            ] {
                let cfg = load(&[on, set]).unwrap();
                let e = validate(&cfg).unwrap_err().to_string();
                assert!(
                    e.contains(named) && e.contains(&format!("`{key} = true` would throw")),
                    "{on} {set}: {e}"
                );
                // The estimator alone is fine.
                let cfg = load(&[set]).unwrap();
                let e = validate(&cfg)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                assert!(!e.contains("would throw"), "{set}: {e}");
            }
            // Undiscounted, an equal-reward group's step returns are all equal too.
            let undiscounted = [
                "algorithm.step_group_weight=0.5",
                "algorithm.turn_gamma=1.0",
            ];
            let cfg = load(&[on, undiscounted[0], undiscounted[1]]).unwrap();
            let e = validate(&cfg)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(!e.contains("would throw"), "{on}: {e}");
            // Unless an environment worker's per-step rewards enter the returns.
            let worker = "agent.kind=\"env-worker\"";
            let cfg = load(&[on, undiscounted[0], undiscounted[1], worker]).unwrap();
            let e = validate(&cfg).unwrap_err().to_string();
            assert!(
                e.contains("per-step rewards")
                    && e.contains(&format!("`{key} = true` would throw")),
                "{on}: {e}"
            );
        }
    }

    /// Dynamic sampling: its bound is refused without it and below one step's groups, and so
    /// is every setting it cannot top up (partial rollout, external agents, multi-turn
    /// tasks), or where it would skip every group, each naming both keys.
    #[test]
    fn dynamic_sampling_names_its_keys_and_the_settings_it_refuses() {
        let err = |sets: &[&str]| {
            let cfg = load(sets).unwrap();
            validate(&cfg).unwrap_err().to_string()
        };
        let on = "rollout.skip_zero_variance_groups=true";
        let cfg = load(&[on]).unwrap();
        assert!(validate(&cfg).is_ok(), "{:?}", validate(&cfg));
        assert_eq!(cfg.rollout.draw_limit(), 4 * cfg.rollout.prompts_per_step);
        let cfg = load(&[on, "rollout.max_draws_per_step=40"]).unwrap();
        assert!(validate(&cfg).is_ok());
        assert_eq!(cfg.rollout.draw_limit(), 40);
        let e = err(&["rollout.max_draws_per_step=64"]);
        assert!(
            e.contains("`rollout.max_draws_per_step`") && e.contains("false"),
            "{e}"
        );
        let e = err(&[on, "rollout.max_draws_per_step=31"]);
        assert!(
            e.contains(
                "`rollout.max_draws_per_step`: must be 0 (4 × rollout.prompts_per_step) \
                 or at least rollout.prompts_per_step = 32"
            ) && e.contains("(got 31)"),
            "{e}"
        );
        for (set, key) in [
            (
                "rollout.samples_per_prompt=1",
                "`rollout.samples_per_prompt`",
            ),
            ("rollout.partial.enabled=true", "`rollout.partial.enabled`"),
            ("agent.kind=\"external\"", "`agent.kind`"),
            (
                "algorithm.drop_equal_reward_groups=true",
                "`algorithm.drop_equal_reward_groups`",
            ),
            ("task.name=\"guess\"", "`task.name`"),
        ] {
            let e = err(&[on, set]);
            assert!(
                e.contains(key) && e.contains("`rollout.skip_zero_variance_groups = true`"),
                "{set}: {e}"
            );
            // Each is refused only with dynamic sampling on.
            if let Ok(cfg) = load(&[set]) {
                let e = validate(&cfg)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                assert!(!e.contains("skip_zero_variance_groups"), "{set}: {e}");
            }
        }
        let e = err(&[on, "agent.kind=\"env-worker\""]);
        assert!(e.contains("`agent.kind`: names a multi-turn task"), "{e}");
    }
}
