//! DAPO's dynamic sampling for single-turn prompts (`rollout.skip_zero_variance_groups`): a
//! group whose rewards are all equal gets a zero advantage from its group baseline, so it
//! teaches nothing; it is skipped, and more prompts are drawn in its place until the step has
//! `rollout.prompts_per_step` groups whose rewards differ, or `rollout.max_draws_per_step`
//! groups were drawn (then the step trains on the ones it has, possibly none).
//!
//! Each round draws only the groups the step still lacks, so no group with variance is drawn
//! and thrown away. The extra prompts come from the task's own sampler, in order, so its
//! checkpointed state covers them and a resumed run draws the same ones. Deciding (how many
//! to draw, which groups to keep: [`DynamicSampling::collect_with`]) is apart from generating
//! them ([`DynamicSampling::collect`]).

use super::buffer::{GroupBuffer, Iteration, IterationConfig, PromptSource};
use super::judge::Answering;
use super::outcomes::Drawn;
use super::stats::{SourceStats, StepRollout};
use crate::engine::EngineStats;
use crate::trainer::config::TrainConfig;
use anyhow::Result;
use serde_json::Value;
use std::collections::HashMap;

/// The step's target and bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamicSampling {
    /// Groups with reward variance a step trains on (`rollout.prompts_per_step`).
    pub groups: usize,
    /// Most groups a step draws, skipped ones included
    /// ([`crate::trainer::config::RolloutConfig::draw_limit`]).
    pub max_draws: usize,
}

/// What one step's dynamic sampling drew, for its metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DrawStats {
    /// Groups drawn (started) in the step.
    pub drawn: usize,
    /// Groups kept: their rewards differ.
    pub kept: usize,
    /// Groups thrown away: rewards all equal, or fewer than two trajectories that did not fail.
    pub skipped: usize,
    /// The step reached `max_draws` with fewer than `groups` groups kept.
    pub limit_hit: bool,
    /// Every group drawn, skipped ones included: the step's training reward
    /// ([`StepRollout::with_drawn`]).
    pub groups: Drawn,
}

impl DrawStats {
    /// `rollout/drawn_groups`, `rollout/skipped_groups` and `rollout/draw_limit_hit` (0 or 1).
    pub fn metrics(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("rollout/drawn_groups", self.drawn.into()),
            ("rollout/skipped_groups", self.skipped.into()),
            ("rollout/draw_limit_hit", u8::from(self.limit_hit).into()),
        ]
    }

    /// A warning for a step that trains on no group at all: its metrics alone look like a
    /// quiet step.
    pub fn warn_if_empty(&self, step: usize) {
        if self.limit_hit && self.kept == 0 {
            eprintln!(
                "skein: warning: step {step}: none of the {} groups drawn had rewards that \
                 differ (rollout.skip_zero_variance_groups; at most rollout.max_draws_per_step \
                 groups a step), so it trains on none",
                self.drawn
            );
        }
    }
}

/// How many groups of one iteration [`keep_varied_groups`] kept and skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Filtered {
    pub kept: usize,
    pub skipped: usize,
}

/// Keeps the groups of `it` whose rewards differ among their trajectories that did not fail
/// ([`skein_plan::rewards_all_equal`], the rule [`super::outcomes::EqualGroups`] counts by),
/// in order. A skipped group's failed trajectories stay, so failures are still counted
/// and shown; they train nothing.
pub fn keep_varied_groups(it: &mut Iteration) -> Filtered {
    let mut order: Vec<&str> = Vec::new();
    let mut rewards: HashMap<&str, Vec<f64>> = HashMap::new();
    for t in &it.trajectories {
        let r = rewards.entry(t.group.as_str()).or_insert_with(|| {
            order.push(t.group.as_str());
            Vec::new()
        });
        if !t.is_failed() {
            r.push(t.total_reward());
        }
    }
    let varied: HashMap<String, bool> = order
        .iter()
        .map(|g| (g.to_string(), !skein_plan::rewards_all_equal(&rewards[g])))
        .collect();
    let kept = varied.values().filter(|&&v| v).count();
    let filtered = Filtered {
        kept,
        skipped: varied.len() - kept,
    };
    let keep: Vec<bool> = it
        .trajectories
        .iter()
        .map(|t| varied[&t.group] || t.is_failed())
        .collect();
    let mut flags = keep.iter();
    it.trajectories.retain(|_| *flags.next().unwrap_or(&false));
    let mut flags = keep.iter();
    it.correct.retain(|_| *flags.next().unwrap_or(&false));
    let mut flags = keep.iter();
    it.sources.retain(|_| *flags.next().unwrap_or(&false));
    filtered
}

/// Adds one round's trajectories and counters to the step's.
fn append(into: &mut Iteration, it: Iteration) {
    into.trajectories.extend(it.trajectories);
    into.correct.extend(it.correct);
    into.sources.extend(it.sources);
    into.engine = into.engine.combined(it.engine);
    into.stats.requests += it.stats.requests;
    into.stats.rounds += it.stats.rounds;
    into.rewards.add(&it.rewards);
}

/// Fails, in one round's trajectories, what the step would fail once it is returned (rows
/// longer than the model's context, rewards out of range: `Trainer::rollout`), so a group is
/// judged by the trajectories that will train. Failing twice is a no-op, so the step's own
/// checks find nothing more.
fn fail_untrainable(it: &mut Iteration, max_positions: usize) {
    let trajectories = std::mem::take(&mut it.trajectories);
    let correct = std::mem::take(&mut it.correct);
    let mut r = StepRollout::new(
        trajectories,
        correct,
        EngineStats::default(),
        0,
        SourceStats::default(),
    );
    r.fail_longer_than(max_positions);
    r.fail_rewards_out_of_range();
    it.trajectories = r.trajectories;
    it.correct = r.correct;
}

impl DynamicSampling {
    /// On with `rollout.skip_zero_variance_groups`.
    pub fn from_config(cfg: &TrainConfig) -> Option<Self> {
        cfg.rollout
            .skip_zero_variance_groups
            .then(|| DynamicSampling {
                groups: cfg.rollout.prompts_per_step,
                max_draws: cfg.rollout.draw_limit(),
            })
    }

    /// The step's groups: rounds of [`GroupBuffer::collect_step`] (no partial rollout: every
    /// group it starts finishes in its round), each starting the groups still missing.
    /// `max_positions` is the policy's context.
    pub fn collect(
        &self,
        buffer: &mut GroupBuffer,
        r: &Answering,
        cfg: &IterationConfig,
        next_prompt: &mut PromptSource,
        max_positions: usize,
    ) -> Result<(Iteration, DrawStats)> {
        self.collect_with(|n| {
            let round = IterationConfig {
                new_groups: n,
                min_groups: n,
                ..cfg.clone()
            };
            let before = buffer.next_group;
            let mut it = buffer.collect_step(r, &round, next_prompt)?;
            fail_untrainable(&mut it, max_positions);
            Ok((it, (buffer.next_group - before) as usize))
        })
    }

    /// Runs `round(n)` — `n` new groups, returned with how many groups it started — until
    /// `groups` groups with variance are kept or `max_draws` groups were drawn, keeping the
    /// varied groups of each round ([`keep_varied_groups`]) in order.
    pub fn collect_with(
        &self,
        mut round: impl FnMut(usize) -> Result<(Iteration, usize)>,
    ) -> Result<(Iteration, DrawStats)> {
        let mut out = Iteration::default();
        let mut draw = DrawStats::default();
        loop {
            let missing = self.groups.saturating_sub(draw.kept);
            let n = missing.min(self.max_draws.saturating_sub(draw.drawn));
            if n == 0 {
                break;
            }
            let (mut it, started) = round(n)?;
            // A round that started nothing could never end the loop; count what was asked.
            draw.drawn += started.max(n);
            draw.groups.add(&it.trajectories, &it.correct);
            let f = keep_varied_groups(&mut it);
            draw.kept += f.kept;
            draw.skipped += f.skipped;
            append(&mut out, it);
        }
        draw.limit_hit = draw.kept < self.groups;
        Ok((out, draw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skein_plan::{Status, Trajectory, Transition};

    fn trajectory(group: &str, k: usize, reward: f64, failed: bool) -> Trajectory {
        Trajectory {
            id: format!("{group}-s{k}"),
            group: group.into(),
            transitions: vec![Transition {
                prompt: vec![1, 2],
                response: vec![3],
                loss_mask: vec![1],
                logprobs: vec![0.0],
                versions: vec![0],
                kept: Default::default(),
                reward: None,
                state: None,
            }],
            reward,
            status: if failed {
                Status::Failed("reward service down".into())
            } else {
                Status::Finished
            },
        }
    }

    /// An iteration of groups `(id, [(reward, failed)])`, flattened in order.
    fn iteration(groups: &[(&str, &[(f64, bool)])]) -> Iteration {
        let mut it = Iteration::default();
        for (g, samples) in groups {
            for (k, &(reward, failed)) in samples.iter().enumerate() {
                it.trajectories.push(trajectory(g, k, reward, failed));
                it.correct.push(reward == 1.0);
                it.sources.push(format!("src-{g}"));
            }
        }
        it
    }

    fn ids(it: &Iteration) -> Vec<&str> {
        it.trajectories.iter().map(|t| t.id.as_str()).collect()
    }

    /// Only groups whose rewards differ among the trajectories that did not fail are kept,
    /// whole and in order, with their `correct` and `sources` entries; a skipped group's
    /// failed trajectories stay (counted as failed), its others go.
    #[test]
    fn only_groups_whose_rewards_differ_are_kept() {
        let ok = false;
        let mut it = iteration(&[
            ("a", &[(1.0, ok), (0.0, ok)]),
            ("b", &[(0.0, ok), (0.0, ok)]),
            ("c", &[(1.0, ok), (0.0, true)]),
            ("d", &[(0.5, ok), (0.5, ok), (0.0, true), (0.25, ok)]),
            ("e", &[(0.0, true), (1.0, true)]),
            ("f", &[(0.3, ok), (0.3, ok), (0.3, ok)]),
        ]);
        let f = keep_varied_groups(&mut it);
        assert_eq!(
            f,
            Filtered {
                kept: 2,
                skipped: 4
            }
        );
        assert_eq!(
            ids(&it),
            ["a-s0", "a-s1", "c-s1", "d-s0", "d-s1", "d-s2", "d-s3", "e-s0", "e-s1"]
        );
        assert_eq!(
            it.correct,
            [true, false, false, false, false, false, false, false, true]
        );
        assert_eq!(it.sources[2], "src-c");
        assert_eq!(it.sources[3], "src-d");
        // What is left trains only the varied groups.
        let trained = super::super::outcomes::EqualGroups::of(&it.trajectories);
        assert_eq!(trained.fraction(), Some(0.0));
    }

    /// A scripted source of rounds: group `i` (in drawing order) varies when `varies(i)`;
    /// one that does not has both its samples cut off at the token limit, as a policy whose
    /// answers run too long scores all of them 0. Records how many groups each round asked
    /// for.
    fn scripted<'a>(
        varies: impl Fn(usize) -> bool + 'a,
        asked: &'a mut Vec<usize>,
    ) -> impl FnMut(usize) -> Result<(Iteration, usize)> + 'a {
        let mut next = 0;
        move |n| {
            asked.push(n);
            let mut it = Iteration::default();
            for _ in 0..n {
                let g = format!("g{next}");
                let second = if varies(next) { 1.0 } else { 0.0 };
                let mut pair = [
                    trajectory(&g, 0, 0.0, false),
                    trajectory(&g, 1, second, false),
                ];
                if !varies(next) {
                    pair.iter_mut().for_each(|t| t.status = Status::Truncated);
                }
                it.trajectories.extend(pair);
                it.correct.extend([false, second == 1.0]);
                it.sources.extend([String::new(), String::new()]);
                next += 1;
            }
            it.engine.generated_tokens = 2 * n;
            Ok((it, n))
        }
    }

    /// Each round asks for the groups still missing (within the bound); the step stops at
    /// the target or the bound, with drawn = kept + skipped, the kept groups in drawing order
    /// and every round's counters summed.
    #[test]
    fn rounds_top_up_the_missing_groups_until_the_target_or_the_bound() {
        // Every third group varies: g0, g3, g6, g9.
        let every_third = |i: usize| i.is_multiple_of(3);
        let mut asked = Vec::new();
        let bounded = DynamicSampling {
            groups: 4,
            max_draws: 9,
        };
        let (it, draw) = bounded
            .collect_with(scripted(every_third, &mut asked))
            .unwrap();
        assert_eq!(asked, [4, 2, 2, 1]);
        assert_eq!(
            (draw.drawn, draw.kept, draw.skipped, draw.limit_hit),
            (9, 3, 6, true),
            "g8 is the ninth group drawn: g9 would have been the fourth with variance"
        );
        assert_eq!(it.trajectories.len(), 6);

        asked.clear();
        let roomy = DynamicSampling {
            groups: 4,
            max_draws: 16,
        };
        let (it, draw) = roomy
            .collect_with(scripted(every_third, &mut asked))
            .unwrap();
        assert_eq!(asked, [4, 2, 2, 1, 1]);
        assert_eq!(
            (draw.drawn, draw.kept, draw.skipped, draw.limit_hit),
            (10, 4, 6, false)
        );
        let groups: Vec<&str> = it.trajectories.iter().map(|t| t.group.as_str()).collect();
        assert_eq!(groups, ["g0", "g0", "g3", "g3", "g6", "g6", "g9", "g9"]);
        assert_eq!(it.engine.generated_tokens, 20, "every round's tokens count");
        let m: HashMap<&str, Value> = draw.metrics().into_iter().collect();
        assert_eq!(m["rollout/drawn_groups"], Value::from(10));
        assert_eq!(m["rollout/skipped_groups"], Value::from(6));
        assert_eq!(m["rollout/draw_limit_hit"], Value::from(0));
        // The training reward is of everything drawn: 4 right of 20 answers, and 6 of the 10
        // groups had equal rewards; the kept groups are all mixed.
        assert_eq!(draw.groups.outcomes.reward_mean(), Some(4.0 / 20.0));
        assert_eq!(draw.groups.groups.fraction(), Some(6.0 / 10.0));
        let rollout = StepRollout::new(
            it.trajectories,
            it.correct,
            EngineStats::default(),
            0,
            SourceStats::default(),
        );
        assert_eq!(rollout.reward_mean(), Some(0.5));
        let rollout = rollout.with_drawn(draw.groups.clone());
        assert_eq!(rollout.reward_mean(), Some(4.0 / 20.0));
        assert_eq!(rollout.accuracy(), Some(4.0 / 20.0));
        let m: HashMap<String, Value> = rollout.metrics(1.0, false, None).into_iter().collect();
        assert_eq!(m["reward/mean"], Value::from(4.0 / 20.0));
        assert_eq!(m["kept/reward_mean"], Value::from(0.5));
        assert_eq!(m["batch/equal_reward_group_fraction"], Value::from(0.6));
        // The skipped groups were the cut-off ones: 12 of the 20 answers drawn, though none
        // of the 8 kept.
        assert_eq!(m["response/truncated_fraction"], Value::from(12.0 / 20.0));
    }

    /// Where every group varies there is one round; where none does the step draws exactly
    /// its bound and ends with no group, flagged.
    #[test]
    fn the_bound_ends_a_step_that_finds_no_variance() {
        let d = DynamicSampling {
            groups: 3,
            max_draws: 12,
        };
        let mut asked = Vec::new();
        let (it, draw) = d.collect_with(scripted(|_| true, &mut asked)).unwrap();
        assert_eq!(
            (asked.as_slice(), draw.drawn, draw.skipped),
            (&[3][..], 3, 0)
        );
        assert!(!draw.limit_hit);
        assert_eq!(it.trajectories.len(), 6);
        asked.clear();
        let (it, draw) = d.collect_with(scripted(|_| false, &mut asked)).unwrap();
        assert_eq!(asked, [3, 3, 3, 3]);
        assert_eq!((draw.drawn, draw.kept, draw.skipped), (12, 0, 12));
        assert!(draw.limit_hit);
        assert!(it.trajectories.is_empty());
        let m: HashMap<&str, Value> = draw.metrics().into_iter().collect();
        assert_eq!(m["rollout/draw_limit_hit"], Value::from(1));
    }

    #[test]
    fn it_is_on_with_its_key_and_bounded_by_default() {
        let mut cfg = TrainConfig::default();
        assert_eq!(DynamicSampling::from_config(&cfg), None);
        cfg.rollout.skip_zero_variance_groups = true;
        cfg.rollout.prompts_per_step = 5;
        assert_eq!(
            DynamicSampling::from_config(&cfg),
            Some(DynamicSampling {
                groups: 5,
                max_draws: 20
            })
        );
    }
}
