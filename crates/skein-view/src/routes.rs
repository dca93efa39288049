//! The page and its JSON API. Every error is a JSON `{"error": "..."}` with a status: 400 for a
//! bad query, 404 for a run, step, trajectory or group that is not there, 422 for a file the
//! viewer will not read (not a regular file, or past a limit, which the message names), 500 for
//! a file that cannot be read (its message names the file and line).

use crate::limits::Refused;
use crate::marks::{row_marks, RowMarks};
use crate::runs::Runs;
use crate::summary::Summary;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::json;
use skein_report::trajectories::TrajectoryRecord;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The page: one file, its styles and script inline, nothing fetched from elsewhere.
pub const PAGE: &str = include_str!("page.html");

/// The viewer's routes; on a loopback address, only for requests that name this machine.
pub fn guarded_router(viewer: Arc<Viewer>, loopback: bool) -> Router {
    let app = router(viewer);
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

/// What the handlers share: the runs, and the turns to read their files.
pub struct Viewer {
    pub runs: Runs,
    /// Requests that read files hold one while they do: memory is bounded per request, so
    /// this bounds it for all of them.
    reads: Arc<Semaphore>,
}

impl Viewer {
    pub fn new(runs: Runs) -> Viewer {
        let reads = Arc::new(Semaphore::new(runs.limits().concurrent_reads.max(1)));
        Viewer { runs, reads }
    }
}

type Shared = State<Arc<Viewer>>;

pub fn router(viewer: Arc<Viewer>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/runs", get(list_runs))
        .route("/api/metrics", get(metrics))
        .route("/api/steps", get(steps))
        .route("/api/step", get(step))
        .route("/api/trajectory", get(trajectory))
        .route("/api/group", get(group))
        .route("/api/diagnoses", get(diagnoses))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such page".into()) })
        .with_state(viewer)
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
        let status = if e.downcast_ref::<Refused>().is_some() {
            StatusCode::UNPROCESSABLE_ENTITY
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        ApiError::new(status, format!("{e:#}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

type Params = Query<HashMap<String, String>>;
type Reply = Result<Response, ApiError>;

/// A JSON reply serialized straight from `value`, with no tree of it built first.
fn reply(value: impl Serialize) -> Result<Response, ApiError> {
    Ok(Json(value).into_response())
}

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

/// Runs `f` off the async workers, once it has one of the turns to read files. The turn
/// goes with `f`: a client that hangs up does not stop `f`, nor free its turn before it ends.
async fn blocking<T: Send + 'static>(
    viewer: &Viewer,
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let turn = viewer
        .reads
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        f()
    })
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
                runs.list()[run].name
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

async fn list_runs(State(viewer): Shared) -> Reply {
    let list: Vec<_> = viewer
        .runs
        .list()
        .iter()
        .enumerate()
        .map(|(i, r)| json!({ "run": i, "name": r.name }))
        .collect();
    reply(json!({ "runs": list }))
}

async fn metrics(State(viewer): Shared, q: Params) -> Reply {
    let v = viewer.clone();
    let body: Bytes = blocking(&viewer, move || {
        let run = run_index(&v.runs, &q)?;
        Ok(v.runs.metrics(run)?)
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

async fn steps(State(viewer): Shared, q: Params) -> Reply {
    let v = viewer.clone();
    blocking(&viewer, move || {
        let run = run_index(&v.runs, &q)?;
        reply(json!({ "run": run, "steps": v.runs.steps(run)? }))
    })
    .await
}

#[derive(Serialize)]
struct StepReply {
    trajectories: Vec<Summary>,
}

async fn step(State(viewer): Shared, q: Params) -> Reply {
    let v = viewer.clone();
    blocking(&viewer, move || {
        let records = step_records(&v.runs, &q)?;
        let trajectories = records.iter().map(Summary::of).collect();
        reply(StepReply { trajectories })
    })
    .await
}

async fn trajectory(State(viewer): Shared, q: Params) -> Reply {
    let v = viewer.clone();
    blocking(&viewer, move || {
        let records = step_records(&v.runs, &q)?;
        let id = param(&q, "id")?;
        let t = records.iter().find(|t| t.id == id).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no trajectory {id:?} in this step"),
            )
        })?;
        reply(shown(t))
    })
    .await
}

#[derive(Serialize)]
struct GroupReply<'a> {
    group: &'a str,
    trajectories: Vec<Shown<'a>>,
}

async fn group(State(viewer): Shared, q: Params) -> Reply {
    let v = viewer.clone();
    blocking(&viewer, move || {
        let records = step_records(&v.runs, &q)?;
        let group = param(&q, "group")?;
        let trajectories: Vec<Shown> = records
            .iter()
            .filter(|t| t.group == group)
            .map(shown)
            .collect();
        if trajectories.is_empty() {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no group {group:?} in this step"),
            ));
        }
        reply(GroupReply {
            group,
            trajectories,
        })
    })
    .await
}

/// `{"run", "diagnoses": [..], "missing"}`: the run's `diagnoses.jsonl`, one
/// [`skein_doctor::Diagnosis`] each, in the order they started; an empty list with `missing`
/// true when the run has no such file.
async fn diagnoses(State(viewer): Shared, q: Params) -> Reply {
    let v = viewer.clone();
    blocking(&viewer, move || {
        let run = run_index(&v.runs, &q)?;
        let found = v.runs.diagnoses(run)?;
        let missing = found.is_none();
        reply(json!({ "run": run, "diagnoses": found.unwrap_or_default(), "missing": missing }))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limits;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// However many requests come at once, no more than `concurrent_reads` read files.
    #[test]
    fn requests_read_files_a_few_at_a_time() {
        let dir = std::env::temp_dir().join(format!("skein-view-{}-turns", std::process::id()));
        crate::fixture::write_run(&dir, 1).unwrap();
        let limits = Limits {
            concurrent_reads: 2,
            ..Limits::DEFAULT
        };
        let viewer = Arc::new(Viewer::new(
            Runs::open(std::slice::from_ref(&dir), limits).unwrap(),
        ));
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let requests: Vec<_> = (0..6)
                .map(|_| {
                    let (viewer, now, most) = (viewer.clone(), now.clone(), most.clone());
                    tokio::spawn(async move {
                        blocking(&viewer, move || {
                            most.fetch_max(
                                now.fetch_add(1, Ordering::SeqCst) + 1,
                                Ordering::SeqCst,
                            );
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            now.fetch_sub(1, Ordering::SeqCst);
                            Ok(())
                        })
                        .await
                        .is_ok()
                    })
                })
                .collect();
            for r in requests {
                assert!(r.await.unwrap());
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 2);
        std::fs::remove_dir_all(&dir).ok();
    }
}
