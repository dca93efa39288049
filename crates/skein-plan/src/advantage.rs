//! Advantage estimators, computed on whole groups before anything is reordered, dropped or
//! padded. Failed trajectories are excluded (and counted), never given reward 0.

use crate::data::Trajectory;
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
    /// REINFORCE++: rewards (minus the group mean with `group_baseline`) whitened over the batch.
    ReinforcePP { group_baseline: bool },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdvantageConfig {
    pub estimator: Estimator,
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
            drop_equal_reward_groups: false,
            eps: 1e-6,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct AdvantageResult {
    /// One per trajectory; None = excluded (failed, or its group was dropped).
    pub per_trajectory: Vec<Option<f64>>,
    pub dropped_groups: usize,
    pub dropped_trajectories: usize,
    pub failed_trajectories: usize,
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
    for members in groups {
        let rewards: Vec<f64> = members.iter().map(|&i| trajs[i].reward).collect();
        let all_equal = rewards.iter().all(|&r| r == rewards[0]);
        if cfg.drop_equal_reward_groups && all_equal {
            out.dropped_groups += 1;
            out.dropped_trajectories += members.len();
            continue;
        }
        let n = rewards.len() as f64;
        let mean = rewards.iter().sum::<f64>() / n;
        let std = if rewards.len() > 1 {
            (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        for (&i, &r) in members.iter().zip(&rewards) {
            let a = match cfg.estimator {
                Estimator::Grpo {
                    normalize_std: true,
                } => (r - mean) / (std + cfg.eps),
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
            };
            out.per_trajectory[i] = Some(a);
            kept.push(i);
        }
    }
    if let Estimator::ReinforcePP { .. } = cfg.estimator {
        whiten(&mut out.per_trajectory, &kept, cfg.eps);
    }
    out
}

fn whiten(values: &mut [Option<f64>], idx: &[usize], eps: f64) {
    if idx.len() < 2 {
        for &i in idx {
            values[i] = Some(0.0);
        }
        return;
    }
    let n = idx.len() as f64;
    let mean = idx.iter().filter_map(|&i| values[i]).sum::<f64>() / n;
    let var = idx
        .iter()
        .filter_map(|&i| values[i])
        .map(|v| (v - mean).powi(2))
        .sum::<f64>()
        / (n - 1.0);
    for &i in idx {
        values[i] = values[i].map(|v| (v - mean) / (var.sqrt() + eps));
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
                reward: None,
            }],
            reward,
            status,
        }
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
