//! Rows: what a rank trains on. One transition each, or a whole trajectory merged into one
//! sequence when every turn's prompt extends the previous context token for token.

use crate::data::{KeptSets, Trajectory};
use crate::error::{err, PlanError};
use crate::padding::PaddingId;
use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowMode {
    /// One row per transition (its prompt is the whole context the model saw).
    Transition,
    /// One row per trajectory; an error if a prompt does not extend the previous context.
    Trajectory,
    /// One row per trajectory whose prompts extend token for token (token-exact multi-turn
    /// rollouts: the shared context is computed once), one row per transition otherwise
    /// (step-wise histories, whose later prompts re-render earlier turns).
    Auto,
}

/// The shape of a row: all the planner needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowShape {
    /// Index of the trajectory (the default unit that stays whole).
    pub trajectory: usize,
    /// Transition index; None for a merged trajectory row.
    pub transition: Option<usize>,
    /// Index of the group (the other unit choice).
    pub group: usize,
    pub prompt_len: usize,
    pub response_len: usize,
    pub loss_tokens: usize,
}

impl RowShape {
    pub fn tokens(&self) -> usize {
        self.prompt_len + self.response_len
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub shape: RowShape,
    pub prompt: Vec<u32>,
    pub response: Vec<u32>,
    pub loss_mask: Vec<u8>,
    pub logprobs: Vec<f32>,
    pub versions: Vec<u64>,
    /// Per response token, what a truncated sampler kept (empty: it did not truncate).
    pub kept: KeptSets,
    /// Per response token: the advantage of the turn that sampled it (the trajectory's, unless
    /// credit is per turn); 0 on inserted tokens.
    pub advantages: Vec<f64>,
    /// Where the response of each transition the row holds lies in the row's response, in
    /// transition order: the whole response for a row per transition, one span per turn for a
    /// merged row (the tokens inserted between turns are in none). Empty for a padding row.
    pub turn_spans: Vec<Range<usize>>,
    /// Some for a synthetic padding row (the `is_padding` flag, with the row's fresh id).
    pub padding: Option<PaddingId>,
}

/// Token id of both tokens of a padding row: any valid id works, as nothing attends to it
/// with a loss.
pub const PADDING_TOKEN: u32 = 0;

impl Row {
    /// A padding row: 1 prompt + 1 response token, loss mask 0, advantage 0. Its shape's
    /// trajectory and group are `usize::MAX`, an index no real row has, so it can never join
    /// an advantage group or a unit.
    pub fn padding(id: PaddingId) -> Row {
        Row {
            shape: RowShape {
                trajectory: usize::MAX,
                transition: None,
                group: usize::MAX,
                prompt_len: 1,
                response_len: 1,
                loss_tokens: 0,
            },
            prompt: vec![PADDING_TOKEN],
            response: vec![PADDING_TOKEN],
            loss_mask: vec![0],
            logprobs: vec![0.0],
            versions: vec![0],
            kept: KeptSets::default(),
            advantages: vec![0.0],
            turn_spans: Vec::new(),
            padding: Some(id),
        }
    }

    pub fn is_padding(&self) -> bool {
        self.padding.is_some()
    }
}

/// Rows of every trajectory that has an advantage (`advantages[i]` is None for excluded ones),
/// the same on each of its turns. Group indices follow first appearance of each group id.
pub fn build_rows(
    trajs: &[Trajectory],
    advantages: &[Option<f64>],
    mode: RowMode,
) -> Result<Vec<Row>, PlanError> {
    let per_turn: Vec<Option<Vec<f64>>> = trajs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let a = advantages.get(i).copied().flatten()?;
            Some(vec![a; t.transitions.len()])
        })
        .collect();
    build_turn_rows(trajs, &per_turn, mode)
}

/// Rows of every trajectory with advantages (`per_turn[i]`: one per transition, None for
/// excluded trajectories): each sampled token carries its own turn's advantage, in a merged
/// row as in a row per transition.
pub fn build_turn_rows(
    trajs: &[Trajectory],
    per_turn: &[Option<Vec<f64>>],
    mode: RowMode,
) -> Result<Vec<Row>, PlanError> {
    let mut groups = std::collections::HashMap::new();
    let mut rows = Vec::new();
    for (ti, t) in trajs.iter().enumerate() {
        let next = groups.len();
        let group = *groups.entry(t.group.as_str()).or_insert(next);
        let Some(turns) = per_turn.get(ti).and_then(|a| a.as_ref()) else {
            continue;
        };
        t.validate()?;
        if turns.len() != t.transitions.len() {
            return err(format!(
                "trajectory `{}` has {} transitions but {} turn advantages",
                t.id,
                t.transitions.len(),
                turns.len()
            ));
        }
        let merge_it = match mode {
            RowMode::Transition => false,
            RowMode::Trajectory => true,
            RowMode::Auto => t.transitions.len() > 1 && extends_token_for_token(t),
        };
        match merge_it {
            false => {
                for (k, tr) in t.transitions.iter().enumerate() {
                    rows.push(Row {
                        shape: RowShape {
                            trajectory: ti,
                            transition: Some(k),
                            group,
                            prompt_len: tr.prompt.len(),
                            response_len: tr.response.len(),
                            loss_tokens: tr.loss_tokens(),
                        },
                        prompt: tr.prompt.clone(),
                        response: tr.response.clone(),
                        loss_mask: tr.loss_mask.clone(),
                        logprobs: tr.logprobs.clone(),
                        versions: tr.versions.clone(),
                        kept: tr.kept.clone(),
                        advantages: on_sampled(&tr.loss_mask, turns[k]),
                        turn_spans: std::iter::once(0..tr.response.len()).collect(),
                        padding: None,
                    });
                }
            }
            true => rows.push(merge(t, ti, group, turns)?),
        }
    }
    Ok(rows)
}

/// `advantage` on each sampled token of a mask, 0 on inserted ones.
fn on_sampled(loss_mask: &[u8], advantage: f64) -> Vec<f64> {
    loss_mask
        .iter()
        .map(|&m| if m != 0 { advantage } else { 0.0 })
        .collect()
}

/// Whether every prompt of `t` starts with the context before it (previous prompt + response):
/// an append-only history, which `RowMode::Auto` merges into one row. A trajectory whose later
/// prompt is a fresh rendering of the history (a chat template that drops earlier reasoning or
/// tool output) is step-wise: one row per turn. A single turn extends trivially.
pub fn extends_token_for_token(t: &Trajectory) -> bool {
    t.transitions.windows(2).all(|w| {
        let (a, b) = (&w[0], &w[1]);
        b.prompt.len() >= a.prompt.len() + a.response.len()
            && b.prompt.starts_with(&a.prompt)
            && b.prompt[a.prompt.len()..].starts_with(&a.response)
    })
}

/// One sequence for a whole trajectory: the first prompt, then each response followed by the
/// tokens inserted before the next turn (loss mask 0). Fails if a prompt does not extend the
/// context it follows.
fn merge(t: &Trajectory, ti: usize, group: usize, turns: &[f64]) -> Result<Row, PlanError> {
    let first = &t.transitions[0];
    let mut context = first.prompt.clone();
    let (mut response, mut mask, mut logprobs, mut versions, mut advantages) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut turn_spans = Vec::with_capacity(t.transitions.len());
    // Kept sets only where a turn has them: inserted tokens then get the whole vocabulary.
    let mut kept = KeptSets::default();
    for (k, tr) in t.transitions.iter().enumerate() {
        if !tr.prompt.starts_with(&context) {
            return err(format!(
                "trajectory `{}`, transition {k}: its prompt does not extend the previous context, so it cannot be merged into one row (use row = \"transition\")",
                t.id
            ));
        }
        let inserted = &tr.prompt[context.len()..];
        response.extend_from_slice(inserted);
        mask.extend(std::iter::repeat_n(0u8, inserted.len()));
        logprobs.extend(std::iter::repeat_n(0f32, inserted.len()));
        versions.extend(std::iter::repeat_n(0u64, inserted.len()));
        advantages.extend(std::iter::repeat_n(0.0, inserted.len()));
        advantages.extend(on_sampled(&tr.loss_mask, turns[k]));
        turn_spans.push(response.len()..response.len() + tr.response.len());
        kept.extend(response.len(), &tr.kept, tr.response.len());
        response.extend_from_slice(&tr.response);
        mask.extend_from_slice(&tr.loss_mask);
        logprobs.extend_from_slice(&tr.logprobs);
        versions.extend_from_slice(&tr.versions);
        context = tr.prompt.clone();
        context.extend_from_slice(&tr.response);
    }
    let loss_tokens = mask.iter().filter(|&&m| m != 0).count();
    Ok(Row {
        shape: RowShape {
            trajectory: ti,
            transition: None,
            group,
            prompt_len: first.prompt.len(),
            response_len: response.len(),
            loss_tokens,
        },
        prompt: first.prompt.clone(),
        response,
        loss_mask: mask,
        logprobs,
        versions,
        kept,
        advantages,
        turn_spans,
        padding: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Status, Transition};

    fn tr(prompt: Vec<u32>, response: Vec<u32>) -> Transition {
        let n = response.len();
        Transition {
            prompt,
            response,
            loss_mask: vec![1; n],
            logprobs: vec![-1.0; n],
            versions: vec![3; n],
            kept: Default::default(),
            reward: None,
            state: None,
        }
    }

    /// A merged row carries each turn's kept sets at its sampled tokens and the whole
    /// vocabulary (no ids) at the inserted ones; a trajectory sampled without truncation
    /// has none at all.
    #[test]
    fn merging_places_each_turns_kept_sets_at_its_tokens() {
        let mut first = tr(vec![1, 2], vec![3, 4]);
        first.kept.push(&[3, 8]);
        first.kept.push(&[4]);
        let mut second = tr(vec![1, 2, 3, 4, 9, 9], vec![5]);
        second.kept.push(&[5, 6, 7]);
        let t = Trajectory {
            id: "t".into(),
            group: "g".into(),
            transitions: vec![first, second],
            reward: 1.0,
            status: Status::Finished,
        };
        let rows = build_rows(std::slice::from_ref(&t), &[Some(0.5)], RowMode::Trajectory).unwrap();
        let kept = &rows[0].kept;
        assert_eq!(kept.len(), 5);
        let sets: Vec<&[u32]> = (0..5).map(|k| kept.get(k)).collect();
        assert_eq!(sets, [&[3, 8][..], &[4], &[], &[], &[5, 6, 7]]);
        let per_turn =
            build_rows(std::slice::from_ref(&t), &[Some(0.5)], RowMode::Transition).unwrap();
        assert_eq!(per_turn[1].kept.get(0), &[5, 6, 7]);
        let mut plain = t.clone();
        for tr in &mut plain.transitions {
            tr.kept = KeptSets::default();
        }
        let rows = build_rows(&[plain], &[Some(0.5)], RowMode::Trajectory).unwrap();
        assert!(rows[0].kept.is_empty());
    }

    #[test]
    fn merging_masks_inserted_tokens_and_rejects_a_broken_prefix() {
        let t = Trajectory {
            id: "t".into(),
            group: "g".into(),
            transitions: vec![
                tr(vec![1, 2], vec![3, 4]),
                tr(vec![1, 2, 3, 4, 9, 9], vec![5]),
            ],
            reward: 1.0,
            status: Status::Finished,
        };
        let rows = build_rows(std::slice::from_ref(&t), &[Some(0.5)], RowMode::Trajectory).unwrap();
        assert_eq!(rows[0].prompt, vec![1, 2]);
        assert_eq!(rows[0].response, vec![3, 4, 9, 9, 5]);
        assert_eq!(rows[0].loss_mask, vec![1, 1, 0, 0, 1]);
        assert_eq!(rows[0].turn_spans, vec![0..2, 4..5]);
        assert_eq!(rows[0].shape.loss_tokens, 3);
        let per_turn =
            build_rows(std::slice::from_ref(&t), &[Some(0.5)], RowMode::Transition).unwrap();
        assert_eq!(per_turn.len(), 2);
        assert_eq!(per_turn[1].turn_spans, vec![0..1]);
        let mut bad = t.clone();
        bad.transitions[1].prompt = vec![1, 7, 3, 4];
        let e = build_rows(&[bad.clone()], &[Some(0.5)], RowMode::Trajectory)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`t`, transition 1"), "{e}");
        // Auto merges the token-exact trajectory and falls back to rows per turn otherwise.
        let auto = build_rows(std::slice::from_ref(&t), &[Some(0.5)], RowMode::Auto).unwrap();
        assert_eq!((auto.len(), auto[0].shape.transition), (1, None));
        let auto = build_rows(&[bad], &[Some(0.5)], RowMode::Auto).unwrap();
        assert_eq!(auto.len(), 2);
    }

    #[test]
    fn advantages_reach_loss_tokens_only_and_padding_is_inert() {
        let t = Trajectory {
            id: "t".into(),
            group: "g".into(),
            transitions: vec![tr(vec![1], vec![2, 3]), tr(vec![1, 2, 3, 7], vec![4])],
            reward: 1.0,
            status: Status::Finished,
        };
        let merged = build_rows(std::slice::from_ref(&t), &[Some(0.5)], RowMode::Trajectory)
            .unwrap()
            .remove(0);
        assert_eq!(merged.advantages, vec![0.5, 0.5, 0.0, 0.5]);
        assert!(!merged.is_padding());
        let mut ids = crate::padding::PaddingIds::default();
        let (a, b) = (Row::padding(ids.next_id()), Row::padding(ids.next_id()));
        assert!(a.is_padding() && a.padding != b.padding);
        assert_eq!(
            (a.prompt.len(), a.response.len(), a.shape.loss_tokens),
            (1, 1, 0)
        );
        assert_eq!(a.advantages, vec![0.0]);
    }

    #[test]
    fn excluded_trajectories_make_no_rows() {
        let t = Trajectory {
            id: "t".into(),
            group: "g".into(),
            transitions: vec![tr(vec![1], vec![2])],
            reward: 0.0,
            status: Status::Finished,
        };
        let rows = build_rows(&[t.clone(), t], &[None, Some(1.0)], RowMode::Transition).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].shape.trajectory, 1);
    }
}
