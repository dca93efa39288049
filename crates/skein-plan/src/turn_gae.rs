//! Turn-level GAE (PPO with a critic and `credit = "turn"`): each turn of a trajectory is one
//! step of generalised advantage estimation instead of each token. A turn's reward is what it
//! earned ([`turn_rewards`]), its value is the critic's value of the state it was written in,
//! discounting is per turn and λ mixes across turns. The turn's advantage goes on every token it
//! sampled, and its return is the critic's target at the one position its value was read at.
//!
//! Where a turn's value is read: at the position that predicts the turn's first sampled token.
//! That position has seen exactly the context the turn was written in (the prompt, the earlier
//! turns and the environment's replies) and none of the turn's own tokens, so its value is the
//! state's, V(s_k). A later position of the turn, the last token's for instance, has already
//! read most of the turn's own message: its value estimates the return of this message
//! (nearer Q(s_k, a_k)), and subtracting it from that same turn's return would take the
//! message's own merit out of its advantage (a baseline must not depend on the action it
//! judges). Reading one position per turn also means the critic is trained at that position
//! only: the other positions' values are never used, so they get no target.
//!
//! Both row layouts hold the same turns: a merged row holds every turn of its trajectory, its
//! spans ([`crate::Row::turn_spans`]) saying where each lies; a row per transition holds one.
//! [`turn_places`] finds every turn of every trajectory in the rows, in order, so a trajectory
//! is always estimated whole, whichever layout and order its rows are in.

use crate::advantage::{gae, turn_rewards};
use crate::data::Trajectory;
use crate::error::{err, PlanError};
use crate::rows::Row;
use std::ops::Range;

/// Turn-level GAE over one trajectory's turns: `rewards[k]` what turn k earned, `values[k]` the
/// critic's value of the state it was written in, `gamma` the discount per turn and `lambda`
/// the mix across turns; the value after the last turn is 0. Returns each turn's advantage and
/// return (advantage + value). A turn with no value (it sampled no token, so there is no
/// position to read one at) makes no estimate of its own: its value is taken as its reward plus
/// the discounted value after it, so its TD error is 0 and it passes the later turns' credit
/// on.
pub fn turn_gae(
    rewards: &[f64],
    values: &[Option<f64>],
    gamma: f64,
    lambda: f64,
) -> (Vec<f64>, Vec<f64>) {
    let mut filled = vec![0.0; rewards.len()];
    let mut next = 0.0;
    for k in (0..rewards.len()).rev() {
        let v = values.get(k).copied().flatten();
        filled[k] = v.unwrap_or(rewards[k] + gamma * next);
        next = filled[k];
    }
    gae(rewards, &filled, gamma, lambda)
}

/// The position (in a row's response) where turn-level GAE reads the value of the turn at
/// `span` and trains its return: the turn's first sampled token, whose predicting position
/// has seen the turn's context and none of its own tokens. None if the turn sampled nothing.
pub fn turn_value_position(loss_mask: &[u8], span: &Range<usize>) -> Option<usize> {
    span.clone()
        .find(|&j| loss_mask.get(j).is_some_and(|&m| m != 0))
}

/// Per response token of a row: 1 at the value position of each turn it holds
/// ([`turn_value_position`]), 0 elsewhere. The value loss of turn-level GAE trains these
/// positions only.
pub fn turn_value_mask(loss_mask: &[u8], turn_spans: &[Range<usize>]) -> Vec<u8> {
    let mut mask = vec![0u8; loss_mask.len()];
    for span in turn_spans {
        if let Some(j) = turn_value_position(loss_mask, span) {
            mask[j] = 1;
        }
    }
    mask
}

/// One turn of a trajectory where it lies in the rows.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnPlace {
    /// Index of the row that holds it.
    pub row: usize,
    /// Its response's span in that row's response.
    pub span: Range<usize>,
    /// What it earned ([`turn_rewards`]).
    pub reward: f64,
}

/// The turns of each trajectory of `trajs` (same index) in turn order, located in `rows`
/// (built from `trajs` by [`crate::build_turn_rows`], in any order, padding rows anywhere). A
/// trajectory without rows has none. An error if a trajectory's rows do not hold each of its
/// turns exactly once.
pub fn turn_places(trajs: &[Trajectory], rows: &[Row]) -> Result<Vec<Vec<TurnPlace>>, PlanError> {
    let mut found: Vec<Vec<(usize, TurnPlace)>> = vec![Vec::new(); trajs.len()];
    for (i, r) in rows.iter().enumerate().filter(|(_, r)| !r.is_padding()) {
        let ti = r.shape.trajectory;
        let Some(t) = trajs.get(ti) else {
            return err(format!(
                "row {i} is of trajectory {ti}, but there are {}",
                trajs.len()
            ));
        };
        let rewards = turn_rewards(t);
        let first = r.shape.transition.unwrap_or(0);
        for (j, span) in r.turn_spans.iter().enumerate() {
            let k = first + j;
            let Some(&reward) = rewards.get(k) else {
                return err(format!(
                    "row {i} holds turn {k} of trajectory `{}`, which has {}",
                    t.id,
                    rewards.len()
                ));
            };
            let place = TurnPlace {
                row: i,
                span: span.clone(),
                reward,
            };
            found[ti].push((k, place));
        }
    }
    let mut out = Vec::with_capacity(trajs.len());
    for (t, mut turns) in trajs.iter().zip(found) {
        turns.sort_by_key(|(k, _)| *k);
        let complete = turns.iter().enumerate().all(|(j, (k, _))| j == *k);
        if !turns.is_empty() && (!complete || turns.len() != t.transitions.len()) {
            return err(format!(
                "trajectory `{}`: its rows hold turns {:?} of its {}",
                t.id,
                turns.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                t.transitions.len()
            ));
        }
        out.push(turns.into_iter().map(|(_, p)| p).collect());
    }
    Ok(out)
}

/// Turn-level GAE of a batch's rows, per token.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TurnGae {
    /// Per row, per response token: its turn's advantage on each token the turn sampled, 0 on
    /// every other token (inserted text, padding).
    pub advantages: Vec<Vec<f64>>,
    /// Per row, per response token: its turn's return at the turn's value position
    /// ([`turn_value_position`]), the token's own value elsewhere (where the value loss does
    /// not train).
    pub returns: Vec<Vec<f64>>,
    /// Per trajectory (as in `places`): each turn's advantage.
    pub per_turn: Vec<Vec<f64>>,
}

/// Turn-level GAE ([`turn_gae`]) of every trajectory of `places` ([`turn_places`]) over rows
/// whose loss masks are `masks` and whose critic values at each response token are `values`:
/// each turn's value is read at its value position, discounting is `gamma` per turn and
/// `lambda` mixes across turns.
pub fn turn_gae_rows(
    places: &[Vec<TurnPlace>],
    masks: &[&[u8]],
    values: &[&[f64]],
    gamma: f64,
    lambda: f64,
) -> TurnGae {
    let mut out = TurnGae {
        advantages: masks.iter().map(|m| vec![0.0; m.len()]).collect(),
        returns: values.iter().map(|v| v.to_vec()).collect(),
        per_turn: Vec::with_capacity(places.len()),
    };
    for turns in places {
        let at: Vec<Option<usize>> = turns
            .iter()
            .map(|p| turn_value_position(masks[p.row], &p.span))
            .collect();
        let rewards: Vec<f64> = turns.iter().map(|p| p.reward).collect();
        let v: Vec<Option<f64>> = turns
            .iter()
            .zip(&at)
            .map(|(p, j)| j.and_then(|j| values[p.row].get(j).copied()))
            .collect();
        let (adv, ret) = turn_gae(&rewards, &v, gamma, lambda);
        for ((p, j), (&a, &r)) in turns.iter().zip(&at).zip(adv.iter().zip(&ret)) {
            let mask = masks[p.row];
            for x in p
                .span
                .clone()
                .filter(|&x| mask.get(x).is_some_and(|&m| m != 0))
            {
                out.advantages[p.row][x] = a;
            }
            if let Some(j) = *j {
                out.returns[p.row][j] = r;
            }
        }
        out.per_turn.push(adv);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Status, Transition};
    use crate::rows::{build_turn_rows, RowMode};

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12)
    }

    /// By hand, γ = 0.5, λ = 0.8, rewards (0, 0.5, 1), values (0.2, 0.4, 0.6):
    /// δ = (0 + 0.5·0.4 − 0.2, 0.5 + 0.5·0.6 − 0.4, 1 − 0.6) = (0, 0.4, 0.4);
    /// A₂ = 0.4, A₁ = 0.4 + 0.4·0.4 = 0.56, A₀ = 0 + 0.4·0.56 = 0.224.
    #[test]
    fn turn_gae_by_hand() {
        let (adv, ret) = turn_gae(
            &[0.0, 0.5, 1.0],
            &[Some(0.2), Some(0.4), Some(0.6)],
            0.5,
            0.8,
        );
        assert!(close(&adv, &[0.224, 0.56, 0.4]), "{adv:?}");
        assert!(close(&ret, &[0.424, 0.96, 1.0]), "{ret:?}");
    }

    /// A turn without a value passes credit on: with γ = 1, λ = 0.5, values (0.5, —, 0.25)
    /// and a final reward of 1, the middle turn's value is taken as 0 + 0.25, so
    /// δ = (−0.25, 0, 0.75) and A = (−0.25 + 0.5·0.375, 0.5·0.75, 0.75).
    #[test]
    fn a_turn_without_a_value_passes_the_later_credit_on() {
        let (adv, ret) = turn_gae(&[0.0, 0.0, 1.0], &[Some(0.5), None, Some(0.25)], 1.0, 0.5);
        assert!(close(&adv, &[-0.0625, 0.375, 0.75]), "{adv:?}");
        assert!(close(&ret, &[0.4375, 0.625, 1.0]), "{ret:?}");
    }

    fn tr(prompt: Vec<u32>, response: Vec<u32>, mask: Vec<u8>, reward: Option<f64>) -> Transition {
        let n = response.len();
        Transition {
            prompt,
            response,
            loss_mask: mask,
            logprobs: vec![0.0; n],
            versions: vec![0; n],
            kept: Default::default(),
            reward,
            state: None,
        }
    }

    /// Two turns: the first earns 0.5 on its own, the episode scores 1. Merged, the row's
    /// response is (3 4 | 9 | 5 6) with 9 inserted; the values are read at each turn's first
    /// sampled token: V₀ = 0.1, V₁ = 0.3. With γ = 0.5, λ = 1 the returns are
    /// G₁ = 1 and G₀ = 0.5 + 0.5·1 = 1, so A₁ = 0.7 and A₀ = 0.9, on every token of their turn;
    /// the same in a row per turn.
    #[test]
    fn merged_and_per_turn_rows_get_the_same_turn_advantages() {
        let t = Trajectory {
            id: "t".into(),
            group: "g".into(),
            transitions: vec![
                tr(vec![1, 2], vec![3, 4], vec![1, 1], Some(0.5)),
                tr(vec![1, 2, 3, 4, 9], vec![5, 6], vec![1, 1], None),
            ],
            reward: 1.0,
            status: Status::Finished,
        };
        let per_turn = [Some(vec![0.0, 0.0])];
        let trajs = std::slice::from_ref(&t);
        let merged = build_turn_rows(trajs, &per_turn, RowMode::Trajectory).unwrap();
        let places = turn_places(trajs, &merged).unwrap();
        assert_eq!(places[0].len(), 2);
        assert_eq!((places[0][0].reward, places[0][1].reward), (0.5, 1.0));
        let values = [0.1, 0.7, 0.9, 0.3, 0.8];
        let g = turn_gae_rows(&places, &[&merged[0].loss_mask], &[&values], 0.5, 1.0);
        assert!(close(&g.advantages[0], &[0.9, 0.9, 0.0, 0.7, 0.7]), "{g:?}");
        assert!(close(&g.returns[0], &[1.0, 0.7, 0.9, 1.0, 0.8]), "{g:?}");
        assert!(close(&g.per_turn[0], &[0.9, 0.7]));
        assert_eq!(
            turn_value_mask(&merged[0].loss_mask, &merged[0].turn_spans),
            vec![1, 0, 0, 1, 0]
        );
        // A row per turn, given in reverse order: the same advantages.
        let mut split = build_turn_rows(trajs, &per_turn, RowMode::Transition).unwrap();
        split.reverse();
        let places = turn_places(trajs, &split).unwrap();
        let (v1, v0) = ([0.3, 0.8], [0.1, 0.7]);
        let masks: Vec<&[u8]> = split.iter().map(|r| &r.loss_mask[..]).collect();
        let g = turn_gae_rows(&places, &masks, &[&v1, &v0], 0.5, 1.0);
        assert!(close(&g.advantages[0], &[0.7, 0.7]) && close(&g.advantages[1], &[0.9, 0.9]));
        assert!(close(&g.returns[0], &[1.0, 0.8]) && close(&g.returns[1], &[1.0, 0.7]));
    }

    /// A turn whose response opens with tokens it did not sample reads its value at its first
    /// sampled one; a turn that sampled nothing has no value position and no advantage.
    #[test]
    fn the_value_is_read_at_the_first_sampled_token() {
        assert_eq!(turn_value_position(&[0, 0, 1, 1], &(0..4)), Some(2));
        assert_eq!(turn_value_position(&[1, 0, 0, 1], &(1..3)), None);
        assert_eq!(
            turn_value_mask(&[0, 1, 1, 0, 1], &[0..3, 3..5]),
            vec![0, 1, 0, 0, 1]
        );
    }

    #[test]
    fn rows_missing_a_turn_are_an_error_naming_the_trajectory() {
        let t = Trajectory {
            id: "lost".into(),
            group: "g".into(),
            transitions: vec![
                tr(vec![1], vec![2], vec![1], None),
                tr(vec![1, 2], vec![3], vec![1], None),
            ],
            reward: 0.0,
            status: Status::Finished,
        };
        let trajs = std::slice::from_ref(&t);
        let mut rows = build_turn_rows(trajs, &[Some(vec![0.0; 2])], RowMode::Transition).unwrap();
        rows.pop();
        let e = turn_places(trajs, &rows).unwrap_err().to_string();
        assert!(e.contains("`lost`") && e.contains("of its 2"), "{e}");
    }
}
