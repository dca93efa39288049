//! The data model: transitions (one policy call each) and trajectories (one rollout).

use crate::error::{err, PlanError};
use serde::{Deserialize, Serialize};

/// The largest reward magnitude a trajectory or turn may carry, and the largest sum of a
/// trajectory's reward magnitudes ([`Trajectory::reward_problem`]): 1e38, so that a group's
/// differences of rewards (at most 2e38) still fit in the `f32` the advantages and the loss are
/// computed in (largest finite value about 3.4e38). A larger or non-finite reward is a reward
/// function's bug, not a signal: the trainer fails that trajectory (counted, with the value
/// in its reason) and `skein plan` refuses the file, naming the trajectory.
pub const MAX_REWARD: f64 = 1e38;

/// Whether `reward` is finite and within ±[`MAX_REWARD`].
pub fn reward_in_range(reward: f64) -> bool {
    reward.abs() <= MAX_REWARD
}

/// One policy call, token-exact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    /// Everything the model saw.
    pub prompt: Vec<u32>,
    /// What it sampled (and, in merged rows, inserted text between turns).
    pub response: Vec<u32>,
    /// Per response token: 1 = sampled by the policy, 0 = inserted tool/environment text.
    pub loss_mask: Vec<u8>,
    /// Behavior log-prob of each response token.
    pub logprobs: Vec<f32>,
    /// Policy version that sampled each response token.
    pub versions: Vec<u64>,
    /// What the sampler's top-k/top-p truncation kept for each response token, when it
    /// truncated (empty otherwise): the behavior log-prob is of that renormalised
    /// distribution, and the trainer computes π under the same sets.
    #[serde(default, skip_serializing_if = "KeptSets::is_empty")]
    pub kept: KeptSets,
    /// Optional per-transition reward.
    pub reward: Option<f64>,
    /// The environment's state when the model wrote this turn, if the environment names one
    /// (the guessing game: the replies so far). Turns of one group taken in the same state
    /// form a step group ([`crate::StepGroups`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

impl Transition {
    pub fn validate(&self) -> Result<(), PlanError> {
        let n = self.response.len();
        if self.loss_mask.len() != n || self.logprobs.len() != n || self.versions.len() != n {
            return err(format!(
                "response has {n} tokens but loss_mask {}, logprobs {}, versions {}",
                self.loss_mask.len(),
                self.logprobs.len(),
                self.versions.len()
            ));
        }
        if !self.kept.is_empty() && self.kept.len() != n {
            return err(format!(
                "response has {n} tokens but kept sets for {}",
                self.kept.len()
            ));
        }
        if self.prompt.is_empty() {
            return err("a transition needs at least one prompt token");
        }
        if let Some(r) = self.reward.filter(|&r| !reward_in_range(r)) {
            return err(format!("its reward {r:e} is outside ±{MAX_REWARD:e}"));
        }
        Ok(())
    }

    pub fn loss_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m != 0).count()
    }
}

/// Per token, the ids a truncated sampler (top-k, top-p) kept: the support of the distribution
/// the token was drawn from, recorded exactly, so the trainer's renormalised log-prob is over
/// the very same set at ties and boundaries. Packed: `ends[k]` is where token k's ids end in
/// `ids`. Empty (no token) when the sampler did not truncate; a token with no ids (inserted
/// text) has the whole vocabulary. Costs 4 bytes per token plus 4 per kept id.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KeptSets {
    pub ends: Vec<u32>,
    pub ids: Vec<u32>,
}

impl KeptSets {
    /// Whether there is no set at all (the sampler did not truncate).
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Tokens with a set (or, for inserted tokens, none).
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Token k's kept ids; empty for the whole vocabulary (or no record).
    pub fn get(&self, k: usize) -> &[u32] {
        let Some(&end) = self.ends.get(k) else {
            return &[];
        };
        let start = if k == 0 { 0 } else { self.ends[k - 1] };
        &self.ids[start as usize..end as usize]
    }

    /// Appends one token's set (empty: the whole vocabulary).
    pub fn push(&mut self, ids: &[u32]) {
        self.ids.extend_from_slice(ids);
        self.ends.push(self.ids.len() as u32);
    }

    /// Keeps the sets of the first `n` tokens.
    pub fn truncate(&mut self, n: usize) {
        self.ends.truncate(n);
        self.ids
            .truncate(self.ends.last().map_or(0, |&end| end as usize));
    }

    /// Appends `n` tokens with the whole vocabulary (inserted text).
    pub fn push_whole(&mut self, n: usize) {
        let end = self.ids.len() as u32;
        self.ends.extend(std::iter::repeat_n(end, n));
    }

    /// Appends the sets of `tokens` more tokens, `other` (none recorded when it is empty),
    /// to these sets of a sequence of `covered` tokens so far: tokens this has no set for yet
    /// get the whole vocabulary. Nothing is recorded while neither side truncated.
    pub fn extend(&mut self, covered: usize, other: &KeptSets, tokens: usize) {
        if other.is_empty() && self.is_empty() {
            return;
        }
        self.push_whole(covered.saturating_sub(self.len()));
        if other.is_empty() {
            self.push_whole(tokens);
        } else {
            for k in 0..other.len() {
                self.push(other.get(k));
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Status {
    Finished,
    /// Stopped by a length limit; trained on as it is.
    Truncated,
    /// Excluded from advantages and training, and counted.
    Failed(String),
}

/// One rollout: one attempt at one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    pub id: String,
    /// The prompt it answers: GRPO/RLOO groups are all trajectories of one group id.
    pub group: String,
    pub transitions: Vec<Transition>,
    pub reward: f64,
    pub status: Status,
}

impl Trajectory {
    pub fn is_failed(&self) -> bool {
        matches!(self.status, Status::Failed(_))
    }

    /// What the episode earned in all: its final score plus every turn's own reward
    /// ([`Transition::reward`]). Group estimators compare a group's trajectories by it when
    /// every turn gets the trajectory's credit, as GAE sums the same rewards.
    pub fn total_reward(&self) -> f64 {
        self.reward
            + self
                .transitions
                .iter()
                .filter_map(|x| x.reward)
                .sum::<f64>()
    }

    /// What is wrong with this trajectory's rewards, if anything: its final score or a turn's
    /// reward is non-finite or beyond ±[`MAX_REWARD`], or its turns' rewards are each within
    /// it but their magnitudes and the final score's sum beyond it. A turn's return adds the
    /// later turns' rewards, discounted by at most 1 per turn, so that sum bounds every return
    /// and keeps the group's differences of returns within `f32` too.
    pub fn reward_problem(&self) -> Option<String> {
        let turns = self.transitions.iter().filter_map(|x| x.reward);
        let rewards = || std::iter::once(self.reward).chain(turns.clone());
        if let Some(bad) = rewards().find(|&r| !reward_in_range(r)) {
            return Some(format!("reward {bad:e} is outside ±{MAX_REWARD:e}"));
        }
        let sum: f64 = rewards().map(f64::abs).sum();
        (!reward_in_range(sum)).then(|| {
            format!(
                "its rewards' magnitudes (the final score and every turn's) sum to {sum:.3e}, \
                 beyond ±{MAX_REWARD:e}, so its returns could overflow"
            )
        })
    }

    pub fn validate(&self) -> Result<(), PlanError> {
        if self.transitions.is_empty() && !self.is_failed() {
            return err(format!("trajectory `{}` has no transitions", self.id));
        }
        for (k, t) in self.transitions.iter().enumerate() {
            t.validate()
                .map_err(|e| PlanError(format!("trajectory `{}`, transition {k}: {e}", self.id)))?;
        }
        match self.reward_problem() {
            Some(why) if !self.is_failed() => err(format!(
                "trajectory `{}`: {why} (advantages are f32)",
                self.id
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_turns(final_score: f64, turns: [Option<f64>; 2]) -> Trajectory {
        let turn = |reward| Transition {
            prompt: vec![1],
            response: vec![2],
            loss_mask: vec![1],
            logprobs: vec![0.0],
            versions: vec![0],
            kept: KeptSets::default(),
            reward,
            state: None,
        };
        Trajectory {
            id: "t".into(),
            group: "g".into(),
            transitions: turns.into_iter().map(turn).collect(),
            reward: final_score,
            status: Status::Finished,
        }
    }

    /// Each reward within the bound is not enough: a return sums them, so their magnitudes'
    /// sum is bounded too, whatever their signs. Failed trajectories are not refused.
    #[test]
    fn rewards_are_bounded_one_by_one_and_as_a_sum() {
        assert!(two_turns(1.0, [Some(0.5), None]).validate().is_ok());
        let bound = two_turns(5e37, [Some(-5e37), None]);
        assert!(bound.validate().is_ok(), "a sum of exactly 1e38 is within");
        let summed = two_turns(6e37, [Some(-5e37), None]);
        let e = summed.validate().unwrap_err().0;
        assert!(e.contains("sum to 1.100e38") && e.contains("`t`"), "{e}");
        let nan = two_turns(0.0, [None, Some(f64::NAN)]);
        assert!(nan.reward_problem().unwrap().contains("NaN"));
        let mut failed = summed;
        failed.status = Status::Failed("why".into());
        assert!(failed.validate().is_ok());
    }
}
