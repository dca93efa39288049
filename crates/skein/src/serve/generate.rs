//! From a validated prompt to engine outputs: sampling parameters checked and built, `n`
//! requests submitted at once (they share decode steps with everything else in flight), each
//! token passed on as it comes for a streamed call, and for a rollout-scoped call, the exact
//! outputs appended to the rollout.

use super::error::ApiError;
use super::openai::{Exact, GenerateRequest, Usage};
use super::state::ServeState;
use super::store::{RecordedCall, StoreError};
use super::text::{add_stop_ids, TextSide};
use crate::engine::{Finish, GenOutput, GenRequest, SamplingParams, TokenWatch};
use axum::http::StatusCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One generated choice, token-exact.
pub struct Sample {
    pub out: GenOutput,
    /// Where the first of the request's `stop` strings starts in the decoded completion: its
    /// text ends there.
    pub stop_at: Option<usize>,
}

impl Sample {
    /// The completion's text, ended before a `stop` string it reached.
    pub fn text(&self, text: &TextSide) -> Result<String, ApiError> {
        let mut decoded = text.decode(&self.out.tokens)?;
        if let Some(at) = self.stop_at {
            decoded.truncate(at);
        }
        Ok(decoded)
    }

    /// Ends the completion at the first token whose text completes one of `stops`, as if
    /// generation had stopped there: the tokens kept are what the policy sampled, and whether
    /// to stop depends only on them, so a recorded call is the policy's sample with `stop`.
    /// Tokens past that one are dropped.
    fn cut_at_stop(&mut self, stops: &[String], text: &TextSide) -> Result<(), ApiError> {
        let first_stop =
            |decoded: &str| stops.iter().filter_map(|s| decoded.find(s.as_str())).min();
        let tokens = &self.out.tokens;
        if first_stop(&text.decode(tokens)?).is_none() {
            return Ok(());
        }
        // The shortest prefix whose text holds a stop string: a longer prefix's text extends
        // a shorter one's, so the search halves.
        let (mut lo, mut hi) = (1, tokens.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match first_stop(&text.decode(&tokens[..mid])?) {
                Some(_) => hi = mid,
                None => lo = mid + 1,
            }
        }
        self.out.keep_first(hi);
        self.out.finish = Finish::Stop;
        self.stop_at = first_stop(&text.decode(&self.out.tokens)?);
        Ok(())
    }

    pub fn finish_reason(&self) -> &'static str {
        match self.out.finish {
            Finish::Stop => "stop",
            // No request here has a budget, so none pauses; a pause would mean "cut short".
            // A too-long context is refused with 400 before it reaches the engine.
            Finish::Length | Finish::Paused | Finish::Failed | Finish::ContextTooLong => "length",
        }
    }

    pub fn exact(&self, prompt: &[u32]) -> Exact {
        Exact {
            prompt_token_ids: prompt.to_vec(),
            completion_token_ids: self.out.tokens.clone(),
            logprobs: self.out.logprobs.clone(),
            versions: self.out.versions.clone(),
        }
    }
}

pub fn usage(prompt: &[u32], samples: &[Sample]) -> Usage {
    let completion: usize = samples.iter().map(|s| s.out.tokens.len()).sum();
    Usage {
        prompt_tokens: prompt.len(),
        completion_tokens: completion,
        total_tokens: prompt.len() + completion,
    }
}

pub fn store_error(e: StoreError) -> ApiError {
    let message = e.to_string();
    match e {
        StoreError::BadId(_) => ApiError::bad_request(message),
        StoreError::Duplicate(_) | StoreError::Closed(_) => ApiError::conflict(message),
        StoreError::Unknown(_) | StoreError::Ended { .. } => ApiError::not_found(message),
    }
}

/// Checks the request fields that do not depend on the prompt: model name, `n`, sampling
/// ranges. Returns the sampling parameters and `n`. A request in a rollout
/// (`recorded`) is training data: it samples from the whole distribution, whose log-probs are
/// the ones recorded, so `top_p` and `top_k` are refused there.
pub fn sampling(
    state: &ServeState,
    req: &GenerateRequest,
    recorded: bool,
) -> Result<(SamplingParams, usize), ApiError> {
    let cfg = &state.0.config;
    if let Some(model) = &req.model {
        if model != &cfg.model_name {
            return Err(ApiError::not_found(format!(
                "model `{model}` not found (served: {})",
                cfg.model_name
            )));
        }
    }
    refuse_unsupported(req)?;
    let n = req.n.unwrap_or(1);
    if n == 0 || n > cfg.max_n {
        return Err(ApiError::bad_request(format!(
            "`n` is {n}; it must be between 1 and {}",
            cfg.max_n
        )));
    }
    let max_new = req
        .max_completion_tokens
        .or(req.max_tokens)
        .unwrap_or(cfg.default_max_tokens);
    if max_new == 0 {
        let field = max_tokens_field(req).unwrap_or("max_tokens");
        return Err(ApiError::bad_request(format!(
            "`{field}` must be at least 1"
        )));
    }
    let trained_at = cfg.rollout_temperature.filter(|_| recorded);
    let temperature = req.temperature.unwrap_or(trained_at.unwrap_or(1.0));
    if let Some(t) = trained_at.filter(|&t| t != temperature) {
        return Err(ApiError::bad_request(format!(
            "`temperature` = {temperature} in a rollout: the trainer recomputes its log-probs at \
             rollout.sampling.temperature = {t}, so another temperature would make the recorded \
             samples off-policy; send {t}, or leave it out"
        )));
    }
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(ApiError::bad_request(format!(
            "`temperature` is {temperature}; it must be a finite number ≥ 0 (0 is greedy)"
        )));
    }
    let temperature = if temperature < crate::engine::sampling::MIN_SAMPLING_TEMPERATURE {
        0.0
    } else {
        temperature
    };
    if recorded && temperature == 0.0 {
        return Err(ApiError::bad_request(
            "`temperature` = 0 in a rollout: greedy decoding draws nothing from the policy, so \
             the recorded log-probs would be of no distribution its tokens came from (off-policy \
             for any update); send a temperature above 0 here (greedy is fine outside a \
             rollout, at /v1/...)",
        ));
    }
    let top_p = req.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_request(format!(
            "`top_p` is {top_p}; it must be in (0, 1]"
        )));
    }
    let top_k = match req.top_k.unwrap_or(0) {
        // vLLM's -1 and 0 both mean off.
        k if k >= -1 => k.max(0) as usize,
        k => {
            return Err(ApiError::bad_request(format!(
                "`top_k` is {k}; it must be a count of tokens, or 0 or -1 for none"
            )))
        }
    };
    if recorded && (top_p < 1.0 || top_k > 0) {
        return Err(ApiError::bad_request(format!(
            "`top_p` = {top_p} and `top_k` = {top_k}: a rollout's samples are recorded for \
             training with the log-probs of the whole distribution, and truncated sampling \
             would make them off-policy; send top_p 1 and top_k 0 here (either is fine outside \
             a rollout, at /v1/...)"
        )));
    }
    let params = SamplingParams {
        temperature,
        top_p,
        top_k,
        max_new_tokens: max_new,
        stop_token_ids: stop_ids(state, req)?,
    };
    Ok((params, n))
}

/// The field that set the request's token limit (`max_completion_tokens` wins over
/// `max_tokens`), or `None` when the server's default applies.
pub fn max_tokens_field(req: &GenerateRequest) -> Option<&'static str> {
    if req.max_completion_tokens.is_some() {
        Some("max_completion_tokens")
    } else if req.max_tokens.is_some() {
        Some("max_tokens")
    } else {
        None
    }
}

/// The model's stop ids and the request's `stop_token_ids`, each of which must be a token of
/// the vocabulary.
fn stop_ids(state: &ServeState, req: &GenerateRequest) -> Result<Vec<u32>, ApiError> {
    let text = &state.0.text;
    let mut ids = text.stop_ids().to_vec();
    let asked = req.stop_token_ids.as_deref().unwrap_or_default();
    add_stop_ids(&mut ids, asked, text.vocab_size()).map_err(|id| {
        ApiError::bad_request(format!(
            "`stop_token_ids` has {id}, outside the vocabulary of {} tokens",
            text.vocab_size()
        ))
    })?;
    Ok(ids)
}

/// Most `stop` strings one request may give: each is looked for in the completion's text.
pub const MAX_STOP_STRINGS: usize = 64;

/// The request's `stop` strings (a string or a list of them; empty, null or none: none).
pub fn stop_strings(req: &GenerateRequest) -> Result<Vec<String>, ApiError> {
    use serde_json::Value;
    let refuse = |why: String| Err(ApiError::bad_request(format!("`stop` {why}")));
    let stops: Vec<String> = match &req.stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) if items.len() > MAX_STOP_STRINGS => {
            return refuse(format!(
                "has {} entries; at most {MAX_STOP_STRINGS} are looked for",
                items.len()
            ))
        }
        Some(Value::Array(items)) => {
            match items
                .iter()
                .map(Value::as_str)
                .collect::<Option<Vec<&str>>>()
            {
                Some(strings) => strings.into_iter().map(String::from).collect(),
                None => return refuse("must be a string or a list of strings".into()),
            }
        }
        Some(other) => {
            return refuse(format!(
                "must be a string or a list of strings, not {other}"
            ))
        }
    };
    Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
}

/// OpenAI-style `logprobs` would change what the client gets back; asked for, they are
/// refused rather than ignored.
fn refuse_unsupported(req: &GenerateRequest) -> Result<(), ApiError> {
    use serde_json::Value;
    let asked = |v: &Option<Value>| match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    };
    if asked(&req.logprobs) || asked(&req.top_logprobs) {
        return Err(ApiError::bad_request(
            "`logprobs` and `top_logprobs` are not supported: each choice's \
             `skein.logprobs` holds the log-prob of every sampled token; leave them out",
        ));
    }
    if req.seed.as_ref().is_some_and(|s| !s.is_null()) {
        return Err(ApiError::bad_request(
            "`seed` is not supported: completions draw from the server's generator (a trainer \
             seeds it per step, from run.seed); leave `seed` out",
        ));
    }
    if let Some(field) = req.unknown_field() {
        return Err(ApiError::bad_request(format!(
            "`{field}` is not a field skein reads: ignoring it could change the completion you \
             expect (vLLM's guided decoding, a misspelt option); leave it out (fields accepted \
             and ignored, which change nothing: {})",
            super::openai::IGNORED_FIELDS.join(", ")
        )));
    }
    if let Some((field, value)) = req.not_neutral() {
        return Err(ApiError::bad_request(format!(
            "`{field}` = {value} is not supported: skein returns the model's own completion, \
             ended at its stop tokens or max_tokens; leave `{field}` out"
        )));
    }
    // Each with its neutral value: what skein's sampling already is.
    let changes = [
        ("presence_penalty", req.presence_penalty, 0.0),
        ("frequency_penalty", req.frequency_penalty, 0.0),
        ("repetition_penalty", req.repetition_penalty, 1.0),
        ("min_p", req.min_p, 0.0),
    ];
    if let Some((field, Some(got), neutral)) = changes
        .into_iter()
        .find(|(_, got, neutral)| got.is_some_and(|g| g != *neutral))
    {
        return Err(ApiError::bad_request(format!(
            "`{field}` = {got} is not supported: skein samples the model's distribution, cut \
             only by temperature, top_p and top_k (the trainer computes its log-probs over the \
             same); leave `{field}` out or at {neutral}"
        )));
    }
    Ok(())
}

/// A completion request checked and ready to generate.
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// How many completions (choices) of the prompt.
    pub n: usize,
    /// The request's `stop` strings.
    pub stops: Vec<String>,
    /// The field that set `params.max_new_tokens` ([`max_tokens_field`]); `None` for the
    /// server's default, which a completion may not reach when the context ends first.
    pub max_tokens_field: Option<&'static str>,
}

/// Where a streamed request's tokens go as the engine samples them: (choice, token id).
pub type TokenSender = tokio::sync::mpsc::UnboundedSender<(usize, u32)>;

/// Generates the job's `n` completions, each ended at the first of its `stops` it reaches,
/// and for a rollout-scoped call, records them: [`check`], [`sample`], [`record`]. Dropped
/// before it is done (its client gone), it ends the completions at their next token and
/// records nothing, as a stream whose client left.
pub async fn run(
    state: &ServeState,
    rollout: Option<&str>,
    job: &Job,
) -> Result<Vec<Sample>, ApiError> {
    check(state, rollout, job)?;
    let samples = sample(state, job, None).await?;
    if let Some(id) = rollout {
        record(state, id, job, &samples)?;
    }
    Ok(samples)
}

/// What is checked before generating: the prompt fits the context with a new token and is
/// of the vocabulary, the tokens the request asked for (`max_tokens`) fit after it, as vLLM
/// checks, and a rollout-scoped call's rollout is open. A stream checks it before it starts,
/// so that these are answered with their status.
pub fn check(state: &ServeState, rollout: Option<&str>, job: &Job) -> Result<(), ApiError> {
    let prompt = &job.prompt;
    let capacity = state.0.config.capacity.max(1) as usize;
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if prompt.len() >= capacity {
        return Err(ApiError::bad_request(format!(
            "the prompt is {} tokens; the model's context holds {capacity} including at least one new token: shorten the prompt",
            prompt.len()
        )));
    }
    if let Some(field) = job.max_tokens_field {
        let asked = job.params.max_new_tokens;
        if prompt.len() + asked > capacity {
            return Err(ApiError::bad_request(format!(
                "`{field}` is {asked}, but the prompt is {} tokens and the model's context \
                 holds {capacity} (prompt and completion): at most {} new tokens fit: lower \
                 `{field}`, or leave it out",
                prompt.len(),
                capacity - prompt.len()
            )));
        }
    }
    state.0.text.check_ids(prompt)?;
    if let Some(id) = rollout {
        state.0.store.check_open(id).map_err(store_error)?;
    }
    Ok(())
}

/// Generates the job's `n` completions (its [`check`] passed), each ended at the first of its
/// `stops` it reaches. With `progress`, each sampled token is sent there as it comes. Dropped
/// before it is done (its client gone: the server drops a handler's future when the
/// connection closes, and a stream's when its body is dropped), it ends the completions at
/// their next token, so an answer no one will read stops taking the engine's slots.
pub async fn sample(
    state: &ServeState,
    job: &Job,
    progress: Option<&TokenSender>,
) -> Result<Vec<Sample>, ApiError> {
    let Job {
        prompt,
        params,
        n,
        stops,
        max_tokens_field: _,
    } = job;
    // The engine ends each sample at the token that completes a stop string; the exact cut
    // (text before the string, ids through that token) is made below.
    let stop = state.0.text.stop_watch(stops);
    // The engine's own end is one token later (its last sampled token is never fed back), so
    // the server's default limit is cut here to what [`check`] lets a request ask for: prompt
    // and completion within the context, as an OpenAI-style client counts it.
    let room = (state.0.config.capacity.max(1) as usize).saturating_sub(prompt.len());
    let params = SamplingParams {
        max_new_tokens: params.max_new_tokens.min(room),
        ..params.clone()
    };
    let dropped = Arc::new(AtomicBool::new(false));
    let _dropped_when_this_is = SetOnDrop(dropped.clone());
    let calls = (0..*n).map(|i| {
        state.0.engine.generate(GenRequest {
            id: i as u64,
            prompt: prompt.clone(),
            resumed: Vec::new(),
            params: params.clone(),
            budget: None,
            session: None,
            watch: Some(watch(i, stop.clone(), progress, &dropped)),
        })
    });
    let mut samples = Vec::with_capacity(*n);
    for out in futures_util::future::join_all(calls).await {
        let out = out.map_err(|gone| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{gone}: restart the server"),
            )
        })?;
        samples.push(Sample { out, stop_at: None });
    }
    samples.sort_by_key(|s| s.out.id);
    if !stops.is_empty() {
        for sample in &mut samples {
            sample.cut_at_stop(stops, &state.0.text)?;
        }
    }
    Ok(samples)
}

/// Appends a call's samples to rollout `id`, exactly as they were returned.
pub fn record(state: &ServeState, id: &str, job: &Job, samples: &[Sample]) -> Result<(), ApiError> {
    let calls = samples
        .iter()
        .map(|s| RecordedCall {
            prompt_ids: job.prompt.clone(),
            completion_ids: s.out.tokens.clone(),
            logprobs: s.out.logprobs.clone(),
            versions: s.out.versions.clone(),
            finish: s.finish_reason().to_string(),
        })
        .collect();
    state.0.store.record(id, calls).map_err(|e| match e {
        StoreError::Unknown(id) => ApiError::not_found(format!(
            "rollout `{id}` was closed while this call generated; its output is not recorded"
        )),
        StoreError::Ended { id, how } => ApiError::not_found(format!(
            "rollout `{id}` ended ({how}) while this call generated; its output is not recorded"
        )),
        other => store_error(other),
    })
}

/// Choice `choice`'s watcher: the stop test, and with `progress`, each token sent on; a
/// token no one receives ends the completion, and so does any token once `dropped` is set.
fn watch(
    choice: usize,
    stop: Option<TokenWatch>,
    progress: Option<&TokenSender>,
    dropped: &Arc<AtomicBool>,
) -> TokenWatch {
    let progress = progress.cloned();
    let dropped = dropped.clone();
    TokenWatch::new(move |generated: &[u32]| {
        let token = generated.last().copied().unwrap_or_default();
        let unread = progress
            .as_ref()
            .is_some_and(|p| p.send((choice, token)).is_err());
        unread
            || dropped.load(Ordering::Relaxed)
            || stop.as_ref().is_some_and(|s| s.ends(generated))
    })
}

/// Sets its flag when dropped: when the future that holds it finishes, or is dropped
/// unfinished. Only the second can reach a completion still generating.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
