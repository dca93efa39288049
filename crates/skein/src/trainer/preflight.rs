//! A memory estimate before the first step, checked against the memory the machine has free,
//! so a run that cannot fit stops at once with the setting to lower, not an hour later.
//!
//! The estimate is built from pieces that `skein bench memory` also calls with its own model
//! and micro-batch, so the figure it sets beside a measured peak is the trainer's own:
//!
//! - the policy: frozen base weights in `model.dtype`, and the trainable parameters (all of
//!   them, or LoRA's adapters alone) in float32 with gradients and two AdamW moments; with
//!   every weight trained below float32, the weights and gradients in `model.dtype` and the
//!   optimizer's float32 master copies beside the moments;
//! - one micro-batch: what autograd keeps per layer (dtype-aware; with activation
//!   checkpointing only each layer's input, plus one layer recomputed), and the logits with
//!   their float32 log-softmax and gradients, vocabulary-sized per token, of at most one chunk
//!   of positions (the head runs a bounded number at a time);
//! - the AdamW step's temporaries, where they outgrow the micro-batch's freed memory;
//! - the process and libtorch themselves;
//! - beside the update: the reference, the critic, other thread ranks, the rollout KV cache, one
//!   prefill forward's activations and the step's rows.

use super::config::{AgentKind, DpBackend, EngineKind, TrainConfig};
use super::rollout::tasks::multi_turn_task;
use super::update::head::chunk_positions;
use super::update::optim::group_elements;
use super::update::ranks::ranks_sharing;
use crate::engine::PREFILL_TOKENS;
use crate::memory::GIB;
use crate::model::{Dtype, Model, ModelConfig, ModelOptions};
use anyhow::{bail, Result};
use tch::Device;

const F32: f64 = 4.0;
const MIB: f64 = 1024.0 * 1024.0;

/// Resident memory of the skein binary once libtorch has initialised, before any model is
/// built: the pages of libtorch and its kernel libraries that the first operations touch,
/// the allocator's arenas and the threads' stacks. `skein bench memory` measures it in every
/// child (its "RSS at start" column): 117 MiB with libtorch 2.13 on a 2-core x86-64 machine.
pub const PROCESS_BYTES: f64 = 120.0 * MIB;

/// What a CUDA device holds before the first tensor: the CUDA context and libtorch's kernel
/// images. Not measured on this project's machines; the half GiB is the usual size of a
/// libtorch CUDA 12 context with lazy module loading.
pub const CUDA_CONTEXT_BYTES: f64 = 0.5 * GIB;

/// One part of the estimate, in bytes, and the settings that size it.
#[derive(Debug, Clone)]
pub struct Part {
    pub what: &'static str,
    pub bytes: f64,
    pub lower: &'static str,
}

/// Sum of the parts, in bytes.
pub fn total(parts: &[Part]) -> f64 {
    parts.iter().map(|p| p.bytes).sum()
}

/// What sizes one update's memory beside the model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateShape {
    /// The dtype of the frozen weights and of the forward, and LoRA.
    pub options: ModelOptions,
    /// Token slots of one micro-batch (lines × width, padding included).
    pub micro_batch_tokens: usize,
    /// Each layer keeps only its input and is recomputed in the backward.
    pub checkpointing: bool,
    /// On CUDA, where LoRA's products run in the base's dtype (`model::lora`), keeping no
    /// float32 copy of their input.
    pub cuda: bool,
}

impl UpdateShape {
    /// The update of a training run on `device`: the device estimated for, which `skein
    /// plan-memory --device` names apart from the config's `run.device`.
    pub fn of(cfg: &TrainConfig, device: Device) -> Self {
        // A warm-up's passes may be larger than the update's micro-batches.
        let warm_up = match cfg.sft.steps + cfg.sft.direct_steps {
            0 => 0,
            _ => cfg.sft.pass_tokens(&cfg.trainer),
        };
        UpdateShape {
            options: cfg.model_options(),
            micro_batch_tokens: cfg.trainer.micro_batch_tokens.max(warm_up),
            checkpointing: cfg.trainer.activation_checkpointing,
            cuda: device.is_cuda(),
        }
    }
}

/// Parameters that train: every one, or only LoRA's adapters.
fn trainable_count(model: &ModelConfig, options: &ModelOptions) -> f64 {
    if options.lora.enabled() {
        model.adapter_count(&options.lora)
    } else {
        model.parameter_count()
    }
}

/// The policy's weights: the frozen base (LoRA only: without it every weight trains) and the
/// float32 trainable parameters with their gradients and two AdamW moments. Both include the
/// rotary tables every model builds.
pub fn policy_parts(model: &ModelConfig, options: &ModelOptions) -> Vec<Part> {
    let trainable = trainable_count(model, options);
    let rope = model.build_bytes(0.0);
    if options.master_weights() {
        return vec![Part {
            what: "policy weights and gradients (`model.dtype`), float32 master weights and \
                   AdamW moments",
            bytes: (2.0 * options.dtype.bytes() + 3.0 * F32) * trainable + rope,
            lower: "the model size (`model.*`, or a smaller `model.path`), or train LoRA \
                    adapters (`lora.rank`)",
        }];
    }
    if !options.lora.enabled() {
        return vec![Part {
            what: "policy weights, gradients and AdamW moments (float32)",
            bytes: 4.0 * F32 * trainable + rope,
            lower: "the model size (`model.*`, or a smaller `model.path`), or train LoRA \
                    adapters (`lora.rank`)",
        }];
    }
    vec![
        Part {
            what: "frozen base weights (`model.dtype`)",
            bytes: model.build_bytes(options.dtype.bytes()),
            lower: "`model.dtype` (\"bfloat16\" halves float32)",
        },
        Part {
            what: "LoRA adapters, gradients and AdamW moments (float32)",
            bytes: 4.0 * F32 * trainable,
            lower: "`lora.rank` or `lora.targets`",
        },
    ]
}

/// Bytes autograd keeps per token for one decoder layer's base.
///
/// In the forward's dtype: both RMSNorms' normalised and scaled outputs (the projections'
/// inputs); q and k as projected, rotated half and rotated; v; attention's output and the
/// contiguous copy `o_proj` reads; the MLP's gate, its SiLU, up and their product. In float32:
/// the residual stream at both norms, which square it in float32.
fn base_layer_bytes_per_token(model: &ModelConfig, dtype: Dtype) -> f64 {
    let b = dtype.bytes();
    let (h, i) = (model.hidden_size as f64, model.intermediate_size as f64);
    let q = (model.num_attention_heads * model.head_dim()) as f64;
    let kv = (model.kv_heads() * model.head_dim()) as f64;
    let kept = b * (4.0 * h + 5.0 * q + 5.0 * kv + 4.0 * i);
    let norms = 2.0 * F32 * h;
    kept + norms
}

/// Bytes one layer's adapters keep per token: each its rank-sized intermediate, in float32
/// with a float32 copy of its input when the base is not float32; on CUDA, where the products
/// run in the base's dtype, the intermediate alone, in that dtype.
fn adapter_bytes_per_token(model: &ModelConfig, options: &ModelOptions, cuda: bool) -> f64 {
    let lora = &options.lora;
    if !lora.enabled() {
        return 0.0;
    }
    let copy = options.dtype != Dtype::Float32 && !cuda;
    let bytes = if cuda { options.dtype.bytes() } else { F32 };
    model
        .projection_shapes()
        .iter()
        .filter(|(name, _, _)| lora.targets.iter().any(|t| t == name))
        .map(|&(_, input, _)| bytes * (lora.rank as f64 + if copy { input as f64 } else { 0.0 }))
        .sum()
}

/// Bytes per token of the logits and what the loss derives from them: the head's output in
/// the forward's dtype (and its float32 copy below float32), the float32 log-softmax and its
/// exponent (the entropy's probabilities), and in the backward their gradients — about six
/// float32 vocabulary-sized rows at the peak.
pub fn logits_bytes_per_token(model: &ModelConfig, dtype: Dtype) -> f64 {
    let v = model.vocab_size as f64;
    let head = if dtype == Dtype::Float32 {
        0.0
    } else {
        dtype.bytes() * v
    };
    6.0 * F32 * v + head
}

/// The activations and logits of one micro-batch, alive from its forward to its backward.
/// The adapters' activations are a part of their own: a huge `lora.rank` is what to lower
/// then, not the micro-batch.
pub fn micro_batch_parts(model: &ModelConfig, shape: &UpdateShape) -> Vec<Part> {
    let tokens = shape.micro_batch_tokens as f64;
    let adapters = adapter_bytes_per_token(model, &shape.options, shape.cuda);
    let kept_layers = kept_layers(model, shape);
    let mut parts = vec![Part {
        what: "activations of one micro-batch",
        bytes: body_activation_bytes(model, shape, shape.options.dtype),
        lower: if shape.checkpointing {
            "`trainer.micro_batch_tokens`"
        } else {
            "`trainer.micro_batch_tokens`, or turn on `trainer.activation_checkpointing`"
        },
    }];
    if adapters > 0.0 {
        parts.push(Part {
            what: "activations of the LoRA adapters in one micro-batch",
            bytes: tokens * kept_layers * adapters,
            lower: "`lora.rank` (each adapter keeps a rank-sized vector per token), or \
                    `trainer.micro_batch_tokens`",
        });
    }
    // The head runs at most one chunk of positions at a time (`update::head`).
    let head_tokens = tokens.min(chunk_positions(model.vocab_size) as f64);
    parts.push(Part {
        what: "logits, float32 log-softmax and gradients of one chunk of positions",
        bytes: head_tokens * logits_bytes_per_token(model, shape.options.dtype),
        lower: "`trainer.micro_batch_tokens`",
    });
    parts
}

/// Layers whose activations a micro-batch keeps at once: all of them, or with checkpointing
/// one recomputed (with its gradients) beside the last one's output.
fn kept_layers(model: &ModelConfig, shape: &UpdateShape) -> f64 {
    if shape.checkpointing {
        2.0
    } else {
        model.num_hidden_layers as f64
    }
}

/// The activations of one micro-batch through the transformer's layers, in `dtype` (the
/// policy's forward, or the critic's float32 one); with checkpointing, each layer's input too.
fn body_activation_bytes(model: &ModelConfig, shape: &UpdateShape, dtype: Dtype) -> f64 {
    let layers = model.num_hidden_layers as f64;
    let inputs = if shape.checkpointing {
        (layers + 1.0) * dtype.bytes() * model.hidden_size as f64
    } else {
        0.0
    };
    let per_token = inputs + kept_layers(model, shape) * base_layer_bytes_per_token(model, dtype);
    shape.micro_batch_tokens as f64 * per_token
}

/// The AdamW step's temporaries beyond the memory the logits gave back: the step works one
/// group of tensors at a time (`optim::group_elements`: the largest trainable tensor, or up to
/// 2^26 elements of smaller ones) and holds `copies` float32 copies of it: the denominator and
/// the update, and for weights held below float32 the gradients cast to float32 ([`step_copies`]);
/// `group` is its elements. The activations' memory is not given back by then: their
/// many small blocks stay with the allocator (glibc's arenas, CUDA's cache) and cannot hold a
/// tensor of the embedding's size, while the logits' few large ones do go back.
pub fn optimizer_step_part(group: f64, copies: f64, logits: f64) -> Option<Part> {
    let bytes = copies * F32 * group - logits;
    (bytes > 0.0).then_some(Part {
        what: "AdamW step's temporaries beyond the logits' memory",
        bytes,
        lower: "the largest trained tensor: the embedding in full fine-tuning (`lora.rank` \
                trains adapters alone)",
    })
}

/// The float32 copies of a group the AdamW step holds ([`optimizer_step_part`]).
pub fn step_copies(options: &ModelOptions) -> f64 {
    if options.master_weights() {
        3.0
    } else {
        2.0
    }
}

/// The process and libtorch (on the CPU), or the CUDA context (on a GPU).
pub fn runtime_part(device: Device) -> Part {
    match device {
        Device::Cpu => Part {
            what: "the process and libtorch",
            bytes: PROCESS_BYTES,
            lower: "nothing: a fixed cost",
        },
        _ => Part {
            what: "the CUDA context and libtorch's kernels",
            bytes: CUDA_CONTEXT_BYTES,
            lower: "nothing: a fixed cost",
        },
    }
}

/// One update's memory: the process, the policy, one micro-batch and the optimizer step (what
/// `skein bench memory` measures). `critic`: a float32 critic also trains (its largest tensor
/// may size the optimizer step).
pub fn update_parts(
    model: &ModelConfig,
    shape: &UpdateShape,
    device: Device,
    critic: bool,
) -> Vec<Part> {
    let mut parts = vec![runtime_part(device)];
    parts.extend(policy_parts(model, &shape.options));
    let micro = micro_batch_parts(model, shape);
    let logits = micro.last().map_or(0.0, |p| p.bytes);
    if critic {
        // The critic runs its micro-batches after the policy's, in float32 whatever
        // `model.dtype` is, with no vocabulary head: the larger of the two is the peak.
        let critic_bytes = body_activation_bytes(model, shape, Dtype::Float32);
        let beyond = critic_bytes - total(&micro);
        if beyond > 0.0 {
            parts.push(Part {
                what: "the critic's float32 activations beyond the policy's micro-batch",
                bytes: beyond,
                lower: "`trainer.micro_batch_tokens`, or turn on \
                        `trainer.activation_checkpointing`",
            });
        }
    }
    parts.extend(micro);
    let lora = &shape.options.lora;
    let mut group = group_elements(
        model.largest_trainable(lora),
        trainable_count(model, &shape.options),
    );
    if critic {
        let full = group_elements(
            model.largest_trainable(&Default::default()),
            model.parameter_count(),
        );
        group = group.max(full);
    }
    parts.extend(optimizer_step_part(
        group,
        step_copies(&shape.options),
        logits,
    ));
    parts
}

/// The estimate of a training run on `device` of this machine, `ranks_here` of its
/// data-parallel ranks (rank 0 included) running on this machine: [`estimate_sharing`] with
/// those placed on rank 0's device ([`ranks_sharing`]). Thread ranks are all here; an MPI
/// job's are those `mpirun` placed on this machine.
pub fn estimate(
    cfg: &TrainConfig,
    model: &ModelConfig,
    device: Device,
    ranks_here: usize,
    loaded_prompt: Option<usize>,
) -> Vec<Part> {
    let sharing = ranks_sharing(device, ranks_here);
    estimate_sharing(cfg, model, device, sharing, loaded_prompt)
}

/// The estimate of a training run on `device` with `sharing` thread ranks beyond the first on
/// the same device: one update's memory, and the reference, the critic, those ranks'
/// replicas, the rollout KV cache and (in host memory) the step's trajectories and rows.
/// `loaded_prompt` is a loaded dataset's longest prompt in tokens; before the dataset is
/// loaded (None) a slot is sized by the bound `data.max_prompt_tokens` sets.
pub fn estimate_sharing(
    cfg: &TrainConfig,
    model: &ModelConfig,
    device: Device,
    sharing: usize,
    loaded_prompt: Option<usize>,
) -> Vec<Part> {
    let shape = UpdateShape::of(cfg, device);
    let critic = cfg.algorithm.estimator.needs_critic();
    let mut parts = update_parts(model, &shape, device, critic);
    if let Some(warm_up) = full_warm_up_parts(cfg, model, &shape, device) {
        if total(&warm_up) > total(&parts) {
            parts = warm_up;
        }
    }
    let params = model.parameter_count() * F32;
    if cfg.algorithm.kl_coef > 0.0 && !shape.options.lora.enabled() {
        parts.push(Part {
            what: "frozen reference model (`model.dtype`)",
            bytes: model.parameter_count() * shape.options.dtype.bytes(),
            lower: "`algorithm.kl_coef` (0 needs no reference), or LoRA (`lora.rank`): its \
                    frozen base is the reference",
        });
    }
    if critic {
        parts.push(Part {
            what: "critic weights, gradients and moments (float32)",
            bytes: 4.0 * params,
            lower: "`algorithm.estimator` (a critic-free estimator such as grpo)",
        });
    }
    parts.extend(other_ranks_part(cfg, model, &shape, sharing));
    parts.extend(mpi_root_part(cfg, model, &shape));
    parts.extend(rollout_parts(cfg, model, device, loaded_prompt));
    parts.extend(reward_models_part(cfg));
    parts
}

/// A model built from scratch with LoRA warms up every weight in float32, and gets its
/// adapters after (`setup::build_policy`): that warm-up's update, where there is one, in place
/// of the adapters' when it is the larger.
fn full_warm_up_parts(
    cfg: &TrainConfig,
    model: &ModelConfig,
    shape: &UpdateShape,
    device: Device,
) -> Option<Vec<Part>> {
    if !cfg.model.path.is_empty() || !cfg.lora.enabled() || !cfg.sft.warms_up() {
        return None;
    }
    let full = UpdateShape {
        options: ModelOptions::default(),
        ..shape.clone()
    };
    let mut parts = update_parts(model, &full, device, false);
    for p in parts
        .iter_mut()
        .filter(|p| p.what.starts_with("policy weights"))
    {
        p.what = "the warm-up's policy weights, gradients and AdamW moments (float32: a model \
                  built from scratch warms up in full, then gets its adapters)";
        p.lower = "`sft.steps` and `sft.direct_steps` (0: no warm-up), or the model size \
                   (`model.*`)";
    }
    Some(parts)
}

/// The `[reward_models]` a `[reward]` table loads beside the policy, each once, in float32. A
/// directory whose weights cannot be read counts nothing here: loading it says what is wrong.
fn reward_models_part(cfg: &TrainConfig) -> Option<Part> {
    cfg.reward.as_ref()?;
    let elements: f64 = cfg
        .reward_models
        .values()
        .filter_map(|dir| crate::model::io::stored_elements(std::path::Path::new(dir)).ok())
        .sum();
    (elements > 0.0).then_some(Part {
        what: "reward models' weights (float32)",
        bytes: elements * F32,
        lower: "`reward_models` (fewer or smaller reward models)",
    })
}

/// The `sharing` ranks beyond the first on rank 0's device, threads of this process or MPI
/// processes on this machine: each a replica (frozen base, trainable weights and gradients;
/// the critic's too) running a micro-batch of its own at the same time.
fn other_ranks_part(
    cfg: &TrainConfig,
    model: &ModelConfig,
    shape: &UpdateShape,
    sharing: usize,
) -> Option<Part> {
    if sharing == 0 {
        return None;
    }
    let options = &shape.options;
    let trainable = 2.0 * trained_bytes(options) * trainable_count(model, options);
    let base = if options.lora.enabled() {
        model.build_bytes(options.dtype.bytes())
    } else {
        model.build_bytes(0.0)
    };
    let critic = if cfg.algorithm.estimator.needs_critic() {
        2.0 * F32 * model.parameter_count()
    } else {
        0.0
    };
    let micro_batch = total(&micro_batch_parts(model, shape));
    // An MPI rank is a process of its own (libtorch; on a GPU, a CUDA context there), and
    // between micro-batches exchanges gradients and weights through host memory buffers.
    let own = match (cfg.trainer.dp_backend, shape.cuda) {
        (DpBackend::Threads, _) => micro_batch,
        (DpBackend::Mpi, true) => micro_batch + CUDA_CONTEXT_BYTES,
        (DpBackend::Mpi, false) => {
            PROCESS_BYTES + micro_batch.max(mpi_buffers(cfg, model, options, false))
        }
    };
    let replica = base + trainable + critic + own;
    Some(Part {
        what: "replicas and micro-batches of the other data-parallel ranks",
        bytes: replica * sharing as f64,
        lower: "`trainer.dp_size`",
    })
}

/// Bytes per trainable parameter of weights and of gradients: float32 for adapters,
/// `model.dtype` when every weight trains.
fn trained_bytes(options: &ModelOptions) -> f64 {
    if options.lora.enabled() {
        F32
    } else {
        options.dtype.bytes()
    }
}

/// What an MPI rank holds at the peak of an update's exchange (`trainer/update/ranks/mpi.rs`),
/// in host memory: the larger of its gradients as float32 for the reduce (on rank 0, `root`,
/// with their sum beside them) and its copy of every weight for the broadcast that starts an
/// update (a LoRA base included), which are never held at once; for the policy or, with a
/// critic, the critic, whose exchanges run one after the other.
fn mpi_buffers(cfg: &TrainConfig, model: &ModelConfig, options: &ModelOptions, root: bool) -> f64 {
    let copies = if root { 2.0 } else { 1.0 };
    let trainable = trainable_count(model, options);
    let adapters = if options.lora.enabled() {
        F32 * trainable
    } else {
        0.0
    };
    let weights = model.build_bytes(options.dtype.bytes()) + adapters;
    let policy = (copies * F32 * trainable).max(weights);
    let critic = if cfg.algorithm.estimator.needs_critic() {
        copies * F32 * model.parameter_count()
    } else {
        0.0
    };
    policy.max(critic)
}

/// Rank 0's own exchange buffers in an MPI job on the CPU, where they outgrow the
/// micro-batch's freed memory (the exchange runs between micro-batches). On a GPU they are
/// host memory, outside the device's plan.
fn mpi_root_part(cfg: &TrainConfig, model: &ModelConfig, shape: &UpdateShape) -> Option<Part> {
    if cfg.trainer.dp_backend != DpBackend::Mpi || cfg.trainer.dp_size < 2 || shape.cuda {
        return None;
    }
    let micro_batch = total(&micro_batch_parts(model, shape));
    let beyond = mpi_buffers(cfg, model, &shape.options, true) - micro_batch;
    (beyond > 0.0).then_some(Part {
        what: "MPI's gradient and weight buffers on rank 0, beyond the freed micro-batch",
        bytes: beyond,
        lower: "`trainer.dp_backend` (thread ranks exchange in place), or the model size \
                (`model.*`)",
    })
}

/// The slots and the positions per slot of the rollout's KV cache, as the engine sizes it: a
/// slot per request running at once, up to `rollout.max_slots`, for the step's samples or the
/// held-out problems, whichever are more. An episode's slot (multi-turn or an environment
/// worker's) holds the episode's whole context: `agent.max_tokens`, 0 the model's. A
/// single-turn sample's holds its prompt and `rollout.sampling.max_new_tokens`: a loaded
/// dataset's longest prompt (the engine sizes its slots by the prompts it is given), else up to
/// `data.max_prompt_tokens` (0: the model's context). External agents' rollouts take a slot
/// each of the model's context, and their evaluation single-turn ones: the larger cache of the
/// two.
fn rollout_cache_shape(
    cfg: &TrainConfig,
    model: &ModelConfig,
    loaded_prompt: Option<usize>,
) -> (usize, usize) {
    let r = &cfg.rollout;
    let positions = model.max_position_embeddings;
    let rollouts = r.prompts_per_step * r.samples_per_prompt;
    let slots = |requests: usize| r.max_slots.min(requests);
    let dataset = !cfg.data.train_files.is_empty();
    let prompt = match (dataset, loaded_prompt, cfg.data.max_prompt_tokens) {
        (false, ..) => 64,
        (true, Some(longest), _) => longest,
        (true, None, 0) => positions,
        (true, None, bound) => bound,
    };
    let single_turn = (prompt + r.sampling.max_new_tokens).min(positions);
    let episodes = match cfg.agent.kind {
        AgentKind::EnvWorker => true,
        AgentKind::External => {
            let agents = (slots(rollouts), positions);
            let eval = (slots(cfg.eval.problems), single_turn);
            return if agents.0 * agents.1 >= eval.0 * eval.1 {
                agents
            } else {
                eval
            };
        }
        AgentKind::Builtin => matches!(multi_turn_task(cfg), Ok(Some(_))),
    };
    let context = match cfg.agent.max_tokens {
        _ if !episodes => single_turn,
        0 => positions,
        n => n.min(positions),
    };
    (slots(rollouts.max(cfg.eval.problems)), context)
}

/// The rollout's KV cache (in the model's dtype), and the step's samples, held twice (as
/// trajectories and as training rows) in host memory.
fn rollout_parts(
    cfg: &TrainConfig,
    model: &ModelConfig,
    device: Device,
    loaded_prompt: Option<usize>,
) -> Vec<Part> {
    let r = &cfg.rollout;
    let (slots, context) = rollout_cache_shape(cfg, model, loaded_prompt);
    // CUDA graphs pad their batches into a scratch slot the cache holds beyond the engine's.
    let cache_slots = slots + usize::from(r.cuda_graphs);
    let element = cfg.model.dtype.bytes();
    let mut parts = Vec::new();
    // A remote engine holds its cache on its own server: this process builds none.
    if r.engine == EngineKind::Local {
        parts.push(Part {
            what: "rollout KV cache",
            bytes: model.kv_cache_bytes(cache_slots, context, element),
            lower: "`rollout.max_slots`, or the tokens a sample or an episode may hold \
                    (`rollout.sampling.max_new_tokens`, a dataset's `data.max_prompt_tokens`, \
                    `agent.max_tokens`)",
        });
    }
    if r.engine == EngineKind::Local {
        parts.push(prefill_part(model, slots, context, element));
    }
    if r.cuda_graphs && r.engine == EngineKind::Local {
        parts.push(Part {
            what: "CUDA graphs' logits, at most one [batch, vocab] per decode shape",
            bytes: crate::engine::captured_logits_bound(
                slots,
                context as i64,
                model.vocab_size,
                element,
            ),
            lower: "`rollout.max_slots`, or `rollout.cuda_graphs` (false)",
        });
    }
    if device == Device::Cpu {
        // Ids, behavior/old/reference log-probs, versions, masks, advantages, values,
        // weights: about 64 bytes per token.
        let samples = (r.prompts_per_step * r.samples_per_prompt) as f64;
        parts.push(Part {
            what: "the step's trajectories and training rows",
            bytes: samples * context as f64 * 64.0,
            lower: "`rollout.prompts_per_step` or `rollout.samples_per_prompt`",
        });
    }
    parts
}

/// One prefill forward's activations: at most [`PREFILL_TOKENS`] context tokens, and no more
/// than the slots' contexts hold (a context longer than that alone), each holding at a layer's peak the residual stream, the MLP's input
/// and three intermediate-sized tensors (gate, up, their product). `skein bench --decode-only
/// --batch 64 --decode-prompt 1024` peaked 9.2 KiB per prefilled token above the cache at
/// hidden 256 and intermediate 688 in float32, where this counts 10.3.
fn prefill_part(model: &ModelConfig, slots: usize, context: usize, element: f64) -> Part {
    let per_token = (2 * model.hidden_size + 3 * model.intermediate_size) as f64 * element;
    let tokens = PREFILL_TOKENS.min(slots * context).max(context);
    Part {
        what: "rollout prefill activations, one forward at a time",
        bytes: tokens as f64 * per_token,
        lower: "the tokens an episode or a sample may hold (`agent.max_tokens`, a dataset's \
                `data.max_prompt_tokens`), where one context is longer than a prefill forward's \
                budget",
    }
}

/// Bytes of the policy's tensors (its weights, and adapters with LoRA).
pub fn held_bytes(policy: &Model) -> f64 {
    policy
        .vs
        .variables()
        .values()
        .map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as f64)
        .sum()
}

/// An error naming the largest part's settings when the estimate exceeds `available` bytes.
pub fn check(parts: &[Part], available: f64) -> Result<()> {
    match shortfall(parts, available) {
        None => Ok(()),
        Some((said, largest)) => bail!("{said}\nlower {} first", largest.lower),
    }
}

/// When the estimate exceeds `available` bytes: what this run needs, part by part, largest
/// first, and that largest part.
pub fn shortfall(parts: &[Part], available: f64) -> Option<(String, &Part)> {
    let total = total(parts);
    if total <= available {
        return None;
    }
    let mut sorted: Vec<&Part> = parts.iter().collect();
    sorted.sort_by(|a, b| b.bytes.total_cmp(&a.bytes));
    let lines: Vec<String> = sorted
        .iter()
        .map(|p| format!("  {:>9.2} GiB  {}", p.bytes / GIB, p.what))
        .collect();
    let said = format!(
        "this run needs about {:.2} GiB but {:.2} GiB of memory is available:\n{}",
        total / GIB,
        available / GIB,
        lines.join("\n"),
    );
    Some((said, sorted[0]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LoraConfig;

    fn model() -> ModelConfig {
        ModelConfig::tiny_qwen2(32, 192, 4, 4, 2, 512, 64)
    }

    fn cpu(cfg: &TrainConfig, model: &ModelConfig) -> Vec<Part> {
        estimate(cfg, model, Device::Cpu, cfg.trainer.dp_size, None)
    }

    fn part(parts: &[Part], what: &str) -> f64 {
        parts
            .iter()
            .filter(|p| p.what.starts_with(what))
            .map(|p| p.bytes)
            .sum()
    }

    /// A config with LoRA rank 16 on every projection, and `dtype` weights, of a loaded model
    /// (one built from scratch warms up in full first).
    fn lora(dtype: Dtype) -> TrainConfig {
        let mut cfg = TrainConfig {
            lora: LoraConfig {
                rank: 16,
                ..Default::default()
            },
            ..Default::default()
        };
        cfg.model.dtype = dtype;
        cfg.model.path = "models/loaded".into();
        cfg
    }

    /// A reward model's float32 weights count as the elements its safetensors headers
    /// list, and only where a `[reward]` table loads it.
    #[test]
    fn reward_models_count_their_weights() {
        let dir = std::env::temp_dir().join(format!("skein-rm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let weights = [
            (
                "a",
                tch::Tensor::zeros([3, 5], (tch::Kind::BFloat16, Device::Cpu)),
            ),
            (
                "b",
                tch::Tensor::zeros([7], (tch::Kind::BFloat16, Device::Cpu)),
            ),
        ];
        tch::Tensor::write_safetensors(&weights, dir.join("model.safetensors")).unwrap();
        let mut cfg = TrainConfig::default();
        let path = dir.display().to_string();
        cfg.reward_models.insert("rm".into(), path);
        let counted = |cfg: &TrainConfig| part(&cpu(cfg, &model()), "reward models");
        assert_eq!(counted(&cfg), 0.0, "no [reward] table loads it");
        cfg.reward = Some(skein_reward::RewardConfig::default());
        assert_eq!(counted(&cfg), 22.0 * 4.0);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_default_run_fits_and_a_huge_cache_names_its_settings() {
        let mut cfg = TrainConfig::default();
        let parts = cpu(&cfg, &model());
        assert!(total(&parts) < 2.0 * GIB, "{}", total(&parts));
        assert!(check(&parts, 16.0 * GIB).is_ok());

        cfg.rollout.prompts_per_step = 1 << 14;
        cfg.rollout.max_slots = 1 << 20;
        let err = check(&cpu(&cfg, &model()), 16.0 * GIB)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`rollout.max_slots`"), "{err}");
        assert!(err.contains("rollout KV cache"), "{err}");
    }

    /// A model built from scratch with LoRA warms up every weight in float32 first: its
    /// estimate is that warm-up's where it is the larger, and the adapters' without a warm-up.
    #[test]
    fn a_scratch_model_with_lora_is_sized_for_its_full_warm_up() {
        let model = ModelConfig::tiny_qwen2(256, 1024, 8, 8, 2, 4096, 64);
        let mut cfg = TrainConfig::default();
        cfg.lora.rank = 8;
        let full_weights = 4.0 * F32 * model.parameter_count();
        let warming = cpu(&cfg, &model);
        assert!(part(&warming, "the warm-up's policy weights") >= full_weights);
        assert_eq!(part(&warming, "LoRA adapters"), 0.0);
        cfg.sft.steps = 0;
        let lora = cpu(&cfg, &model);
        assert_eq!(part(&lora, "the warm-up's"), 0.0);
        assert!(part(&lora, "LoRA adapters") > 0.0);
        assert!(total(&lora) < total(&warming));
        // A loaded model warms up its adapters alone.
        cfg.sft.steps = 10;
        cfg.model.path = "models/m".into();
        assert_eq!(part(&cpu(&cfg, &model), "the warm-up's"), 0.0);
    }

    /// A remote engine's cache lives on its server: however many slots the config names, the
    /// trainer's process holds none.
    #[test]
    fn a_remote_engine_holds_no_cache_here() {
        let mut cfg = TrainConfig::default();
        cfg.rollout.max_slots = 1 << 20;
        cfg.rollout.prompts_per_step = 1 << 14;
        assert!(part(&cpu(&cfg, &model()), "rollout KV") > 16.0 * GIB);
        cfg.rollout.engine = EngineKind::Remote;
        assert_eq!(part(&cpu(&cfg, &model()), "rollout KV"), 0.0);
    }

    /// One prefill forward is counted, however many prompts an admission holds: the engine's
    /// token budget, or one context beyond it; a remote engine prefills on its server.
    #[test]
    fn one_prefill_forward_is_counted() {
        let model = ModelConfig::tiny_qwen2(32, 192, 4, 4, 2, 512, 65536);
        let per_token = (2.0 * 192.0 + 3.0 * 512.0) * 4.0;
        let prefill = |cfg: &TrainConfig| part(&cpu(cfg, &model), "rollout prefill");
        let mut cfg = TrainConfig::default();
        cfg.eval.problems = 1000;
        assert_eq!(prefill(&cfg), PREFILL_TOKENS as f64 * per_token);
        (cfg.task.name, cfg.agent.max_tokens) = ("calculator".into(), 40000);
        assert_eq!(prefill(&cfg), 40000.0 * per_token);
        // A few slots never fill a forward's budget.
        (cfg.task.name, cfg.agent.max_tokens) = ("arithmetic".into(), 0);
        (cfg.rollout.max_slots, cfg.eval.problems) = (4, 4);
        let context = 64 + cfg.rollout.sampling.max_new_tokens;
        assert_eq!(prefill(&cfg), (4 * context) as f64 * per_token);
        cfg.rollout.engine = EngineKind::Remote;
        assert_eq!(prefill(&cfg), 0.0);
    }

    /// The cache is counted as the engine sizes it: a multi-turn episode's slot holds the
    /// model's whole context when `agent.max_tokens` is 0, and evaluation runs a slot per
    /// held-out problem; a single-turn sample's slot holds its prompt (a loaded dataset's
    /// longest) and new tokens.
    #[test]
    fn the_cache_holds_what_the_engine_allocates() {
        let model = ModelConfig::tiny_qwen2(32, 192, 4, 4, 2, 512, 8192);
        let element = TrainConfig::default().model.dtype.bytes();
        let cache = |cfg: &TrainConfig| part(&cpu(cfg, &model), "rollout KV");
        let mut cfg = TrainConfig::default();
        (cfg.task.name, cfg.task.difficulty) = ("calculator".into(), 1);
        (cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt) = (8, 4);
        cfg.eval.problems = 100;
        assert_eq!(cache(&cfg), model.kv_cache_bytes(100, 8192, element));
        cfg.agent.max_tokens = 1024;
        assert_eq!(cache(&cfg), model.kv_cache_bytes(100, 1024, element));
        cfg.task.name = "arithmetic".into();
        let new = cfg.rollout.sampling.max_new_tokens;
        assert_eq!(cache(&cfg), model.kv_cache_bytes(100, 64 + new, element));
        cfg.rollout.max_slots = 16;
        assert_eq!(cache(&cfg), model.kv_cache_bytes(16, 64 + new, element));
        // A dataset's prompts: its longest once loaded, else the `data.max_prompt_tokens` bound.
        let mut data = cfg.clone();
        data.data.train_files = vec!["train.jsonl".into()];
        let sized = |cfg: &TrainConfig, loaded| {
            part(&estimate(cfg, &model, Device::Cpu, 1, loaded), "rollout KV")
        };
        assert_eq!(
            sized(&data, Some(40)),
            model.kv_cache_bytes(16, 40 + new, element)
        );
        assert_eq!(
            sized(&data, None),
            model.kv_cache_bytes(16, 1024 + new, element)
        );
        data.data.max_prompt_tokens = 0;
        assert_eq!(sized(&data, None), model.kv_cache_bytes(16, 8192, element));
        // External agents: their 32 rollouts at the whole context, or the evaluation's 100
        // single-turn slots, whichever cache is larger.
        cfg.rollout.max_slots = 256;
        cfg.agent.kind = AgentKind::External;
        assert_eq!(cache(&cfg), model.kv_cache_bytes(32, 8192, element));
        (cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt) = (1, 2);
        cfg.eval.problems = 10_000;
        assert_eq!(cache(&cfg), model.kv_cache_bytes(256, 64 + new, element));
    }

    /// A critic trains on the same micro-batches in float32: under a bfloat16 policy its
    /// activations are the peak, counted beyond the policy's; under a float32 one the
    /// policy's (the same body and the vocabulary's logits) are.
    #[test]
    fn a_float32_critic_under_a_bfloat16_policy_counts_its_activations() {
        let qwen = ModelConfig::qwen2_5_0_5b();
        let mut cfg = lora(Dtype::Bfloat16);
        cfg.algorithm.estimator = crate::trainer::config::Estimator::Gae;
        cfg.trainer.micro_batch_tokens = 8192;
        let shape = UpdateShape::of(&cfg, Device::Cpu);
        let parts = update_parts(&qwen, &shape, Device::Cpu, true);
        let beyond = part(&parts, "the critic's");
        let critic = body_activation_bytes(&qwen, &shape, Dtype::Float32);
        let policy = total(&micro_batch_parts(&qwen, &shape));
        assert!(
            beyond > 0.0 && (beyond - (critic - policy)).abs() < 1.0,
            "{beyond}"
        );
        cfg.model.dtype = Dtype::Float32;
        let shape = UpdateShape::of(&cfg, Device::Cpu);
        let parts = update_parts(&qwen, &shape, Device::Cpu, true);
        assert_eq!(part(&parts, "the critic's"), 0.0);
    }

    /// CUDA graphs add a scratch slot to the cache and, at most, one set of logits per
    /// decode shape: at the default 256 slots and 72 positions (64-token prompts, 8 new
    /// tokens), batches of 1, 2, …, 256 rows and spans of 16, 32, 64 and 72, of Qwen2.5-0.5B's
    /// vocabulary in float32 (1.2 GB).
    #[test]
    fn cuda_graphs_count_their_logits_and_scratch_slot() {
        let qwen = ModelConfig::qwen2_5_0_5b();
        let mut cfg = TrainConfig::default();
        let plain = cpu(&cfg, &qwen);
        cfg.rollout.cuda_graphs = true;
        let graphs = cpu(&cfg, &qwen);
        let (cache, with) = (part(&plain, "rollout KV"), part(&graphs, "rollout KV"));
        assert!(
            (with / cache - 257.0 / 256.0).abs() < 1e-9,
            "{with} / {cache}"
        );
        let logits = part(&graphs, "CUDA graphs");
        assert_eq!(logits, 511.0 * 4.0 * qwen.vocab_size as f64 * 4.0);
        assert_eq!(part(&plain, "CUDA graphs"), 0.0);
    }

    /// Ranks that share rank 0's device hold their replicas there: on the CPU, and on a
    /// machine with one GPU (or, as here, none to spread them over), every other rank of the
    /// machine.
    #[test]
    fn ranks_on_rank_zeros_device_count_their_replicas() {
        let mut cfg = TrainConfig::default();
        let replicas = |cfg: &TrainConfig, device| {
            part(
                &estimate(cfg, &model(), device, cfg.trainer.dp_size, None),
                "replicas and micro-batches",
            )
        };
        assert_eq!(replicas(&cfg, Device::Cpu), 0.0);
        cfg.trainer.dp_size = 3;
        let on_cpu = replicas(&cfg, Device::Cpu);
        assert!(on_cpu > 0.0);
        if tch::Cuda::device_count() <= 1 {
            assert_eq!(replicas(&cfg, Device::Cuda(0)), on_cpu);
        }
        // MPI ranks on this machine hold the same, each in a process of its own and with
        // its exchange buffers where they outgrow its micro-batch; ranks on other machines
        // hold nothing here.
        cfg.trainer.dp_backend = DpBackend::Mpi;
        let options = UpdateShape::of(&cfg, Device::Cpu).options;
        let buffers = mpi_buffers(&cfg, &model(), &options, false);
        let micro = total(&micro_batch_parts(
            &model(),
            &UpdateShape::of(&cfg, Device::Cpu),
        ));
        let own = PROCESS_BYTES + buffers.max(micro) - micro;
        assert!((replicas(&cfg, Device::Cpu) - (on_cpu + 2.0 * own)).abs() < 1.0);
        let one_here = estimate(&cfg, &model(), Device::Cpu, 1, None);
        assert_eq!(part(&one_here, "replicas and micro-batches"), 0.0);
    }

    /// Rank 0 of an MPI job holds its gradients twice for the reduce (its own and the sum),
    /// or at another moment a copy of every weight for the broadcast (a LoRA base included):
    /// the larger, where it outgrows its micro-batch, and on the CPU only.
    #[test]
    fn an_mpi_job_counts_rank_zeros_exchange_buffers() {
        let qwen = ModelConfig::qwen2_5_0_5b();
        let mut cfg = TrainConfig::default();
        cfg.trainer.micro_batch_tokens = 64;
        cfg.trainer.dp_size = 2;
        assert_eq!(
            part(&cpu(&cfg, &qwen), "MPI's"),
            0.0,
            "threads exchange in place"
        );
        cfg.trainer.dp_backend = DpBackend::Mpi;
        let micro = |cfg: &TrainConfig| {
            total(&micro_batch_parts(
                &qwen,
                &UpdateShape::of(cfg, Device::Cpu),
            ))
        };
        let params = qwen.parameter_count();
        assert_eq!(
            part(&cpu(&cfg, &qwen), "MPI's"),
            2.0 * 4.0 * params - micro(&cfg)
        );
        // LoRA in bfloat16: the base crosses in the broadcast, far above the adapters' sum.
        let mut lora_cfg = lora(Dtype::Bfloat16);
        lora_cfg.trainer.micro_batch_tokens = 64;
        lora_cfg.trainer.dp_size = 2;
        lora_cfg.trainer.dp_backend = DpBackend::Mpi;
        let options = UpdateShape::of(&lora_cfg, Device::Cpu).options;
        let weights = qwen.build_bytes(2.0) + 4.0 * trainable_count(&qwen, &options);
        assert_eq!(
            part(&cpu(&lora_cfg, &qwen), "MPI's"),
            weights - micro(&lora_cfg)
        );
        let gpu = estimate(&cfg, &qwen, Device::Cuda(0), 2, None);
        assert_eq!(part(&gpu, "MPI's"), 0.0, "host memory, not the GPU's");
    }

    #[test]
    fn a_huge_rollout_names_its_setting() {
        let mut cfg = TrainConfig::default();
        cfg.rollout.prompts_per_step = 100_000_000;
        let err = check(&cpu(&cfg, &model()), 24.0 * GIB)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`rollout.prompts_per_step`"), "{err}");
    }

    /// A rank far beyond the model's widths makes the adapters, not the micro-batch, the
    /// largest part, and the advice names `lora.rank`.
    #[test]
    fn a_huge_lora_rank_names_the_rank() {
        let mut cfg = lora(Dtype::Float32);
        cfg.lora.rank = 1_000_000_000_000;
        let err = check(&cpu(&cfg, &model()), 64.0 * GIB)
            .unwrap_err()
            .to_string();
        let advice = err.lines().last().unwrap_or_default();
        assert!(advice.starts_with("lower `lora.rank`"), "{err}");
    }

    #[test]
    fn a_huge_micro_batch_names_its_setting() {
        let mut cfg = TrainConfig::default();
        cfg.trainer.micro_batch_tokens = 1 << 26;
        let err = check(&cpu(&cfg, &model()), 8.0 * GIB)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`trainer.micro_batch_tokens`"), "{err}");
    }

    /// A warm-up whose passes are larger than the update's micro-batches (`sft.micro_batch_tokens`)
    /// sizes the activations; without a warm-up it sizes nothing.
    #[test]
    fn a_larger_warm_up_pass_sizes_the_activations() {
        let activations = |cfg: &TrainConfig| part(&cpu(cfg, &model()), "activations of one");
        let mut cfg = TrainConfig::default();
        let update = activations(&cfg);
        cfg.sft.micro_batch_tokens = 4 * cfg.trainer.micro_batch_tokens;
        assert!((activations(&cfg) - 4.0 * update).abs() < 1e-6 * update);
        cfg.sft.steps = 0;
        assert_eq!(activations(&cfg), update);
    }

    /// On Qwen2.5-0.5B's shape with a KL term and micro-batches of 256 tokens: LoRA drops the
    /// trainable state to the adapters' and the reference to nothing (the base is it), and
    /// bfloat16 halves the base.
    #[test]
    fn lora_and_bfloat16_shrink_the_estimate() {
        let qwen = ModelConfig::qwen2_5_0_5b();
        let mut full = TrainConfig::default();
        full.algorithm.kl_coef = 0.01;
        let mut adapters = lora(Dtype::Float32);
        adapters.algorithm.kl_coef = 0.01;
        let mut bf16 = lora(Dtype::Bfloat16);
        bf16.algorithm.kl_coef = 0.01;
        for cfg in [&mut full, &mut adapters, &mut bf16] {
            cfg.trainer.micro_batch_tokens = 256;
        }
        let (full, adapters, bf16) = (cpu(&full, &qwen), cpu(&adapters, &qwen), cpu(&bf16, &qwen));
        assert!(total(&adapters) < 0.5 * total(&full));
        assert!(total(&bf16) < total(&adapters));
        assert!(part(&full, "frozen reference") > 0.0);
        assert_eq!(part(&adapters, "frozen reference"), 0.0);
        let base = |p: &[Part]| part(p, "frozen base");
        let ratio = base(&bf16) / base(&adapters);
        assert!((ratio - 0.5).abs() < 0.01, "{ratio}");
        // rank · (in + out) per projection and layer, float32, with gradients and two moments.
        assert_eq!(part(&bf16, "LoRA adapters"), 16.0 * 8_798_208.0);
        assert!(part(&bf16, "activations") < part(&adapters, "activations"));
    }

    /// On CUDA a bfloat16 base's adapters keep their rank-sized intermediate in bfloat16 and
    /// no float32 copy of their input (their products run in the base's dtype).
    #[test]
    fn adapters_on_cuda_keep_less() {
        let qwen = ModelConfig::qwen2_5_0_5b();
        let mut shape = UpdateShape::of(&lora(Dtype::Bfloat16), Device::Cpu);
        let adapters = |shape: &UpdateShape| {
            let parts = update_parts(&qwen, shape, Device::Cpu, false);
            part(&parts, "activations of the LoRA adapters")
        };
        let on_cpu = adapters(&shape);
        shape.cuda = true;
        let on_cuda = adapters(&shape);
        // Per token and layer: 16 · Σ rank against 4 · Σ (rank + input) over 7 projections.
        let (rank, inputs) = (16.0 * 7.0, 896.0 * 6.0 + 4864.0);
        let ratio = on_cuda / on_cpu;
        let want = 2.0 * rank / (4.0 * (rank + inputs));
        assert!((ratio - want).abs() < 1e-9, "{ratio} against {want}");
    }

    #[test]
    fn checkpointing_shrinks_the_activations_alone() {
        let qwen = ModelConfig::qwen2_5_0_5b();
        let mut shape = UpdateShape::of(&lora(Dtype::Bfloat16), Device::Cpu);
        let plain = update_parts(&qwen, &shape, Device::Cpu, false);
        shape.checkpointing = true;
        let ckpt = update_parts(&qwen, &shape, Device::Cpu, false);
        let (a, b) = (part(&plain, "activations"), part(&ckpt, "activations"));
        assert!(b < a / 4.0, "{b} against {a}");
        assert_eq!(
            total(&plain) - a,
            total(&ckpt) - b,
            "only the activations change"
        );
        let advice = |parts: &[Part]| {
            let p = parts.iter().find(|p| p.what.starts_with("activations"));
            p.map(|p| p.lower).unwrap_or_default()
        };
        assert!(advice(&plain).contains("activation_checkpointing"));
        assert!(
            !advice(&ckpt).contains("activation_checkpointing"),
            "checkpointing is on already"
        );
    }

    /// Every part is positive, and the total is their sum with each piece where it belongs:
    /// the host's parts only on the CPU.
    #[test]
    fn the_parts_sum_to_the_total() {
        let qwen = ModelConfig::qwen2_5_0_5b();
        let mut cfg = TrainConfig::default();
        cfg.algorithm.kl_coef = 0.01;
        let parts = cpu(&cfg, &qwen);
        assert!(parts.iter().all(|p| p.bytes > 0.0), "{parts:?}");
        let sum: f64 = parts.iter().map(|p| p.bytes).sum();
        assert_eq!(total(&parts), sum);
        let params = qwen.parameter_count();
        let rope = qwen.build_bytes(0.0);
        assert_eq!(part(&parts, "policy weights"), 16.0 * params + rope);
        assert_eq!(part(&parts, "frozen reference"), 4.0 * params);
        assert_eq!(part(&parts, "the process"), PROCESS_BYTES);
        let gpu = estimate(&cfg, &qwen, Device::Cuda(0), 1, None);
        assert_eq!(part(&gpu, "the step's trajectories"), 0.0);
        assert_eq!(part(&gpu, "the CUDA context"), CUDA_CONTEXT_BYTES);
        assert!(part(&parts, "the step's trajectories") > 0.0);
    }

    #[test]
    fn this_machine_reports_its_memory() {
        let m = crate::memory::available().expect("/proc/meminfo");
        assert!(m > 64.0 * 1024.0 * 1024.0);
    }

    /// What the memory check adds to free memory is the policy's own bytes, in its dtype: a
    /// float32 model's 4 per parameter, a bfloat16 one's 2.
    #[test]
    fn the_policy_holds_its_parameters_bytes() {
        let cfg = ModelConfig::tiny_qwen2(32, 16, 1, 2, 1, 32, 64);
        let full = Model::random(&cfg, Device::Cpu, 0).unwrap();
        assert_eq!(held_bytes(&full), 4.0 * cfg.parameter_count());
        let bf16 = ModelOptions {
            dtype: Dtype::Bfloat16,
            ..Default::default()
        };
        let half = Model::random_with(&cfg, &bf16, Device::Cpu, 0).unwrap();
        assert_eq!(held_bytes(&half), 2.0 * cfg.parameter_count());
    }
}
