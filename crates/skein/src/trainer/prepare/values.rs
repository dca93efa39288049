//! Values for every response token (the critic at the step's start) and GAE advantages and
//! returns from them, one step per token or one per turn (`credit = "turn"`): the critic
//! path's part of preparing a batch.

use crate::model::ValueModel;
use crate::trainer::batch::TrainRow;
use crate::trainer::config::Batching;
use crate::trainer::update::pack::micro_batches;
use crate::trainer::update::tensors::MicroBatch;

/// Fills every row's `old_values`: V(s) at the position that predicts each response token.
pub fn compute_values(critic: &ValueModel, rows: &mut [TrainRow], batching: &Batching) {
    let all: Vec<usize> = (0..rows.len()).collect();
    tch::no_grad(|| {
        for plan in micro_batches(rows, &all, batching) {
            let mb = MicroBatch::new(rows, &plan, critic.vs.device());
            let batch: Vec<&TrainRow> = plan.rows.iter().map(|&i| &rows[i]).collect();
            let per_row = mb.response_values(&mb.values(critic), &batch);
            for (&i, v) in plan.rows.iter().zip(per_row) {
                rows[i].old_values = v;
            }
        }
    });
}

/// Token-level GAE ([`skein_plan::token_gae_rows`]) of each trajectory's sampled tokens, across
/// its turns wherever they lie in `rows` (`turns`), then advantages whitened ([`whiten`]).
pub fn apply_gae(
    rows: &mut [TrainRow],
    turns: &[Vec<skein_plan::TurnPlace>],
    gamma: f64,
    lambda: f64,
) {
    let values = old_values(rows);
    let masks: Vec<&[u8]> = rows.iter().map(|r| &r.loss_mask[..]).collect();
    let values: Vec<&[f64]> = values.iter().map(|v| &v[..]).collect();
    let gae = skein_plan::token_gae_rows(turns, &masks, &values, gamma, lambda);
    set_gae(rows, &gae.advantages, &gae.returns);
    whiten(rows);
}

/// Every row's `old_values` in f64, GAE's input.
fn old_values(rows: &[TrainRow]) -> Vec<Vec<f64>> {
    rows.iter()
        .map(|r| r.old_values.iter().map(|&v| v as f64).collect())
        .collect()
}

/// Sets every row's advantages and returns from GAE's (before whitening).
fn set_gae(rows: &mut [TrainRow], advantages: &[Vec<f64>], returns: &[Vec<f64>]) {
    for (row, (adv, ret)) in rows.iter_mut().zip(advantages.iter().zip(returns)) {
        row.advantages = adv.iter().map(|&a| a as f32).collect();
        row.returns = ret.iter().map(|&x| x as f32).collect();
    }
}

/// Turn-level GAE ([`skein_plan::turn_gae_rows`]) of each trajectory's turns (`turns`, where
/// they lie in `rows`): each turn's value is the critic's at its first sampled token, its
/// advantage goes on every token it sampled and its return is the value target at that one
/// position (the rows' `value_mask`, set when the batch was built). The advantages are then
/// whitened as token-level GAE's ([`whiten`]). Returns each trajectory's turn advantages as
/// trained (whitened).
pub fn apply_turn_gae(
    rows: &mut [TrainRow],
    turns: &[Vec<skein_plan::TurnPlace>],
    gamma: f64,
    lambda: f64,
) -> Vec<Vec<f64>> {
    let values = old_values(rows);
    let masks: Vec<&[u8]> = rows.iter().map(|r| &r.loss_mask[..]).collect();
    let values: Vec<&[f64]> = values.iter().map(|v| &v[..]).collect();
    let gae = skein_plan::turn_gae_rows(turns, &masks, &values, gamma, lambda);
    set_gae(rows, &gae.advantages, &gae.returns);
    let mut per_turn = gae.per_turn;
    if let Some((mean, std)) = whiten(rows) {
        for a in per_turn.iter_mut().flatten() {
            *a = (*a - mean) / std;
        }
    }
    per_turn
}

/// Whitens the advantages of the loss tokens of real rows over those tokens
/// ([`skein_plan::Moments`]: sample standard deviation, as the group estimators'; padding rows
/// have weight 0 and are skipped, so they cannot shift the mean); every other token's
/// advantage is 0, as on the rows of the group estimators. Returns the mean and the scale it
/// used, None when there are fewer than two loss tokens to whiten over.
pub fn whiten(rows: &mut [TrainRow]) -> Option<(f64, f64)> {
    const EPS: f64 = 1e-6;
    let loss_advantages = rows.iter().filter(|r| r.loss_weight > 0.0).flat_map(|r| {
        r.advantages
            .iter()
            .zip(&r.loss_mask)
            .filter(|(_, &m)| m > 0)
            .map(|(&a, _)| a as f64)
    });
    let m = skein_plan::Moments::of(loss_advantages);
    let scale = (m.n > 1).then_some((m.mean, m.std + EPS));
    for r in rows.iter_mut() {
        for (a, &mask) in r.advantages.iter_mut().zip(&r.loss_mask) {
            *a = match (mask, scale) {
                (0, _) => 0.0,
                (_, Some(_)) => m.whiten(*a as f64, EPS) as f32,
                (_, None) => *a,
            };
        }
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Model, ModelConfig};
    use crate::trainer::batch::RowPlan;
    use crate::trainer::update::critic::ValueLossConfig;
    use crate::trainer::update::critic_update;
    use crate::trainer::update::optim::{OptimConfig, Optimizer};
    use crate::trainer::update::ranks::Replicas;
    use tch::Device;

    fn row(tokens: Vec<u32>, prompt_len: usize) -> TrainRow {
        let n = tokens.len() - prompt_len;
        TrainRow::sampled(tokens, prompt_len, 1.0 / (2 * n) as f64)
    }

    /// Whitening is over the loss tokens of real rows; inserted tokens and padding rows keep
    /// an advantage of 0 and shift nothing.
    #[test]
    fn whitening_leaves_tokens_outside_the_loss_at_zero() {
        let mut rows = vec![
            TrainRow {
                loss_mask: vec![1, 0, 1],
                advantages: vec![1.0, 5.0, 3.0],
                loss_weight: 0.5,
                ..Default::default()
            },
            TrainRow {
                loss_mask: vec![0],
                advantages: vec![9.0],
                ..Default::default()
            },
        ];
        // 1 and 3: mean 2, sample standard deviation √2 (the convention of skein_plan::Moments).
        let (mean, std) = whiten(&mut rows).unwrap();
        let root2 = 2f64.sqrt();
        assert!(
            (mean - 2.0).abs() < 1e-12 && (std - root2).abs() < 1e-5,
            "{std}"
        );
        let a = &rows[0].advantages;
        let third = (1.0 / root2) as f32;
        assert!((a[0] + third).abs() < 1e-5 && a[1] == 0.0 && (a[2] - third).abs() < 1e-5);
        assert_eq!(rows[1].advantages, vec![0.0]);
    }

    /// Turn-level GAE on a merged row of two turns (the numbers of
    /// `skein_plan::turn_gae`'s tests): values read at each turn's first sampled token, the
    /// turn's advantage on its tokens (whitened: 0.9, 0.9, 0.7 and 0.7 around 0.8, sample standard
    /// deviation 0.1·√(4/3), become ±√3/2), its return
    /// at that one position, the old value elsewhere.
    #[test]
    fn turn_level_gae_fills_each_turn_and_its_one_target() {
        let mut rows = vec![TrainRow {
            loss_mask: vec![1, 1, 0, 1, 1],
            old_values: vec![0.1, 0.7, 0.9, 0.3, 0.8],
            loss_weight: 0.1,
            ..Default::default()
        }];
        let place = |span, reward| skein_plan::TurnPlace {
            row: 0,
            span,
            reward,
        };
        let turns = vec![vec![place(0..2, 0.5), place(3..5, 1.0)]];
        let per_turn = apply_turn_gae(&mut rows, &turns, 0.5, 1.0);
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-4);
        let h = 3f32.sqrt() / 2.0;
        assert!(close(&rows[0].advantages, &[h, h, 0.0, -h, -h]), "{rows:?}");
        assert!(
            close(&rows[0].returns, &[1.0, 0.7, 0.9, 1.0, 0.8]),
            "{rows:?}"
        );
        assert_eq!(per_turn.len(), 1);
        let h = h as f64;
        assert!((per_turn[0][0] - h).abs() < 1e-4 && (per_turn[0][1] + h).abs() < 1e-4);
    }

    /// One episode of two turns, once in a merged row (its second prompt extends the first
    /// with an environment token) and once in a row per turn: token-level GAE gives its
    /// sampled tokens the same advantages and returns in both layouts, the first turn sees the
    /// final score, and the inserted token is no action.
    #[test]
    fn token_level_gae_is_the_same_in_both_row_layouts() {
        use crate::trainer::batch::{build_step_batch, StepBatchConfig};
        use crate::trainer::config::Estimator;
        use skein_plan::{Status, Trajectory, Transition};
        let turn = |prompt: Vec<u32>, response: Vec<u32>, reward| Transition {
            loss_mask: vec![1; response.len()],
            logprobs: vec![0.0; response.len()],
            versions: vec![0; response.len()],
            kept: Default::default(),
            prompt,
            response,
            reward,
            state: None,
        };
        let merged = Trajectory {
            id: "merged".into(),
            group: "g".into(),
            transitions: vec![
                turn(vec![1, 2], vec![3, 4], Some(0.5)),
                turn(vec![1, 2, 3, 4, 9], vec![5], None),
            ],
            reward: 1.0,
            status: Status::Finished,
        };
        let mut split = merged.clone();
        split.id = "split".into();
        split.transitions[1].prompt = vec![7, 9];
        let mut cfg = crate::trainer::TrainConfig::default();
        cfg.algorithm.estimator = Estimator::Gae;
        let trajs = [merged, split];
        let mut batch =
            build_step_batch(&trajs, &StepBatchConfig::from_config(&cfg, 8), 1).unwrap();
        assert_eq!(batch.real_rows, 3, "one merged row and a row per turn");
        for row in batch.rows.iter_mut() {
            row.old_values = vec![0.25; row.loss_mask.len()];
        }
        apply_gae(&mut batch.rows, &batch.turns, 1.0, 1.0);
        let tokens = |t: usize| -> Vec<(f32, f32)> {
            let mut out = Vec::new();
            for p in &batch.turns[t] {
                let row = &batch.rows[p.row];
                for x in p.span.clone() {
                    out.push((row.advantages[x], row.returns[x]));
                }
            }
            out
        };
        let (a, b) = (tokens(0), tokens(1));
        // With γ = λ = 1 a token's return is every reward after it: the first turn's own 0.5
        // and the final score 1 for the first turn's tokens, 1 for the second turn's.
        for (x, want) in a.iter().chain(&b).zip([1.5, 1.5, 1.0, 1.5, 1.5, 1.0]) {
            assert!((x.1 - want).abs() < 1e-6, "{a:?} {b:?}");
        }
        for (x, y) in a.iter().zip(&b) {
            assert!((x.0 - y.0).abs() < 1e-5, "{a:?} vs {b:?}");
        }
        let merged_row = &batch.rows[batch.turns[0][0].row];
        assert_eq!(merged_row.loss_mask, vec![1, 1, 0, 1]);
        assert_eq!(
            merged_row.advantages[2], 0.0,
            "the environment's token is no action"
        );
    }

    /// The critic starts at 0 (zero head) and learns the returns of a fixed batch; GAE with
    /// γ = λ = 1 gives every token the final reward as its return.
    #[test]
    fn critic_learns_the_returns_and_gae_broadcasts_the_reward() {
        let cfg = ModelConfig::tiny_qwen2(16, 32, 1, 2, 2, 64, 32);
        let policy = Model::random(&cfg, Device::Cpu, 3).unwrap();
        let critic = ValueModel::from_policy(&policy, Device::Cpu).unwrap();
        let mut opt = Optimizer::new(
            &critic.vs,
            &OptimConfig {
                lr: 1e-2,
                ..Default::default()
            },
            100,
        )
        .unwrap();
        let mut rows = vec![row(vec![1, 2, 3, 4, 5], 2), row(vec![1, 6, 7, 8, 9], 2)];
        let plan: RowPlan = vec![vec![vec![0, 1]]];
        let mut losses = Vec::new();
        for _ in 0..30 {
            compute_values(&critic, &mut rows, &Batching::padded(1024));
            let place = |row, reward| skein_plan::TurnPlace {
                row,
                span: 0..3,
                reward,
            };
            apply_gae(
                &mut rows,
                &[vec![place(0, 1.0)], vec![place(1, -1.0)]],
                1.0,
                1.0,
            );
            let cfg = ValueLossConfig {
                clip: 10.0,
                epochs: 1,
                batching: Batching::padded(1024),
                activation_checkpointing: false,
            };
            let mut one_rank = Replicas::new(&critic, 1).unwrap();
            let stats = critic_update(&critic, &mut one_rank, &mut opt, &rows, &plan, &cfg);
            losses.push(stats.unwrap().loss);
        }
        assert_eq!(rows[0].returns.len(), 3);
        assert!(
            rows[0].returns.iter().all(|r| (r - 1.0).abs() < 1e-5),
            "{:?}",
            rows[0].returns
        );
        assert!(rows[1].returns.iter().all(|r| (r + 1.0).abs() < 1e-5));
        assert!(
            losses[0] > 0.4,
            "zero-initialised values against returns of ±1: {}",
            losses[0]
        );
        assert!(*losses.last().unwrap() < 0.1 * losses[0], "{losses:?}");
    }
}
