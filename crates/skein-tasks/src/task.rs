//! What a task is: it samples problems, checks responses, and can demonstrate a solution.

use crate::rng::TaskRng;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    pub prompt: String,
    pub ground_truth: String,
    pub data_source: String,
    pub meta: serde_json::Value,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    pub reward: f64,
    /// The answer is right (strict; partial format credit never sets this).
    pub correct: bool,
    /// The response had the expected shape.
    pub formatted: bool,
}

pub trait Task: Send + Sync {
    fn name(&self) -> &str;
    fn sample(&self, rng: &mut TaskRng) -> Problem;
    /// Scores untrusted model output: never panics, whatever the text.
    fn score(&self, problem: &Problem, response: &str) -> Score;
    /// A teacher's response, for supervised warm-up: correct unless the task's teacher is
    /// careless (`arithmetic`'s `dropped_carries`) or not optimal (`guess`).
    fn demonstration(&self, problem: &Problem, rng: &mut TaskRng) -> String;
    /// Every character a prompt or a demonstration can contain.
    fn alphabet(&self) -> &'static str;
    fn max_response_chars(&self) -> usize;
    /// Distinct problems `sample` can draw (None: too many to matter); a small space is not
    /// split into training and held-out problems (`crate::split`).
    fn problem_count(&self) -> Option<u64> {
        None
    }
    /// The prompts are text a chat template rendered, which writes the model's start tokens
    /// itself; otherwise they are plain text, which the tokenizer's start tokens (a BOS) go
    /// before.
    fn prompt_is_rendered(&self) -> bool {
        false
    }
}
