//! Policy drift: each step moves the policy further than PPO's trust region is meant to, or
//! the engine that sampled the tokens and the trainer disagree about their probabilities.

use super::{f2, Finding, Rule};
use crate::history::{step_span, History};

/// `approx_kl`: the k2 estimate of KL(π_old‖π), the mean of ½(log π − log π_old)² (nats),
/// over the mini-batches of a step's update that come after one of its optimizer steps (the
/// first has π = π_old exactly). A step of one mini-batch and one epoch logs none: its one
/// step's drift is seen by no pass, and the rule does not apply there.
pub const MAX_APPROX_KL: f64 = 0.1;
/// Share of the same tokens where the loss's trust region bound (`clip_frac`: clipped by
/// `ppo`, capped by `cispo`, masked by `dppo`). GSPO's `clip_frac/sequence` is not bounded:
/// its range is in thousandths and a healthy run clips far more; SAPO has no clip.
pub const MAX_CLIP_FRAC: f64 = 0.3;
/// Mean raw importance weight π_old/π_behavior of off-policy tokens, before `is_cap`
/// (`is/raw_weight_mean`), outside this range. The applied weight (`is/weight_mean`) is
/// capped at `is_cap` (2 by default) and diluted by on-policy tokens, so it could never pass
/// the upper bound.
pub const IS_WEIGHT_RANGE: (f64, f64) = (0.5, 2.0);
/// Steps of the window, and how many of them must exceed a bound.
pub const WINDOW: usize = 3;
pub const MIN_STEPS: usize = 2;

/// Mean |behavior log-prob − recomputed π_old log-prob| over tokens the step's own policy
/// sampled: the same weights give the same numbers up to float round-off (the default job's
/// steps: a mean of at most 3.6e-7), so more is an engine that does not compute what the
/// trainer does. The bound of a float32 run, and of runs that did not log theirs: the trainer
/// logs the bound of its dtype as `logp_mismatch/tolerance` (bfloat16 rounds far coarser).
pub const MAX_LOGP_MISMATCH: f64 = 1e-3;

pub const POLICY_DRIFT: Rule = Rule {
    name: "policy-drift",
    title: "updates move the policy beyond PPO's trust region",
    advice: "lower `optim.lr`, take fewer optimizer steps per rollout (`trainer.ppo_epochs`, \
             `trainer.num_mini_batches`), narrow `algorithm.clip_low`/`algorithm.clip_high`, \
             or add a KL term `algorithm.kl_coef`",
    check: drift,
};

pub const LOGPROB_MISMATCH: Rule = Rule {
    name: "logprob-mismatch",
    title: "the engine's log-probs disagree with the trainer's on the same weights",
    advice: "the rollout engine does not compute the policy the trainer trains: check that a \
             remote engine (`rollout.remote.url`) loads every published version \
             (`rollout.remote.reload_path`), runs the same dtype and chat template, and samples \
             at `rollout.sampling.temperature` without top-k/top-p",
    check: mismatch,
};

/// What exceeded a bound at one step, if anything.
fn excess(s: &crate::StepView) -> Option<String> {
    let mut out = Vec::new();
    if let Some(kl) = s.get("approx_kl").filter(|&v| v > MAX_APPROX_KL) {
        out.push(format!("approx_kl {kl:.3} > {MAX_APPROX_KL}"));
    }
    if let Some(c) = s.get("clip_frac").filter(|&v| v > MAX_CLIP_FRAC) {
        out.push(format!("clip_frac {} > {MAX_CLIP_FRAC}", f2(c)));
    }
    let (lo, hi) = IS_WEIGHT_RANGE;
    if let Some(w) = s
        .get("is/raw_weight_mean")
        .filter(|&v| !(lo..=hi).contains(&v))
    {
        out.push(format!("is/raw_weight_mean {} outside {lo}–{hi}", f2(w)));
    }
    (!out.is_empty()).then(|| out.join(", "))
}

fn drift(h: &History) -> Option<Finding> {
    let last = h.last().filter(|s| s.is_rl_step())?;
    excess(last)?;
    let w = h.recent_rl(WINDOW);
    let over: Vec<(usize, String)> = w
        .iter()
        .filter_map(|s| Some((s.step, excess(s)?)))
        .collect();
    if over.len() < MIN_STEPS {
        return None;
    }
    let steps: Vec<usize> = over.iter().map(|(s, _)| *s).collect();
    let detail: Vec<String> = over.iter().map(|(s, e)| format!("step {s}: {e}")).collect();
    Some(Finding {
        evidence: format!(
            "{} of the last {} steps exceeded a bound ({})",
            over.len(),
            w.len(),
            detail.join("; ")
        ),
        steps,
        examples: Vec::new(),
    })
}

fn mismatch(h: &History) -> Option<Finding> {
    let last = h.last().filter(|s| s.is_rl_step())?;
    let mean = last.get("logp_mismatch/mean")?;
    let bound = last
        .get("logp_mismatch/tolerance")
        .unwrap_or(MAX_LOGP_MISMATCH);
    if mean < bound {
        return None;
    }
    let max = last
        .get("logp_mismatch/max")
        .map(|m| format!(", at most {m:.3}"))
        .unwrap_or_default();
    Some(Finding {
        evidence: format!(
            "tokens sampled by the current policy differ from the trainer's recomputed \
             log-probs by {mean:.4} nats on average{max} at {} (float round-off in the run's \
             dtype explains up to {bound})",
            step_span(&[last.step])
        ),
        steps: vec![last.step],
        examples: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::history;
    use serde_json::json;

    #[test]
    fn drift_needs_two_of_three_steps_beyond_a_bound_including_the_newest() {
        let h = history(3, |s| json!({"approx_kl": if s == 2 { 0.5 } else { 0.01 }}));
        assert!(check_drift(&h).is_none());
        // Two steps beyond, but not the newest: the policy came back, nothing to say.
        let h = history(3, |s| json!({"approx_kl": if s < 3 { 0.5 } else { 0.01 }}));
        assert!(check_drift(&h).is_none());
        let h = history(
            3,
            |s| json!({"approx_kl": if s == 2 { 0.5 } else { 0.01 }, "clip_frac": if s == 3 { 0.6 } else { 0.1 }}),
        );
        let f = check_drift(&h).unwrap();
        assert_eq!(f.steps, vec![2, 3]);
        assert!(
            f.evidence.contains("step 3: clip_frac 0.60 > 0.3"),
            "{}",
            f.evidence
        );
    }

    /// The off-policy bound reads the raw weight, which can pass the cap, and never the
    /// applied one, which cannot.
    #[test]
    fn off_policy_drift_reads_the_weight_before_its_cap() {
        let h = history(
            3,
            |_| json!({"is/weight_mean": 2.0, "is/raw_weight_mean": 3.5}),
        );
        let f = check_drift(&h).expect("raw weights beyond 2");
        assert!(
            f.evidence.contains("is/raw_weight_mean 3.50 outside"),
            "{}",
            f.evidence
        );
        let h = history(
            3,
            |_| json!({"is/weight_mean": 0.2, "is/raw_weight_mean": 1.1}),
        );
        assert!(check_drift(&h).is_none());
    }

    fn check_drift(h: &History) -> Option<Finding> {
        drift(h)
    }

    #[test]
    fn mismatch_beyond_round_off_holds() {
        let h = history(
            1,
            |_| json!({"logp_mismatch/mean": 2e-7, "logp_mismatch/max": 1e-6}),
        );
        assert!(mismatch(&h).is_none());
        let h = history(
            1,
            |_| json!({"logp_mismatch/mean": 0.02, "logp_mismatch/max": 0.4}),
        );
        assert!(mismatch(&h).unwrap().evidence.contains("0.0200 nats"));
    }

    /// A bfloat16 run logs its coarser round-off bound: its usual mismatch (0.013 on a 358M
    /// body) is no diagnosis, while one beyond the bound still is.
    #[test]
    fn mismatch_is_bounded_by_the_runs_own_dtype() {
        let h = history(
            1,
            |_| json!({"logp_mismatch/mean": 0.014, "logp_mismatch/max": 0.08, "logp_mismatch/tolerance": 0.05}),
        );
        assert!(mismatch(&h).is_none());
        let h = history(
            1,
            |_| json!({"logp_mismatch/mean": 0.3, "logp_mismatch/max": 2.0, "logp_mismatch/tolerance": 0.05}),
        );
        assert!(mismatch(&h).unwrap().evidence.contains("up to 0.05"));
    }
}
