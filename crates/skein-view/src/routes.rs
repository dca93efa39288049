//! The page and its JSON API. Every error is a JSON `{"error": "..."}` with a status: 400 for a
//! bad query, 404 for a run, step, trajectory or group that is not there, 500 for a file that
//! cannot be read (its message names the file and line).

use crate::marks::{row_marks, RowMarks};
use crate::runs::Runs;
use crate::summary::Summary;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::{json, Value};
use skein_report::trajectories::TrajectoryRecord;
use std::collections::HashMap;
use std::sync::Arc;

/// The page: one file, its styles and script inline, nothing fetched from elsewhere.
pub const PAGE: &str = include_str!("page.html");

/// The viewer's routes; on a loopback address, only for requests that name this machine.
pub fn guarded_router(runs: Arc<Runs>, loopback: bool) -> Router {
    let app = router(runs);
    if loopback {
        app.layer(axum::middleware::from_fn(loopback_host_only))
    } else {
        app
    }
}

/// A viewer on loopback answers only requests whose `Host` is a loopback name: a page of
/// another site can point its own name at 127.0.0.1 (DNS rebinding) and read the runs through
/// its visitor's browser, and such a request carries that site's name.
async fn loopback_host_only(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if is_loopback_host(host) {
        return next.run(req).await;
    }
    ApiError::new(
        StatusCode::FORBIDDEN,
        format!(
            "the viewer listens on this machine only and answers requests for localhost or \
             127.0.0.1, not for Host `{host}`"
        ),
    )
    .into_response()
}

/// `localhost`, a loopback address, either with a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

pub fn router(runs: Arc<Runs>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/runs", get(list_runs))
        .route("/api/metrics", get(metrics))
        .route("/api/steps", get(steps))
        .route("/api/step", get(step))
        .route("/api/trajectory", get(trajectory))
        .route("/api/group", get(group))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such page".into()) })
        .with_state(runs)
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Files change while a run trains: always ask again.
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
        .into_response()
}

struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: String) -> ApiError {
        ApiError { status, message }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

type Params = Query<HashMap<String, String>>;
type Reply = Result<Json<Value>, ApiError>;

fn param<'a>(q: &'a Params, name: &str) -> Result<&'a str, ApiError> {
    q.get(name)
        .map(String::as_str)
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, format!("missing `{name}`")))
}

fn number(q: &Params, name: &str) -> Result<usize, ApiError> {
    let v = param(q, name)?;
    v.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("`{name}` must be a number, got {v:?}"),
        )
    })
}

/// Runs `f` off the async workers: it reads and decodes files.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

fn run_index(runs: &Runs, q: &Params) -> Result<usize, ApiError> {
    let run = number(q, "run")?;
    runs.get(run)
        .map_err(|e| ApiError::new(StatusCode::NOT_FOUND, format!("{e:#}")))?;
    Ok(run)
}

/// The records of the step a query names.
fn step_records(runs: &Runs, q: &Params) -> Result<Arc<Vec<TrajectoryRecord>>, ApiError> {
    let run = run_index(runs, q)?;
    let step = number(q, "step")?;
    runs.step(run, step)?.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "no trajectories of step {step} in {}",
                runs.list()[run].dir.display()
            ),
        )
    })
}

/// A record with its rows' marks, as the page draws it.
#[derive(Serialize)]
struct Shown<'a> {
    trajectory: &'a TrajectoryRecord,
    marks: Vec<RowMarks>,
    summary: Summary,
}

fn shown(t: &TrajectoryRecord) -> Shown<'_> {
    Shown {
        trajectory: t,
        marks: t.rows.iter().map(row_marks).collect(),
        summary: Summary::of(t),
    }
}

async fn list_runs(State(runs): State<Arc<Runs>>) -> Reply {
    let list: Vec<Value> = runs
        .list()
        .iter()
        .enumerate()
        .map(|(i, r)| json!({ "run": i, "name": r.name, "dir": r.dir.display().to_string() }))
        .collect();
    Ok(Json(json!({ "runs": list })))
}

async fn metrics(State(runs): State<Arc<Runs>>, q: Params) -> Reply {
    blocking(move || {
        let run = run_index(&runs, &q)?;
        Ok(Json(json!({ "run": run, "metrics": runs.metrics(run)? })))
    })
    .await
}

async fn steps(State(runs): State<Arc<Runs>>, q: Params) -> Reply {
    blocking(move || {
        let run = run_index(&runs, &q)?;
        Ok(Json(json!({ "run": run, "steps": runs.steps(run)? })))
    })
    .await
}

async fn step(State(runs): State<Arc<Runs>>, q: Params) -> Reply {
    blocking(move || {
        let records = step_records(&runs, &q)?;
        let list: Vec<Summary> = records.iter().map(Summary::of).collect();
        Ok(Json(json!({ "trajectories": list })))
    })
    .await
}

async fn trajectory(State(runs): State<Arc<Runs>>, q: Params) -> Reply {
    blocking(move || {
        let records = step_records(&runs, &q)?;
        let id = param(&q, "id")?;
        let t = records.iter().find(|t| t.id == id).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no trajectory {id:?} in this step"),
            )
        })?;
        Ok(Json(json!(shown(t))))
    })
    .await
}

async fn group(State(runs): State<Arc<Runs>>, q: Params) -> Reply {
    blocking(move || {
        let records = step_records(&runs, &q)?;
        let group = param(&q, "group")?;
        let members: Vec<Shown> = records
            .iter()
            .filter(|t| t.group == group)
            .map(shown)
            .collect();
        if members.is_empty() {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no group {group:?} in this step"),
            ));
        }
        Ok(Json(json!({ "group": group, "trajectories": members })))
    })
    .await
}
