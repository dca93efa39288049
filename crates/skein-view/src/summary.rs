//! One line of the step table: what a trajectory is sorted and filtered by, without its tokens.

use serde::Serialize;
use skein_report::trajectories::{Status, TrajectoryRecord};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub id: String,
    pub group: String,
    pub source: String,
    pub status: Status,
    pub reason: Option<String>,
    /// None for a failed trajectory: it has no reward (its reason says why), and a 0 would
    /// sort and filter among real zeros.
    pub reward: Option<f64>,
    pub correct: bool,
    pub turns: usize,
    pub tool_calls: usize,
    /// Response tokens over all rows, the environment's included.
    pub length: usize,
    /// Of those, the ones that trained (sampled, in a row that trained).
    pub trained: usize,
    /// Mean advantage over its trained tokens (None: nothing of it trained). Outcome
    /// estimators give every token the same one, so this is the trajectory's advantage.
    pub advantage: Option<f64>,
    /// Policy versions behind the step's policy its oldest token was sampled by.
    pub max_staleness: u64,
}

impl Summary {
    pub fn of(t: &TrajectoryRecord) -> Summary {
        let mut length = 0;
        let mut trained = 0;
        let mut adv_sum = 0.0;
        let mut max_staleness = 0;
        for row in &t.rows {
            length += row.response_ids.len();
            for (i, &a) in row.advantages.iter().enumerate() {
                if row.loss_mask.get(i).is_some_and(|&m| m != 0) {
                    trained += 1;
                    adv_sum += a as f64;
                }
            }
            for (i, &v) in row.versions.iter().enumerate() {
                if row.loss_mask.get(i).is_some_and(|&m| m != 0) {
                    max_staleness = max_staleness.max(t.policy_version.saturating_sub(v));
                }
            }
        }
        Summary {
            id: t.id.clone(),
            group: t.group.clone(),
            source: t.source.clone(),
            status: t.status,
            reason: t.reason.clone(),
            reward: (t.status != Status::Failed).then_some(t.reward),
            correct: t.correct,
            turns: t.turns,
            tool_calls: t.tool_calls,
            length,
            trained,
            advantage: (trained > 0).then(|| adv_sum / trained as f64),
            max_staleness,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skein_report::trajectories::RowRecord;

    #[test]
    fn counts_trained_tokens_their_advantage_and_staleness() {
        let row = |mask: Vec<u8>, adv: Vec<f32>, versions: Vec<u64>| RowRecord {
            transition: None,
            mini_batch: None,
            rank: None,
            prompt_ids: vec![1, 2],
            prompt_text: vec!["a".into(), "b".into()],
            response_ids: vec![3; mask.len()],
            response_text: vec!["c".into(); mask.len()],
            loss_mask: mask,
            behavior_logp: vec![],
            versions,
            advantages: adv,
            is_weight: vec![],
        };
        let mut t = TrajectoryRecord {
            step: 3,
            policy_version: 5,
            id: "t".into(),
            group: "g".into(),
            source: "s".into(),
            status: Status::Finished,
            reason: None,
            reward: 1.0,
            correct: true,
            turns: 2,
            tool_calls: 0,
            turn_rewards: vec![],
            // The environment's tokens (mask 0) count in the length only.
            rows: vec![
                row(vec![1, 0, 1], vec![0.5, 9.0, 0.5], vec![5, 0, 3]),
                row(vec![1], vec![-1.0], vec![4]),
            ],
        };
        let s = Summary::of(&t);
        assert_eq!((s.length, s.trained, s.max_staleness), (4, 3, 2));
        assert_eq!(s.advantage, Some(0.0));
        // A row that did not train has no advantages: nothing of it counts as trained.
        t.rows[1].advantages.clear();
        t.rows[0].advantages.clear();
        let s = Summary::of(&t);
        assert_eq!((s.trained, s.advantage), (0, None));
        assert_eq!(s.reward, Some(1.0));
        // A failed trajectory has no reward to sort or filter by, whatever its record holds.
        t.status = Status::Failed;
        t.reward = 0.0;
        assert_eq!(Summary::of(&t).reward, None);
    }
}
