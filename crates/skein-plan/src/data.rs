//! The data model: transitions (one policy call each) and trajectories (one rollout).

use crate::error::{err, PlanError};
use serde::{Deserialize, Serialize};

/// The largest reward magnitude a trajectory or turn may carry: 1e38, so that a group's
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

    pub fn validate(&self) -> Result<(), PlanError> {
        if self.transitions.is_empty() && !self.is_failed() {
            return err(format!("trajectory `{}` has no transitions", self.id));
        }
        for (k, t) in self.transitions.iter().enumerate() {
            t.validate()
                .map_err(|e| PlanError(format!("trajectory `{}`, transition {k}: {e}", self.id)))?;
        }
        if !reward_in_range(self.reward) && !self.is_failed() {
            return err(format!(
                "trajectory `{}` has reward {:e}, outside ±{MAX_REWARD:e} (advantages are f32)",
                self.id, self.reward
            ));
        }
        Ok(())
    }
}
