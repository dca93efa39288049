//! One step's rollouts: sample prompts, generate `n` responses each, and score every response
//! the moment it finishes (inside the engine's callback, while the rest still generate).

use crate::engine::{Engine, EngineStats, Finish, GenRequest, SamplingParams};
use crate::model::Model;
use skein_plan::{Status, Trajectory, Transition};
use skein_tasks::{Problem, Task};
use skein_text::Tokenizer;

pub struct Rollouts {
    pub trajectories: Vec<Trajectory>,
    /// Parallel to `trajectories`: whether the task judged the answer correct.
    pub correct: Vec<bool>,
    pub engine: EngineStats,
}

pub struct PromptBatch {
    pub problems: Vec<Problem>,
    pub prompt_ids: Vec<Vec<u32>>,
}

/// Generates `n` samples for each prompt and scores them as they finish.
#[allow(clippy::too_many_arguments)]
pub fn collect(
    engine: &Engine,
    policy: &Model,
    version: u64,
    task: &dyn Task,
    tokenizer: &Tokenizer,
    batch: &PromptBatch,
    n: usize,
    params: &SamplingParams,
    tag: &str,
) -> Rollouts {
    let mut requests = Vec::with_capacity(batch.problems.len() * n);
    for (p, ids) in batch.prompt_ids.iter().enumerate() {
        for k in 0..n {
            requests.push(GenRequest {
                id: (p * n + k) as u64,
                prompt: ids.clone(),
                resumed: Vec::new(),
                params: params.clone(),
                budget: None,
            });
        }
    }
    let mut slots: Vec<Option<(Trajectory, bool)>> = (0..requests.len()).map(|_| None).collect();
    let stats = engine.generate(policy, version, requests, |out| {
        let id = out.id as usize;
        let (p, k) = (id / n, id % n);
        let problem = &batch.problems[p];
        // The reward program sees text; the gradient only ever sees the token ids.
        let answer_ids: Vec<u32> = out
            .tokens
            .iter()
            .copied()
            .filter(|t| !params.stop_token_ids.contains(t))
            .collect();
        let (reward, correct, status) = match tokenizer.decode(&answer_ids, true) {
            Ok(text) => {
                let score = task.score(problem, &text);
                let status = if out.finish == Finish::Stop {
                    Status::Finished
                } else {
                    Status::Truncated
                };
                (score.reward, score.correct, status)
            }
            Err(e) => (
                0.0,
                false,
                Status::Failed(format!("decoding the response: {e}")),
            ),
        };
        let len = out.tokens.len();
        let trajectory = Trajectory {
            id: format!("{tag}-p{p}-s{k}"),
            group: format!("{tag}-p{p}"),
            transitions: vec![Transition {
                prompt: batch.prompt_ids[p].clone(),
                response: out.tokens,
                loss_mask: vec![1; len],
                logprobs: out.logprobs,
                versions: out.versions,
                reward: None,
            }],
            reward,
            status,
        };
        slots[id] = Some((trajectory, correct));
    });
    let (trajectories, correct) = slots.into_iter().flatten().unzip();
    Rollouts {
        trajectories,
        correct,
        engine: stats,
    }
}
