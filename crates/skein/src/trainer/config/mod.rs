//! Every key of a training run, with its default. `skein train --print-config` prints them.
//!
//! A key with a fixed set of values is an enum here, so a wrong value is a load error that
//! names the key and the allowed values, and no code downstream parses a string again.

mod batching;
pub mod correct_by;
mod inert;
mod trajectories;
pub mod validate;

pub use batching::Batching;
pub use correct_by::CorrectBy;
pub use trajectories::{Keep, TrajectoriesConfig};

use crate::engine::SamplingParams;
use crate::trainer::update::optim::OptimConfig;
use crate::trainer::update::policy_loss::{KlEstimator, LossConfig, PolicyLoss};
use serde::{Deserialize, Serialize};
use skein_data::Truncation;
use skein_plan::{LossAggMode, Unit};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    pub run: RunConfig,
    pub model: ModelSection,
    pub task: TaskConfig,
    /// Your own prompts (JSONL or verl-layout parquet): used instead of `task` when
    /// `data.train_files` is set.
    pub data: DataConfig,
    pub sft: SftConfig,
    pub rollout: RolloutConfig,
    pub algorithm: AlgorithmConfig,
    pub trainer: TrainerConfig,
    /// LoRA adapters on a frozen base (`lora.rank` > 0) instead of training every weight.
    pub lora: crate::model::LoraConfig,
    pub optim: OptimConfig,
    pub eval: EvalConfig,
    /// What each step's trajectory file keeps (`RUN_DIR/trajectories/`, read by `skein view`).
    pub trajectories: TrajectoriesConfig,
    /// Multi-turn tasks (`task.name = "guess"` or `"calculator"`, or an environment worker):
    /// who runs the episodes, and their limits.
    pub agent: AgentConfig,
    /// Reward sources, routes and the reward executor (see crates/skein-reward/README.md).
    /// Absent: the task's own program scores every response, inline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reward: Option<skein_reward::RewardConfig>,
    /// Reward-model directories (Hugging Face layout) by source name: `rm = "path"` supplies
    /// `[reward.sources.rm] kind = "scorer"`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub reward_models: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Run directory: resolved config, metrics.jsonl (and tensorboard/), plot.png, checkpoints.
    pub dir: String,
    pub seed: u64,
    /// `cpu`, `cuda` or `cuda:N` (read with [`RunConfig::device`]).
    pub device: String,
    /// Threads libtorch may use (0 = its default).
    pub threads: usize,
    /// Where the metrics go: `jsonl` (`metrics.jsonl`) and `tensorboard` (event files in
    /// `tensorboard/`, for `tensorboard --logdir`). `jsonl` must be listed: resume, plot.png
    /// and `skein plot` read metrics.jsonl, so every run writes it.
    pub tracking: Vec<Tracking>,
}

impl RunConfig {
    /// The libtorch device `run.device` names.
    pub fn device(&self) -> anyhow::Result<tch::Device> {
        parse_device(&self.device)
    }

    /// The device, with libtorch set to `run.threads` threads.
    pub fn start_device(&self) -> anyhow::Result<tch::Device> {
        start_device(&self.device, self.threads)
    }
}

/// More libtorch threads than this per core only oversubscribe it (and enough of them
/// overflow a thread's stack).
pub const MAX_THREADS_PER_CORE: usize = 4;

/// The most libtorch threads a command may ask for on this machine.
pub fn max_threads() -> usize {
    MAX_THREADS_PER_CORE * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The device `device` names, with libtorch set to `threads` threads (0 keeps its default):
/// the start of every command that computes.
pub fn start_device(device: &str, threads: usize) -> anyhow::Result<tch::Device> {
    let device = parse_device(device)?;
    if threads > max_threads() {
        anyhow::bail!(
            "{threads} threads: at most {} ({MAX_THREADS_PER_CORE} per core of this machine's {}; \
             0 keeps libtorch's default)",
            max_threads(),
            max_threads() / MAX_THREADS_PER_CORE
        );
    }
    if threads > 0 {
        tch::set_num_threads(threads as i32);
    }
    Ok(device)
}

/// `cpu`, `cuda` (the first GPU) or `cuda:N`: a device this machine has.
pub fn parse_device(s: &str) -> anyhow::Result<tch::Device> {
    let gpus = tch::Cuda::device_count().max(0) as usize;
    let n = match s {
        "cpu" => return Ok(tch::Device::Cpu),
        "cuda" => 0,
        other => match other.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(n) => n,
            None => {
                anyhow::bail!(
                    "invalid value `{other}` for `run.device` (allowed: cpu, cuda, cuda:N)"
                )
            }
        },
    };
    if n >= gpus {
        let why = match crate::devices::cuda() {
            crate::devices::Cuda::Unavailable(why) => why,
            crate::devices::Cuda::Gpus(_) => "`skein devices` lists them".to_string(),
        };
        anyhow::bail!(
            "invalid value `{s}` for `run.device`: this machine has {gpus} CUDA GPU(s) for \
             skein: {why}; use cpu"
        );
    }
    Ok(tch::Device::Cuda(n))
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            dir: "runs/default".into(),
            seed: 0,
            device: "cpu".into(),
            threads: 0,
            tracking: vec![Tracking::Jsonl],
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// A Hugging Face model directory; empty builds a tiny character-level model from scratch.
    pub path: String,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub intermediate_size: usize,
    pub max_positions: usize,
    /// Dtype of the weights and of the forward: "float32", "bfloat16", or "float16" (CUDA
    /// only, and with LoRA: without loss scaling its gradients underflow). Below float32 what
    /// trains stays float32: LoRA's adapters (`lora.rank` > 0), or with every weight trained
    /// the optimizer's master copies; the moments, the loss and the log-softmax too.
    pub dtype: crate::model::Dtype,
}

impl TrainConfig {
    /// Whether the warm-up trains LoRA adapters: those of a loaded model (one built from
    /// scratch is warmed up in full and gets its adapters after). RL then goes on training
    /// them, with a frozen copy of them in its KL reference.
    pub fn warm_up_trains_adapters(&self) -> bool {
        self.lora.enabled() && !self.model.path.is_empty() && self.sft.warms_up()
    }

    /// How the policy's weights are held: `model.dtype` and `[lora]`.
    pub fn model_options(&self) -> crate::model::ModelOptions {
        crate::model::ModelOptions {
            dtype: self.model.dtype,
            lora: self.lora.clone(),
        }
    }
}

impl ModelSection {
    /// The from-scratch model these keys describe, for a vocabulary and context length.
    pub fn tiny_config(
        &self,
        vocab_size: usize,
        max_positions: usize,
    ) -> crate::model::ModelConfig {
        crate::model::ModelConfig::tiny_qwen2(
            vocab_size,
            self.hidden_size,
            self.num_layers,
            self.num_heads,
            self.num_kv_heads,
            self.intermediate_size,
            max_positions,
        )
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            path: String::new(),
            hidden_size: 192,
            num_layers: 4,
            num_heads: 4,
            num_kv_heads: 2,
            intermediate_size: 512,
            max_positions: 64,
            dtype: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskConfig {
    /// A built-in task: `arithmetic` or `reverse` (long-tail response lengths).
    pub name: String,
    pub difficulty: u32,
    /// `arithmetic` at difficulty 1 to 3 (additions): the chance that a warm-up demonstration
    /// drops each carry, as a careless teacher does (unset or 0: every demonstration is
    /// correct). The reward still checks the exact sum, so RL has something to correct that
    /// more imitation cannot. The default job (`skein train` without `--config`, on its task)
    /// sets 0.7. The careless answers come from the warm-up's own stream, so with
    /// `sft.demonstrations` the set, answers included, is the same for every `run.seed`.
    pub dropped_carries: Option<f64>,
}

impl Default for TaskConfig {
    fn default() -> Self {
        // Difficulty 2 (a + b in 0..=31) is the easiest with enough problems to hold some out,
        // so the default run's evaluation is on problems it never trains on.
        TaskConfig {
            name: "arithmetic".into(),
            difficulty: 2,
            dropped_carries: None,
        }
    }
}

/// A prompt dataset: rows `{prompt, data_source, reward_model: {ground_truth}, extra_info}`
/// (see crates/skein-data).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// Training files (`.jsonl` or `.parquet`), read in order; empty: the built-in `task`.
    pub train_files: Vec<String>,
    /// Validation files, evaluated greedily (the first `eval.problems` rows); empty: held-out
    /// draws from the training rows.
    pub val_files: Vec<String>,
    /// Skip (and count, as `data/skipped_rows`) malformed rows instead of stopping.
    pub skip_bad_rows: bool,
    /// Longest prompt in tokens, after the chat template (0: no limit).
    pub max_prompt_tokens: usize,
    /// A prompt over the limit: `error`, `filter` (left out, counted as
    /// `data/filtered_prompts`), `left` or `right` (tokens cut from that side of its question,
    /// the last user message's text, so a chat template's framing stays whole; counted as
    /// `data/truncated_prompts`).
    pub truncation: Truncation,
    /// Visit the rows of each epoch in a seeded random order (else in file order).
    pub shuffle: bool,
    /// The seed of that order, apart from `run.seed`: runs that differ only in `run.seed`
    /// (the model's initialisation and sampling) draw the same rows in the same order. Each
    /// epoch gets its own order from it; a resumed run continues where it stopped.
    pub seed: u64,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            train_files: Vec::new(),
            val_files: Vec::new(),
            skip_bad_rows: false,
            max_prompt_tokens: 1024,
            truncation: Truncation::Filter,
            shuffle: true,
            seed: 0,
        }
    }
}

/// Supervised warm-up on generated solutions, so RL starts from a policy that sometimes succeeds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SftConfig {
    pub steps: usize,
    pub batch_size: usize,
    pub lr: f64,
    /// Steps of a second warm-up stage, after `steps`, in which a share `direct_share` of the
    /// demonstrations answer at once, without the task's tools (`calculator`): a policy that
    /// has learned to use a tool is taught to often go without it, and RL has to find out
    /// again when the tool pays.
    pub direct_steps: usize,
    pub direct_share: f64,
    /// The stage's peak learning rate (a schedule of its own), below `lr`: it fine-tunes a
    /// policy that has learned the task, and a step as large as the first stage's unlearns
    /// some of it.
    pub direct_lr: f64,
    /// Demonstrations the warm-up has (0: a new one for every row): drawn once from the
    /// training problems and visited again in a new order each pass, as a set of written
    /// solutions is, while RL draws every training problem with the reward program alone.
    /// For a single-turn task the set is the same for every `run.seed`. With `direct_steps`,
    /// that stage draws a set of its own (its demonstrations answer differently), so the
    /// warm-up has twice as many.
    pub demonstrations: usize,
    /// AdamW's decoupled weight decay in the warm-up, on every trainable tensor (norm gains
    /// and biases too, as `optim.weight_decay`).
    pub weight_decay: f64,
    /// Evaluate held-out greedy accuracy every N warm-up steps, and at the end of a stage that
    /// another follows (`sft/eval_accuracy`; the warm-up's end is the evaluation before RL;
    /// 0: only that one). With the local engine: a remote one
    /// is given the policy's weights once the warm-up is over.
    pub eval_every: usize,
    /// Token slots of one warm-up forward/backward pass (0: `trainer.micro_batch_tokens`): a
    /// batch longer than this runs in several passes, with the same loss and step. Set apart
    /// from the update's, two runs that differ only in `trainer.micro_batch_tokens` start RL
    /// from the same warm-up, bit for bit.
    pub micro_batch_tokens: usize,
}

impl SftConfig {
    /// Whether the run warms up at all: either stage has steps.
    pub fn warms_up(&self) -> bool {
        self.steps + self.direct_steps > 0
    }

    /// Token slots of one warm-up pass: `micro_batch_tokens`, or the update's.
    pub fn pass_tokens(&self, trainer: &TrainerConfig) -> usize {
        match self.micro_batch_tokens {
            0 => trainer.micro_batch_tokens,
            n => n,
        }
    }
}

impl Default for SftConfig {
    fn default() -> Self {
        // Enough warm-up for the default task's held-out accuracy to level off, on every seed
        // measured (0–6: docs/first-run.md), where its careless teacher leaves it: about 0.6.
        SftConfig {
            steps: 1500,
            batch_size: 64,
            lr: 3e-3,
            direct_steps: 0,
            direct_share: 0.0,
            direct_lr: 1e-3,
            demonstrations: 0,
            weight_decay: 0.0,
            eval_every: 250,
            micro_batch_tokens: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutConfig {
    /// Prompts (groups) per training step.
    pub prompts_per_step: usize,
    /// Samples per prompt (the group size of GRPO/RLOO).
    pub samples_per_prompt: usize,
    /// KV-cache slots of the engine: sequences generated concurrently.
    pub max_slots: usize,
    pub sampling: SamplingParams,
    pub partial: PartialConfig,
    /// DAPO's dynamic sampling (single-turn prompts of the trainer's engine, without partial
    /// rollout): a group whose rewards are all equal has zero advantage, so it is skipped
    /// (counted as `rollout/skipped_groups`) and more prompts are drawn until the step has
    /// `prompts_per_step` groups whose rewards differ, or `max_draws_per_step` groups were
    /// drawn. Only the rewards of trajectories that did not fail count; a group with fewer
    /// than two such rewards is skipped (its failed trajectories stay, counted as failed).
    /// Refused where an equal-reward group has signal (`reinforce++`, `gae`, turn credit).
    pub skip_zero_variance_groups: bool,
    /// With `skip_zero_variance_groups`: most groups one step draws, skipped ones included
    /// (0: 4 × `prompts_per_step`). A step that reaches it trains on the groups with
    /// variance it has, possibly none, and logs `rollout/draw_limit_hit = 1`.
    pub max_draws_per_step: usize,
    /// `local` (the embedded engine on the policy's weights) or `remote` (an OpenAI-compatible
    /// server at `rollout.remote.url`, given the policy's weights after every step).
    pub engine: EngineKind,
    pub remote: crate::engine::RemoteEngineConfig,
    /// The embedded engine's decode steps as CUDA graphs on a GPU (`run.device = "cuda"`):
    /// each step in one of a few fixed shapes, captured on its second use and replayed with
    /// one launch instead of one per kernel (docs/speed.md). Off by default until measured.
    /// A step then logs `rollout/graph_replayed_fraction` (of its decode steps) and
    /// `rollout/graph_captures` (shapes its rollout captured).
    pub cuda_graphs: bool,
}

/// Partial rollout: each iteration caps the tokens a sample may generate; samples that reach
/// the cap pause and continue (from their token ids) in the next iteration, so a long tail of
/// responses does not stall the step.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PartialConfig {
    pub enabled: bool,
    /// Most new tokens one sample may generate in one iteration before it pauses; below
    /// `rollout.sampling.max_new_tokens`, or no sample would ever pause.
    pub token_budget: usize,
    /// Most policy versions a group's oldest token trails π_old, the policy at the start of
    /// the step that trains on it (the step's later mini-batches train with weights up to
    /// `trainer.num_mini_batches × trainer.ppo_epochs − 1` versions newer still). A step
    /// advances the version by `trainer.num_mini_batches × trainer.ppo_epochs`.
    pub max_staleness: u64,
    /// What happens to a group that would exceed `max_staleness`: `drop` (discard the whole
    /// group, counted) or `finish-first` (its paused samples run to the end, without a budget,
    /// in the last iteration that keeps it within the cap).
    pub on_stale: OnStale,
    /// Complete groups a step needs before it trains (0: `rollout.prompts_per_step`).
    pub min_groups: usize,
}

impl PartialConfig {
    /// When partial rollout is on, the most versions behind a trained token can get: the cap
    /// rounded down to whole steps, since a group is finished or dropped before a step would
    /// take it past the cap, and a step advances `versions_per_step` versions (with a cap of
    /// 5 and 2 versions a step, 4).
    pub fn reachable_staleness(&self, versions_per_step: u64) -> Option<u64> {
        let per_step = versions_per_step.max(1);
        self.enabled
            .then(|| (self.max_staleness - self.max_staleness % per_step).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::PartialConfig;

    #[test]
    fn the_reachable_staleness_is_the_cap_in_whole_steps() {
        let on = |max_staleness| PartialConfig {
            enabled: true,
            max_staleness,
            ..Default::default()
        };
        assert_eq!(on(5).reachable_staleness(2), Some(4));
        assert_eq!(on(16).reachable_staleness(3), Some(15));
        assert_eq!(on(4).reachable_staleness(2), Some(4));
        assert_eq!(on(4).reachable_staleness(1), Some(4));
        assert_eq!(PartialConfig::default().reachable_staleness(2), None);
    }
}

impl Default for PartialConfig {
    fn default() -> Self {
        PartialConfig {
            enabled: false,
            token_budget: 16,
            max_staleness: 4,
            on_stale: OnStale::FinishFirst,
            min_groups: 0,
        }
    }
}

/// Groups a step draws at most under dynamic sampling when `rollout.max_draws_per_step` is 0,
/// per group it trains.
pub const DEFAULT_DRAWS_PER_GROUP: usize = 4;

impl RolloutConfig {
    /// Most groups one step draws under dynamic sampling (`rollout.max_draws_per_step`, or
    /// [`DEFAULT_DRAWS_PER_GROUP`] × `rollout.prompts_per_step` when it is 0).
    pub fn draw_limit(&self) -> usize {
        match self.max_draws_per_step {
            0 => DEFAULT_DRAWS_PER_GROUP.saturating_mul(self.prompts_per_step),
            n => n,
        }
    }
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            prompts_per_step: 32,
            samples_per_prompt: 8,
            max_slots: 256,
            sampling: SamplingParams {
                max_new_tokens: 8,
                ..Default::default()
            },
            partial: PartialConfig::default(),
            skip_zero_variance_groups: false,
            max_draws_per_step: 0,
            cuda_graphs: false,
            engine: EngineKind::Local,
            remote: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlgorithmConfig {
    /// `grpo`, `dr-grpo`, `rloo`, `reinforce++`, `reinforce++-baseline`, or `gae` (PPO with a
    /// critic: a value head on the same architecture, initialised from the policy). `dr-grpo`
    /// is Dr. GRPO: group-centred rewards without the std, and token sums over a constant, so it
    /// needs `loss_agg_mode = "seq-mean-token-sum-norm"`. `reinforce++` whitens rewards over
    /// the batch's loss tokens (each answer counted once per token it trains, as REINFORCE++
    /// whitens its per-token advantages); `reinforce++-baseline` subtracts the group mean
    /// first and then only divides by that spread, so an equal-reward group stays at 0.
    pub estimator: Estimator,
    /// GRPO only (refused as `false` with another estimator): divide group-centred rewards by
    /// the group's standard deviation.
    pub normalize_std: bool,
    /// Drop the step's groups whose rewards are all equal (counted as `batch/dropped_groups`);
    /// the step trains on fewer groups. `rollout.skip_zero_variance_groups` draws others in
    /// their place. Refused where an equal-reward group has signal: `reinforce++` (batch
    /// whitening without a group baseline), `gae` (the critic's advantages) and
    /// `credit = "turn"` (each turn's own return).
    pub drop_equal_reward_groups: bool,
    /// Who gets credit for an episode's outcome: `trajectory` (every turn the episode's
    /// advantage; with `gae`, GAE over the tokens) or `turn` (each turn its own: with a group
    /// estimator, the return from that turn on, discounted by `turn_gamma` per turn, against
    /// the same turn index of its group; with `gae`, turn-level GAE: one step per turn, the
    /// critic's value read at the turn's first sampled token, `turn_gamma` per turn and
    /// `lambda` across turns, the value loss trained at that one position per turn).
    pub credit: CreditMode,
    /// The per-turn discount of `credit = "turn"` (turn-level GAE included) and of step
    /// groups, in (0, 1].
    pub turn_gamma: f64,
    /// GiGPO's step groups (0: off): turns of a group taken in the same environment state
    /// (an environment that names its states, like `guess`) are compared with each other by
    /// their returns, and this weight times that step-relative advantage is added to each.
    /// Group estimators only (with `gae` the critic's advantages replace the group ones).
    pub step_group_weight: f64,
    /// The policy-gradient term: `ppo` (the clipped surrogate), `cispo` (a clipped,
    /// stop-gradient importance weight on a REINFORCE term of every token; MiniMax-M1),
    /// `gspo` (one clipped ratio per sequence, the geometric mean of its tokens'; needs
    /// `loss_agg_mode = "seq-mean-token-mean"`), `sapo` (a soft, temperature-controlled gate
    /// instead of a clip) or `dppo` (a trust region on the sampled token's probability, as
    /// prime-rl trains). docs/losses.md has each one's formula.
    pub policy_loss: PolicyLoss,
    /// The loss's trust region below and above: the ratio's range [1 − low, 1 + high] for
    /// `ppo`, `cispo` and `gspo` (a sequence's ratio), the bounds of the probability's change
    /// for `dppo`; `sapo` has none (refused set). Unset: 0.2 and 0.28 (`ppo`, `cispo`),
    /// 3e-4 and 4e-4 (`gspo`, the paper's), 0.2 and 0.2 (`dppo`, prime-rl's).
    pub clip_low: Option<f64>,
    pub clip_high: Option<f64>,
    /// Dual-clip constant (> 1); 0 disables. `ppo` only.
    pub dual_clip: f64,
    /// `sapo`'s gate temperature for positive advantages and for the others (the paper's 1
    /// and 1.05: a larger one damps negative updates faster as the ratio leaves 1).
    pub sapo_tau_pos: f64,
    pub sapo_tau_neg: f64,
    /// `dppo`'s weight of (log π − log π_old)² on every loss token (prime-rl's `kl_tau`).
    pub dppo_kl_coef: f64,
    /// KL-to-reference coefficient in the loss; 0 disables the reference model.
    pub kl_coef: f64,
    pub kl_estimator: KlEstimator,
    pub entropy_coef: f64,
    /// `token-mean`, `seq-mean-token-sum`, `seq-mean-token-mean`, `seq-mean-token-sum-norm`
    /// or `trajectory-mean`.
    pub loss_agg_mode: LossAggMode,
    /// GAE discount per token and λ (critic path). With `credit = "turn"`, GAE steps per turn:
    /// `turn_gamma` discounts and `lambda` mixes across turns, and `gamma` is unused (refused
    /// unless 1, as without a critic).
    pub gamma: f64,
    pub lambda: f64,
    /// Clip range of the value loss around the old values (critic path).
    pub value_clip: f64,
    /// Critic learning rate (critic path; the other optimizer settings are shared).
    pub critic_lr: f64,
    /// Correction for tokens sampled by an older policy than the step's (partial rollout):
    /// `tis` scales their surrogate by min(π_old/π_behavior, `is_cap`); `decoupled` scales it
    /// by π_old/π_behavior (the proximal policy is π_old) and leaves out tokens whose weight
    /// exceeds `is_cap`; `mis` scales it by π_old/π_behavior and leaves out tokens whose
    /// weight is outside [1/`is_cap`, `is_cap`]; `seq-mis` leaves out whole sequences whose
    /// weights' geometric mean is outside that band and truncates the rest; `icepop` weighs
    /// and masks as `mis` on every token, the current version's included (the engine's
    /// mismatch). Otherwise tokens of the current version weigh exactly 1.
    pub off_policy: OffPolicy,
    pub is_cap: f64,
}

impl AlgorithmConfig {
    /// The policy loss's settings these keys make.
    pub fn loss_config(&self) -> LossConfig {
        let (low, high) = self.policy_loss.default_clip().unwrap_or((0.0, 0.0));
        LossConfig {
            kind: self.policy_loss,
            clip_low: self.clip_low.unwrap_or(low),
            clip_high: self.clip_high.unwrap_or(high),
            dual_clip: self.dual_clip,
            kl_coef: self.kl_coef,
            kl_estimator: self.kl_estimator,
            entropy_coef: self.entropy_coef,
            sapo_tau_pos: self.sapo_tau_pos,
            sapo_tau_neg: self.sapo_tau_neg,
            dppo_kl_coef: self.dppo_kl_coef,
        }
    }
}

impl Default for AlgorithmConfig {
    fn default() -> Self {
        let loss = LossConfig::default();
        AlgorithmConfig {
            estimator: Estimator::Grpo,
            normalize_std: true,
            drop_equal_reward_groups: false,
            credit: CreditMode::Trajectory,
            turn_gamma: 0.9,
            step_group_weight: 0.0,
            policy_loss: loss.kind,
            clip_low: None,
            clip_high: None,
            dual_clip: loss.dual_clip,
            sapo_tau_pos: loss.sapo_tau_pos,
            sapo_tau_neg: loss.sapo_tau_neg,
            dppo_kl_coef: loss.dppo_kl_coef,
            kl_coef: loss.kl_coef,
            kl_estimator: loss.kl_estimator,
            entropy_coef: loss.entropy_coef,
            loss_agg_mode: LossAggMode::TokenMean,
            gamma: 1.0,
            lambda: 1.0,
            value_clip: 0.5,
            critic_lr: 1e-3,
            off_policy: OffPolicy::Tis,
            is_cap: 2.0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerConfig {
    /// RL steps (each: rollout, advantages, plan, PPO epochs).
    pub steps: usize,
    pub ppo_epochs: usize,
    /// PPO mini-batches per step: one optimizer step each.
    pub num_mini_batches: usize,
    /// Data-parallel ranks a mini-batch is balanced over: each rank beyond the first holds a
    /// copy of the policy (and critic) and runs its rows; gradients are summed into one
    /// optimizer step.
    pub dp_size: usize,
    /// Where ranks run: `threads` (of this process) or `mpi` (one process per rank, started by
    /// `mpirun -np <dp_size>`; needs a build with `--features mpi`).
    pub dp_backend: DpBackend,
    /// Most padded tokens per micro-batch (gradient accumulation beyond that).
    pub micro_batch_tokens: usize,
    /// What must stay in one mini-batch: `trajectory` or `group`. With `shared_prefix`,
    /// `group` lets every sample of a prompt share its computation (with `dp_size` > 1, the
    /// ranks are balanced row by row, so each rank computes the prompt once for the samples
    /// it holds); `trajectory` is as exact but shares only among the rows that land together.
    pub unit: Unit,
    /// Rows end to end in a micro-batch (each at its own positions, blind to the others)
    /// instead of one right-padded row per line: no compute on padding.
    pub packing: bool,
    /// With `packing`: rows of a micro-batch with identical prompts (a group's samples)
    /// compute that prompt once. Exact: prompt tokens carry no loss.
    pub shared_prefix: bool,
    /// Save a resumable checkpoint (`checkpoint-N`: weights and trainer state) every N steps;
    /// 0 writes only the final model (`checkpoint/`).
    pub checkpoint_every: usize,
    /// Numbered checkpoints to keep, newest first (0: all).
    pub keep_last: usize,
    /// Updates with a NaN or infinite loss or gradient are skipped and counted; after this
    /// many in a row the run stops (its last checkpoint intact).
    pub max_consecutive_skips: usize,
    /// Keep only each decoder layer's input during the update's forward and compute the layer
    /// again during the backward: the memory of every layer's activations (the largest part
    /// of a long batch's) for one extra forward of each layer, about a third more compute.
    /// Gradients are unchanged. The supervised warm-up's passes use it too; the log-prob and
    /// value forwards that have no backward do not.
    pub activation_checkpointing: bool,
}

impl TrainerConfig {
    /// How rows become micro-batches in every forward of the step.
    pub fn batching(&self) -> Batching {
        Batching {
            micro_batch_tokens: self.micro_batch_tokens,
            packing: self.packing,
            shared_prefix: self.packing && self.shared_prefix,
        }
    }
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            // Enough for the default job's held-out accuracy to rise and level off.
            steps: 40,
            ppo_epochs: 1,
            num_mini_batches: 2,
            dp_size: 1,
            dp_backend: DpBackend::Threads,
            micro_batch_tokens: 8192,
            // A group's rows share a mini-batch, so its prompt is computed once per rank.
            unit: Unit::Group,
            packing: true,
            shared_prefix: true,
            checkpoint_every: 0,
            keep_last: 0,
            max_consecutive_skips: 3,
            activation_checkpointing: false,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Distinct held-out problems (from a seed of their own) evaluated greedily; a held-out
    /// split that holds fewer is evaluated whole (`eval/problems` logs how many). An
    /// environment worker's problems are distinct seeds, which it may map onto fewer problems.
    /// At least 1: every run is evaluated before and after training.
    pub problems: usize,
    /// Evaluate every N RL steps (0: only before and after training).
    pub every: usize,
    /// What decides that a response is correct, for every accuracy of the run (`eval/accuracy`,
    /// `sft/eval_accuracy`, the training samples' `reward/accuracy`) and for `skein eval` on
    /// it: `task` (the task's own checker; for a dataset, math equivalence of a `\boxed{}`,
    /// `####` or bare-number answer) or the name of a `[reward.sources]` entry of kind `math`
    /// or `exact_match` (correct when its reward is 1; it need not be on a route). Workers,
    /// remote services, reward models, `format` and `overlong` give no verdict and are
    /// refused. Unset: the one such source (or the `task` scorer) the reward routes use, else
    /// `task`; with several, set it.
    pub correct_by: Option<String>,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            problems: 256,
            every: 10,
            correct_by: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// `builtin`: multi-turn tasks run in this process (`task.name = "guess"` or
    /// `"calculator"`). `env-worker`: this process runs the episodes of an environment that
    /// lives in worker processes (`command`, started `workers` times) speaking JSON lines
    /// (see README, "Python environments"); `task.name` is not used. `external`: the policy is
    /// served over an OpenAI-compatible API and external agents take the task's problems at
    /// `GET /tasks/next`, call the model through each rollout's own URL and post its reward;
    /// the trainer learns from what they recorded.
    pub kind: AgentKind,
    /// Messages an episode may take before it is cut off (0: the task's own limit).
    pub max_turns: usize,
    /// Most tokens of an episode, first prompt and inserted replies included (0: the model's
    /// context; a from-scratch model gets at least 256 positions for a multi-turn task).
    pub max_tokens: usize,
    /// Longest an environment may take to answer one message (or, for an environment worker,
    /// any request, timed from when its process takes it), in seconds; past it that episode
    /// fails (counted as `agent/env_timeouts`) and the others go on. A worker that hangs is
    /// killed and started again.
    pub env_timeout_s: f64,
    /// Environment workers: extra time a newly started worker process gets for its first
    /// answer (imports, loading data), in seconds.
    pub start_timeout_s: f64,
    /// Keep each episode's keys/values in its engine slot between turns, so a turn feeds only
    /// the inserted tokens (false: prefill the whole context every turn, to compare).
    pub reuse_prefix: bool,
    /// External agents: the address the policy is served on (port 0: any free port; the URL
    /// is printed).
    pub listen: String,
    /// External agents: required as `Authorization: Bearer …` on every route when set.
    pub api_key: String,
    /// External agents: the agent program and its arguments, started `workers` times; `{server}`
    /// and `{api_key}` in them are replaced (also given as SKEIN_SERVER and SKEIN_API_KEY), e.g.
    /// [".venv/bin/python", "scripts/example_agent.py", "--server", "{server}"].
    /// Environment workers: the worker program and its arguments, e.g.
    /// ["python3", "scripts/env_worker_example.py"].
    pub command: Vec<String>,
    /// External agents: processes of `command` to start (0: start them yourself).
    /// Environment workers: processes of `command` to run (at least 1); each hosts many
    /// episodes at once.
    pub workers: usize,
    /// External agents: a rollout not closed this many seconds after its step handed it out
    /// fails (counted as `agent/timed_out_rollouts`).
    pub rollout_timeout_s: f64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            kind: AgentKind::Builtin,
            max_turns: 0,
            max_tokens: 0,
            env_timeout_s: 10.0,
            start_timeout_s: 30.0,
            reuse_prefix: true,
            listen: "127.0.0.1:0".into(),
            api_key: String::new(),
            command: Vec::new(),
            workers: 0,
            rollout_timeout_s: 300.0,
        }
    }
}

/// `run.tracking`: a place every metrics record is written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tracking {
    /// `RUN_DIR/metrics.jsonl`, one JSON object per line.
    Jsonl,
    /// TensorBoard event files in `RUN_DIR/tensorboard/`.
    Tensorboard,
}

/// `rollout.engine`: where rollouts are generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// The embedded engine, on the policy's own weights.
    Local,
    /// An OpenAI-compatible server, given the policy's weights after every step.
    Remote,
}

/// `rollout.partial.on_stale`: a group that would exceed `max_staleness`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnStale {
    /// Discard the whole group (counted).
    Drop,
    /// Run its paused samples to the end in the last iteration that keeps it within the cap.
    FinishFirst,
}

/// `algorithm.estimator`: how a trajectory's advantage is computed. Where a spread scales or
/// whitens advantages (grpo's group normalisation, reinforce++'s batch whitening, GAE's
/// whitening over loss tokens) it is the sample standard deviation ([`skein_plan::Moments`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Estimator {
    #[serde(rename = "grpo")]
    Grpo,
    #[serde(rename = "dr-grpo")]
    DrGrpo,
    #[serde(rename = "rloo")]
    Rloo,
    #[serde(rename = "reinforce++")]
    ReinforcePP,
    #[serde(rename = "reinforce++-baseline")]
    ReinforcePPBaseline,
    /// PPO with a critic: per-token GAE advantages.
    #[serde(rename = "gae")]
    Gae,
}

impl Estimator {
    /// Whether the run trains a critic (value model) beside the policy.
    pub fn needs_critic(self) -> bool {
        self == Estimator::Gae
    }
}

/// `algorithm.credit`: who gets credit for an episode's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CreditMode {
    /// Every turn gets the trajectory's advantage (with a critic: GAE over the tokens).
    Trajectory,
    /// Each turn gets its own advantage from its discounted return (with a critic:
    /// turn-level GAE).
    Turn,
}

/// `algorithm.off_policy`: the correction for tokens an older policy sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OffPolicy {
    /// Truncated importance sampling: weight min(π_old/π_behavior, cap).
    Tis,
    /// Decoupled PPO: weight π_old/π_behavior; tokens above the cap are left out.
    Decoupled,
    /// Masked importance sampling, per token: weight π_old/π_behavior inside
    /// [1/cap, cap], and tokens outside that band left out on either side (weight 0, counted
    /// as `is/masked_tokens`; rows left with no token as `is/masked_rows`), rather than
    /// truncated. A token far below its behavior probability is as untrustworthy as one far
    /// above it.
    Mis,
    /// Masked importance sampling per sequence: a row whose off-policy tokens' raw weights
    /// have a geometric mean outside [1/cap, cap] is left out whole (every token weight 0,
    /// counted in `is/masked_tokens` and `is/masked_rows`); the tokens of a row kept are
    /// truncated as `tis` does. One far-off token does not reject an otherwise close sample,
    /// and a sample drifting a little on every token is rejected as a whole.
    #[serde(rename = "seq-mis")]
    SeqMis,
    /// IcePop-style masking of the engine–trainer mismatch: every token, those of the step's
    /// own version too, is weighted by π_old/π_behavior inside [1/cap, cap] and left out
    /// outside it (π_old is recomputed for every row). On-policy, the ratio is the engine's
    /// numerical mismatch with the trainer (low precision, other kernels), 1 to round-off in
    /// float32; IcePop's paper masks its tails at [0.5, 5].
    Icepop,
}

/// `trainer.dp_backend`: where data-parallel ranks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DpBackend {
    /// Threads of this process, each rank beyond the first with a replica.
    Threads,
    /// One MPI process per rank (`mpirun -np <dp_size>`; a build with `--features mpi`).
    Mpi,
}

/// `agent.kind`: who runs multi-turn episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    /// This process (multi-turn tasks' environments), or plain prompts for single-turn tasks.
    Builtin,
    /// This process runs the episodes; the environment lives in worker processes.
    #[serde(rename = "env-worker")]
    EnvWorker,
    /// Programs outside calling the served policy over an OpenAI-compatible API.
    External,
}
