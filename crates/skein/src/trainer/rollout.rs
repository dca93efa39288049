//! One step's rollouts: sample prompts, generate `n` responses each, and score every response
//! the moment it finishes. The task's checker runs inside the engine's callback (it judges
//! `correct`, and is the reward when no `[reward]` sources are configured); configured sources
//! only receive the request there and are collected after generation, so scoring overlaps it.

use super::reward::{failed_status, request, RewardStats, RoundRewards};
use crate::engine::{EngineStats, Finish, GenRequest, Generator, SamplingParams};
use crate::model::Model;
use skein_plan::{Status, Trajectory, Transition};
use skein_reward::Rewarder;
use skein_tasks::{Problem, Task};
use skein_text::Tokenizer;

pub struct Rollouts {
    pub trajectories: Vec<Trajectory>,
    /// Parallel to `trajectories`: whether the task judged the answer correct.
    pub correct: Vec<bool>,
    pub engine: EngineStats,
    pub rewards: RewardStats,
}

pub struct PromptBatch {
    pub problems: Vec<Problem>,
    pub prompt_ids: Vec<Vec<u32>>,
}

/// Generates `n` samples for each prompt and scores them as they finish.
#[allow(clippy::too_many_arguments)]
pub fn collect(
    engine: &Generator,
    policy: &Model,
    version: u64,
    task: &dyn Task,
    tokenizer: &Tokenizer,
    batch: &PromptBatch,
    n: usize,
    params: &SamplingParams,
    tag: &str,
    rewarder: Option<&Rewarder>,
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
                session: None,
            });
        }
    }
    let mut slots: Vec<Option<(Trajectory, bool)>> = (0..requests.len()).map(|_| None).collect();
    let mut round = RoundRewards::new(rewarder);
    let stats = engine.generate(policy, version, requests, |out| {
        let id = out.id as usize;
        let (p, k) = (id / n, id % n);
        let judged = score_response(
            task,
            tokenizer,
            &batch.problems[p],
            &out.tokens,
            out.finish,
            &params.stop_token_ids,
        );
        let traj_id = format!("{tag}-p{p}-s{k}");
        if let (true, Some(text)) = (round.active(), judged.text) {
            let req = request(
                traj_id.clone(),
                &batch.problems[p],
                &batch.prompt_ids[p],
                &out.tokens,
                text,
            );
            round.submit(id, req);
        }
        let trajectory = single_turn(
            traj_id,
            format!("{tag}-p{p}"),
            batch.prompt_ids[p].clone(),
            out.tokens,
            out.logprobs,
            out.versions,
            judged.reward,
            judged.status,
        );
        slots[id] = Some((trajectory, judged.correct));
    });
    let rewards = round.finish(|id, result| {
        if let Some((t, _)) = &mut slots[id] {
            apply_reward(t, result);
        }
    });
    let (trajectories, correct) = slots.into_iter().flatten().unzip();
    Rollouts {
        trajectories,
        correct,
        engine: stats,
        rewards,
    }
}

/// Sets a trajectory's reward from its sources, or fails it when they failed.
pub fn apply_reward(
    t: &mut Trajectory,
    result: Result<skein_reward::RewardOutput, skein_reward::RewardError>,
) {
    match result {
        Ok(out) => t.reward = out.reward,
        Err(e) => {
            t.reward = 0.0;
            t.status = failed_status(&e);
        }
    }
}

/// What the task's checker made of one response.
pub struct Judged {
    /// The task's reward (the trajectory's reward unless `[reward]` sources replace it).
    pub reward: f64,
    pub correct: bool,
    pub status: Status,
    /// The decoded response (None when it does not decode; the trajectory has failed).
    pub text: Option<String>,
}

/// Scores one finished response (`tokens`, stop token included). The reward program sees
/// text; the gradient only ever sees the token ids.
pub fn score_response(
    task: &dyn Task,
    tokenizer: &Tokenizer,
    problem: &Problem,
    tokens: &[u32],
    finish: Finish,
    stop_token_ids: &[u32],
) -> Judged {
    let answer_ids: Vec<u32> = tokens
        .iter()
        .copied()
        .filter(|t| !stop_token_ids.contains(t))
        .collect();
    if finish == Finish::Failed {
        return Judged {
            reward: 0.0,
            correct: false,
            status: Status::Failed("the remote engine failed to generate it".into()),
            text: None,
        };
    }
    match tokenizer.decode(&answer_ids, true) {
        Ok(text) => {
            let score = task.score(problem, &text);
            let status = if finish == Finish::Stop {
                Status::Finished
            } else {
                Status::Truncated
            };
            Judged {
                reward: score.reward,
                correct: score.correct,
                status,
                text: Some(text),
            }
        }
        Err(e) => Judged {
            reward: 0.0,
            correct: false,
            status: Status::Failed(format!("decoding the response: {e}")),
            text: None,
        },
    }
}

/// A one-call trajectory whose every response token was sampled by the policy.
#[allow(clippy::too_many_arguments)]
pub fn single_turn(
    id: String,
    group: String,
    prompt: Vec<u32>,
    response: Vec<u32>,
    logprobs: Vec<f32>,
    versions: Vec<u64>,
    reward: f64,
    status: Status,
) -> Trajectory {
    let len = response.len();
    Trajectory {
        id,
        group,
        transitions: vec![Transition {
            prompt,
            response,
            loss_mask: vec![1; len],
            logprobs,
            versions,
            reward: None,
        }],
        reward,
        status,
    }
}
