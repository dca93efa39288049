//! `stream: true`: a finished completion sent as OpenAI's server-sent events, so clients and
//! agent frameworks that only stream (or stream by default) get their answer.
//!
//! The engine hands over a completion when it ends, so the stream carries it whole: per
//! choice one chunk with all of its text (and tool calls), then one with its finish reason and
//! the token-exact `skein` record, then, when `stream_options.include_usage` asks, a chunk of
//! the usage with no choice, then `data: [DONE]`. The answer is the one `stream: false` gets,
//! only framed as a stream; tokens do not arrive any sooner.

use super::openai::{ChatResponse, CompletionResponse, Exact, GenerateRequest, Usage};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{json, Value};

/// How a streamed answer is framed; `None` from [`requested`] for a plain JSON answer.
#[derive(Debug, Clone, Copy)]
pub struct StreamOptions {
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
}

/// The request's stream framing, if it asks for a stream.
pub fn requested(req: &GenerateRequest) -> Option<StreamOptions> {
    (req.stream == Some(true)).then(|| StreamOptions {
        include_usage: req
            .other
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

/// One event: the answer's identity around `choices`, and the usage in the last.
#[derive(Serialize)]
struct Chunk<'a, C: Serialize> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: C,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<&'a Usage>,
}

/// A choice's last event: its finish reason and token-exact record (typed, so the log-probs
/// keep the float32 text the plain answer gives them).
#[derive(Serialize)]
struct Finish<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'static str>,
    logprobs: Option<()>,
    finish_reason: &'static str,
    skein: &'a Exact,
}

impl<'a> Finish<'a> {
    /// A chat choice's last event (an empty delta), or a text choice's (an empty text).
    fn new(index: usize, finish_reason: &'static str, skein: &'a Exact, chat: bool) -> Self {
        Finish {
            index,
            delta: chat.then(|| json!({})),
            text: (!chat).then_some(""),
            logprobs: None,
            finish_reason,
            skein,
        }
    }
}

/// A chat completion as `chat.completion.chunk` events.
pub fn chat(resp: ChatResponse, opts: StreamOptions) -> Response {
    let choices = resp.choices.iter().map(|c| {
        let mut delta = json!({"role": c.message.role, "content": c.message.content});
        if let Some(calls) = &c.message.tool_calls {
            // A streamed tool call carries its place among the message's calls.
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(k, call)| {
                    json!({"index": k, "id": call.id, "type": call.kind,
                           "function": {"name": call.function.name,
                                        "arguments": call.function.arguments}})
                })
                .collect();
            delta["tool_calls"] = Value::Array(calls);
        }
        let first = json!({"index": c.index, "delta": delta, "logprobs": null,
                           "finish_reason": null});
        (first, Finish::new(c.index, c.finish_reason, &c.skein, true))
    });
    let head = Head::new(&resp.id, "chat.completion.chunk", resp.created, &resp.model);
    stream(head, choices, opts.include_usage.then_some(&resp.usage))
}

/// A text completion as `text_completion` events.
pub fn completion(resp: CompletionResponse, opts: StreamOptions) -> Response {
    let choices = resp.choices.iter().map(|c| {
        let first = json!({"index": c.index, "text": c.text, "logprobs": null,
                           "finish_reason": null});
        (
            first,
            Finish::new(c.index, c.finish_reason, &c.skein, false),
        )
    });
    let head = Head::new(&resp.id, "text_completion", resp.created, &resp.model);
    stream(head, choices, opts.include_usage.then_some(&resp.usage))
}

/// What every event of one answer repeats.
#[derive(Clone, Copy)]
struct Head<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
}

impl<'a> Head<'a> {
    fn new(id: &'a str, object: &'static str, created: u64, model: &'a str) -> Self {
        Head {
            id,
            object,
            created,
            model,
        }
    }

    fn chunk<C: Serialize>(self, choices: C, usage: Option<&'a Usage>) -> Chunk<'a, C> {
        Chunk {
            id: self.id,
            object: self.object,
            created: self.created,
            model: self.model,
            choices,
            usage,
        }
    }
}

/// The events of an answer: each choice's first and last, then the usage, if given, then
/// `[DONE]`, as a `text/event-stream` body.
fn stream<'a>(
    head: Head<'a>,
    choices: impl Iterator<Item = (Value, Finish<'a>)>,
    usage: Option<&'a Usage>,
) -> Response {
    let mut body = String::new();
    for (first, last) in choices {
        body.push_str(&event(&head.chunk([first], None)));
        body.push_str(&event(&head.chunk([last], None)));
    }
    if let Some(usage) = usage {
        body.push_str(&event(&head.chunk([(); 0], Some(usage))));
    }
    body.push_str("data: [DONE]\n\n");
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// One server-sent event of `chunk`.
fn event(chunk: &impl Serialize) -> String {
    // Serializing plain data (strings, numbers, the token-exact record) cannot fail.
    let json = serde_json::to_string(chunk).unwrap_or_default();
    format!("data: {json}\n\n")
}
