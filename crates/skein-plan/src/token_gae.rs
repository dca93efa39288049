//! Token-level GAE (PPO with a critic and `credit = "trajectory"`): every token a trajectory
//! sampled is one step of generalised advantage estimation, across all of its turns, whichever
//! rows the turns lie in.
//!
//! A trajectory is one episode, so it is estimated whole: its sampled tokens in turn order are
//! the actions, what each turn earned ([`crate::turn_rewards`]: its own reward, plus the final
//! score on the last turn) is received after the turn's last sampled token, and the value after
//! the trajectory's last sampled token is 0. Tokens the model did not sample (an environment's
//! reply inside a merged row, padding) are not actions: GAE steps over them and they get an
//! advantage of 0. Estimating each row on its own instead would treat every row of a step-wise
//! trajectory as a finished episode (an earlier turn would never see the final score) and walk
//! through inserted tokens as if they were actions, so the same episode would get different
//! advantages in the two layouts.

use crate::advantage::gae;
use crate::turn_gae::TurnPlace;

/// Token-level GAE of a batch's rows, per response token.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TokenGae {
    /// Per row, per response token: the token's advantage if it was sampled, 0 otherwise.
    pub advantages: Vec<Vec<f64>>,
    /// Per row, per response token: advantage + value where the token was sampled (the value
    /// loss's target there), the token's own value elsewhere (where the value loss does not
    /// train).
    pub returns: Vec<Vec<f64>>,
}

/// Token-level GAE of every trajectory of `places` ([`crate::turn_places`]: each trajectory's
/// turns in order, where they lie in the rows) over rows whose loss masks are `masks` and whose
/// critic values at each response token are `values`; `gamma` discounts per sampled token and
/// `lambda` mixes across them. A turn's reward goes on the last token sampled up to the end of
/// that turn; one earned before the trajectory's first sampled token has no action to credit.
pub fn token_gae_rows(
    places: &[Vec<TurnPlace>],
    masks: &[&[u8]],
    values: &[&[f64]],
    gamma: f64,
    lambda: f64,
) -> TokenGae {
    let mut out = TokenGae {
        advantages: masks.iter().map(|m| vec![0.0; m.len()]).collect(),
        returns: values.iter().map(|v| v.to_vec()).collect(),
    };
    for turns in places {
        let mut actions: Vec<(usize, usize)> = Vec::new();
        let mut rewards: Vec<f64> = Vec::new();
        for p in turns {
            let mask = masks[p.row];
            for x in p
                .span
                .clone()
                .filter(|&x| mask.get(x).is_some_and(|&m| m != 0))
            {
                actions.push((p.row, x));
                rewards.push(0.0);
            }
            if let Some(last) = rewards.last_mut() {
                *last += p.reward;
            }
        }
        let v: Vec<f64> = actions
            .iter()
            .map(|&(row, x)| values[row].get(x).copied().unwrap_or(0.0))
            .collect();
        let (adv, ret) = gae(&rewards, &v, gamma, lambda);
        for (&(row, x), (a, r)) in actions.iter().zip(adv.into_iter().zip(ret)) {
            out.advantages[row][x] = a;
            out.returns[row][x] = r;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(row: usize, span: std::ops::Range<usize>, reward: f64) -> TurnPlace {
        TurnPlace { row, span, reward }
    }

    /// Two turns in one merged row with an environment reply between them: the reply's tokens
    /// are stepped over, the first turn's reward lands on its last token, and with γ = λ = 1
    /// each sampled token's advantage is the rewards after it minus its value.
    #[test]
    fn a_merged_row_steps_over_inserted_tokens_and_keeps_turn_rewards() {
        let mask: &[u8] = &[1, 1, 0, 0, 1];
        let values: &[f64] = &[0.5, 0.25, 9.0, 9.0, 0.125];
        let turns = vec![vec![place(0, 0..2, 1.0), place(0, 4..5, 2.0)]];
        let g = token_gae_rows(&turns, &[mask], &[values], 1.0, 1.0);
        assert_eq!(g.advantages, vec![vec![2.5, 2.75, 0.0, 0.0, 1.875]]);
        assert_eq!(g.returns, vec![vec![3.0, 3.0, 9.0, 9.0, 2.0]]);
    }

    /// The same trajectory in a row per turn, rows in reverse order, gives the same
    /// advantages token for token: the first turn sees the second turn's reward.
    #[test]
    fn rows_per_turn_give_the_merged_row_s_advantages() {
        let (first, second): (&[u8], &[u8]) = (&[1, 1], &[1]);
        let (v1, v2): (&[f64], &[f64]) = (&[0.5, 0.25], &[0.125]);
        let turns = vec![vec![place(1, 0..2, 1.0), place(0, 0..1, 2.0)]];
        let g = token_gae_rows(&turns, &[second, first], &[v2, v1], 1.0, 1.0);
        assert_eq!(g.advantages, vec![vec![1.875], vec![2.5, 2.75]]);
    }

    /// A turn that sampled nothing passes its reward to the last token sampled before it; a
    /// reward before any sampled token credits nothing; λ = 0 gives one-step TD errors.
    #[test]
    fn rewards_of_turns_without_tokens_go_to_the_last_action_before_them() {
        let mask: &[u8] = &[0, 1, 0];
        let values: &[f64] = &[7.0, 0.5, 7.0];
        let turns = vec![vec![
            place(0, 0..1, 4.0),
            place(0, 1..2, 1.0),
            place(0, 2..3, 2.0),
        ]];
        let g = token_gae_rows(&turns, &[mask], &[values], 0.5, 0.0);
        assert_eq!(g.advantages, vec![vec![0.0, 2.5, 0.0]]);
        assert_eq!(g.returns, vec![vec![7.0, 3.0, 7.0]]);
    }
}
