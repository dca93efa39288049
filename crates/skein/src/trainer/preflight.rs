//! A memory estimate before the first step: parameters, gradients and AdamW moments (policy,
//! critic), the frozen reference, the KV cache of the rollout engine, and the activations of
//! one micro-batch — checked against the memory the machine has free, so a run that cannot
//! fit stops at once with the setting to lower, not an hour later.

use super::config::TrainConfig;
use crate::memory::GIB;
use crate::model::ModelConfig;
use anyhow::{bail, Result};

const F32: f64 = 4.0;

/// One part of the estimate, in bytes, and the settings that size it.
#[derive(Debug, Clone)]
pub struct Part {
    pub what: &'static str,
    pub bytes: f64,
    pub lower: &'static str,
}

pub fn estimate(cfg: &TrainConfig, model: &ModelConfig) -> Vec<Part> {
    let params = model.num_parameters() as f64 * F32;
    let mut parts = vec![Part {
        what: "policy weights, gradients and AdamW moments",
        bytes: 4.0 * params,
        lower: "the model size (`model.*`, or a smaller `model.path`)",
    }];
    // MPI ranks are other processes (often other machines): only thread ranks live here.
    if cfg.trainer.dp_size > 1 && cfg.trainer.dp_backend == super::config::DpBackend::Threads {
        parts.push(Part {
            what: "weights and gradients of the other data-parallel ranks",
            bytes: 2.0 * params * (cfg.trainer.dp_size - 1) as f64,
            lower: "`trainer.dp_size`",
        });
    }
    if cfg.algorithm.kl_coef > 0.0 {
        parts.push(Part {
            what: "frozen reference model",
            bytes: params,
            lower: "`algorithm.kl_coef` (0 needs no reference)",
        });
    }
    if cfg.algorithm.estimator.needs_critic() {
        parts.push(Part {
            what: "critic weights, gradients and moments",
            bytes: 4.0 * params,
            lower: "`algorithm.estimator` (a critic-free estimator such as grpo)",
        });
    }
    let r = &cfg.rollout;
    let slots = r.max_slots.min(r.prompts_per_step * r.samples_per_prompt);
    let prompt = if cfg.data.train_files.is_empty() {
        64
    } else {
        cfg.data.max_prompt_tokens
    };
    let context = (prompt + r.sampling.max_new_tokens).min(model.max_position_embeddings);
    parts.push(Part {
        what: "rollout KV cache",
        bytes: model.kv_cache_bytes(slots, context),
        lower: "`rollout.max_slots` or `rollout.sampling.max_new_tokens`",
    });
    // Every sample of a step is held twice, as a trajectory and as a training row: ids,
    // behavior/old/reference log-probs, versions, masks, advantages, values, weights — about
    // 64 bytes per token.
    let samples = (r.prompts_per_step * r.samples_per_prompt) as f64;
    parts.push(Part {
        what: "the step's trajectories and training rows",
        bytes: samples * context as f64 * 64.0,
        lower: "`rollout.prompts_per_step` or `rollout.samples_per_prompt`",
    });
    // Saved for backward, per token and layer: roughly a dozen hidden-sized tensors and three
    // intermediate-sized ones; plus logits, their log-softmax and its gradient.
    let tokens = cfg.trainer.micro_batch_tokens as f64;
    let per_layer = 12.0 * model.hidden_size as f64 + 3.0 * model.intermediate_size as f64;
    let activations =
        tokens * F32 * (per_layer * model.num_hidden_layers as f64 + 3.0 * model.vocab_size as f64);
    parts.push(Part {
        what: "activations of one micro-batch",
        bytes: activations,
        lower: "`trainer.micro_batch_tokens`",
    });
    parts
}

/// An error naming the largest part's settings when the estimate exceeds `available` bytes.
pub fn check(parts: &[Part], available: f64) -> Result<()> {
    let total: f64 = parts.iter().map(|p| p.bytes).sum();
    if total <= available {
        return Ok(());
    }
    let mut sorted: Vec<&Part> = parts.iter().collect();
    sorted.sort_by(|a, b| b.bytes.total_cmp(&a.bytes));
    let lines: Vec<String> = sorted
        .iter()
        .map(|p| format!("  {:>9.2} GiB  {}", p.bytes / GIB, p.what))
        .collect();
    bail!(
        "this run needs about {:.2} GiB but {:.2} GiB of memory is available:\n{}\n\
         lower {} first",
        total / GIB,
        available / GIB,
        lines.join("\n"),
        sorted[0].lower
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> ModelConfig {
        ModelConfig::tiny_qwen2(32, 192, 4, 4, 2, 512, 64)
    }

    #[test]
    fn the_default_run_fits_and_a_huge_cache_names_its_settings() {
        let mut cfg = TrainConfig::default();
        let parts = estimate(&cfg, &model());
        let total: f64 = parts.iter().map(|p| p.bytes).sum();
        assert!(total < 2.0 * GIB, "{total}");
        assert!(check(&parts, 16.0 * GIB).is_ok());

        cfg.rollout.prompts_per_step = 1 << 14;
        cfg.rollout.max_slots = 1 << 20;
        let err = check(&estimate(&cfg, &model()), 16.0 * GIB)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`rollout.max_slots`"), "{err}");
        assert!(err.contains("rollout KV cache"), "{err}");
    }

    #[test]
    fn a_huge_rollout_names_its_setting() {
        let mut cfg = TrainConfig::default();
        cfg.rollout.prompts_per_step = 100_000_000;
        let err = check(&estimate(&cfg, &model()), 24.0 * GIB)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`rollout.prompts_per_step`"), "{err}");
    }

    #[test]
    fn a_huge_micro_batch_names_its_setting() {
        let mut cfg = TrainConfig::default();
        cfg.trainer.micro_batch_tokens = 1 << 26;
        let err = check(&estimate(&cfg, &model()), 8.0 * GIB)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`trainer.micro_batch_tokens`"), "{err}");
    }

    #[test]
    fn this_machine_reports_its_memory() {
        let m = crate::memory::available().expect("/proc/meminfo");
        assert!(m > 64.0 * 1024.0 * 1024.0);
    }
}
