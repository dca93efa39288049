//! What a rule needs of one trajectory: enough to pick examples and to tell right from wrong,
//! nothing of its tokens. The trainer makes digests from a step's rollout; `skein doctor`
//! from the step files (`trajectories/step-N.jsonl.zst`), which hold the same facts.

use serde::{Deserialize, Serialize};
use skein_report::trajectories::{Status, TrajectoryRecord};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Finished,
    /// Cut off by a length or turn limit (trained on as it is).
    Truncated,
    /// Did not train.
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Digest {
    pub id: String,
    /// The prompt it answers: its group.
    pub group: String,
    pub reward: f64,
    pub correct: bool,
    /// Tokens the policy sampled (its loss tokens).
    pub sampled_tokens: usize,
    pub outcome: Outcome,
    /// Why it failed or was cut off.
    pub reason: Option<String>,
}

impl Digest {
    pub fn of_record(r: &TrajectoryRecord) -> Digest {
        let sampled_tokens = r
            .rows
            .iter()
            .map(|row| row.loss_mask.iter().filter(|&&m| m != 0).count())
            .sum();
        Digest {
            id: r.id.clone(),
            group: r.group.clone(),
            reward: r.reward,
            correct: r.correct,
            sampled_tokens,
            outcome: match r.status {
                Status::Finished => Outcome::Finished,
                Status::Truncated => Outcome::Truncated,
                Status::Failed => Outcome::Failed,
            },
            reason: r.reason.clone(),
        }
    }

    pub fn failed(&self) -> bool {
        self.outcome == Outcome::Failed
    }
}

/// The groups of a step whose trajectories that did not fail all earned one reward (no
/// learning signal), in the order they first appear: (group, all correct?, first member id).
pub fn equal_reward_groups(digests: &[Digest]) -> Vec<(String, bool, String)> {
    let mut order: Vec<&str> = Vec::new();
    let mut members: std::collections::HashMap<&str, Vec<&Digest>> = Default::default();
    for d in digests.iter().filter(|d| !d.failed()) {
        let m = members.entry(d.group.as_str()).or_default();
        if m.is_empty() {
            order.push(d.group.as_str());
        }
        m.push(d);
    }
    order
        .into_iter()
        .filter_map(|g| {
            let m = &members[g];
            let first = m[0];
            let equal = m.iter().all(|d| d.reward == first.reward);
            equal.then(|| {
                let all_correct = m.iter().all(|d| d.correct);
                (g.to_string(), all_correct, first.id.clone())
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn digest(id: &str, group: &str, reward: f64, outcome: Outcome) -> Digest {
        Digest {
            id: id.into(),
            group: group.into(),
            reward,
            correct: reward > 0.5,
            sampled_tokens: 4,
            outcome,
            reason: None,
        }
    }

    #[test]
    fn groups_with_one_reward_among_their_unfailed_members_are_equal() {
        let d = [
            digest("a0", "a", 1.0, Outcome::Finished),
            digest("a1", "a", 1.0, Outcome::Truncated),
            digest("b0", "b", 0.0, Outcome::Finished),
            digest("b1", "b", 1.0, Outcome::Finished),
            // A failed member does not count: c is equal (all wrong).
            digest("c0", "c", 0.0, Outcome::Finished),
            digest("c1", "c", 1.0, Outcome::Failed),
        ];
        let eq = equal_reward_groups(&d);
        assert_eq!(
            eq,
            vec![
                ("a".to_string(), true, "a0".to_string()),
                ("c".to_string(), false, "c0".to_string())
            ]
        );
    }
}
