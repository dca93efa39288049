//! The routes: OpenAI-compatible completions (plain and rollout-scoped), the task queue and
//! rewards of rollouts, weight reloads, health.

use super::answer::{self, Identity};
use super::error::{ApiError, Body, RolloutId};
use super::generate::{self, store_error};
use super::guard;
use super::openai::GenerateRequest;
use super::state::ServeState;
use super::store::TaskSpec;
use super::stream;
use crate::engine::Control;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// Every route of the server, with its limits (body size, API key, requests in flight).
pub fn router(state: ServeState) -> Router {
    let body_limit = state.0.config.max_body_bytes;
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/reload", post(reload))
        .route("/rollouts/{id}/v1/chat/completions", post(rollout_chat))
        .route("/rollouts/{id}/v1/completions", post(rollout_completions))
        .route("/rollouts/{id}/v1/models", get(models))
        .route("/rollouts/{id}", get(rollout))
        .route("/rollouts/{id}/reward", post(reward))
        .route("/rollouts/{id}/fail", post(fail))
        .route("/tasks", post(add_tasks))
        .route("/tasks/next", get(next_task))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::guard,
        ))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

async fn not_found(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!(
        "no route {method} {}: the model is under /v1 (or a rollout's /rollouts/ID/v1)",
        uri.path()
    ))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {method}", uri.path()),
    )
}

/// What load balancers probe: 503 once the engine thread has died, when every completion
/// would fail, so traffic goes elsewhere and the server is restarted.
async fn health(State(s): State<ServeState>) -> (StatusCode, Json<Value>) {
    let version = s.current_version();
    if s.0.engine.is_running() {
        (
            StatusCode::OK,
            Json(json!({"status": "ok", "version": version})),
        )
    } else {
        let body = json!({"status": "engine stopped: restart the server", "version": version});
        (StatusCode::SERVICE_UNAVAILABLE, Json(body))
    }
}

async fn models(State(s): State<ServeState>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.0.config.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "skein",
            "max_model_len": s.0.config.capacity,
        }]
    }))
}

async fn chat(
    State(s): State<ServeState>,
    Body(req): Body<GenerateRequest>,
) -> Result<Response, ApiError> {
    chat_answer(&s, None, req).await
}

async fn rollout_chat(
    State(s): State<ServeState>,
    RolloutId(id): RolloutId,
    Body(req): Body<GenerateRequest>,
) -> Result<Response, ApiError> {
    chat_answer(&s, Some(&id), req).await
}

async fn completions(
    State(s): State<ServeState>,
    Body(req): Body<GenerateRequest>,
) -> Result<Response, ApiError> {
    completion_answer(&s, None, req).await
}

async fn rollout_completions(
    State(s): State<ServeState>,
    RolloutId(id): RolloutId,
    Body(req): Body<GenerateRequest>,
) -> Result<Response, ApiError> {
    completion_answer(&s, Some(&id), req).await
}

/// A chat completion as JSON, or as a stream when the request asks for one. A request that
/// cannot be generated is refused with its status before any stream starts.
async fn chat_answer(
    s: &ServeState,
    rollout: Option<&str>,
    req: GenerateRequest,
) -> Result<Response, ApiError> {
    let chat = answer::chat_job(s, rollout.is_some(), &req)?;
    if let Some(opts) = stream::requested(&req) {
        return stream::chat(s.clone(), rollout.map(String::from), chat, opts);
    }
    let samples = generate::run(s, rollout, &chat.job).await?;
    let resp = answer::chat_response(s, &chat, &samples, Identity::chat(s))?;
    Ok(Json(resp).into_response())
}

/// A text completion as JSON, or as a stream when the request asks for one.
async fn completion_answer(
    s: &ServeState,
    rollout: Option<&str>,
    req: GenerateRequest,
) -> Result<Response, ApiError> {
    let job = answer::completion_job(s, rollout.is_some(), &req)?;
    if let Some(opts) = stream::requested(&req) {
        return stream::completion(s.clone(), rollout.map(String::from), job, opts);
    }
    let samples = generate::run(s, rollout, &job).await?;
    let resp = answer::completion_response(s, &job, &samples, Identity::completion(s))?;
    Ok(Json(resp).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReloadRequest {
    path: PathBuf,
}

/// Loads new weights into the engine (after the requests it is running finish) and answers
/// with the new policy version. The path is any directory on the server, and a failed load
/// says whether it exists, so a server other hosts reach without an API key refuses it. A
/// trainer's server refuses it too: the trainer owns its weights, and the reload would end
/// its engine's phase, leaving every open rollout of the step to time out.
async fn reload(
    State(s): State<ServeState>,
    Body(req): Body<ReloadRequest>,
) -> Result<Json<Value>, ApiError> {
    if s.0.config.rollout_temperature.is_some() {
        return Err(ApiError::conflict(
            "this server is a trainer's: its weights change with each update of the policy, \
             and a reload would end the step's rollouts; reload a `skein serve` of your own",
        ));
    }
    if s.open_to_other_hosts() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "/v1/reload loads weights from a path on the server, so a server listening beyond \
             loopback takes it only with an API key: restart with --api-key (or bind 127.0.0.1)",
        ));
    }
    let served = s.clone();
    let dir = req.path.clone();
    tokio::task::spawn_blocking(move || {
        super::reload_text::check_same_text(served.0.text.tokenizer(), &dir)
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("checking the new text: {e}"),
        )
    })?
    .map_err(|e| ApiError::bad_request(format!("reloading the weights: {e:#}")))?;
    let gone =
        |e: crate::engine::EngineGone| ApiError::unavailable(format!("{e}: restart the server"));
    let (reply, answer) = tokio::sync::oneshot::channel();
    s.0.engine
        .control(Control::Reload {
            dir: req.path,
            reply,
        })
        .map_err(gone)?;
    let version = answer
        .await
        .map_err(|_| gone(crate::engine::EngineGone))?
        .map_err(|e| ApiError::bad_request(format!("reloading the weights: {e}")))?;
    s.0.version.fetch_max(version, Ordering::SeqCst);
    Ok(Json(json!({ "version": version })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddTasks {
    tasks: Vec<TaskSpec>,
}

/// Queues tasks for `GET /tasks/next`. A trainer's server refuses them: its trainer hands out
/// each step's tasks and waits for that many rollouts to close, so tasks of another's would
/// end its step early, and one named like the trainer's own would stop the run.
async fn add_tasks(
    State(s): State<ServeState>,
    Body(req): Body<AddTasks>,
) -> Result<Json<Value>, ApiError> {
    if s.0.config.rollout_temperature.is_some() {
        return Err(ApiError::conflict(
            "this server is a trainer's: it hands out its own tasks each step at \
             /tasks/next; queue tasks on a `skein serve` of your own",
        ));
    }
    let added = req.tasks.len();
    s.0.store.add_tasks(req.tasks).map_err(store_error)?;
    Ok(Json(json!({ "added": added })))
}

/// The next waiting task (it becomes open), or 204 when none waits.
async fn next_task(State(s): State<ServeState>) -> Response {
    match s.0.store.next_task() {
        None => StatusCode::NO_CONTENT.into_response(),
        Some(t) => Json(json!({
            "base_url": format!("/rollouts/{}/v1", t.rollout_id),
            "rollout_id": t.rollout_id,
            "group": t.group,
            "task": t.task,
        }))
        .into_response(),
    }
}

async fn rollout(
    State(s): State<ServeState>,
    RolloutId(id): RolloutId,
) -> Result<Json<Value>, ApiError> {
    let (state, recording) =
        s.0.store
            .get(&id)
            .ok_or_else(|| ApiError::not_found(format!("no rollout `{id}`")))?;
    let mut body = serde_json::to_value(recording)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding: {e}")))?;
    body["state"] = json!(state);
    Ok(Json(body))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RewardRequest {
    reward: f64,
    #[serde(default)]
    correct: Option<bool>,
}

async fn reward(
    State(s): State<ServeState>,
    RolloutId(id): RolloutId,
    Body(req): Body<RewardRequest>,
) -> Result<Json<Value>, ApiError> {
    if !req.reward.is_finite() {
        return Err(ApiError::bad_request("`reward` must be a finite number"));
    }
    s.0.store
        .close(&id, req.reward, req.correct, None)
        .map_err(store_error)?;
    Ok(Json(json!({"rollout_id": id, "state": "closed"})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FailRequest {
    error: String,
}

async fn fail(
    State(s): State<ServeState>,
    RolloutId(id): RolloutId,
    Body(req): Body<FailRequest>,
) -> Result<Json<Value>, ApiError> {
    s.0.store
        .close(&id, 0.0, None, Some(req.error))
        .map_err(store_error)?;
    Ok(Json(json!({"rollout_id": id, "state": "closed"})))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GET `path` from a server on loopback with a plain socket: the status line and body.
    fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(addr).unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        let status = answer.lines().next().unwrap_or_default().to_string();
        let body = answer
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_string();
        (status, body)
    }

    /// `/health` is what load balancers probe: once the engine thread has died (here it
    /// panics holding the queue), it answers 503, as every completion would fail.
    #[test]
    fn health_fails_once_the_engine_thread_has_died() {
        let tokenizer = skein_text::Tokenizer::char_level("ab").unwrap();
        let vocab = tokenizer.vocab_size();
        let text = crate::serve::TextSide::new(tokenizer, vocab).unwrap();
        let (handle, queue) = crate::engine::channel();
        let state = ServeState::new(handle, text, crate::serve::ServeConfig::default());
        let server = crate::serve::spawn("127.0.0.1:0", state, 1).unwrap();
        let (status, body) = get(server.addr(), "/health");
        assert!(status.contains("200"), "{status} {body}");
        let engine = std::thread::spawn(move || {
            let _queue = queue;
            panic!("the engine thread dies");
        });
        assert!(engine.join().is_err());
        let (status, body) = get(server.addr(), "/health");
        assert!(
            status.contains("503") && body.contains("restart"),
            "{status} {body}"
        );
    }
}
