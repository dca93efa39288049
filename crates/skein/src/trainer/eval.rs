//! Held-out evaluation: greedy answers to problems drawn from a seed training never uses.

use super::rollout::{collect, PromptBatch};
use crate::engine::{Generator, SamplingParams};
use crate::model::Model;
use skein_reward::Rewarder;
use skein_tasks::Task;
use skein_text::Tokenizer;

#[derive(Debug, Clone, Copy, Default)]
pub struct EvalResult {
    pub accuracy: f64,
    pub mean_reward: f64,
}

pub fn evaluate(
    engine: &Generator,
    policy: &Model,
    task: &dyn Task,
    tokenizer: &Tokenizer,
    batch: &PromptBatch,
    params: &SamplingParams,
    rewarder: Option<&Rewarder>,
) -> EvalResult {
    let greedy = SamplingParams {
        temperature: 0.0,
        ..params.clone()
    };
    let r = collect(
        engine, policy, 0, task, tokenizer, batch, 1, &greedy, "eval", rewarder,
    );
    let n = r.trajectories.len().max(1) as f64;
    EvalResult {
        accuracy: r.correct.iter().filter(|&&c| c).count() as f64 / n,
        mean_reward: r.trajectories.iter().map(|t| t.reward).sum::<f64>() / n,
    }
}
