//! Property tests of the planner and loss arithmetic over random batches, including one-row
//! batches, one giant trajectory, dp larger than the row count, and all-failed batches.

use proptest::prelude::*;
use skein_plan::*;
use std::collections::{HashMap, HashSet};

fn arb_rows() -> impl Strategy<Value = Vec<RowShape>> {
    // (group, turns, long-tail factor) per trajectory.
    prop::collection::vec(
        (
            0usize..6,
            1usize..5,
            prop::bool::weighted(0.1),
            1usize..200,
            1usize..300,
        ),
        1..40,
    )
    .prop_map(|ts| {
        let mut rows = Vec::new();
        for (t, (group, turns, giant, p, r)) in ts.into_iter().enumerate() {
            for k in 0..turns {
                let response = if giant { r * 20 } else { r } + k;
                rows.push(RowShape {
                    trajectory: t,
                    transition: Some(k),
                    group,
                    prompt_len: p + k,
                    response_len: response,
                    loss_tokens: response - response / 7,
                });
            }
        }
        rows
    })
}

fn arb_cfg() -> impl Strategy<Value = PlanConfig> {
    (
        1usize..10,
        1usize..6,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
        prop::option::of(1usize..12),
    )
        .prop_map(|(dp, m, group, equal, balanced, seed, pad)| PlanConfig {
            dp_size: dp,
            num_mini_batches: m,
            unit: if group { Unit::Group } else { Unit::Trajectory },
            equal_minibatch_rows: equal,
            token_balanced: balanced,
            seed,
            pad_multiple: pad,
            ..Default::default()
        })
}

fn unit_of(r: &RowShape, u: Unit) -> usize {
    match u {
        Unit::Trajectory => r.trajectory,
        Unit::Group => r.group,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn plan_invariants(rows in arb_rows(), cfg in arb_cfg()) {
        let p = plan(&rows, &cfg).unwrap();
        // 1. every real row exactly once
        let mut seen = vec![0usize; rows.len()];
        let mut pads = HashSet::new();
        for mb in &p.mini_batches {
            for s in mb.ranks.iter().flatten() {
                match s {
                    Slot::Real(i) => seen[*i] += 1,
                    Slot::Padding(id) => prop_assert!(pads.insert(*id), "padding ids are never shared"),
                }
            }
        }
        prop_assert!(seen.iter().all(|&n| n == 1));
        // 2. a unit lives in one mini-batch
        let mut home: HashMap<usize, usize> = HashMap::new();
        for (b, mb) in p.mini_batches.iter().enumerate() {
            for s in mb.ranks.iter().flatten() {
                if let Slot::Real(i) = s {
                    let u = unit_of(&rows[*i], cfg.unit);
                    prop_assert_eq!(*home.entry(u).or_insert(b), b);
                }
            }
        }
        // 3. equal rows per rank; equal mini-batches in the fixed-size mode; total multiple
        let sizes: Vec<usize> = p.mini_batches.iter().map(|mb| mb.ranks.iter().map(Vec::len).sum()).collect();
        for mb in &p.mini_batches {
            prop_assert_eq!(mb.ranks.len(), cfg.dp_size);
            prop_assert!(mb.ranks.iter().all(|r| r.len() == mb.ranks[0].len()));
        }
        if cfg.equal_minibatch_rows {
            prop_assert!(sizes.iter().all(|&s| s == sizes[0]));
        }
        if let Some(k) = cfg.pad_multiple {
            prop_assert_eq!(sizes.iter().sum::<usize>() % k, 0);
        }
        // 4. global counts are sums over the real rows
        for mb in &p.mini_batches {
            let real: Vec<&RowShape> = mb.ranks.iter().flatten().filter_map(|s| match s { Slot::Real(i) => Some(&rows[*i]), _ => None }).collect();
            prop_assert_eq!(mb.counts.rows, real.len());
            prop_assert_eq!(mb.counts.loss_tokens, real.iter().map(|r| r.loss_tokens).sum::<usize>());
            prop_assert_eq!(mb.counts.tokens, real.iter().map(|r| r.tokens()).sum::<usize>());
            prop_assert_eq!(mb.counts.trajectories, real.iter().map(|r| r.trajectory).collect::<HashSet<_>>().len());
            if !cfg.equal_minibatch_rows && cfg.pad_multiple.is_none() {
                prop_assert!(mb.padding_rows < cfg.dp_size, "at most dp-1 padding rows");
            }
        }
        // 5. near-equal unit counts
        if !cfg.token_balanced {
            let counts: Vec<usize> = p.mini_batches.iter().map(|mb| {
                mb.ranks.iter().flatten().filter_map(|s| match s { Slot::Real(i) => Some(unit_of(&rows[*i], cfg.unit)), _ => None }).collect::<HashSet<_>>().len()
            }).collect();
            prop_assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
        }
        // 7. deterministic
        prop_assert_eq!(plan(&rows, &cfg).unwrap(), p);
    }

    /// The loss is the same for any dp size, any micro-batch split and any padding.
    #[test]
    fn loss_does_not_depend_on_the_layout(rows in arb_rows(), seed in any::<u64>(), mode_i in 0usize..5, split in 1usize..6) {
        let mode = LossAggMode::ALL[mode_i];
        let losses: Vec<Vec<f64>> = rows.iter().enumerate().map(|(i, r)| (0..r.response_len).map(|k| ((i * 31 + k * 7) % 13) as f64 - 6.0).collect()).collect();
        let mask = |r: &RowShape| -> Vec<u8> { (0..r.response_len).map(|k| u8::from(k < r.loss_tokens)).collect() };
        let total = |dp: usize, pad: Option<usize>, equal: bool| -> Vec<f64> {
            let cfg = PlanConfig { dp_size: dp, num_mini_batches: 2, seed, pad_multiple: pad, equal_minibatch_rows: equal, ..Default::default() };
            let p = plan(&rows, &cfg).unwrap();
            p.mini_batches.iter().map(|mb| {
                let traj_tokens = mb.trajectory_loss_tokens(&rows);
                mb.ranks.iter().map(|rank| {
                    let row_losses: Vec<RowLoss> = rank.iter().map(|s| match s {
                        Slot::Real(i) => RowLoss { token_losses: losses[*i].clone(), mask: mask(&rows[*i]), trajectory_loss_tokens: traj_tokens[&rows[*i].trajectory], is_padding: false },
                        Slot::Padding(_) => RowLoss { token_losses: vec![100.0], mask: vec![0], trajectory_loss_tokens: 0, is_padding: true },
                    }).collect();
                    // Any micro-batch split of the rank's rows.
                    row_losses.chunks(split).map(|c| rank_contribution(mode, c, &mb.counts, 512)).sum::<f64>()
                }).sum::<f64>()
            }).collect()
        };
        let reference = total(1, None, false);
        for dp in [1, 2, 3, 4, 8] {
            for (pad, equal) in [(None, false), (Some(7), false), (None, true), (Some(5), true)] {
                let t = total(dp, pad, equal);
                // Units go to the same mini-batches for every dp (same seed), so compare per mini-batch.
                for (a, b) in reference.iter().zip(&t) {
                    prop_assert!((a - b).abs() <= 1e-9 * a.abs().max(1.0), "dp {} pad {:?} equal {}: {} vs {}", dp, pad, equal, a, b);
                }
            }
        }
    }
}

#[test]
fn an_all_failed_batch_is_an_error_not_a_fabricated_batch() {
    let e = plan(&[], &PlanConfig::default()).unwrap_err().to_string();
    assert!(e.contains("no real row"), "{e}");
}

#[test]
fn dp_larger_than_rows_and_one_giant_trajectory() {
    let rows = vec![RowShape {
        trajectory: 0,
        transition: Some(0),
        group: 0,
        prompt_len: 5,
        response_len: 100_000,
        loss_tokens: 100_000,
    }];
    let p = plan(
        &rows,
        &PlanConfig {
            dp_size: 8,
            num_mini_batches: 4,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(p.mini_batches.len(), 1, "one unit makes one mini-batch");
    assert_eq!(p.mini_batches[0].padding_rows, 7);
    assert!(p.mini_batches[0].ranks.iter().all(|r| r.len() == 1));
}

/// Normalising by a rank-local token count (the bug this crate exists to prevent) makes the
/// loss depend on the layout: the same batch gives different totals for dp 1 and dp 4.
#[test]
fn rank_local_normalisation_would_depend_on_dp() {
    let rows: Vec<RowShape> = (0..16)
        .map(|t| RowShape {
            trajectory: t,
            transition: Some(0),
            group: 0,
            prompt_len: 4,
            response_len: 1 + t * t,
            loss_tokens: 1 + t * t,
        })
        .collect();
    let local_total = |dp: usize| -> f64 {
        let p = plan(
            &rows,
            &PlanConfig {
                dp_size: dp,
                ..Default::default()
            },
        )
        .unwrap();
        p.mini_batches[0]
            .ranks
            .iter()
            .map(|rank| {
                let real: Vec<usize> = rank
                    .iter()
                    .filter_map(|s| match s {
                        Slot::Real(i) => Some(*i),
                        _ => None,
                    })
                    .collect();
                let local_tokens: usize = real.iter().map(|&i| rows[i].loss_tokens).sum();
                // mean over the rank's own tokens of a per-row constant loss (= row index), averaged over ranks
                real.iter()
                    .map(|&i| (i as f64) * rows[i].loss_tokens as f64)
                    .sum::<f64>()
                    / local_tokens.max(1) as f64
                    / dp as f64
            })
            .sum()
    };
    assert!(
        (local_total(1) - local_total(4)).abs() > 1e-3,
        "rank-local normalisation is layout-dependent"
    );
}

#[test]
fn karmarkar_karp_balances_long_tail_ranks_within_five_percent() {
    let mut s = 42u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let rows: Vec<RowShape> = (0..20_000)
        .map(|i| {
            let u = (next() % 10_000) as f64 / 10_000.0;
            let r = (32.0 / (1.0 - u * 0.995).powf(0.8)) as usize;
            RowShape {
                trajectory: i / 4,
                transition: Some(i % 4),
                group: i / 32,
                prompt_len: 64,
                response_len: r,
                loss_tokens: r,
            }
        })
        .collect();
    let cfg = PlanConfig {
        dp_size: 8,
        num_mini_batches: 4,
        ..Default::default()
    };
    let p = plan(&rows, &cfg).unwrap();
    assert_eq!(p.mini_batches.len(), 4);
    for mb in &p.mini_batches {
        let loads: Vec<u64> = mb
            .ranks
            .iter()
            .map(|r| {
                r.iter()
                    .map(|s| match s {
                        Slot::Real(i) => cfg.cost.cost(rows[*i].tokens()),
                        Slot::Padding(_) => cfg.cost.cost(PADDING_ROW_TOKENS),
                    })
                    .sum()
            })
            .collect();
        assert_eq!(loads, mb.rank_costs);
        let max = *loads.iter().max().unwrap() as f64;
        let mean = loads.iter().sum::<u64>() as f64 / loads.len() as f64;
        assert!(max / mean <= 1.05, "max/mean {}", max / mean);
        assert!((mb.imbalance() - max / mean).abs() < 1e-12);
        assert!(mb.padding_rows < 8);
    }
}

/// Trajectories with real token ids whose turns extend each other (so they can be merged).
fn arb_trajectories() -> impl Strategy<Value = Vec<Trajectory>> {
    prop::collection::vec(
        (
            0usize..4,
            0u8..3,
            prop::sample::select(vec![0u8, 0, 0, 1, 2]),
            prop::collection::vec(
                (
                    0usize..5,
                    0usize..40,
                    0usize..6,
                    prop::option::of(0u8..3),
                    prop::option::of(0u8..2),
                ),
                1..4,
            ),
        ),
        1..24,
    )
    .prop_map(|ts| {
        ts.into_iter()
            .enumerate()
            .map(|(i, (group, reward, status, turns))| {
                let mut context: Vec<u32> = vec![1, 2, 3];
                let mut transitions = Vec::new();
                for (k, (inserted, response, masked_out, own, state)) in
                    turns.into_iter().enumerate()
                {
                    context.extend((0..inserted as u32).map(|x| 1000 + x));
                    let resp: Vec<u32> = (0..response as u32).map(|x| 7 * x + k as u32).collect();
                    let mask: Vec<u8> = (0..response).map(|j| u8::from(j >= masked_out)).collect();
                    transitions.push(Transition {
                        prompt: context.clone(),
                        response: resp.clone(),
                        loss_mask: mask,
                        logprobs: vec![-0.5; response],
                        versions: vec![k as u64; response],
                        kept: Default::default(),
                        reward: own.map(|r| r as f64 * 0.5),
                        state: state.map(|s| format!("turn {k}, state {s}")),
                    });
                    context.extend(resp);
                }
                Trajectory {
                    id: format!("t{i}"),
                    group: format!("g{group}"),
                    transitions,
                    reward: reward as f64,
                    status: match status {
                        0 => Status::Finished,
                        1 => Status::Truncated,
                        _ => Status::Failed("env error".into()),
                    },
                }
            })
            .collect()
    })
}

fn arb_credit() -> impl Strategy<Value = Credit> {
    prop::sample::select(vec![
        Credit::Trajectory,
        Credit::Turn { gamma: 1.0 },
        Credit::Turn { gamma: 0.9 },
    ])
}

fn arb_estimator() -> impl Strategy<Value = Estimator> {
    prop::sample::select(vec![
        Estimator::Grpo {
            normalize_std: true,
        },
        Estimator::Grpo {
            normalize_std: false,
        },
        Estimator::DrGrpo,
        Estimator::Rloo,
        Estimator::ReinforcePP {
            group_baseline: false,
        },
        Estimator::ReinforcePP {
            group_baseline: true,
        },
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// From trajectories to a plan: failed trajectories are counted and make no row, advantages
    /// reach the rows unchanged, merged rows keep the stored tokens, and a batch with nothing
    /// left to train on is an error (invariant 6), including all-failed batches.
    #[test]
    fn pipeline_from_trajectories(
        mut trajs in arb_trajectories(),
        all_failed in prop::bool::weighted(0.15),
        estimator in arb_estimator(),
        credit in arb_credit(),
        steps in prop::option::of((0.0f64..2.0, 0.5f64..=1.0)),
        drop in any::<bool>(),
        merge in any::<bool>(),
        cfg in arb_cfg(),
    ) {
        if all_failed {
            for t in &mut trajs {
                t.status = Status::Failed("sandbox timeout".into());
            }
        }
        let step_groups = steps.map(|(weight, gamma)| StepGroups { weight, gamma });
        let adv = compute_advantages(&trajs, &AdvantageConfig { estimator, credit, step_groups, drop_equal_reward_groups: drop, eps: 1e-6 });
        let failed = trajs.iter().filter(|t| t.is_failed()).count();
        prop_assert_eq!(adv.failed_trajectories, failed);
        for (t, a) in trajs.iter().zip(&adv.per_trajectory) {
            if t.is_failed() {
                prop_assert!(a.is_none(), "failed trajectories get no advantage");
            }
        }
        if !drop {
            prop_assert_eq!(adv.dropped_groups, 0);
            prop_assert!(trajs.iter().zip(&adv.per_trajectory).all(|(t, a)| t.is_failed() || a.is_some()));
        }
        let mode = if merge { RowMode::Trajectory } else { RowMode::Transition };
        let rows = build_turn_rows(&trajs, &adv.per_turn, mode).unwrap();
        let live = adv.per_trajectory.iter().filter(|a| a.is_some()).count();
        let expected_rows: usize = trajs.iter().zip(&adv.per_trajectory)
            .filter(|(_, a)| a.is_some())
            .map(|(t, _)| if merge { 1 } else { t.transitions.len() })
            .sum();
        prop_assert_eq!(rows.len(), expected_rows);
        for r in &rows {
            let t = &trajs[r.shape.trajectory];
            // Each sampled token carries its own turn's advantage, inserted tokens none.
            let turns = adv.per_turn[r.shape.trajectory].as_ref().expect("a live trajectory");
            prop_assert_eq!(turns.len(), t.transitions.len());
            if credit == Credit::Trajectory && step_groups.is_none() {
                let a = adv.per_trajectory[r.shape.trajectory].unwrap();
                prop_assert!(turns.iter().all(|&x| x == a));
            }
            let segments: Vec<usize> = match r.shape.transition {
                Some(k) => vec![k],
                None => (0..t.transitions.len()).collect(),
            };
            let mut want = Vec::new();
            for (j, k) in segments.iter().enumerate() {
                let x = &t.transitions[*k];
                if j > 0 {
                    let prev = &t.transitions[k - 1];
                    want.extend(std::iter::repeat_n(0.0, x.prompt.len() - prev.prompt.len() - prev.response.len()));
                }
                want.extend(x.loss_mask.iter().map(|&m| if m != 0 { turns[*k] } else { 0.0 }));
            }
            prop_assert_eq!(&r.advantages, &want);
            prop_assert!(!r.is_padding());
            if merge {
                // Token-exact: the merged row is the last turn's full context.
                let last = t.transitions.last().unwrap();
                let seq: Vec<u32> = r.prompt.iter().chain(&r.response).copied().collect();
                let want: Vec<u32> = last.prompt.iter().chain(&last.response).copied().collect();
                prop_assert_eq!(seq, want);
                prop_assert_eq!(r.shape.loss_tokens, t.transitions.iter().map(|x| x.loss_tokens()).sum::<usize>());
            }
        }
        let shapes: Vec<RowShape> = rows.iter().map(|r| r.shape).collect();
        match plan(&shapes, &cfg) {
            Err(e) => {
                prop_assert_eq!(live, 0);
                prop_assert!(e.to_string().contains("no real row"), "{}", e);
            }
            Ok(p) => {
                prop_assert!(live > 0);
                let real: usize = p.mini_batches.iter().map(|m| m.counts.rows).sum();
                prop_assert_eq!(real, rows.len());
                let seqs: usize = p.mini_batches.iter().map(|m| m.counts.trajectories).sum();
                if cfg.unit == Unit::Trajectory || merge {
                    prop_assert_eq!(seqs, live, "each live trajectory counted once");
                }
                let (metrics, _) = plan_metrics(&p, &shapes);
                prop_assert_eq!(metrics.real_rows, rows.len());
                prop_assert_eq!(metrics.loss_tokens, p.mini_batches.iter().map(|m| m.counts.loss_tokens).sum::<usize>());
            }
        }
        if all_failed {
            prop_assert!(rows.is_empty());
        }
    }

    /// Group baselines centre every group; the result does not depend on the batch order.
    #[test]
    fn advantages_are_per_group_and_order_free(trajs in arb_trajectories(), estimator in arb_estimator(), seed in any::<u64>()) {
        let cfg = AdvantageConfig { estimator, ..Default::default() };
        let adv = compute_advantages(&trajs, &cfg);
        if matches!(estimator, Estimator::DrGrpo | Estimator::Grpo { .. } | Estimator::Rloo) {
            let mut sums: HashMap<&str, f64> = HashMap::new();
            for (t, a) in trajs.iter().zip(&adv.per_trajectory) {
                if let Some(a) = a {
                    *sums.entry(t.group.as_str()).or_default() += a;
                }
            }
            prop_assert!(sums.values().all(|s| s.abs() < 1e-9), "{:?}", sums);
        }
        // Reverse-and-rotate the batch: each trajectory keeps its advantage.
        let mut order: Vec<usize> = (0..trajs.len()).rev().collect();
        order.rotate_left((seed % trajs.len() as u64) as usize);
        let shuffled: Vec<Trajectory> = order.iter().map(|&i| trajs[i].clone()).collect();
        let again = compute_advantages(&shuffled, &cfg);
        for (j, &i) in order.iter().enumerate() {
            match (adv.per_trajectory[i], again.per_trajectory[j]) {
                (Some(a), Some(b)) => prop_assert!((a - b).abs() < 1e-9),
                (a, b) => prop_assert_eq!(a, b),
            }
        }
    }

    /// Turn credit: each turn's advantage is its discounted return against the same turn index
    /// of its group, so group baselines centre every turn index that two or more trajectories
    /// reached; one-turn trajectories without turn rewards get exactly the trajectory credit.
    #[test]
    fn turn_credit_centres_each_turn_index(trajs in arb_trajectories(), estimator in arb_estimator(), gamma in 0.5f64..=1.0) {
        let turn = AdvantageConfig { estimator, credit: Credit::Turn { gamma }, ..Default::default() };
        let adv = compute_advantages(&trajs, &turn);
        if matches!(estimator, Estimator::DrGrpo | Estimator::Grpo { .. } | Estimator::Rloo) {
            let mut by_index: HashMap<(&str, usize), Vec<f64>> = HashMap::new();
            for (t, a) in trajs.iter().zip(&adv.per_turn) {
                for (k, &x) in a.iter().flatten().enumerate() {
                    by_index.entry((t.group.as_str(), k)).or_default().push(x);
                }
            }
            for (key, xs) in &by_index {
                if xs.len() >= 2 {
                    prop_assert!(xs.iter().sum::<f64>().abs() < 1e-6, "{:?}: {:?}", key, xs);
                }
            }
        }
        for t in &trajs {
            let g = turn_returns(t, gamma);
            let last = t.transitions.len() - 1;
            let own = |k: usize| t.transitions[k].reward.unwrap_or(0.0);
            prop_assert!((g[last] - own(last) - t.reward).abs() < 1e-12);
            for k in 0..last {
                prop_assert!((g[k] - own(k) - gamma * g[k + 1]).abs() < 1e-9);
            }
        }
        let single: Vec<Trajectory> = trajs.iter().map(|t| {
            let mut t = t.clone();
            t.transitions.truncate(1);
            t.transitions[0].reward = None;
            t
        }).collect();
        let by_turn = compute_advantages(&single, &turn);
        let whole = compute_advantages(&single, &AdvantageConfig { estimator, ..Default::default() });
        for (a, b) in by_turn.per_turn.iter().zip(&whole.per_trajectory) {
            match (a, b) {
                (Some(a), Some(b)) => prop_assert!((a[0] - b).abs() < 1e-9, "{} vs {}", a[0], b),
                (a, b) => prop_assert_eq!(a.is_some(), b.is_some()),
            }
        }
    }

    /// Step groups add a step-relative advantage that is centred within each state of a group:
    /// per state, the turns' additions sum to zero, and turns without a state gain nothing.
    #[test]
    fn step_groups_add_advantages_centred_per_state(trajs in arb_trajectories(), estimator in arb_estimator(), weight in 0.1f64..2.0) {
        let plain = AdvantageConfig { estimator, ..Default::default() };
        let steps = AdvantageConfig { step_groups: Some(StepGroups { weight, gamma: 0.9 }), ..plain };
        let (a, b) = (compute_advantages(&trajs, &plain), compute_advantages(&trajs, &steps));
        let mut by_state: HashMap<(&str, &str), f64> = HashMap::new();
        let mut counted = HashMap::<(&str, &str), usize>::new();
        for (i, t) in trajs.iter().enumerate() {
            let (Some(x), Some(y)) = (&a.per_turn[i], &b.per_turn[i]) else {
                prop_assert_eq!(a.per_turn[i].is_some(), b.per_turn[i].is_some());
                continue;
            };
            for (k, tr) in t.transitions.iter().enumerate() {
                let added = y[k] - x[k];
                match &tr.state {
                    Some(s) => {
                        *by_state.entry((t.group.as_str(), s.as_str())).or_default() += added;
                        *counted.entry((t.group.as_str(), s.as_str())).or_default() += 1;
                    }
                    None => prop_assert_eq!(added, 0.0),
                }
            }
        }
        for (key, sum) in &by_state {
            prop_assert!(sum.abs() < 1e-6, "{:?}: {}", key, sum);
        }
        let shared = counted.values().filter(|&&n| n >= 2);
        prop_assert_eq!(b.step_groups, shared.clone().count());
        prop_assert_eq!(b.step_group_turns, shared.sum::<usize>());
    }
}

/// A critic's value at response token `j` of turn `k` of trajectory `i`: the same in every row
/// layout (inserted tokens get 100, which no turn may read).
fn value_at(i: usize, k: usize, j: usize, seed: u64) -> f64 {
    ((i * 31 + k * 7 + j * 3) as u64 + seed % 13) as f64 % 17.0 / 8.0 - 1.0
}

/// `trajs`' group advantages and rows in both layouts: merged, and a row per turn in reverse
/// order.
fn both_layouts(trajs: &[Trajectory]) -> (AdvantageResult, Vec<Row>, Vec<Row>) {
    let group = compute_advantages(trajs, &AdvantageConfig::default());
    let merged = build_turn_rows(trajs, &group.per_turn, RowMode::Trajectory).unwrap();
    let mut split = build_turn_rows(trajs, &group.per_turn, RowMode::Transition).unwrap();
    split.reverse();
    (group, merged, split)
}

/// [`value_at`] at every response token of `rows` (100 on inserted tokens).
fn critic_values(rows: &[Row], seed: u64) -> Vec<Vec<f64>> {
    rows.iter()
        .map(|r| {
            let mut v = vec![100.0; r.response.len()];
            let first = r.shape.transition.unwrap_or(0);
            for (j, span) in r.turn_spans.iter().enumerate() {
                for (x, at) in span.clone().enumerate() {
                    v[at] = value_at(r.shape.trajectory, first + j, x, seed);
                }
            }
            v
        })
        .collect()
}

/// Turn-level GAE of `rows` built from `trajs`, with [`value_at`] as the critic.
fn turn_gae_of(
    trajs: &[Trajectory],
    rows: &[Row],
    gamma: f64,
    lambda: f64,
    seed: u64,
) -> (Vec<Vec<TurnPlace>>, Vec<Vec<f64>>, TurnGae) {
    let places = turn_places(trajs, rows).unwrap();
    let values = critic_values(rows, seed);
    let masks: Vec<&[u8]> = rows.iter().map(|r| &r.loss_mask[..]).collect();
    let vals: Vec<&[f64]> = values.iter().map(|v| &v[..]).collect();
    let out = turn_gae_rows(&places, &masks, &vals, gamma, lambda);
    (places, values, out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Turn-level GAE (a critic with per-turn credit), on merged rows and on rows per turn in
    /// any order: each turn's advantage is on every token it sampled and nowhere else; both
    /// layouts give every turn the same advantage; the value is read and trained at the turn's
    /// first sampled token only; λ = 1 gives each turn its discounted return minus its value
    /// and λ = 0 its one-turn TD error; and the planner keeps a trajectory's rows, whichever
    /// layout, in one mini-batch.
    #[test]
    fn turn_gae_is_per_trajectory_in_both_layouts(
        trajs in arb_trajectories(),
        gamma in 0.5f64..=1.0,
        lambda in prop::sample::select(vec![0.0, 0.5, 0.95, 1.0]),
        seed in any::<u64>(),
        cfg in arb_cfg(),
    ) {
        let (group, merged, split) = both_layouts(&trajs);
        let mut per_layout = Vec::new();
        for rows in [&merged, &split] {
            let (places, values, g) = turn_gae_of(&trajs, rows, gamma, lambda, seed);
            // Each place is its turn's response, token for token.
            for (ti, turns) in places.iter().enumerate() {
                for (k, p) in turns.iter().enumerate() {
                    let x = &trajs[ti].transitions[k];
                    prop_assert_eq!(&rows[p.row].response[p.span.clone()], &x.response[..]);
                    prop_assert_eq!(&rows[p.row].loss_mask[p.span.clone()], &x.loss_mask[..]);
                }
            }
            // Every token a turn sampled carries the turn's advantage; every other token 0.
            let mut want: Vec<Vec<f64>> = rows.iter().map(|r| vec![0.0; r.response.len()]).collect();
            for (turns, adv) in places.iter().zip(&g.per_turn) {
                for (p, &a) in turns.iter().zip(adv) {
                    for x in p.span.clone().filter(|&x| rows[p.row].loss_mask[x] != 0) {
                        want[p.row][x] = a;
                    }
                }
            }
            prop_assert_eq!(&g.advantages, &want);
            // The value loss trains one position per turn that sampled a token; elsewhere the
            // return is the old value.
            for (i, r) in rows.iter().enumerate() {
                let vm = turn_value_mask(&r.loss_mask, &r.turn_spans);
                let sampled = r.turn_spans.iter().filter(|s| std::ops::Range::clone(s).any(|x| r.loss_mask[x] != 0)).count();
                prop_assert_eq!(vm.iter().filter(|&&m| m != 0).count(), sampled);
                for (x, &m) in vm.iter().enumerate() {
                    if m == 0 {
                        prop_assert_eq!(g.returns[i][x], values[i][x]);
                    }
                }
            }
            for (ti, (turns, adv)) in places.iter().zip(&g.per_turn).enumerate() {
                if turns.is_empty() {
                    prop_assert!(adv.is_empty());
                    prop_assert!(group.per_turn[ti].is_none(), "only an excluded trajectory has no rows");
                    continue;
                }
                let t = &trajs[ti];
                let value = |k: usize| turn_value_position(&rows[turns[k].row].loss_mask, &turns[k].span)
                    .map(|x| values[turns[k].row][x]);
                let returns = turn_returns(t, gamma);
                let rewards = turn_rewards(t);
                for k in 0..turns.len() {
                    let Some(v) = value(k) else {
                        // No sampled token, no value: the turn passes the later credit on.
                        let later = adv.get(k + 1).map_or(0.0, |a| gamma * lambda * a);
                        prop_assert!((adv[k] - later).abs() < 1e-9);
                        continue;
                    };
                    let at = turn_value_position(&rows[turns[k].row].loss_mask, &turns[k].span).unwrap();
                    prop_assert!((g.returns[turns[k].row][at] - (adv[k] + v)).abs() < 1e-9);
                    if lambda == 1.0 {
                        prop_assert!((adv[k] - (returns[k] - v)).abs() < 1e-9, "turn {}: {} vs {} - {}", k, adv[k], returns[k], v);
                    }
                    let next = if k + 1 == turns.len() { Some(0.0) } else { value(k + 1) };
                    if let (0.0, Some(next)) = (lambda, next) {
                        prop_assert!((adv[k] - (rewards[k] + gamma * next - v)).abs() < 1e-9);
                    }
                }
            }
            per_layout.push(g.per_turn);
        }
        prop_assert_eq!(per_layout[0].len(), per_layout[1].len());
        for (a, b) in per_layout[0].iter().zip(&per_layout[1]) {
            prop_assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(b) {
                prop_assert!((x - y).abs() < 1e-12, "{} vs {}", x, y);
            }
        }
        // The planner keeps each trajectory's rows in one mini-batch, in both layouts.
        for rows in [&merged, &split] {
            let shapes: Vec<RowShape> = rows.iter().map(|r| r.shape).collect();
            let Ok(p) = plan(&shapes, &cfg) else {
                prop_assert!(rows.is_empty());
                continue;
            };
            let mut mini_batch_of = HashMap::new();
            for (m, mb) in p.mini_batches.iter().enumerate() {
                for slot in mb.ranks.iter().flatten() {
                    if let Slot::Real(i) = slot {
                        mini_batch_of.insert(*i, m);
                    }
                }
            }
            for turns in turn_places(&trajs, rows).unwrap() {
                let mbs: HashSet<usize> = turns.iter().map(|p| mini_batch_of[&p.row]).collect();
                prop_assert!(mbs.len() <= 1, "a trajectory's turns in mini-batches {:?}", mbs);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Token-level GAE (a critic with per-trajectory credit), on merged rows and on rows per
    /// turn in any order: every token a turn sampled gets the same advantage and return in both
    /// layouts, every other token an advantage of 0 and its own value as return; with λ = 1 a
    /// sampled token's advantage is the rewards after it (each turn's on its last sampled token,
    /// discounted per sampled token) minus its value, so an early turn sees the final score.
    #[test]
    fn token_gae_is_per_trajectory_in_both_layouts(
        trajs in arb_trajectories(),
        gamma in 0.5f64..=1.0,
        lambda in prop::sample::select(vec![0.0, 0.5, 0.95, 1.0]),
        seed in any::<u64>(),
    ) {
        let (_, merged, split) = both_layouts(&trajs);
        // Per layout: each trajectory's (advantage, return) of every token of every turn.
        let mut per_layout = Vec::new();
        for rows in [&merged, &split] {
            let places = turn_places(&trajs, rows).unwrap();
            let values = critic_values(rows, seed);
            let masks: Vec<&[u8]> = rows.iter().map(|r| &r.loss_mask[..]).collect();
            let vals: Vec<&[f64]> = values.iter().map(|v| &v[..]).collect();
            let g = token_gae_rows(&places, &masks, &vals, gamma, lambda);
            for (i, r) in rows.iter().enumerate() {
                for (x, &m) in r.loss_mask.iter().enumerate() {
                    if m == 0 {
                        prop_assert_eq!(g.advantages[i][x], 0.0);
                        prop_assert_eq!(g.returns[i][x], values[i][x]);
                    }
                }
            }
            let mut by_token = Vec::new();
            for (ti, turns) in places.iter().enumerate() {
                let rewards = turn_rewards(&trajs[ti]);
                // (advantage, value, reward received after it) of each sampled token in order.
                let mut steps: Vec<(f64, f64, f64)> = Vec::new();
                let mut tokens = Vec::new();
                for (k, p) in turns.iter().enumerate() {
                    for x in p.span.clone() {
                        let sampled = rows[p.row].loss_mask[x] != 0;
                        tokens.push((g.advantages[p.row][x], g.returns[p.row][x], sampled));
                        if sampled {
                            steps.push((g.advantages[p.row][x], values[p.row][x], 0.0));
                        }
                    }
                    if let Some(last) = steps.last_mut() {
                        last.2 += rewards[k];
                    }
                }
                if lambda == 1.0 {
                    let mut to_go = 0.0;
                    for &(a, v, r) in steps.iter().rev() {
                        to_go = r + gamma * to_go;
                        prop_assert!((a - (to_go - v)).abs() < 1e-9, "{} vs {} - {}", a, to_go, v);
                    }
                }
                by_token.push(tokens);
            }
            per_layout.push(by_token);
        }
        prop_assert_eq!(per_layout[0].len(), per_layout[1].len());
        for (a, b) in per_layout[0].iter().zip(&per_layout[1]) {
            prop_assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(b) {
                prop_assert_eq!(x.2, y.2);
                prop_assert!((x.0 - y.0).abs() < 1e-12 && (x.1 - y.1).abs() < 1e-12, "{:?} vs {:?}", x, y);
            }
        }
    }
}
