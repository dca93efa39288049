//! Values for every response token (the critic at the step's start) and GAE advantages and
//! returns from them, one step per token or one per turn (`credit = "turn"`): the critic
//! path's part of preparing a batch.

use crate::model::ValueModel;
use crate::trainer::batch::TrainRow;
use crate::trainer::update::pack::{micro_batches, Batching};
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

/// GAE over each row's response tokens with the row's reward on its last token, then
/// advantages whitened ([`whiten`]).
pub fn apply_gae(rows: &mut [TrainRow], rewards: &[f64], gamma: f64, lambda: f64) {
    for (row, &reward) in rows.iter_mut().zip(rewards) {
        let n = row.loss_mask.len();
        let mut r = vec![0.0; n];
        if n > 0 {
            r[n - 1] = reward;
        }
        let values: Vec<f64> = row.old_values.iter().map(|&v| v as f64).collect();
        let (adv, ret) = skein_plan::gae(&r, &values, gamma, lambda);
        row.advantages = adv.iter().map(|&a| a as f32).collect();
        row.returns = ret.iter().map(|&x| x as f32).collect();
    }
    whiten(rows);
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
    let values: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| r.old_values.iter().map(|&v| v as f64).collect())
        .collect();
    let masks: Vec<&[u8]> = rows.iter().map(|r| &r.loss_mask[..]).collect();
    let values: Vec<&[f64]> = values.iter().map(|v| &v[..]).collect();
    let gae = skein_plan::turn_gae_rows(turns, &masks, &values, gamma, lambda);
    for (row, (adv, ret)) in rows.iter_mut().zip(gae.advantages.iter().zip(&gae.returns)) {
        row.advantages = adv.iter().map(|&a| a as f32).collect();
        row.returns = ret.iter().map(|&x| x as f32).collect();
    }
    let mut per_turn = gae.per_turn;
    if let Some((mean, std)) = whiten(rows) {
        for a in per_turn.iter_mut().flatten() {
            *a = (*a - mean) / std;
        }
    }
    per_turn
}

/// Whitens the advantages of the loss tokens of real rows over those tokens (padding rows have
/// weight 0 and are skipped, so they cannot shift the mean); every other token's advantage is
/// 0, as on the rows of the group estimators. Returns the mean and the scale it used, None
/// when there are fewer than two loss tokens to whiten over.
pub fn whiten(rows: &mut [TrainRow]) -> Option<(f64, f64)> {
    let real = |r: &&TrainRow| r.weight > 0.0;
    let (mut sum, mut sq, mut n) = (0.0f64, 0.0f64, 0.0f64);
    for r in rows.iter().filter(real) {
        for (a, &m) in r.advantages.iter().zip(&r.loss_mask) {
            if m > 0 {
                sum += *a as f64;
                sq += (*a as f64).powi(2);
                n += 1.0;
            }
        }
    }
    let scale = (n > 1.0).then(|| {
        let mean = sum / n;
        (mean, (sq / n - mean * mean).max(0.0).sqrt() + 1e-6)
    });
    for r in rows.iter_mut() {
        for (a, &m) in r.advantages.iter_mut().zip(&r.loss_mask) {
            *a = match (m, scale) {
                (0, _) => 0.0,
                (_, Some((mean, std))) => ((*a as f64 - mean) / std) as f32,
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
                weight: 0.5,
                ..Default::default()
            },
            TrainRow {
                loss_mask: vec![0],
                advantages: vec![9.0],
                ..Default::default()
            },
        ];
        let (mean, std) = whiten(&mut rows).unwrap();
        assert!((mean - 2.0).abs() < 1e-12 && (std - 1.0).abs() < 1e-5);
        let a = &rows[0].advantages;
        assert!((a[0] + 1.0).abs() < 1e-5 && a[1] == 0.0 && (a[2] - 1.0).abs() < 1e-5);
        assert_eq!(rows[1].advantages, vec![0.0]);
    }

    /// Turn-level GAE on a merged row of two turns (the numbers of
    /// `skein_plan::turn_gae`'s tests): values read at each turn's first sampled token, the
    /// turn's advantage on its tokens (whitened: 0.9 and 0.7 around 0.8 become ±1), its return
    /// at that one position, the old value elsewhere.
    #[test]
    fn turn_level_gae_fills_each_turn_and_its_one_target() {
        let mut rows = vec![TrainRow {
            loss_mask: vec![1, 1, 0, 1, 1],
            old_values: vec![0.1, 0.7, 0.9, 0.3, 0.8],
            weight: 0.1,
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
        assert!(
            close(&rows[0].advantages, &[1.0, 1.0, 0.0, -1.0, -1.0]),
            "{rows:?}"
        );
        assert!(
            close(&rows[0].returns, &[1.0, 0.7, 0.9, 1.0, 0.8]),
            "{rows:?}"
        );
        assert_eq!(per_turn.len(), 1);
        assert!((per_turn[0][0] - 1.0).abs() < 1e-4 && (per_turn[0][1] + 1.0).abs() < 1e-4);
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
            apply_gae(&mut rows, &[1.0, -1.0], 1.0, 1.0);
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
