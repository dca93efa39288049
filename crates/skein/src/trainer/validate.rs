//! Start-up checks of a training config: every problem names its key and the allowed values.

use super::config::TrainConfig;
use anyhow::{bail, Result};

const ESTIMATORS: &str = "grpo, dr-grpo, rloo, reinforce++, reinforce++-baseline, gae";
const LOSS_AGG: &str =
    "token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm, trajectory-mean";

pub fn validate(cfg: &TrainConfig) -> Result<()> {
    let mut problems = Vec::new();
    let mut check = |ok: bool, key: &str, rule: &str, got: String| {
        if !ok {
            problems.push(format!("invalid value for `{key}`: {rule} (got {got})"));
        }
    };
    let r = &cfg.rollout;
    check(
        r.prompts_per_step > 0,
        "rollout.prompts_per_step",
        "must be at least 1",
        r.prompts_per_step.to_string(),
    );
    check(
        r.samples_per_prompt > 0,
        "rollout.samples_per_prompt",
        "must be at least 1",
        r.samples_per_prompt.to_string(),
    );
    check(
        r.max_slots > 0,
        "rollout.max_slots",
        "must be at least 1",
        r.max_slots.to_string(),
    );
    let s = &r.sampling;
    check(
        s.temperature >= 0.0 && s.temperature.is_finite(),
        "rollout.sampling.temperature",
        "must be ≥ 0 (0 = greedy)",
        s.temperature.to_string(),
    );
    check(
        s.top_p > 0.0 && s.top_p <= 1.0,
        "rollout.sampling.top_p",
        "must be in (0, 1]",
        s.top_p.to_string(),
    );
    check(
        s.max_new_tokens > 0,
        "rollout.sampling.max_new_tokens",
        "must be at least 1",
        s.max_new_tokens.to_string(),
    );
    let a = &cfg.algorithm;
    check(
        ESTIMATORS.split(", ").any(|e| e == a.estimator),
        "algorithm.estimator",
        &format!("allowed: {ESTIMATORS}"),
        format!("`{}`", a.estimator),
    );
    check(
        LOSS_AGG.split(", ").any(|e| e == a.loss_agg_mode),
        "algorithm.loss_agg_mode",
        &format!("allowed: {LOSS_AGG}"),
        format!("`{}`", a.loss_agg_mode),
    );
    check(
        a.clip_low >= 0.0 && a.clip_low < 1.0,
        "algorithm.clip_low",
        "must be in [0, 1)",
        a.clip_low.to_string(),
    );
    check(
        a.clip_high >= 0.0,
        "algorithm.clip_high",
        "must be ≥ 0",
        a.clip_high.to_string(),
    );
    check(
        a.dual_clip == 0.0 || a.dual_clip > 1.0,
        "algorithm.dual_clip",
        "must be 0 (off) or > 1",
        a.dual_clip.to_string(),
    );
    check(
        a.kl_coef >= 0.0,
        "algorithm.kl_coef",
        "must be ≥ 0",
        a.kl_coef.to_string(),
    );
    let t = &cfg.trainer;
    check(
        t.ppo_epochs > 0,
        "trainer.ppo_epochs",
        "must be at least 1",
        t.ppo_epochs.to_string(),
    );
    check(
        t.num_mini_batches > 0,
        "trainer.num_mini_batches",
        "must be at least 1",
        t.num_mini_batches.to_string(),
    );
    check(
        t.dp_size > 0,
        "trainer.dp_size",
        "must be at least 1",
        t.dp_size.to_string(),
    );
    check(
        t.micro_batch_tokens > 0,
        "trainer.micro_batch_tokens",
        "must be at least 1",
        t.micro_batch_tokens.to_string(),
    );
    check(
        t.unit == "trajectory" || t.unit == "group",
        "trainer.unit",
        "allowed: trajectory, group",
        format!("`{}`", t.unit),
    );
    let o = &cfg.optim;
    check(
        o.lr > 0.0 && o.lr.is_finite(),
        "optim.lr",
        "must be > 0",
        o.lr.to_string(),
    );
    check(
        o.grad_clip >= 0.0,
        "optim.grad_clip",
        "must be ≥ 0 (0 = off)",
        o.grad_clip.to_string(),
    );
    check(
        (0.0..1.0).contains(&o.beta1) && (0.0..1.0).contains(&o.beta2),
        "optim.beta1/optim.beta2",
        "must be in [0, 1)",
        format!("{}, {}", o.beta1, o.beta2),
    );
    let m = &cfg.model;
    if m.path.is_empty() {
        check(
            m.num_heads > 0 && m.hidden_size.is_multiple_of(m.num_heads.max(1)),
            "model.hidden_size",
            "must be a multiple of model.num_heads",
            m.hidden_size.to_string(),
        );
        check(
            m.num_kv_heads > 0 && m.num_heads.is_multiple_of(m.num_kv_heads.max(1)),
            "model.num_kv_heads",
            "must divide model.num_heads",
            m.num_kv_heads.to_string(),
        );
        check(
            m.max_positions > s.max_new_tokens,
            "model.max_positions",
            "must exceed rollout.sampling.max_new_tokens",
            m.max_positions.to_string(),
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        bail!("{}", problems.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let mut cfg = TrainConfig::default();
        assert!(validate(&cfg).is_ok());
        cfg.algorithm.estimator = "ppo2".into();
        cfg.optim.lr = -1.0;
        let err = validate(&cfg).unwrap_err().to_string();
        assert!(
            err.contains("`algorithm.estimator`") && err.contains("rloo"),
            "{err}"
        );
        assert!(err.contains("`optim.lr`"), "{err}");
    }
}
