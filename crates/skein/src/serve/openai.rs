//! The request and response bodies of the OpenAI-compatible routes, and the conversion of
//! OpenAI chat messages into the chat template's messages. Fields clients commonly send and
//! that change nothing of a completion (`user`, `metadata`…) are accepted and ignored; those
//! that would change what a client gets back and skein does not do (`stop` strings,
//! `logprobs`, a `seed`, penalties, `min_p`, a `tool_choice` but `auto`, `logit_bias`,
//! `response_format`, `echo`…) are refused unless absent or neutral, and so is any field it
//! does not know.

use super::error::ApiError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skein_text::{FunctionCall, Message, ToolCall};

/// The body of both completion routes (one struct, so a wrong type is reported with its
/// field's name): chat requests carry `messages`, completion requests `prompt`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenerateRequest {
    pub messages: Option<Vec<ChatMessage>>,
    pub tools: Option<Vec<Value>>,
    pub prompt: Option<Prompt>,
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    /// The chat API's newer name for `max_tokens`; wins when both are given.
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// vLLM's extension; 0 or -1 disables it.
    pub top_k: Option<i64>,
    /// vLLM's extension: token ids that end a completion besides the model's own stop ids
    /// (a trainer's `rollout.sampling.stop_token_ids`).
    pub stop_token_ids: Option<Vec<u32>>,
    pub n: Option<usize>,
    pub stream: Option<bool>,
    /// Stop strings: refused unless null or empty (the model's stop tokens end a completion).
    pub stop: Option<Value>,
    /// OpenAI's log-probs (chat: a bool; completions: a count of alternatives): refused
    /// unless null, false or 0 and `top_logprobs` likewise; `skein.logprobs` carries the
    /// sampled tokens' log-probs.
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<Value>,
    /// Refused unless null: sampling draws from the server's generator, which a trainer
    /// seeds per step.
    pub seed: Option<Value>,
    /// Refused unless 0 (OpenAI's neutral value): skein samples the model's distribution.
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// vLLM's extensions, refused unless neutral (1 and 0).
    pub repetition_penalty: Option<f64>,
    pub min_p: Option<f64>,
    /// vLLM's extension: extra variables of the chat template (e.g. `enable_thinking`), as
    /// transformers' `apply_chat_template(**kwargs)` takes them. Chat only.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Refused unless absent or `auto`: skein offers the tools and returns whatever calls the
    /// model writes; it cannot force or forbid one.
    pub tool_choice: Option<Value>,
    /// Other OpenAI and vLLM options skein does not do, each refused unless absent or at
    /// the value that changes nothing ([`GenerateRequest::not_neutral`]).
    pub logit_bias: Option<Value>,
    pub response_format: Option<Value>,
    pub echo: Option<Value>,
    pub best_of: Option<Value>,
    pub suffix: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
    pub ignore_eos: Option<Value>,
    pub min_tokens: Option<Value>,
    /// vLLM's chat extensions: skein always closes the last message and opens a new
    /// assistant turn.
    pub add_generation_prompt: Option<Value>,
    pub continue_final_message: Option<Value>,
    /// Every other field of the body: accepted when it is one of [`IGNORED_FIELDS`], which
    /// change nothing of a completion, and refused otherwise, so that an option skein does not
    /// do (vLLM's `guided_json`, a misspelt `max_token`) is never dropped without a word.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

/// Fields clients send that change nothing of a completion: who asks, bookkeeping of the
/// provider's, and how a stream is framed.
pub const IGNORED_FIELDS: [&str; 9] = [
    "user",
    "metadata",
    "store",
    "stream_options",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "request_id",
    "priority",
];

impl GenerateRequest {
    /// The first option skein does not do that the request sets to something other than
    /// its neutral value, with that value: `logit_bias` other than `{}`, a `response_format`
    /// other than text, `echo`, `best_of` above 1, a `suffix`, `parallel_tool_calls` false
    /// (skein cannot forbid a second call), `ignore_eos`, `min_tokens` above 0,
    /// `add_generation_prompt` false, `continue_final_message`.
    pub fn not_neutral(&self) -> Option<(&'static str, &Value)> {
        fn empty(v: &Value) -> bool {
            v.as_object().is_some_and(|o| o.is_empty())
        }
        fn text(v: &Value) -> bool {
            v.get("type").and_then(Value::as_str) == Some("text")
        }
        fn falsy(v: &Value) -> bool {
            v == &Value::Bool(false)
        }
        fn at_most_one(v: &Value) -> bool {
            v.as_f64().is_some_and(|n| n <= 1.0)
        }
        fn blank(v: &Value) -> bool {
            v.as_str() == Some("")
        }
        fn truthy(v: &Value) -> bool {
            v == &Value::Bool(true)
        }
        fn zero(v: &Value) -> bool {
            v.as_f64() == Some(0.0)
        }
        type Neutral = fn(&Value) -> bool;
        let options: [(&'static str, &Option<Value>, Neutral); 10] = [
            ("logit_bias", &self.logit_bias, empty),
            ("response_format", &self.response_format, text),
            ("echo", &self.echo, falsy),
            ("best_of", &self.best_of, at_most_one),
            ("suffix", &self.suffix, blank),
            ("parallel_tool_calls", &self.parallel_tool_calls, truthy),
            ("ignore_eos", &self.ignore_eos, falsy),
            ("min_tokens", &self.min_tokens, zero),
            ("add_generation_prompt", &self.add_generation_prompt, truthy),
            (
                "continue_final_message",
                &self.continue_final_message,
                falsy,
            ),
        ];
        options.into_iter().find_map(|(name, value, neutral)| {
            let v = value.as_ref().filter(|v| !v.is_null())?;
            (!neutral(v)).then_some((name, v))
        })
    }
}

impl GenerateRequest {
    /// The first field of the body that skein neither reads nor knows to change nothing.
    pub fn unknown_field(&self) -> Option<&str> {
        self.other
            .keys()
            .map(String::as_str)
            .find(|k| !IGNORED_FIELDS.contains(k))
    }
}

/// Variables the chat template gets from the request itself, which `chat_template_kwargs`
/// cannot set.
const TEMPLATE_VARIABLES: [&str; 5] = [
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// The chat template's extra variables (`chat_template_kwargs`), after refusing a
/// `tool_choice` skein cannot keep and a variable the request itself sets.
pub fn template_variables(
    req: &GenerateRequest,
) -> Result<serde_json::Map<String, Value>, ApiError> {
    match &req.tool_choice {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "auto" => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "`tool_choice` = {other} is not supported: the model is offered the tools and \
                 its calls are returned as it writes them (`auto`); leave `tool_choice` out or \
                 set it to \"auto\""
            )))
        }
    }
    let kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    if let Some(name) = TEMPLATE_VARIABLES.iter().find(|v| kwargs.contains_key(**v)) {
        return Err(ApiError::bad_request(format!(
            "`chat_template_kwargs` sets `{name}`, which the request itself gives the template \
             (`messages`, `tools`, the generation prompt, the model's tokens): leave it out"
        )));
    }
    Ok(kwargs)
}

/// A chat message as OpenAI clients send it.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    pub tool_calls: Option<Vec<InToolCall>>,
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    pub reasoning_content: Option<String>,
}

/// `content`: a string, or a list of parts of which only text parts are understood.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "a string, null, or a list of {\"type\": \"text\", \"text\": ...} parts"
)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct InToolCall {
    pub id: Option<String>,
    pub function: InFunction,
}

#[derive(Debug, Clone, Deserialize)]
pub struct InFunction {
    pub name: String,
    /// OpenAI sends a JSON string; an object is accepted too.
    #[serde(default)]
    pub arguments: Value,
}

const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// OpenAI messages to template messages. Tool-call arguments sent as JSON strings are parsed
/// into objects, the form HF templates print (as vLLM does before rendering).
pub fn to_template_messages(messages: &[ChatMessage]) -> Result<Vec<Message>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("`messages` is empty"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            if !ROLES.contains(&m.role.as_str()) && m.role != "developer" {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}].role is `{}`; expected one of system, user, assistant, tool",
                    m.role
                )));
            }
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(s)) => s.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            _ => {
                                return Err(ApiError::bad_request(format!(
                                    "messages[{i}].content[{j}] is a `{}` part; only text parts are supported",
                                    p.kind
                                )))
                            }
                        }
                    }
                    text
                }
            };
            let tool_calls = m.tool_calls.as_ref().map(|calls| {
                calls
                    .iter()
                    .map(|c| ToolCall {
                        id: c.id.clone(),
                        kind: "function".into(),
                        function: FunctionCall {
                            name: c.function.name.clone(),
                            arguments: parse_arguments(&c.function.arguments),
                        },
                    })
                    .collect()
            });
            // `developer` is the newer OpenAI name of the system role.
            let role = if m.role == "developer" { "system" } else { &m.role };
            Ok(Message {
                role: role.to_string(),
                content,
                tool_calls,
                name: m.name.clone(),
                tool_call_id: m.tool_call_id.clone(),
                reasoning_content: m.reasoning_content.clone(),
                content_is_null: m.content.is_none(),
            })
        })
        .collect()
}

fn parse_arguments(v: &Value) -> Value {
    match v {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| v.clone()),
        other => other.clone(),
    }
}

/// A completion prompt: text, or token ids (what a remote-engine client sends).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "a string or a list of token ids")]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    /// A batch of prompts: refused with a message (one prompt per request).
    Batch(Vec<Value>),
}

/// The token-exact record of one choice, so no client ever retokenizes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Exact {
    pub prompt_token_ids: Vec<u32>,
    pub completion_token_ids: Vec<u32>,
    /// Behavior log-prob of each completion token.
    pub logprobs: Vec<f32>,
    /// Policy version that sampled each completion token.
    pub versions: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct OutToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: OutFunction,
}

#[derive(Debug, Clone, Serialize)]
pub struct OutFunction {
    pub name: String,
    /// A JSON string, as OpenAI returns it.
    pub arguments: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<OutToolCall>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub finish_reason: &'static str,
    pub logprobs: Option<()>,
    pub skein: Exact,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub finish_reason: &'static str,
    pub logprobs: Option<()>,
    pub skein: Exact,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `tool_choice` other than `auto` and template variables the request itself sets are
    /// refused by name; other `chat_template_kwargs` pass through.
    #[test]
    fn template_variables_refuse_what_skein_cannot_keep() {
        let req =
            |body: serde_json::Value| -> GenerateRequest { serde_json::from_value(body).unwrap() };
        let ok =
            req(json!({"tool_choice": "auto", "chat_template_kwargs": {"enable_thinking": false}}));
        assert_eq!(
            template_variables(&ok).unwrap()["enable_thinking"],
            json!(false)
        );
        for choice in [
            json!("required"),
            json!("none"),
            json!({"type": "function"}),
        ] {
            let err = template_variables(&req(json!({ "tool_choice": choice }))).unwrap_err();
            assert!(err.message.contains("`tool_choice`"), "{err}");
        }
        let err =
            template_variables(&req(json!({"chat_template_kwargs": {"tools": []}}))).unwrap_err();
        assert!(err.message.contains("sets `tools`"), "{err}");
    }

    #[test]
    fn openai_messages_become_template_messages() {
        let msgs: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"x\": 1}"}}]},
            {"role": "tool", "content": "2", "tool_call_id": "c1"}
        ]))
        .unwrap();
        let out = to_template_messages(&msgs).unwrap();
        assert_eq!(out[0].role, "system");
        assert_eq!(out[1].content, "ab");
        let call = &out[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.function.arguments, json!({"x": 1}));
        assert_eq!(out[3].tool_call_id.as_deref(), Some("c1"));
    }

    #[test]
    fn unknown_roles_images_and_empty_conversations_are_refused() {
        let bad_role: Vec<ChatMessage> =
            serde_json::from_value(json!([{"role": "robot", "content": "x"}])).unwrap();
        assert!(to_template_messages(&bad_role)
            .unwrap_err()
            .message
            .contains("robot"));
        let image: Vec<ChatMessage> = serde_json::from_value(
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        )
        .unwrap();
        assert!(to_template_messages(&image)
            .unwrap_err()
            .message
            .contains("image_url"));
        assert!(to_template_messages(&[]).is_err());
    }

    #[test]
    fn prompts_are_text_ids_or_a_refused_batch() {
        let prompt = |v: Value| {
            serde_json::from_value::<GenerateRequest>(json!({ "prompt": v }))
                .unwrap()
                .prompt
                .unwrap()
        };
        assert!(matches!(prompt(json!([1, 2, 3])), Prompt::Ids(v) if v == [1, 2, 3]));
        assert!(matches!(prompt(json!("hi")), Prompt::Text(_)));
        assert!(matches!(prompt(json!(["a", "b"])), Prompt::Batch(_)));
    }
}
