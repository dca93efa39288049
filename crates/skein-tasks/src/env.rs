//! Multi-turn tasks: an episode alternates the model's message and the environment's answer
//! until the environment says it is over, and the program-checked outcome is the reward.

use crate::rng::TaskRng;
use crate::task::{Problem, Score};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A message the environment inserts after the model's turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvMessage {
    pub role: EnvRole,
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvRole {
    User,
    Tool,
}

impl EnvMessage {
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: EnvRole::User,
            content: content.into(),
        }
    }

    pub fn tool(content: impl Into<String>) -> Self {
        Self {
            role: EnvRole::Tool,
            content: content.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum EnvStep {
    /// The episode goes on: `messages` follow the model's message; `reward` is an optional
    /// per-turn reward.
    Continue {
        messages: Vec<EnvMessage>,
        reward: Option<f64>,
    },
    /// The episode is over with this outcome.
    Done(Score),
}

/// Why an environment could not answer: a misuse by its caller (a step after the end), the
/// environment's own failure, or (`worker_failed`) the failure of a process it runs in. Model
/// output never causes one in a built-in environment.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvError {
    pub message: String,
    /// The process hosting the environment crashed, hung or broke its protocol: the
    /// environment itself may be fine, and its episode is lost.
    pub worker_failed: bool,
    /// The environment took longer than its time limit (`agent.env_timeout_s`) to answer.
    pub timed_out: bool,
}

impl EnvError {
    pub fn new(message: impl Into<String>) -> Self {
        EnvError {
            message: message.into(),
            worker_failed: false,
            timed_out: false,
        }
    }

    /// The failure of the process hosting the environment.
    pub fn worker(message: impl Into<String>) -> Self {
        EnvError {
            message: message.into(),
            worker_failed: true,
            timed_out: false,
        }
    }

    /// An environment that did not answer within its time limit.
    pub fn timed_out(message: impl Into<String>) -> Self {
        EnvError {
            timed_out: true,
            ..EnvError::worker(message)
        }
    }
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for EnvError {}

/// One episode. `open` comes first, then `step` receives each model message (decoded text,
/// stop token removed) and never panics, whatever the text.
pub trait Env: Send {
    /// Begins the episode, before the model's first message: the text of its first prompt
    /// when the environment writes it, None when it is the problem's own (`Problem::prompt`,
    /// which a built-in task knows when it samples). An environment in another process
    /// starts its episode here and may fail to. May block.
    fn open(&mut self) -> Result<Option<String>, EnvError> {
        Ok(None)
    }

    fn step(&mut self, message: &str) -> Result<EnvStep, EnvError>;

    /// The state the next message will be written in, as a key: two episodes of one problem
    /// with the same key are in the same state (for step-level credit, `algorithm.
    /// step_group_weight`). None: the environment does not name its states.
    fn state_key(&self) -> Option<String> {
        None
    }

    /// Whether the environment enforces `agent.env_timeout_s` itself, from the moment its
    /// call is served (a worker process answers one request at a time, so a call may first
    /// wait its turn). The agent loop then leaves the clock to it; otherwise the loop times
    /// each call whole.
    fn keeps_own_time(&self) -> bool {
        false
    }
}

/// One turn of a transcript: what the model said and what the environment answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    pub message: String,
    pub reply: Vec<EnvMessage>,
}

/// A multi-turn task: samples problems, starts episodes, and can demonstrate a good next
/// message.
pub trait AgentTask: Send + Sync {
    fn name(&self) -> &str;
    /// `Problem::prompt` is the text of the first prompt.
    fn sample(&self, rng: &mut TaskRng) -> Problem;
    fn start(&self, problem: &Problem) -> Box<dyn Env>;
    /// A good next message given the transcript so far, using only what the model could know
    /// (the prompt and the replies), for supervised warm-up.
    fn demonstration_turn(
        &self,
        problem: &Problem,
        transcript: &[Turn],
        rng: &mut TaskRng,
    ) -> String;
    /// The final answer given at once, without the task's tools, for warm-up demonstrations
    /// that leave it to RL to find when a tool pays (`sft.direct_share`). None: the task has
    /// no tools to go without, or no answer the model could give without them.
    fn direct_answer(&self, _problem: &Problem) -> Option<String> {
        None
    }
    /// Every character a prompt, a demonstration or an environment message can contain,
    /// `render_plain`'s wrappers included (for a character-level tokenizer built from it).
    fn alphabet(&self) -> &str;
    /// Turns an episode may take before it is cut off (counted as truncated, reward 0).
    fn max_turns(&self) -> usize;
    /// Longest message a demonstration produces, in characters.
    fn max_message_chars(&self) -> usize;
    /// Distinct problems `sample` can draw (None: too many to matter); a small space is not
    /// split into training and held-out problems (`crate::split`).
    fn problem_count(&self) -> Option<u64> {
        None
    }

    /// `demonstration_turn`, for a task that may fail to demonstrate (its environment runs
    /// elsewhere). May block.
    fn demonstrate(
        &self,
        problem: &Problem,
        transcript: &[Turn],
        rng: &mut TaskRng,
    ) -> Result<String, EnvError> {
        Ok(self.demonstration_turn(problem, transcript, rng))
    }

    /// Counters of the machinery behind the environment (e.g. worker restarts), totals since
    /// the start; the rollout logs how much each grew in a step. Built-in tasks have none.
    fn counters(&self) -> Vec<(&'static str, f64)> {
        Vec::new()
    }
}

pub const TOOL_OPEN: &str = "<tool_response>";
pub const TOOL_CLOSE: &str = "</tool_response>";

/// Environment messages as plain text, for models without a chat template (the built-in
/// character-level model): a user message is `{content}\n`; a tool message is
/// `<tool_response>{content}</tool_response>\n`. Short on purpose: every character is a token.
pub fn render_plain(messages: &[EnvMessage]) -> String {
    let mut out = String::new();
    for m in messages {
        match m.role {
            EnvRole::User => out.push_str(&m.content),
            EnvRole::Tool => {
                out.push_str(TOOL_OPEN);
                out.push_str(&m.content);
                out.push_str(TOOL_CLOSE);
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_plain_wraps_tool_messages_and_ends_lines() {
        assert_eq!(render_plain(&[]), "");
        let text = render_plain(&[EnvMessage::user("higher"), EnvMessage::tool("42")]);
        assert_eq!(text, "higher\n<tool_response>42</tool_response>\n");
    }

    #[test]
    fn roles_serialize_lowercase() {
        let json = serde_json::to_string(&EnvMessage::tool("1")).unwrap();
        assert_eq!(json, r#"{"role":"tool","content":"1"}"#);
    }
}
