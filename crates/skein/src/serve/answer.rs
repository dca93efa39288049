//! A completion request made ready to generate (its prompt rendered or read, its sampling
//! checked), and its samples made into OpenAI's answer, whole or streamed. For a chat, the
//! prompt goes through the model's chat template and the reply's tool calls are parsed.

use super::error::ApiError;
use super::generate::{self, Job, Sample};
use super::openai::{
    template_variables, to_template_messages, AssistantMessage, ChatChoice, ChatResponse,
    CompletionChoice, CompletionResponse, GenerateRequest, OutFunction, OutToolCall, Prompt,
};
use super::state::ServeState;
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

/// A chat request ready to generate.
pub struct ChatJob {
    pub job: Job,
    /// Whether the request offered tools, so that tool-call blocks in the reply become
    /// `tool_calls`.
    pub tools_offered: bool,
}

/// What every form of one answer carries: its id and when it was created.
pub struct Identity {
    pub id: String,
    pub created: u64,
}

impl Identity {
    pub fn chat(s: &ServeState) -> Self {
        Identity {
            id: format!("chatcmpl-{}", s.fresh_id()),
            created: now(),
        }
    }

    pub fn completion(s: &ServeState) -> Self {
        Identity {
            id: format!("cmpl-{}", s.fresh_id()),
            created: now(),
        }
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Checks a chat request and renders its messages (and tools) into prompt ids.
pub fn chat_job(
    s: &ServeState,
    recorded: bool,
    req: &GenerateRequest,
) -> Result<ChatJob, ApiError> {
    let (params, n) = generate::sampling(s, req, recorded)?;
    let messages = req
        .messages
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("`messages` is required"))?;
    if req.prompt.is_some() {
        return Err(ApiError::bad_request(
            "`prompt` belongs to /v1/completions; a chat request sends `messages`",
        ));
    }
    let messages = to_template_messages(messages)?;
    let tools = req
        .tools
        .as_ref()
        .filter(|t| !t.is_empty())
        .map(|t| Value::Array(t.clone()));
    let variables = template_variables(req)?;
    let capacity = s.0.config.capacity.max(1) as usize;
    let (_, prompt) =
        s.0.text
            .chat_prompt(&messages, tools.as_ref(), &variables, capacity)?;
    let stops = generate::stop_strings(req)?;
    Ok(ChatJob {
        job: Job {
            prompt,
            params,
            n,
            stops,
            max_tokens_field: generate::max_tokens_field(req),
        },
        tools_offered: tools.is_some(),
    })
}

/// The chat answer of `samples`, generated for `chat`.
pub fn chat_response(
    s: &ServeState,
    chat: &ChatJob,
    samples: &[Sample],
    identity: Identity,
) -> Result<ChatResponse, ApiError> {
    let prompt = &chat.job.prompt;
    let mut choices = Vec::with_capacity(samples.len());
    for (index, sample) in samples.iter().enumerate() {
        let text = sample.text(&s.0.text)?;
        let finish = sample.finish_reason();
        let (message, finish_reason) =
            assistant_message(text, chat.tools_offered, finish, || s.fresh_id());
        choices.push(ChatChoice {
            index,
            message,
            finish_reason,
            logprobs: None,
            skein: sample.exact(prompt),
        });
    }
    Ok(ChatResponse {
        id: identity.id,
        object: "chat.completion",
        created: identity.created,
        model: s.0.config.model_name.clone(),
        usage: generate::usage(prompt, samples),
        choices,
    })
}

/// The reply as an assistant message. With tools offered, complete `<tool_call>` blocks become
/// `tool_calls` (the text outside them stays `content`, and a stop becomes `tool_calls`); text
/// that does not parse as tool calls is returned as it is.
fn assistant_message(
    text: String,
    tools_offered: bool,
    finish: &'static str,
    mut fresh_id: impl FnMut() -> u64,
) -> (AssistantMessage, &'static str) {
    let calls = match skein_text::parse_tool_calls(&text) {
        Ok(calls) if tools_offered && !calls.is_empty() => calls,
        _ => {
            let message = AssistantMessage {
                role: "assistant",
                content: Some(text),
                tool_calls: None,
            };
            return (message, finish);
        }
    };
    let content = skein_text::strip_tool_calls(&text);
    let tool_calls = calls
        .into_iter()
        .map(|c| OutToolCall {
            id: format!("call_{}", fresh_id()),
            kind: "function",
            function: OutFunction {
                name: c.function.name,
                // OpenAI returns the arguments as a JSON string.
                arguments: match c.function.arguments {
                    Value::String(s) => s,
                    other => other.to_string(),
                },
            },
        })
        .collect();
    let message = AssistantMessage {
        role: "assistant",
        content: (!content.is_empty()).then_some(content),
        tool_calls: Some(tool_calls),
    };
    let reason = if finish == "stop" {
        "tool_calls"
    } else {
        finish
    };
    (message, reason)
}

/// Checks a text completion request and reads its prompt (text or ids).
pub fn completion_job(
    s: &ServeState,
    recorded: bool,
    req: &GenerateRequest,
) -> Result<Job, ApiError> {
    let (params, n) = generate::sampling(s, req, recorded)?;
    let stops = generate::stop_strings(req)?;
    if req.messages.is_some() {
        return Err(ApiError::bad_request(
            "`messages` belongs to /v1/chat/completions; a completion request sends `prompt`",
        ));
    }
    if req.chat_template_kwargs.is_some() || req.tool_choice.is_some() {
        return Err(ApiError::bad_request(
            "`chat_template_kwargs` and `tool_choice` belong to /v1/chat/completions; a \
             completion's prompt is not rendered through the chat template",
        ));
    }
    let prompt = match &req.prompt {
        None => return Err(ApiError::bad_request("`prompt` is required")),
        Some(Prompt::Text(text)) => {
            let capacity = s.0.config.capacity.max(1) as usize;
            s.0.text.text_prompt(text, capacity)?
        }
        Some(Prompt::Ids(ids)) => ids.clone(),
        Some(Prompt::Batch(items)) if items.iter().all(Value::is_number) => {
            return Err(ApiError::bad_request(
                "`prompt` token ids must be integers from 0 to the vocabulary size",
            ))
        }
        Some(Prompt::Batch(_)) => {
            return Err(ApiError::bad_request(
                "`prompt` must be one string or one list of token ids (one prompt per request)",
            ))
        }
    };
    Ok(Job {
        prompt,
        params,
        n,
        stops,
        max_tokens_field: generate::max_tokens_field(req),
    })
}

/// The text completion answer of `samples`, generated for `job`.
pub fn completion_response(
    s: &ServeState,
    job: &Job,
    samples: &[Sample],
    identity: Identity,
) -> Result<CompletionResponse, ApiError> {
    let mut choices = Vec::with_capacity(samples.len());
    for (index, sample) in samples.iter().enumerate() {
        choices.push(CompletionChoice {
            index,
            text: sample.text(&s.0.text)?,
            finish_reason: sample.finish_reason(),
            logprobs: None,
            skein: sample.exact(&job.prompt),
        });
    }
    Ok(CompletionResponse {
        id: identity.id,
        object: "text_completion",
        created: identity.created,
        model: s.0.config.model_name.clone(),
        usage: generate::usage(&job.prompt, samples),
        choices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_call_blocks_become_openai_tool_calls_when_tools_are_offered() {
        let text =
            r#"let me add <tool_call>{"name": "calc", "arguments": {"x": "1+2"}}</tool_call>"#;
        let mut n = 0;
        let (m, reason) = assistant_message(text.into(), true, "stop", || {
            n += 1;
            n
        });
        assert_eq!(reason, "tool_calls");
        assert_eq!(m.content.as_deref(), Some("let me add"));
        let calls = m.tool_calls.unwrap();
        assert_eq!(
            (calls[0].id.as_str(), calls[0].kind),
            ("call_1", "function")
        );
        assert_eq!(calls[0].function.name, "calc");
        let args: Value = serde_json::from_str(&calls[0].function.arguments).unwrap();
        assert_eq!(args, json!({"x": "1+2"}));

        let (m, reason) = assistant_message(text.into(), false, "stop", || 0);
        assert_eq!((m.content.as_deref(), reason), (Some(text), "stop"));
        assert!(m.tool_calls.is_none(), "no tools offered: plain text");
        let broken = "<tool_call>{not json</tool_call>";
        let (m, reason) = assistant_message(broken.into(), true, "length", || 0);
        assert_eq!((m.content.as_deref(), reason), (Some(broken), "length"));
    }
}
