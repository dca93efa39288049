//! `stream: true`: an answer as OpenAI's server-sent events, its text sent in pieces as the
//! engine samples its tokens.
//!
//! A chat's choices open with their role; then each choice's text comes in pieces as it is
//! generated ([`StreamedText`] says what can be sent yet); when the completions end, each
//! choice gets the rest of its text (and its tool calls), then an event with its finish
//! reason and the token-exact `skein` record, then, when `stream_options.include_usage` asks,
//! an event of the usage with no choice, then `data: [DONE]`. Put together, the pieces are
//! the answer `stream: false` gets.
//!
//! With tools offered, a chat's text is streamed up to the first `<tool_call>`: the calls and
//! any text after them come at the end, where the calls are parsed out of the text (which
//! also trims it, so a text that starts with whitespace waits for the end whole). A request refused before generating answers with its status, not a stream;
//! an error after the stream has begun (a rollout closed meanwhile, the engine gone) is its
//! last event, in OpenAI's error shape. A client that goes away before the completions end
//! ends them at the next token, and a rollout records nothing of them. The server's
//! in-flight limit holds a stream's place until its body ends (`guard`).

use super::answer::{self, ChatJob, Identity};
use super::error::ApiError;
use super::generate::{self, Job, Sample};
use super::openai::{Exact, GenerateRequest, Usage};
use super::state::ServeState;
use super::stream_text::StreamedText;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

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

/// A chat completion as `chat.completion.chunk` events, generated as they are sent; refused
/// with its status, before the stream starts, when it cannot be generated.
pub fn chat(
    s: ServeState,
    rollout: Option<String>,
    chat: ChatJob,
    opts: StreamOptions,
) -> Result<Response, ApiError> {
    generate::check(&s, rollout.as_deref(), &chat.job)?;
    let head = Head::new(&s, Identity::chat(&s), "chat.completion.chunk");
    Ok(live(s, rollout, Answer::Chat(chat), head, opts))
}

/// A text completion as `text_completion` events, generated as they are sent; refused like
/// a chat's.
pub fn completion(
    s: ServeState,
    rollout: Option<String>,
    job: Job,
    opts: StreamOptions,
) -> Result<Response, ApiError> {
    generate::check(&s, rollout.as_deref(), &job)?;
    let head = Head::new(&s, Identity::completion(&s), "text_completion");
    Ok(live(s, rollout, Answer::Text(job), head, opts))
}

/// What is streamed: a chat's answer or a text completion's.
enum Answer {
    Chat(ChatJob),
    Text(Job),
}

impl Answer {
    fn job(&self) -> &Job {
        match self {
            Answer::Chat(chat) => &chat.job,
            Answer::Text(job) => job,
        }
    }

    /// Whether tool-call blocks are parsed out of the text at the end.
    fn parses_tool_calls(&self) -> bool {
        matches!(self, Answer::Chat(chat) if chat.tools_offered)
    }

    /// The strings nothing is streamed past: the request's `stop` strings, and where tool
    /// calls are parsed, the tag that opens one (the call and what follows come at the end).
    fn streamed_until(&self) -> Vec<String> {
        let mut until = self.job().stops.clone();
        if self.parses_tool_calls() {
            until.push(skein_text::TOOL_CALL_OPEN.to_string());
        }
        until
    }

    /// A choice's event carrying a piece of its text.
    fn piece(&self, index: usize, text: &str) -> Value {
        match self {
            Answer::Chat(_) => json!({"index": index, "delta": {"content": text},
                                      "logprobs": null, "finish_reason": null}),
            Answer::Text(_) => json!({"index": index, "text": text, "logprobs": null,
                                      "finish_reason": null}),
        }
    }

    /// The events that end the stream of `samples`: each choice's rest of its text (and tool
    /// calls), then its finish; then the usage.
    fn ending(
        &self,
        s: &ServeState,
        head: &Head,
        samples: &[Sample],
        texts: &[StreamedText],
    ) -> Result<(Vec<Value>, Vec<Finish>, Usage), ApiError> {
        let identity = Identity {
            id: head.id.clone(),
            created: head.created,
        };
        let rest = |index: usize, text: &str| match texts[index].rest(text) {
            Some(rest) => rest.to_string(),
            None => {
                eprintln!(
                    "skein serve: choice {index} of {}: the text streamed is not the beginning \
                     of its final text; its `skein` record holds the exact tokens",
                    head.id
                );
                String::new()
            }
        };
        let mut pieces = Vec::new();
        let mut finishes = Vec::new();
        match self {
            Answer::Chat(chat) => {
                let resp = answer::chat_response(s, chat, samples, identity)?;
                for c in resp.choices {
                    let mut delta = json!({});
                    if let Some(content) = &c.message.content {
                        let rest = rest(c.index, content);
                        if !rest.is_empty() {
                            delta["content"] = Value::String(rest);
                        }
                    }
                    if let Some(calls) = &c.message.tool_calls {
                        delta["tool_calls"] = tool_call_deltas(calls);
                    }
                    if delta != json!({}) {
                        pieces.push(json!({"index": c.index, "delta": delta, "logprobs": null,
                                           "finish_reason": null}));
                    }
                    finishes.push(Finish::new(c.index, c.finish_reason, c.skein, true));
                }
                Ok((pieces, finishes, resp.usage))
            }
            Answer::Text(job) => {
                let resp = answer::completion_response(s, job, samples, identity)?;
                for c in resp.choices {
                    let rest = rest(c.index, &c.text);
                    if !rest.is_empty() {
                        pieces.push(self.piece(c.index, &rest));
                    }
                    finishes.push(Finish::new(c.index, c.finish_reason, c.skein, false));
                }
                Ok((pieces, finishes, resp.usage))
            }
        }
    }
}

/// Tool calls as a streamed delta carries them: each with its place among the message's.
fn tool_call_deltas(calls: &[super::openai::OutToolCall]) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(k, call)| {
            json!({"index": k, "id": call.id, "type": call.kind,
                   "function": {"name": call.function.name,
                                "arguments": call.function.arguments}})
        })
        .collect()
}

/// A choice's last event: its finish reason and token-exact record (typed, so the log-probs
/// keep the float32 text the plain answer gives them).
#[derive(Serialize)]
struct Finish {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'static str>,
    logprobs: Option<()>,
    finish_reason: &'static str,
    skein: Exact,
}

impl Finish {
    /// A chat choice's last event (an empty delta), or a text choice's (an empty text).
    fn new(index: usize, finish_reason: &'static str, skein: Exact, chat: bool) -> Self {
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

/// What every event of one answer repeats.
struct Head {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
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

impl Head {
    fn new(s: &ServeState, identity: Identity, object: &'static str) -> Self {
        Head {
            id: identity.id,
            object,
            created: identity.created,
            model: s.0.config.model_name.clone(),
        }
    }

    /// One server-sent event of `choices` (and `usage`).
    fn event<C: Serialize>(&self, choices: C, usage: Option<&Usage>) -> String {
        let chunk = Chunk {
            id: &self.id,
            object: self.object,
            created: self.created,
            model: &self.model,
            choices,
            usage,
        };
        // Serializing plain data (strings, numbers, the token-exact record) cannot fail.
        let json = serde_json::to_string(&chunk).unwrap_or_default();
        format!("data: {json}\n\n")
    }
}

/// The response whose body is the events, sent as they are made.
fn live(
    s: ServeState,
    rollout: Option<String>,
    answer: Answer,
    head: Head,
    opts: StreamOptions,
) -> Response {
    let (events, received) = mpsc::unbounded_channel::<String>();
    tokio::spawn(produce(s, rollout, answer, head, opts, events));
    let body = futures_util::stream::unfold(received, |mut received| async move {
        let event = received.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(event), received))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// Generates the answer, records it in its rollout, and sends its events to `events`.
/// Returning early (the client gone) drops the generation, so a rollout records nothing, and
/// the engine ends the completions at their next token, which no one receives.
async fn produce(
    s: ServeState,
    rollout: Option<String>,
    answer: Answer,
    head: Head,
    opts: StreamOptions,
    events: mpsc::UnboundedSender<String>,
) {
    let job = answer.job();
    if let Answer::Chat(_) = answer {
        for index in 0..job.n {
            let role = json!({"index": index, "delta": {"role": "assistant", "content": ""},
                              "logprobs": null, "finish_reason": null});
            if events.send(head.event([role], None)).is_err() {
                return;
            }
        }
    }
    let (tokens, mut sampled) = mpsc::unbounded_channel();
    let generation = generate::sample(&s, job, Some(&tokens));
    tokio::pin!(generation);
    let until = answer.streamed_until();
    let mut texts: Vec<StreamedText> = (0..job.n)
        .map(|_| StreamedText::new(answer.parses_tool_calls()))
        .collect();
    let decode = |ids: &[u32]| s.0.text.decode(ids).ok();
    let samples = loop {
        tokio::select! {
            biased;
            Some(first) = sampled.recv() => {
                if events.is_closed() {
                    return;
                }
                // Every token that has come, then one decode per choice that grew.
                let mut grew = vec![false; job.n];
                let more = std::iter::from_fn(|| sampled.try_recv().ok());
                for (choice, token) in std::iter::once(first).chain(more) {
                    texts[choice].push(token);
                    grew[choice] = true;
                }
                for choice in (0..job.n).filter(|&c| grew[c]) {
                    if let Some(piece) = texts[choice].next_piece(decode, &until) {
                        let event = head.event([answer.piece(choice, &piece)], None);
                        if events.send(event).is_err() {
                            return;
                        }
                    }
                }
            }
            samples = &mut generation => break samples,
        }
    };
    // A client gone before the end (its last token a stop id, which ends the completion
    // anyway) gets nothing recorded either.
    if events.is_closed() {
        return;
    }
    let ending = samples.and_then(|samples| {
        if let Some(id) = &rollout {
            generate::record(&s, id, job, &samples)?;
        }
        answer.ending(&s, &head, &samples, &texts)
    });
    let (pieces, finishes, usage) = match ending {
        Ok(ending) => ending,
        Err(e) => {
            let _ = events.send(format!("data: {}\n\n", e.body()));
            return;
        }
    };
    for piece in pieces {
        let _ = events.send(head.event([piece], None));
    }
    for finish in finishes {
        let _ = events.send(head.event([finish], None));
    }
    if opts.include_usage {
        let _ = events.send(head.event([(); 0], Some(&usage)));
    }
    let _ = events.send("data: [DONE]\n\n".to_string());
}
