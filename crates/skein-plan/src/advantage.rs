//! Advantage estimators, computed on whole groups before anything is reordered, dropped or
//! padded. Failed trajectories are excluded (and counted), never given reward 0.

use crate::data::Trajectory;
use crate::moments::Moments;
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Estimator {
    /// Group-mean-centred reward, optionally divided by the group's standard deviation.
    Grpo { normalize_std: bool },
    /// Dr. GRPO: group-mean-centred, never divided by the standard deviation.
    DrGrpo,
    /// Leave-one-out baseline: the mean of the other members of the group. A group of one has
    /// no other member to form a baseline from, so its advantage is 0.
    Rloo,
    /// REINFORCE++: rewards whitened over the batch's loss tokens, each trajectory's (or
    /// turn's) value counted once per loss token; with `group_baseline`, minus the group mean
    /// and divided by that spread only, so an equal-reward group keeps advantage 0.
    ReinforcePP { group_baseline: bool },
    /// PPO with a critic: no group advantage (0 for every kept trajectory). Groups are still
    /// formed, so failures are counted; the trainer then replaces the advantages with GAE's
    /// (and refuses `drop_equal_reward_groups`: the critic's advantages carry signal in an
    /// equal-reward group).
    Critic,
}

/// Who gets credit for a trajectory's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Credit {
    /// Every turn gets the trajectory's advantage.
    #[default]
    Trajectory,
    /// Each turn gets its own: the discounted return from that turn on (its own reward, the
    /// later turns' rewards, and the final score at the last turn, `gamma` per turn), against
    /// the returns of the same turn index in the group ([`turn_advantages`]).
    Turn { gamma: f64 },
}

/// GiGPO's step-level groups: within a group, the turns taken in the same environment state
/// ([`crate::Transition::state`]) are compared with each other by their returns (discounted
/// by `gamma` per turn), and `weight` times that step-relative advantage is added to each
/// turn's own. A state only one turn of the group was in adds nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepGroups {
    pub weight: f64,
    pub gamma: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdvantageConfig {
    pub estimator: Estimator,
    pub credit: Credit,
    pub step_groups: Option<StepGroups>,
    /// DAPO dynamic sampling: drop groups whose rewards are all equal (they carry no learning
    /// signal under a group baseline). A group of one (e.g. its siblings failed) is all-equal
    /// too, and is dropped.
    pub drop_equal_reward_groups: bool,
    pub eps: f64,
}

impl Default for AdvantageConfig {
    fn default() -> Self {
        AdvantageConfig {
            estimator: Estimator::Grpo {
                normalize_std: true,
            },
            credit: Credit::Trajectory,
            step_groups: None,
            drop_equal_reward_groups: false,
            eps: 1e-6,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct AdvantageResult {
    /// One per trajectory; None = excluded (failed, or its group was dropped).
    pub per_trajectory: Vec<Option<f64>>,
    /// One per transition of each trajectory (None = excluded, as above): the trajectory's
    /// advantage on every turn, or each turn's own with [`Credit::Turn`].
    pub per_turn: Vec<Option<Vec<f64>>>,
    /// With [`StepGroups`]: states shared by two or more turns of a group, and those turns.
    pub step_groups: usize,
    pub step_group_turns: usize,
    pub dropped_groups: usize,
    pub dropped_trajectories: usize,
    pub failed_trajectories: usize,
}

/// Whether a group's rewards (of its trajectories that did not fail, each its
/// [`Trajectory::total_reward`]) are all equal, so that
/// a group baseline leaves every member an advantage of zero: what `drop_equal_reward_groups`
/// drops and the trainer's dynamic sampling skips. Fewer than two rewards count as equal.
pub fn rewards_all_equal(rewards: &[f64]) -> bool {
    rewards.len() < 2 || rewards.iter().all(|&r| r == rewards[0])
}

/// Sequence-level advantages of `trajs` (any order; groups are formed by group id among the
/// trajectories that did not fail). Call it on whole groups, before any reordering, dropping
/// or padding: padding rows are made later and can never join a group.
pub fn compute_advantages(trajs: &[Trajectory], cfg: &AdvantageConfig) -> AdvantageResult {
    let mut out = AdvantageResult {
        per_trajectory: vec![None; trajs.len()],
        ..Default::default()
    };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, t) in trajs.iter().enumerate() {
        if t.is_failed() {
            out.failed_trajectories += 1;
            continue;
        }
        let g = *index.entry(t.group.as_str()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    let mut kept = Vec::new();
    let mut kept_groups = Vec::new();
    for members in groups {
        let rewards: Vec<f64> = members.iter().map(|&i| trajs[i].total_reward()).collect();
        if cfg.drop_equal_reward_groups && rewards_all_equal(&rewards) {
            out.dropped_groups += 1;
            out.dropped_trajectories += members.len();
            continue;
        }
        let m = Moments::of(rewards.iter().copied());
        let (n, mean) = (m.n as f64, m.mean);
        for (&i, &r) in members.iter().zip(&rewards) {
            let a = match cfg.estimator {
                Estimator::Grpo {
                    normalize_std: true,
                } => m.whiten(r, cfg.eps),
                Estimator::Grpo {
                    normalize_std: false,
                }
                | Estimator::DrGrpo => r - mean,
                Estimator::Rloo if members.len() > 1 => (r - mean) * n / (n - 1.0),
                Estimator::Rloo => 0.0,
                Estimator::ReinforcePP {
                    group_baseline: true,
                } => r - mean,
                Estimator::ReinforcePP {
                    group_baseline: false,
                } => r,
                Estimator::Critic => 0.0,
            };
            out.per_trajectory[i] = Some(a);
            kept.push(i);
        }
        kept_groups.push(members);
    }
    // Per-turn credit falls back on the trajectory's advantage before REINFORCE++ whitens it
    // (the turns are whitened on their own).
    let turns = match cfg.credit {
        Credit::Turn { gamma } => Some(turn_advantages(trajs, &kept_groups, &out, cfg, gamma)),
        Credit::Trajectory => None,
    };
    if let Estimator::ReinforcePP { group_baseline } = cfg.estimator {
        whiten(
            trajs,
            &mut out.per_trajectory,
            &kept,
            !group_baseline,
            cfg.eps,
        );
    }
    out.per_turn = turns.unwrap_or_else(|| {
        trajs
            .iter()
            .zip(&out.per_trajectory)
            .map(|(t, a)| a.map(|a| vec![a; t.transitions.len()]))
            .collect()
    });
    if let Some(steps) = cfg.step_groups {
        add_step_advantages(trajs, &kept_groups, &mut out, cfg, steps);
    }
    out
}

/// Adds `weight` × the step-relative advantage to each turn that shares its state with other
/// turns of its group: the turn's return against theirs, centred (and scaled by their
/// standard deviation under GRPO with `normalize_std`).
fn add_step_advantages(
    trajs: &[Trajectory],
    groups: &[Vec<usize>],
    out: &mut AdvantageResult,
    cfg: &AdvantageConfig,
    steps: StepGroups,
) {
    for members in groups {
        let mut by_state: HashMap<&str, Vec<(usize, usize, f64)>> = HashMap::new();
        for &i in members {
            let returns = turn_returns(&trajs[i], steps.gamma);
            for (k, x) in trajs[i].transitions.iter().enumerate() {
                if let Some(state) = &x.state {
                    by_state.entry(state).or_default().push((i, k, returns[k]));
                }
            }
        }
        for turns in by_state.values().filter(|t| t.len() >= 2) {
            let m = Moments::of(turns.iter().map(|t| t.2));
            out.step_groups += 1;
            out.step_group_turns += turns.len();
            for &(i, k, r) in turns {
                let a = match cfg.estimator {
                    Estimator::Grpo {
                        normalize_std: true,
                    } => m.whiten(r, cfg.eps),
                    _ => r - m.mean,
                };
                if let Some(Some(adv)) = out.per_turn.get_mut(i) {
                    adv[k] += steps.weight * a;
                }
            }
        }
    }
}

/// What each turn of `t` earned: its own reward ([`crate::Transition::reward`], None = 0),
/// plus the final score on the last turn.
pub fn turn_rewards(t: &Trajectory) -> Vec<f64> {
    let n = t.transitions.len();
    t.transitions
        .iter()
        .enumerate()
        .map(|(k, x)| x.reward.unwrap_or(0.0) + if k + 1 == n { t.reward } else { 0.0 })
        .collect()
}

/// The discounted return from each turn on: its own reward plus the later turns', and the
/// final score at the last turn, `gamma` per turn.
pub fn turn_returns(t: &Trajectory, gamma: f64) -> Vec<f64> {
    let mut returns = turn_rewards(t);
    let mut running = 0.0;
    for r in returns.iter_mut().rev() {
        running = *r + gamma * running;
        *r = running;
    }
    returns
}

/// Per-turn advantages of the kept groups. Each turn's return is compared with the returns of
/// the same turn index in its group: an early turn is compared with early turns, so a turn
/// that leads to a quicker success stands out, where pooling all turns of a group would favour
/// late turns merely for being late. A turn index fewer than two trajectories of the group
/// reached has nothing to be compared with, and takes its trajectory's own advantage
/// (`whole`, before any whitening). REINFORCE++ whitens the turns over the whole batch.
fn turn_advantages(
    trajs: &[Trajectory],
    groups: &[Vec<usize>],
    whole: &AdvantageResult,
    cfg: &AdvantageConfig,
    gamma: f64,
) -> Vec<Option<Vec<f64>>> {
    let mut out: Vec<Option<Vec<f64>>> = vec![None; trajs.len()];
    for members in groups {
        let returns: Vec<Vec<f64>> = members
            .iter()
            .map(|&i| turn_returns(&trajs[i], gamma))
            .collect();
        for (&i, g) in members.iter().zip(&returns) {
            let adv = g
                .iter()
                .enumerate()
                .map(|(k, &r)| {
                    let m = Moments::of(returns.iter().filter_map(|g| g.get(k).copied()));
                    if m.n < 2 {
                        return whole.per_trajectory[i].unwrap_or(0.0);
                    }
                    match cfg.estimator {
                        Estimator::Grpo {
                            normalize_std: true,
                        } => m.whiten(r, cfg.eps),
                        Estimator::Grpo {
                            normalize_std: false,
                        }
                        | Estimator::DrGrpo => r - m.mean,
                        Estimator::Rloo => (r - m.mean) * m.n as f64 / (m.n - 1) as f64,
                        Estimator::ReinforcePP {
                            group_baseline: true,
                        } => r - m.mean,
                        Estimator::ReinforcePP {
                            group_baseline: false,
                        } => r,
                        Estimator::Critic => 0.0,
                    }
                })
                .collect();
            out[i] = Some(adv);
        }
    }
    if let Estimator::ReinforcePP { group_baseline } = cfg.estimator {
        // Each turn's advantage counted once per loss token of its turn.
        let per_token = out.iter().zip(trajs).flat_map(|(adv, t)| {
            let turns = adv.iter().flat_map(|a| a.iter().zip(&t.transitions));
            turns.flat_map(|(&a, x)| std::iter::repeat_n(a, x.loss_tokens()))
        });
        let all = Moments::of(per_token);
        for a in out.iter_mut().flatten().flatten() {
            *a = token_whitened(*a, &all, !group_baseline, cfg.eps);
        }
    }
    out
}

/// REINFORCE++'s batch whitening of the kept trajectories' advantages over the batch's loss
/// tokens, as it whitens its per-token advantages: each trajectory's value counts once per
/// loss token ([`token_whitened`]).
fn whiten(trajs: &[Trajectory], values: &mut [Option<f64>], idx: &[usize], centre: bool, eps: f64) {
    let per_token = idx.iter().flat_map(|&i| {
        let tokens = trajs[i].transitions.iter().map(|x| x.loss_tokens()).sum();
        values[i]
            .into_iter()
            .flat_map(move |v| std::iter::repeat_n(v, tokens))
    });
    let m = Moments::of(per_token);
    for &i in idx {
        values[i] = values[i].map(|v| token_whitened(v, &m, centre, eps));
    }
}

/// `v` against the moments `m` of the batch's per-token advantages. REINFORCE++ (`centre`)
/// subtracts their mean, so the trained tokens' advantages have mean 0 however long the right
/// and wrong answers; with its group baseline, the groups are centred already, and dividing
/// alone keeps an equal-reward group at 0. Fewer than two tokens have nothing to be whitened
/// against and get 0.
fn token_whitened(v: f64, m: &Moments, centre: bool, eps: f64) -> f64 {
    match (m.n < 2, centre) {
        (true, _) => 0.0,
        (false, true) => m.whiten(v, eps),
        (false, false) => v / (m.std + eps),
    }
}

/// Generalised advantage estimation over one sequence: per-token rewards and values (the value
/// after the last token is 0). Returns (advantages, returns).
pub fn gae(rewards: &[f64], values: &[f64], gamma: f64, lambda: f64) -> (Vec<f64>, Vec<f64>) {
    let n = rewards.len();
    let mut adv = vec![0.0; n];
    let mut next_value = 0.0;
    let mut running = 0.0;
    for t in (0..n).rev() {
        let v = values.get(t).copied().unwrap_or(0.0);
        let delta = rewards[t] + gamma * next_value - v;
        running = delta + gamma * lambda * running;
        adv[t] = running;
        next_value = v;
    }
    let returns = adv
        .iter()
        .zip(values.iter().chain(std::iter::repeat(&0.0)))
        .map(|(a, v)| a + v)
        .collect();
    (adv, returns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Status, Transition};

    fn traj(id: &str, group: &str, reward: f64, status: Status) -> Trajectory {
        Trajectory {
            id: id.into(),
            group: group.into(),
            transitions: vec![Transition {
                prompt: vec![1],
                response: vec![2],
                loss_mask: vec![1],
                logprobs: vec![0.0],
                versions: vec![0],
                kept: Default::default(),
                reward: None,
                state: None,
            }],
            reward,
            status,
        }
    }

    fn one_token_turn(reward: Option<f64>, state: Option<String>) -> Transition {
        Transition {
            prompt: vec![1],
            response: vec![2],
            loss_mask: vec![1],
            logprobs: vec![0.0],
            versions: vec![0],
            kept: Default::default(),
            reward,
            state,
        }
    }

    /// Two guessing episodes of one secret: A wins on its second message, B never does and
    /// plays a third. Turn credit separates their turns by index; B's third turn, which no
    /// other episode reached, takes B's own episode advantage.
    #[test]
    fn turn_credit_compares_each_turn_with_the_same_turn_of_the_group() {
        let turn = |reward: Option<f64>| one_token_turn(reward, None);
        let a = Trajectory {
            transitions: vec![turn(None), turn(None)],
            ..traj("a", "g", 1.0, Status::Finished)
        };
        let b = Trajectory {
            transitions: vec![turn(None), turn(Some(0.2)), turn(None)],
            ..traj("b", "g", 0.0, Status::Truncated)
        };
        assert_eq!(turn_returns(&a, 0.5), vec![0.5, 1.0]);
        assert_eq!(turn_returns(&b, 0.5), vec![0.1, 0.2, 0.0]);
        let cfg = AdvantageConfig {
            estimator: Estimator::DrGrpo,
            credit: Credit::Turn { gamma: 0.5 },
            ..Default::default()
        };
        let r = compute_advantages(&[a, b], &cfg);
        let close = |x: &[f64], y: &[f64]| x.iter().zip(y).all(|(p, q)| (p - q).abs() < 1e-12);
        // The episodes' totals are 1 and 0.2 (B's turn reward counts).
        let whole: Vec<f64> = r.per_trajectory.iter().flatten().copied().collect();
        assert!(close(&whole, &[0.4, -0.4]), "{whole:?}");
        let (ta, tb) = (
            r.per_turn[0].as_ref().unwrap(),
            r.per_turn[1].as_ref().unwrap(),
        );
        assert!(close(ta, &[0.2, 0.4]), "{ta:?}");
        assert!(close(tb, &[-0.2, -0.4, -0.4]), "{tb:?}");
    }

    /// With every turn given its episode's credit, an episode's turn rewards count in the
    /// return its group compares: A earned 1 on its first turn and B nothing, both final
    /// scores 0, so A is ahead and the group is not one of equal rewards.
    #[test]
    fn trajectory_credit_compares_episodes_by_their_total_reward() {
        let a = Trajectory {
            transitions: vec![one_token_turn(Some(1.0), None), one_token_turn(None, None)],
            ..traj("a", "g", 0.0, Status::Finished)
        };
        let b = Trajectory {
            transitions: vec![one_token_turn(None, None), one_token_turn(None, None)],
            ..traj("b", "g", 0.0, Status::Finished)
        };
        assert_eq!((a.total_reward(), b.total_reward()), (1.0, 0.0));
        for estimator in [
            Estimator::DrGrpo,
            Estimator::Rloo,
            Estimator::ReinforcePP {
                group_baseline: true,
            },
        ] {
            let cfg = AdvantageConfig {
                estimator,
                drop_equal_reward_groups: true,
                ..Default::default()
            };
            let r = compute_advantages(&[a.clone(), b.clone()], &cfg);
            assert_eq!(r.dropped_groups, 0, "{estimator:?}");
            let (pa, pb) = (r.per_trajectory[0].unwrap(), r.per_trajectory[1].unwrap());
            assert!(pa > 0.0 && pb < 0.0, "{estimator:?}: {r:?}");
            assert_eq!(r.per_turn[0], Some(vec![pa; 2]), "{estimator:?}");
        }
    }

    /// Step groups: both episodes guessed first in the same (empty) state; A's first guess led
    /// to a win, B's to a loss, so A's first turn gains and B's loses, in addition to their
    /// episode advantages. Second turns were in different states and gain nothing.
    #[test]
    fn step_groups_compare_turns_taken_in_the_same_state() {
        let turn = |state: &str| one_token_turn(None, Some(state.into()));
        let a = Trajectory {
            transitions: vec![turn(""), turn("lower")],
            ..traj("a", "g", 1.0, Status::Finished)
        };
        let b = Trajectory {
            transitions: vec![turn(""), turn("higher")],
            ..traj("b", "g", 0.0, Status::Finished)
        };
        let cfg = AdvantageConfig {
            estimator: Estimator::DrGrpo,
            step_groups: Some(StepGroups {
                weight: 0.5,
                gamma: 1.0,
            }),
            ..Default::default()
        };
        let r = compute_advantages(&[a, b], &cfg);
        assert_eq!((r.step_groups, r.step_group_turns), (1, 2));
        assert_eq!(r.per_turn[0], Some(vec![0.5 + 0.25, 0.5]));
        assert_eq!(r.per_turn[1], Some(vec![-0.5 - 0.25, -0.5]));
    }

    /// With a critic the group step gives no advantage of its own (GAE replaces it) but
    /// still counts failures and drops equal-reward groups when asked.
    #[test]
    fn a_critic_gets_zero_group_advantages_and_the_same_accounting() {
        let ts = vec![
            traj("a", "g", 1.0, Status::Finished),
            traj("b", "g", 0.0, Status::Finished),
            traj("c", "g", 0.0, Status::Failed("x".into())),
            traj("d", "h", 1.0, Status::Finished),
            traj("e", "h", 1.0, Status::Finished),
        ];
        let cfg = AdvantageConfig {
            estimator: Estimator::Critic,
            drop_equal_reward_groups: true,
            ..Default::default()
        };
        let out = compute_advantages(&ts, &cfg);
        assert_eq!(
            out.per_trajectory,
            vec![Some(0.0), Some(0.0), None, None, None]
        );
        assert_eq!((out.failed_trajectories, out.dropped_groups), (1, 1));
    }

    /// Equal means exactly equal, and a group of one (or none) has nothing to differ from.
    #[test]
    fn rewards_are_all_equal_only_without_a_difference() {
        assert!(rewards_all_equal(&[]));
        assert!(rewards_all_equal(&[0.3]));
        assert!(rewards_all_equal(&[1.0, 1.0, 1.0]));
        assert!(!rewards_all_equal(&[1.0, 1.0, 0.0]));
        assert!(!rewards_all_equal(&[0.5, 0.5 + 1e-9]));
    }

    #[test]
    fn grpo_rloo_and_failures() {
        let ts = vec![
            traj("a", "g", 1.0, Status::Finished),
            traj("b", "g", 0.0, Status::Finished),
            traj("c", "g", 0.0, Status::Failed("env crashed".into())),
            traj("d", "h", 1.0, Status::Finished),
            traj("e", "h", 1.0, Status::Truncated),
        ];
        let cfg = AdvantageConfig {
            estimator: Estimator::DrGrpo,
            ..Default::default()
        };
        let r = compute_advantages(&ts, &cfg);
        assert_eq!(
            r.per_trajectory,
            vec![Some(0.5), Some(-0.5), None, Some(0.0), Some(0.0)]
        );
        assert_eq!(
            r.failed_trajectories, 1,
            "failed trajectories are excluded, not scored 0"
        );
        let rloo = compute_advantages(
            &ts,
            &AdvantageConfig {
                estimator: Estimator::Rloo,
                ..Default::default()
            },
        );
        assert_eq!(rloo.per_trajectory[0], Some(1.0));
        let grpo = compute_advantages(&ts, &AdvantageConfig::default());
        let std = (0.5f64).sqrt();
        assert!((grpo.per_trajectory[0].unwrap() - 0.5 / (std + 1e-6)).abs() < 1e-9);
        let dapo = compute_advantages(
            &ts,
            &AdvantageConfig {
                drop_equal_reward_groups: true,
                ..Default::default()
            },
        );
        assert_eq!((dapo.dropped_groups, dapo.dropped_trajectories), (1, 2));
        assert_eq!(dapo.per_trajectory[3], None);
        assert!(dapo.per_trajectory[0].is_some());
        let kept = compute_advantages(&ts, &AdvantageConfig::default());
        assert_eq!(kept.dropped_groups, 0, "dropping is opt-in");
    }

    #[test]
    fn rloo_uses_the_others_mean_and_gives_a_lone_member_zero() {
        let ts = vec![
            traj("a", "g", 3.0, Status::Finished),
            traj("b", "g", 1.0, Status::Finished),
            traj("c", "g", 2.0, Status::Finished),
            traj("d", "solo", 5.0, Status::Finished),
            traj(
                "e",
                "solo",
                0.0,
                Status::Failed("reward service down".into()),
            ),
        ];
        let cfg = AdvantageConfig {
            estimator: Estimator::Rloo,
            ..Default::default()
        };
        let r = compute_advantages(&ts, &cfg);
        // a: 3 - mean(1, 2) = 1.5
        assert!((r.per_trajectory[0].unwrap() - 1.5).abs() < 1e-12);
        assert!((r.per_trajectory[1].unwrap() + 1.5).abs() < 1e-12);
        assert_eq!(r.per_trajectory[3], Some(0.0));
        assert_eq!(r.per_trajectory[4], None);
        let dapo = compute_advantages(
            &ts,
            &AdvantageConfig {
                drop_equal_reward_groups: true,
                ..cfg
            },
        );
        assert_eq!(dapo.dropped_groups, 1, "a lone survivor has no spread");
        assert_eq!(dapo.per_trajectory[3], None);
    }

    #[test]
    fn grpo_without_std_is_dr_grpo_and_std_scales() {
        let ts: Vec<_> = [0.0, 2.0, 4.0]
            .iter()
            .enumerate()
            .map(|(i, &r)| traj(&format!("t{i}"), "g", r, Status::Finished))
            .collect();
        let plain = compute_advantages(
            &ts,
            &AdvantageConfig {
                estimator: Estimator::Grpo {
                    normalize_std: false,
                },
                ..Default::default()
            },
        );
        let dr = compute_advantages(
            &ts,
            &AdvantageConfig {
                estimator: Estimator::DrGrpo,
                ..Default::default()
            },
        );
        assert_eq!(plain, dr);
        assert_eq!(dr.per_trajectory[0], Some(-2.0));
        let std = compute_advantages(&ts, &AdvantageConfig::default());
        // sample std of (0, 2, 4) is 2
        assert!((std.per_trajectory[0].unwrap() + 1.0).abs() < 1e-6);
    }

    #[test]
    fn reinforce_pp_whitens_over_the_batch() {
        let ts: Vec<_> = (0..4)
            .map(|i| {
                traj(
                    &format!("t{i}"),
                    &format!("g{}", i / 2),
                    i as f64,
                    Status::Finished,
                )
            })
            .collect();
        let r = compute_advantages(
            &ts,
            &AdvantageConfig {
                estimator: Estimator::ReinforcePP {
                    group_baseline: false,
                },
                ..Default::default()
            },
        );
        let v: Vec<f64> = r.per_trajectory.iter().map(|a| a.unwrap()).collect();
        assert!(v.iter().sum::<f64>().abs() < 1e-9);
        assert!(v[3] > v[0]);
        // With the group baseline first, (0, 1) and (2, 3) both centre to (-0.5, 0.5): the
        // groups' offsets vanish before whitening.
        let b = compute_advantages(
            &ts,
            &AdvantageConfig {
                estimator: Estimator::ReinforcePP {
                    group_baseline: true,
                },
                ..Default::default()
            },
        );
        let w: Vec<f64> = b.per_trajectory.iter().map(|a| a.unwrap()).collect();
        assert!((w[0] - w[2]).abs() < 1e-12 && (w[1] - w[3]).abs() < 1e-12);
        assert!(w[0] < 0.0 && w[1] > 0.0);
        // unit sample variance after whitening
        let var = w.iter().map(|x| x * x).sum::<f64>() / 3.0;
        assert!((var - 1.0).abs() < 1e-4, "{var}");
    }

    /// REINFORCE++ whitens over loss tokens: right answers of 10 tokens and wrong ones of 30
    /// leave the trained tokens' advantages with mean 0, where whitening the four answers
    /// alike would push every token down (a token-weighted mean of -0.433).
    #[test]
    fn reinforce_pp_whitens_over_loss_tokens() {
        let answer = |i: usize, reward: f64, tokens: usize| Trajectory {
            transitions: vec![Transition {
                response: vec![2; tokens],
                loss_mask: vec![1; tokens],
                logprobs: vec![0.0; tokens],
                versions: vec![0; tokens],
                ..one_token_turn(None, None)
            }],
            ..traj(&format!("t{i}"), "g", reward, Status::Finished)
        };
        let ts = [
            answer(0, 1.0, 10),
            answer(1, 1.0, 10),
            answer(2, 0.0, 30),
            answer(3, 0.0, 30),
        ];
        let cfg = AdvantageConfig {
            estimator: Estimator::ReinforcePP {
                group_baseline: false,
            },
            ..Default::default()
        };
        let r = compute_advantages(&ts, &cfg);
        let v: Vec<f64> = r.per_trajectory.iter().map(|a| a.unwrap()).collect();
        // Over 80 tokens: mean 0.25, sample variance 15 / 79.
        let std = (15.0f64 / 79.0).sqrt() + 1e-6;
        assert!((v[0] - 0.75 / std).abs() < 1e-9, "{v:?}");
        assert!((v[2] + 0.25 / std).abs() < 1e-9, "{v:?}");
        let token_mean = (v[0] * 20.0 + v[2] * 60.0) / 80.0;
        assert!(token_mean.abs() < 1e-9, "{token_mean}");
        // Per turn, the same.
        let turns = compute_advantages(
            &ts,
            &AdvantageConfig {
                credit: Credit::Turn { gamma: 1.0 },
                ..cfg
            },
        );
        let per_turn: Vec<f64> = turns
            .per_turn
            .iter()
            .map(|a| a.as_ref().unwrap()[0])
            .collect();
        assert!(
            per_turn.iter().zip(&v).all(|(a, b)| (a - b).abs() < 1e-9),
            "{per_turn:?}"
        );
        // With the group baseline, a group of equal rewards keeps advantage 0 beside one that
        // differs, whatever its answers' lengths.
        let mut both = ts.to_vec();
        both.push(Trajectory {
            group: "h".into(),
            ..answer(4, 1.0, 5)
        });
        both.push(Trajectory {
            group: "h".into(),
            ..answer(5, 1.0, 40)
        });
        let b = compute_advantages(
            &both,
            &AdvantageConfig {
                estimator: Estimator::ReinforcePP {
                    group_baseline: true,
                },
                ..Default::default()
            },
        );
        assert_eq!(b.per_trajectory[4..], [Some(0.0), Some(0.0)]);
        assert!(b.per_trajectory[0].unwrap() > 0.0 && b.per_trajectory[2].unwrap() < 0.0);
    }

    #[test]
    fn gae_with_lambda_one_is_return_minus_value() {
        let (adv, ret) = gae(&[0.0, 0.0, 1.0], &[0.2, 0.5, 0.7], 1.0, 1.0);
        assert!((adv[0] - 0.8).abs() < 1e-12 && (adv[2] - 0.3).abs() < 1e-12);
        assert!(ret.iter().all(|r| (r - 1.0).abs() < 1e-12));
    }

    #[test]
    fn gae_matches_the_discounted_sum_of_td_errors() {
        let (r, v, g, l) = ([0.5, -1.0, 0.0, 2.0], [0.1, 0.4, -0.3, 0.8], 0.9, 0.95);
        let (adv, ret) = gae(&r, &v, g, l);
        let next = |t: usize| if t + 1 < v.len() { v[t + 1] } else { 0.0 };
        for t in 0..r.len() {
            let want: f64 = (t..r.len())
                .map(|u| (g * l).powi((u - t) as i32) * (r[u] + g * next(u) - v[u]))
                .sum();
            assert!((adv[t] - want).abs() < 1e-12, "t={t}");
            assert!((ret[t] - (want + v[t])).abs() < 1e-12);
        }
    }
}
