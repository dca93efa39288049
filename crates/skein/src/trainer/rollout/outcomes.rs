//! What a step's answers were ([`Outcomes`]): reward, accuracy and response lengths over the
//! trajectories that did not fail, and the share of groups whose rewards are all equal
//! ([`EqualGroups`]).
//!
//! One rule for every figure: a failed trajectory (a reward time-out, a crashed worker, a row
//! longer than the context) has no answer to judge, so it is left out of each mean and counted
//! apart (`batch/failed_trajectories`). A share of nothing is not logged: a step whose every
//! trajectory failed logs no `reward/mean`, instead of a 0 that reads as a policy that got
//! everything wrong.
//!
//! With dynamic sampling a step trains on the groups it kept, which by construction are the
//! mixed ones. The training reward is what the policy was drawn to answer, so the plain names
//! describe every group drawn and the kept groups' figures get their own (`kept/…`).

use crate::trainer::config::Estimator;
use serde_json::Value;
use skein_plan::{Status, Trajectory};
use std::collections::HashMap;

/// Sums over the trajectories that did not fail.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcomes {
    answered: usize,
    reward_sum: f64,
    reward_min: Option<f64>,
    reward_max: Option<f64>,
    correct: usize,
    /// Of those, the ones a single-turn rollout cut off at the token limit (`Truncated`).
    truncated: usize,
    /// Response tokens summed, and counted, of right and of wrong answers.
    right_len: (f64, usize),
    wrong_len: (f64, usize),
}

impl Outcomes {
    /// Over `trajectories`, with `correct` parallel to them (a missing entry is wrong).
    pub fn of(trajectories: &[Trajectory], correct: &[bool]) -> Self {
        let mut o = Outcomes::default();
        o.add(trajectories, correct);
        o
    }

    /// Adds more trajectories (another draw round of the same step).
    pub fn add(&mut self, trajectories: &[Trajectory], correct: &[bool]) {
        for (i, t) in trajectories.iter().enumerate() {
            if t.is_failed() {
                continue;
            }
            let right = correct.get(i).copied().unwrap_or(false);
            self.answered += 1;
            self.truncated += usize::from(t.status == Status::Truncated);
            self.reward_sum += t.reward;
            self.reward_min = Some(self.reward_min.map_or(t.reward, |m| m.min(t.reward)));
            self.reward_max = Some(self.reward_max.map_or(t.reward, |m| m.max(t.reward)));
            let len = if right {
                self.correct += 1;
                &mut self.right_len
            } else {
                &mut self.wrong_len
            };
            len.0 += response_len(t);
            len.1 += 1;
        }
    }

    /// Trajectories that did not fail.
    pub fn answered(&self) -> usize {
        self.answered
    }

    /// Mean reward of the trajectories that did not fail; None when every one failed.
    pub fn reward_mean(&self) -> Option<f64> {
        (self.answered > 0).then(|| self.reward_sum / self.answered as f64)
    }

    /// Share of the trajectories that did not fail that the task judged correct.
    pub fn accuracy(&self) -> Option<f64> {
        (self.answered > 0).then(|| self.correct as f64 / self.answered as f64)
    }

    /// Share of the trajectories that did not fail that were cut off at the token limit
    /// (`response/truncated_fraction` of a single-turn rollout; an episode is also
    /// `Truncated` at its turn limit, which that figure leaves out).
    pub fn truncated_fraction(&self) -> Option<f64> {
        (self.answered > 0).then(|| self.truncated as f64 / self.answered as f64)
    }

    fn response_len_mean(&self) -> Option<f64> {
        let (sum, n) = (self.right_len.0 + self.wrong_len.0, self.answered);
        (n > 0).then(|| sum / n as f64)
    }

    /// `reward/mean`, `reward/accuracy`, `reward/min`, `reward/max`, `response_len/mean`,
    /// `response_len/correct_mean` and `response_len/incorrect_mean`, each where it has a
    /// trajectory to describe.
    pub fn metrics(&self) -> Vec<(String, Value)> {
        let mean = |(sum, n): (f64, usize)| (n > 0).then(|| sum / n as f64);
        named([
            ("reward/mean", self.reward_mean()),
            ("reward/accuracy", self.accuracy()),
            ("reward/min", self.reward_min),
            ("reward/max", self.reward_max),
            ("response_len/mean", self.response_len_mean()),
            ("response_len/correct_mean", mean(self.right_len)),
            ("response_len/incorrect_mean", mean(self.wrong_len)),
        ])
    }

    /// The kept groups' figures under dynamic sampling: `kept/reward_mean`, `kept/accuracy`,
    /// `kept/response_len_mean`.
    pub fn kept_metrics(&self) -> Vec<(String, Value)> {
        named([
            ("kept/reward_mean", self.reward_mean()),
            ("kept/accuracy", self.accuracy()),
            ("kept/response_len_mean", self.response_len_mean()),
        ])
    }
}

fn named<const N: usize>(pairs: [(&str, Option<f64>); N]) -> Vec<(String, Value)> {
    pairs
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), Value::from(v?))))
        .collect()
}

/// Every group a step drew under dynamic sampling, skipped ones included: what the step's
/// training reward and equal-group share describe.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Drawn {
    pub outcomes: Outcomes,
    pub groups: EqualGroups,
}

impl Drawn {
    /// Adds one round's whole groups, before any is skipped.
    pub fn add(&mut self, trajectories: &[Trajectory], correct: &[bool]) {
        self.outcomes.add(trajectories, correct);
        self.groups.add(EqualGroups::of(trajectories));
    }
}

/// Response tokens of a trajectory, over its transitions.
fn response_len(t: &Trajectory) -> f64 {
    t.transitions
        .iter()
        .map(|x| x.response.len())
        .sum::<usize>() as f64
}

/// Whether the step's groups whose rewards are all equal still have an advantage: always with
/// a critic (gae); with reinforce++'s batch whitening, unless every reward of the step is the
/// same (then every advantage is 0). The other estimators centre each group, and turn credit
/// and discounted step groups give an all-wrong group with no turn rewards none either, so
/// there an equal group counts as one without signal.
pub fn equal_groups_carry_signal(estimator: Estimator, trajectories: &[Trajectory]) -> bool {
    match estimator {
        Estimator::Gae => true,
        Estimator::ReinforcePP => {
            let kept = trajectories.iter().filter(|t| !t.is_failed());
            !skein_plan::rewards_all_equal(&kept.map(Trajectory::total_reward).collect::<Vec<_>>())
        }
        _ => false,
    }
}

/// Groups whose rewards are all equal ([`skein_plan::rewards_all_equal`]), among the groups
/// counted: under a group baseline such a group gives every member a zero advantage. A group
/// counts by its trajectories that did not fail: with one such trajectory it counts as equal,
/// with none it trains nothing and is not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EqualGroups {
    pub equal: usize,
    pub counted: usize,
}

impl EqualGroups {
    /// Over whole groups (every member of a group is in `trajectories`).
    pub fn of(trajectories: &[Trajectory]) -> Self {
        let mut groups: Vec<Vec<f64>> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for t in trajectories.iter().filter(|t| !t.is_failed()) {
            let g = *index.entry(t.group.as_str()).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[g].push(t.total_reward());
        }
        EqualGroups {
            equal: groups
                .iter()
                .filter(|r| skein_plan::rewards_all_equal(r))
                .count(),
            counted: groups.len(),
        }
    }

    /// Adds another set of whole groups (another draw round).
    pub fn add(&mut self, other: EqualGroups) {
        self.equal += other.equal;
        self.counted += other.counted;
    }

    /// `batch/equal_reward_group_fraction`; None without a counted group.
    pub fn fraction(&self) -> Option<f64> {
        (self.counted > 0).then(|| self.equal as f64 / self.counted as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skein_plan::{Status, Transition};

    fn scored(group: &str, reward: f64, len: usize, status: Status) -> Trajectory {
        Trajectory {
            id: format!("{group}-{reward}-{len}"),
            group: group.into(),
            transitions: vec![Transition {
                prompt: vec![1],
                response: vec![2; len],
                loss_mask: vec![1; len],
                logprobs: vec![0.0; len],
                versions: vec![0; len],
                kept: Default::default(),
                reward: None,
                state: None,
            }],
            reward,
            status,
        }
    }

    /// An equal group keeps an advantage with a critic always, under reinforce++ only when
    /// some reward of the step differs (failed trajectories aside), and never with a group
    /// baseline.
    #[test]
    fn equal_groups_carry_signal_where_the_estimator_leaves_them_some() {
        let failed = Status::Failed("x".into());
        let equal = [
            scored("a", 0.0, 1, Status::Finished),
            scored("a", 0.0, 1, Status::Finished),
            scored("b", 1.0, 1, failed),
        ];
        let mut differ = equal.to_vec();
        differ.push(scored("b", 1.0, 1, Status::Finished));
        for (estimator, on_equal, on_differ) in [
            (Estimator::Gae, true, true),
            (Estimator::ReinforcePP, false, true),
            (Estimator::ReinforcePPBaseline, false, false),
            (Estimator::Grpo, false, false),
        ] {
            assert_eq!(
                equal_groups_carry_signal(estimator, &equal),
                on_equal,
                "{estimator:?}"
            );
            assert_eq!(
                equal_groups_carry_signal(estimator, &differ),
                on_differ,
                "{estimator:?}"
            );
        }
    }

    fn failed() -> Status {
        Status::Failed("reward service down".into())
    }

    /// A failed trajectory is out of every figure: one in five timing out leaves the mean,
    /// accuracy, range and lengths of the other four as they were.
    #[test]
    fn failed_trajectories_are_out_of_every_figure() {
        let ok = |r: f64, len| scored("g", r, len, Status::Finished);
        let four = [ok(1.0, 2), ok(0.0, 4), ok(1.0, 6), ok(0.5, 8)];
        let right = [true, false, true, false];
        let mut five = four.to_vec();
        five.insert(2, scored("g", 0.0, 3, failed()));
        let mut right5 = right.to_vec();
        right5.insert(2, false);
        let (a, b) = (Outcomes::of(&four, &right), Outcomes::of(&five, &right5));
        assert_eq!(a, b);
        let m: HashMap<String, Value> = b.metrics().into_iter().collect();
        assert_eq!(m["reward/mean"], Value::from(2.5 / 4.0));
        assert_eq!(m["reward/accuracy"], Value::from(0.5));
        assert_eq!(m["reward/min"], Value::from(0.0));
        assert_eq!(m["reward/max"], Value::from(1.0));
        assert_eq!(m["response_len/mean"], Value::from(5.0));
        assert_eq!(m["response_len/correct_mean"], Value::from(4.0));
        assert_eq!(m["response_len/incorrect_mean"], Value::from(6.0));
    }

    /// Nothing answered, nothing logged (not a 0 reward).
    #[test]
    fn a_step_whose_every_trajectory_failed_logs_no_reward() {
        let o = Outcomes::of(&[scored("g", 0.0, 2, failed())], &[false]);
        assert_eq!(o.reward_mean(), None);
        assert!(o.metrics().is_empty() && o.kept_metrics().is_empty());
        assert_eq!(EqualGroups::of(&[]).fraction(), None);
    }

    /// Groups count by their members that did not fail: `a` differs, `b` is equal, `c` has
    /// one member left (equal), `d` none (not counted).
    #[test]
    fn equal_groups_count_by_their_members_that_did_not_fail() {
        let fin = Status::Finished;
        let trajs = [
            scored("a", 1.0, 1, fin.clone()),
            scored("b", 0.5, 1, fin.clone()),
            scored("a", 0.0, 1, Status::Truncated),
            scored("b", 0.5, 1, fin.clone()),
            scored("c", 1.0, 1, fin.clone()),
            scored("c", 0.0, 1, failed()),
            scored("d", 0.0, 1, failed()),
            scored("d", 1.0, 1, failed()),
        ];
        let g = EqualGroups::of(&trajs);
        assert_eq!(
            g,
            EqualGroups {
                equal: 2,
                counted: 3
            }
        );
        assert_eq!(g.fraction(), Some(2.0 / 3.0));
        assert_eq!(EqualGroups::of(&trajs[..4]).fraction(), Some(0.5));
        let mut sum = EqualGroups::of(&trajs[..4]);
        sum.add(EqualGroups::of(&trajs[4..]));
        assert_eq!(sum, g);
    }
}
