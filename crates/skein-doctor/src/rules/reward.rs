//! Reward trouble: a reward source that fails, a reward far outside what the run has seen (a
//! reward function's bug or an exploit), and a training reward that rises while held-out
//! accuracy falls (overfitting).

use super::{examples_where, f2, num, Finding, Rule};
use crate::history::{step_span, History};
use crate::summaries::{Around, Evaluation};

pub use crate::summaries::REWARD_STEPS;

/// Share of the step's trajectories whose reward call failed or timed out.
pub const MAX_FAILED_FRACTION: f64 = 0.1;
/// RL steps seen before a range exists to fall outside of.
pub const MIN_RANGE_STEPS: usize = 3;
/// A reward beyond the range seen by more than the range's width (at least this).
pub const MIN_RANGE_WIDTH: f64 = 1.0;
/// Held-out accuracy below its best by this much...
pub const MIN_ACCURACY_DROP: f64 = 0.05;
/// ...while the training reward rose by this much since the best.
pub const MIN_REWARD_RISE: f64 = 0.05;
/// Slack in those two comparisons, so a drop or rise of exactly 0.05 counts wherever it lies
/// (0.80 − 0.75 is 0.0500000000000000044 in floats, 0.60 − 0.55 is 0.0499999999999999889).
const ROUND_OFF: f64 = 1e-9;

pub const REWARD_FAILURES: Rule = Rule {
    name: "reward-failures",
    title: "reward calls fail or time out",
    advice: "see the failed trajectories' reasons in `skein view`; check the reward worker or \
             service (`reward.sources`), raise its `timeout_ms` if it is slow, or give it more \
             workers",
    check: failures,
};

pub const REWARD_OUT_OF_RANGE: Rule = Rule {
    name: "reward-out-of-range",
    title: "a reward far outside the range seen so far",
    advice: "read the example trajectory: a reward function's bug or an exploit of it shifts \
             every advantage of its group; fix or clip the reward (`skein_plan::MAX_REWARD` \
             bounds what is accepted at all)",
    check: out_of_range,
};

pub const OVERFITTING: Rule = Rule {
    name: "overfitting",
    title: "training reward rises while held-out accuracy falls",
    advice: "train on more or more varied prompts (`data.train_files`, `task.difficulty`), \
             fewer steps (`trainer.steps`), a lower `optim.lr` or a KL term \
             `algorithm.kl_coef`; keep checkpoints (`trainer.checkpoint_every`) to return to \
             the best held-out step",
    check: overfitting,
};

fn failures(h: &History) -> Option<Finding> {
    let last = h.last().filter(|s| s.is_rl_step())?;
    let failed = last.get("reward/step_failed")?;
    // The step's reward calls, every draw round of dynamic sampling included (the failures
    // are counted over all of them; the step's kept trajectories are fewer). Runs that did not
    // log the calls had one round: their trajectories.
    let n = last
        .get("reward/step_calls")
        .or_else(|| last.get("rollout/trajectories"))?
        .max(1.0);
    if failed / n < MAX_FAILED_FRACTION {
        return None;
    }
    let examples = examples_where(h, last.step, 2, |d| {
        d.failed() && d.reason.as_deref().is_some_and(|r| r.contains("reward"))
    });
    let timeouts = last
        .get("reward/timeouts")
        .map(|t| format!(" ({t:.0} timed out so far in the run)"))
        .unwrap_or_default();
    Some(Finding {
        evidence: format!(
            "{failed:.0} of {n:.0} reward calls failed at step {}{timeouts}",
            last.step
        ),
        steps: vec![last.step],
        examples,
    })
}

fn out_of_range(h: &History) -> Option<Finding> {
    let last = h.last().filter(|s| s.is_rl_step())?;
    let run = &h.summaries().reward;
    if run.range_steps < MIN_RANGE_STEPS {
        return None;
    }
    let (lo, hi) = run.range?;
    let width = (hi - lo).max(MIN_RANGE_WIDTH);
    let (min, max) = (last.get("reward/min")?, last.get("reward/max")?);
    let beyond = if max > hi + width {
        max
    } else if min < lo - width {
        min
    } else {
        return None;
    };
    Some(Finding {
        evidence: format!(
            "a reward of {} at step {} after {} steps within {}–{}",
            num(beyond),
            last.step,
            run.range_steps,
            num(lo),
            num(hi)
        ),
        steps: vec![last.step],
        examples: examples_where(h, last.step, 1, |d| d.reward == beyond && !d.failed()),
    })
}

fn overfitting(h: &History) -> Option<Finding> {
    // Evaluations of problems the run trains on (`eval/held_out` 0: a task without a
    // held-out split) cannot show overfitting. A log without the flag is read as held out.
    let newest = h.last().and_then(|s| s.get("eval/held_out"));
    if h.summaries().reward.train_set || newest == Some(0.0) {
        return None;
    }
    let (now, earlier, best) = evaluations(h)?;
    if earlier < 2 {
        return None;
    }
    if now.accuracy > best.accuracy - MIN_ACCURACY_DROP + ROUND_OFF {
        return None;
    }
    let (r_best, r_now) = (reward_at(h, best.reward)?, reward_at(h, now.reward)?);
    if r_now - r_best < MIN_REWARD_RISE - ROUND_OFF {
        return None;
    }
    let steps = vec![best.step, now.step];
    Some(Finding {
        evidence: format!(
            "held-out accuracy fell from {} to {} over {} while the training reward rose \
             from {} to {}",
            f2(best.accuracy),
            f2(now.accuracy),
            step_span(&steps),
            f2(r_best),
            f2(r_now)
        ),
        steps,
        examples: Vec::new(),
    })
}

/// The newest evaluation of held-out accuracy, how many came before it, and the best of those
/// (the earliest of equals).
fn evaluations(h: &History) -> Option<(Evaluation, usize, Evaluation)> {
    let run = &h.summaries().reward;
    let last = h.last()?;
    match last.get("eval/accuracy") {
        // The newest step evaluated: every evaluation done came before it.
        Some(accuracy) => {
            let now = Evaluation {
                step: last.step,
                accuracy,
                reward: Around::up_to(&h.recent_rl(REWARD_STEPS)),
            };
            Some((now, run.evaluations, run.best?))
        }
        None => Some((
            run.latest?,
            run.evaluations.saturating_sub(1),
            run.best_before_latest?,
        )),
    }
}

/// The training reward around an evaluation; for one before RL, the run's first RL steps'
/// so far.
fn reward_at(h: &History, around: Around) -> Option<f64> {
    let Around::Mean(m) = around else {
        return h.summaries().reward.first_steps_reward(h.last());
    };
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::{history, push};
    use crate::{Digest, Outcome};
    use serde_json::json;

    #[test]
    fn failures_above_a_tenth_hold_with_a_failed_example() {
        let h = history(
            1,
            |_| json!({"reward/step_failed": 1, "rollout/trajectories": 16}),
        );
        assert!(failures(&h).is_none());
        let mut h = history(1, |_| json!({}));
        let d = Digest {
            id: "t3".into(),
            group: "g".into(),
            reward: 0.0,
            correct: false,
            sampled_tokens: 3,
            outcome: Outcome::Failed,
            reason: Some("reward worker crashed".into()),
        };
        push(
            &mut h,
            2,
            json!({"reward/mean": 0.0, "reward/step_failed": 4, "rollout/trajectories": 16}),
            vec![d],
        );
        let f = failures(&h).unwrap();
        assert_eq!(f.evidence, "4 of 16 reward calls failed at step 2");
        assert_eq!(f.examples[0].id, "t3");
    }

    /// Under dynamic sampling the failures of every draw round count against every call, not
    /// against the kept trajectories: 3 of 100 calls failing is 3%, not 3 of 27 (11%). A step
    /// whose every call failed logs no reward mean and is still an RL step.
    #[test]
    fn failures_are_a_share_of_the_calls_made() {
        let h = history(
            1,
            |_| json!({"reward/step_failed": 3, "reward/step_calls": 100, "rollout/trajectories": 27}),
        );
        assert!(failures(&h).is_none());
        let mut h = History::default();
        push(
            &mut h,
            1,
            json!({"reward/step_failed": 16, "reward/step_calls": 16, "rollout/trajectories": 16}),
            vec![],
        );
        let f = failures(&h).expect("every call failed");
        assert_eq!(f.evidence, "16 of 16 reward calls failed at step 1");
    }

    #[test]
    fn a_reward_beyond_the_range_seen_holds() {
        let h = history(
            4,
            |s| json!({"reward/min": 0.0, "reward/max": if s == 4 { 1.8 } else { 1.0 }}),
        );
        assert!(out_of_range(&h).is_none(), "within one width of 0–1");
        let h = history(
            4,
            |s| json!({"reward/min": 0.0, "reward/max": if s == 4 { 100.0 } else { 1.0 }}),
        );
        assert!(out_of_range(&h)
            .unwrap()
            .evidence
            .starts_with("a reward of 100 at step 4"));
        let h = history(
            3,
            |s| json!({"reward/min": 0.0, "reward/max": 50.0 * s as f64}),
        );
        assert!(out_of_range(&h).is_none(), "too few steps for a range");
    }

    #[test]
    fn rising_reward_with_falling_held_out_accuracy_is_overfitting() {
        let mut h = History::default();
        push(&mut h, 0, json!({"eval/accuracy": 0.5}), vec![]);
        for s in 1..=9 {
            let mut r = json!({"reward/mean": 0.3 + 0.05 * s as f64});
            if s % 3 == 0 {
                r["eval/accuracy"] = json!([0.0, 0.0, 0.0, 0.6, 0.0, 0.0, 0.55, 0.0, 0.0, 0.5][s]);
            }
            push(&mut h, s, r, vec![]);
        }
        let f = overfitting(&h).unwrap();
        assert_eq!(f.steps, vec![3, 9]);
        assert!(f.evidence.contains("from 0.60 to 0.50"), "{}", f.evidence);
        // The same run evaluated on problems it trains on (no held-out split) cannot be
        // overfitting, whichever of its evaluations says so.
        for flagged in [0, 9] {
            let mut train_set = History::default();
            for s in 0..=9 {
                let mut r = json!({"reward/mean": 0.3 + 0.05 * s as f64});
                if s % 3 == 0 {
                    let a = [0.5, 0.0, 0.0, 0.6, 0.0, 0.0, 0.55, 0.0, 0.0, 0.5][s];
                    r["eval/accuracy"] = json!(a);
                    r["eval/held_out"] = json!(if s == flagged { 0.0 } else { 1.0 });
                }
                push(&mut train_set, s, r, vec![]);
            }
            assert!(overfitting(&train_set).is_none(), "flagged at {flagged}");
        }
        // The same accuracies with a flat training reward: no overfitting.
        let mut flat = History::default();
        for (s, a) in [(0, 0.5), (3, 0.6), (6, 0.55), (9, 0.5)] {
            push(
                &mut flat,
                s,
                json!({"eval/accuracy": a, "reward/mean": 0.4}),
                vec![],
            );
        }
        assert!(overfitting(&flat).is_none());
        // A drop of exactly 0.05 counts wherever it lies.
        for (best, now) in [(0.8, 0.75), (0.5, 0.45), (0.6, 0.55), (1.0, 0.95)] {
            let mut h = History::default();
            for (s, a, r) in [(0, 0.3, 0.3), (3, best, 0.3), (6, 0.4, 0.6), (9, now, 0.6)] {
                push(
                    &mut h,
                    s,
                    json!({"eval/accuracy": a, "reward/mean": r}),
                    vec![],
                );
            }
            assert!(overfitting(&h).is_some(), "{best} → {now}");
        }
    }

    /// The whole-run rules as a scan of every step seen, the specification the running
    /// summaries must meet: the same finding at every record of a long run.
    mod scan {
        use super::super::*;
        use crate::step::StepView;
        use skein_report::Record;

        #[derive(Default)]
        pub struct Every(pub Vec<StepView>);

        impl Every {
            pub fn push(&mut self, step: usize, metrics: Record) {
                match self.0.last_mut().filter(|s| s.step == step) {
                    Some(last) => last.metrics.extend(metrics),
                    None => self.0.push(StepView {
                        step,
                        metrics,
                        trajectories: Vec::new(),
                    }),
                }
            }

            fn rl(&self) -> Vec<&StepView> {
                self.0.iter().filter(|s| s.is_rl_step()).collect()
            }

            fn mean_between(&self, key: &str, from: usize, to: usize) -> Option<f64> {
                let v: Vec<f64> = self
                    .rl()
                    .into_iter()
                    .filter(|s| (from..=to).contains(&s.step))
                    .filter_map(|s| s.get(key))
                    .collect();
                (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
            }
        }

        pub fn out_of_range(h: &Every) -> Option<Finding> {
            let last = h.0.last().filter(|s| s.is_rl_step())?;
            let before: Vec<(f64, f64)> = h
                .rl()
                .iter()
                .filter(|s| s.step < last.step)
                .filter_map(|s| Some((s.get("reward/min")?, s.get("reward/max")?)))
                .collect();
            if before.len() < MIN_RANGE_STEPS {
                return None;
            }
            let lo = before.iter().map(|b| b.0).fold(f64::INFINITY, f64::min);
            let hi = before.iter().map(|b| b.1).fold(f64::NEG_INFINITY, f64::max);
            let width = (hi - lo).max(MIN_RANGE_WIDTH);
            let (min, max) = (last.get("reward/min")?, last.get("reward/max")?);
            let beyond = if max > hi + width {
                max
            } else if min < lo - width {
                min
            } else {
                return None;
            };
            Some(Finding {
                evidence: format!(
                    "a reward of {} at step {} after {} steps within {}–{}",
                    num(beyond),
                    last.step,
                    before.len(),
                    num(lo),
                    num(hi)
                ),
                steps: vec![last.step],
                examples: Vec::new(),
            })
        }

        pub fn overfitting(h: &Every) -> Option<Finding> {
            if h.0.iter().any(|s| s.get("eval/held_out") == Some(0.0)) {
                return None;
            }
            let evals: Vec<(usize, f64)> =
                h.0.iter()
                    .filter_map(|s| Some((s.step, s.get("eval/accuracy")?)))
                    .collect();
            let (&(now_step, now), earlier) = evals.split_last()?;
            if earlier.len() < 2 {
                return None;
            }
            let &(best_step, best) =
                earlier
                    .iter()
                    .fold(&earlier[0], |b, e| if e.1 > b.1 { e } else { b });
            if now > best - MIN_ACCURACY_DROP + ROUND_OFF {
                return None;
            }
            let rl: Vec<usize> = h.rl().iter().map(|s| s.step).collect();
            let around = |step: usize| {
                let upto: Vec<usize> = rl.iter().copied().filter(|&s| s <= step).collect();
                let (from, to) = match upto.len() {
                    0 => (*rl.first()?, *rl.get(REWARD_STEPS - 1).or(rl.last())?),
                    n => (upto[n.saturating_sub(REWARD_STEPS)], upto[n - 1]),
                };
                h.mean_between("reward/mean", from, to)
            };
            let (r_best, r_now) = (around(best_step)?, around(now_step)?);
            if r_now - r_best < MIN_REWARD_RISE - ROUND_OFF {
                return None;
            }
            let steps = vec![best_step, now_step];
            Some(Finding {
                evidence: format!(
                    "held-out accuracy fell from {} to {} over {} while the training reward \
                     rose from {} to {}",
                    f2(best),
                    f2(now),
                    step_span(&steps),
                    f2(r_best),
                    f2(r_now)
                ),
                steps,
                examples: Vec::new(),
            })
        }
    }

    /// A small deterministic generator (xorshift): uniform in [0, 1).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }

        /// One of `values`, or null (a value that is not a finite number) or nothing.
        fn pick(&mut self, values: &[f64]) -> Option<serde_json::Value> {
            let x = self.next();
            if x < 0.05 {
                return Some(serde_json::Value::Null);
            }
            if x < 0.1 {
                return None;
            }
            Some(json!(values[(self.next() * values.len() as f64) as usize]))
        }
    }

    /// The records of a run: warm-up records before RL, evaluations at the start, as a second
    /// record of a step and as a step of their own (RL's record of it may follow), rewards
    /// and ranges sometimes missing or null, accuracies with ties.
    fn records(seed: u64, steps: usize) -> Vec<(usize, serde_json::Value)> {
        let mut rng = Rng(seed);
        let mut out = vec![(0, json!({"eval/accuracy": 0.5}))];
        let warm_up = (rng.next() * 4.0) as usize;
        for s in 1..=warm_up {
            out.push((s, json!({"sft/loss": 1.0})));
        }
        let accuracies = [0.4, 0.5, 0.55, 0.6, 0.7];
        let mut spike = 4.0;
        for s in warm_up + 1..=warm_up + steps {
            if rng.next() < 0.1 {
                let mut e = json!({});
                if let Some(a) = rng.pick(&accuracies) {
                    e["eval/accuracy"] = a;
                }
                out.push((s, e));
            }
            let mut r = json!({});
            if let Some(m) = rng.pick(&[0.1, 0.3, 0.5, 0.7, 0.9, 0.95]) {
                r["reward/mean"] = m;
            }
            if let Some(m) = rng.pick(&[-1.0, 0.0, 0.0, 0.0]) {
                r["reward/min"] = m;
            }
            if let Some(m) = rng.pick(&[1.0, 1.0, 1.0, 2.0]) {
                r["reward/max"] = m;
            }
            // Now and then a reward beyond all before it, up or down.
            if rng.next() < 0.04 {
                spike *= 4.0;
                let key = if rng.next() < 0.5 {
                    "reward/max"
                } else {
                    "reward/min"
                };
                r[key] = json!(if key == "reward/max" { spike } else { -spike });
            }
            out.push((s, r));
            while rng.next() < 0.15 {
                let mut e = json!({});
                if let Some(a) = rng.pick(&accuracies) {
                    e["eval/accuracy"] = a;
                }
                out.push((s, e));
            }
        }
        out
    }

    #[test]
    fn running_summaries_find_what_a_scan_of_every_step_finds() {
        let mut held = [0usize; 2];
        for seed in 1..=40 {
            let (mut h, mut every) = (History::default(), scan::Every::default());
            for (step, r) in records(seed * 7919, 400) {
                push(&mut h, step, r.clone(), vec![]);
                every.push(step, r.as_object().cloned().unwrap());
                let now = [out_of_range(&h), overfitting(&h)];
                let scanned = [scan::out_of_range(&every), scan::overfitting(&every)];
                assert_eq!(now, scanned, "seed {seed}, step {step}");
                for (n, f) in held.iter_mut().zip(&now) {
                    *n += usize::from(f.is_some());
                }
            }
            assert!(h.stored_steps() <= crate::history::WINDOW + 1);
        }
        // Both rules held often enough for the comparison to mean something.
        assert!(held.iter().all(|&n| n > 100), "{held:?}");
    }
}
