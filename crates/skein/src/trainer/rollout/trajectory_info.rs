//! What the trajectory log shows of a trajectory beyond its tokens ([`TrajectoryInfo`]), filled
//! in by each rollout source.

use skein_plan::{Status, Trajectory};

/// What a reader of a trajectory wants to know that its tokens do not say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrajectoryInfo {
    /// The task's name, or a dataset row's `data_source`.
    pub source: String,
    /// Messages the model wrote.
    pub turns: usize,
    /// Of those, the ones a tool answered.
    pub tool_calls: usize,
    /// Why a truncated trajectory was cut off.
    pub cutoff: Option<String>,
}

impl TrajectoryInfo {
    /// What the tokens alone tell: a turn is a run of sampled tokens.
    pub fn of(t: &Trajectory) -> TrajectoryInfo {
        let turns = t
            .transitions
            .iter()
            .map(|x| {
                let mut runs = 0;
                let mut prev = 0;
                for &m in &x.loss_mask {
                    if m != 0 && prev == 0 {
                        runs += 1;
                    }
                    prev = m;
                }
                runs
            })
            .sum();
        TrajectoryInfo {
            source: String::new(),
            turns,
            tool_calls: 0,
            cutoff: (t.status == Status::Truncated).then(|| "a length limit".to_string()),
        }
    }
}
