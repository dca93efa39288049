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

/// A misuse of an environment by its caller (a step after the end); model output never causes
/// one.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvError(pub String);

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EnvError {}

/// One episode. `step` receives the model's message (decoded text, stop token removed) and
/// never panics, whatever the text.
pub trait Env: Send {
    fn step(&mut self, message: &str) -> Result<EnvStep, EnvError>;

    /// The state the next message will be written in, as a key: two episodes of one problem
    /// with the same key are in the same state (for step-level credit, `algorithm.
    /// step_group_weight`). None: the environment does not name its states.
    fn state_key(&self) -> Option<String> {
        None
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
    /// Every character a prompt, a demonstration or an environment message can contain,
    /// `render_plain`'s wrappers included (for a character-level tokenizer built from it).
    fn alphabet(&self) -> &'static str;
    /// Turns an episode may take before it is cut off (counted as truncated, reward 0).
    fn max_turns(&self) -> usize;
    /// Longest message a demonstration produces, in characters.
    fn max_message_chars(&self) -> usize;
    /// Distinct problems `sample` can draw (None: too many to matter); a small space is not
    /// split into training and held-out problems (`crate::split`).
    fn problem_count(&self) -> Option<u64> {
        None
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
