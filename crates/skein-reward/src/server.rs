//! Serves any `BatchScorer` over HTTP through an `Executor`, so a reward model can live in
//! another process or on another machine and still batch requests from many clients.
//!
//! `POST /score` takes one request object (answered with one answer object) or an array of
//! them (answered with an array, in order); `GET /health` says it is up; `GET /metrics` gives
//! the executor's counters, or those of what stands behind it ([`serve_with_metrics`]). Malformed JSON gets 400 with the reason, an oversized body 413.

use crate::{Executor, RewardError, RewardRequest, WireResponse};
use serde::{Deserialize, Serialize};
use skein_config::Validator;
use std::collections::BTreeMap;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often idle handler threads look for a shutdown.
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Requests handled at once. Each waits for its rewards, so this bounds how many clients
    /// the executor can batch together.
    pub http_threads: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            max_body_bytes: 16 << 20,
            http_threads: 16,
        }
    }
}

impl ServeConfig {
    pub fn validate(&self, key: &str, v: &mut Validator) {
        v.at_least(&format!("{key}.max_body_bytes"), self.max_body_bytes, 1);
        v.at_least(&format!("{key}.http_threads"), self.http_threads, 1);
    }
}

/// A running reward service. Dropping it stops accepting requests and joins its threads.
pub struct RewardServer {
    server: Arc<tiny_http::Server>,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl RewardServer {
    /// The address it listens on (useful after binding port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The scoring endpoint, for a `RemoteConfig::url`.
    pub fn score_url(&self) -> String {
        format!("http://{}/score", self.addr)
    }
}

impl Drop for RewardServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for _ in &self.threads {
            self.server.unblock();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// What `GET /metrics` answers: flat `reward/...` figures.
pub type MetricsSource = Arc<dyn Fn() -> BTreeMap<String, f64> + Send + Sync>;

/// Listens on `addr` (e.g. `127.0.0.1:0`) and serves `executor` until the handle is dropped;
/// `GET /metrics` gives the executor's own counters.
pub fn serve(
    addr: &str,
    executor: Arc<Executor>,
    cfg: &ServeConfig,
) -> Result<RewardServer, RewardError> {
    let of = Arc::clone(&executor);
    let metrics: MetricsSource = Arc::new(move || {
        let mut m = of.metrics().to_map("reward");
        for (k, v) in of.scorer_counters() {
            m.insert(format!("reward/{k}"), v);
        }
        m
    });
    serve_with_metrics(addr, executor, cfg, metrics)
}

/// [`serve`], with `GET /metrics` answered by `metrics`: the figures of what stands behind
/// the executor, when that is where the batching happens (a whole `Rewarder`'s sources).
pub fn serve_with_metrics(
    addr: &str,
    executor: Arc<Executor>,
    cfg: &ServeConfig,
    metrics: MetricsSource,
) -> Result<RewardServer, RewardError> {
    let mut v = Validator::new();
    cfg.validate("serve", &mut v);
    v.finish()?;
    let fail = |detail: String| RewardError::Scorer {
        source: format!("reward server on {addr}"),
        detail,
    };
    let server = tiny_http::Server::http(addr).map_err(|e| fail(format!("cannot listen: {e}")))?;
    let bound = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| fail("it is not listening on an IP address".into()))?;
    let server = Arc::new(server);
    let stop = Arc::new(AtomicBool::new(false));
    let mut handle = RewardServer {
        server: Arc::clone(&server),
        addr: bound,
        stop: Arc::clone(&stop),
        threads: Vec::new(),
    };
    for i in 0..cfg.http_threads {
        let (server, stop, executor, metrics) = (
            Arc::clone(&server),
            Arc::clone(&stop),
            Arc::clone(&executor),
            Arc::clone(&metrics),
        );
        let max_body = cfg.max_body_bytes;
        let t = std::thread::Builder::new()
            .name(format!("skein-reward-http-{i}"))
            .spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match server.recv_timeout(POLL) {
                        Ok(Some(rq)) => handle_request(rq, &executor, &metrics, max_body),
                        Ok(None) => {}
                        Err(_) => break,
                    }
                }
            })
            .map_err(|e| fail(format!("cannot start handler thread {i}: {e}")))?;
        handle.threads.push(t);
    }
    Ok(handle)
}

fn respond(rq: tiny_http::Request, status: u16, body: String) {
    let mut resp = tiny_http::Response::from_string(body).with_status_code(status);
    if let Ok(h) = tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]) {
        resp = resp.with_header(h);
    }
    // The client may be gone; there is no one left to tell.
    let _ = rq.respond(resp);
}

fn error_body(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

fn handle_request(
    mut rq: tiny_http::Request,
    executor: &Executor,
    metrics: &MetricsSource,
    max_body: usize,
) {
    let path = rq.url().split('?').next().unwrap_or("").to_string();
    let method = rq.method().clone();
    match (method, path.as_str()) {
        (tiny_http::Method::Get, "/health") => {
            respond(rq, 200, serde_json::json!({"status": "ok"}).to_string())
        }
        (tiny_http::Method::Get, "/metrics") => {
            let body =
                serde_json::to_string(&metrics()).unwrap_or_else(|e| error_body(&e.to_string()));
            respond(rq, 200, body)
        }
        (tiny_http::Method::Post, "/score") => {
            let (status, body) = score_body(&mut rq, executor, max_body);
            respond(rq, status, body)
        }
        (_, "/health" | "/metrics" | "/score") => respond(
            rq,
            405,
            error_body("method not allowed: use POST /score, GET /health or GET /metrics"),
        ),
        (_, other) => respond(
            rq,
            404,
            error_body(&format!(
                "no such endpoint {other}: use POST /score, GET /health or GET /metrics"
            )),
        ),
    }
}

/// Reads, scores and answers a `/score` body: (status, JSON body).
fn score_body(rq: &mut tiny_http::Request, executor: &Executor, max_body: usize) -> (u16, String) {
    let too_large = || error_body(&format!("request body over {max_body} bytes"));
    if rq.body_length().is_some_and(|n| n > max_body) {
        return (413, too_large());
    }
    let mut body = Vec::new();
    let limit = u64::try_from(max_body)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    if let Err(e) = rq.as_reader().take(limit).read_to_end(&mut body) {
        return (
            400,
            error_body(&format!("cannot read the request body: {e}")),
        );
    }
    if body.len() > max_body {
        return (413, too_large());
    }
    let value: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (400, error_body(&format!("malformed JSON: {e}"))),
    };
    match value {
        serde_json::Value::Array(items) => {
            let mut reqs = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                match serde_json::from_value::<RewardRequest>(item) {
                    Ok(r) => reqs.push(r),
                    Err(e) => {
                        return (
                            400,
                            error_body(&format!("request [{i}] is not a reward request: {e}")),
                        )
                    }
                }
            }
            // Submit all before waiting on any, so they can share batches.
            let ids: Vec<String> = reqs.iter().map(|r| r.id.clone()).collect();
            let tickets: Vec<_> = reqs.into_iter().map(|r| executor.submit(r)).collect();
            let answers: Vec<WireResponse> = ids
                .iter()
                .zip(tickets)
                .map(|(id, t)| WireResponse::from_result(id, &t.wait()))
                .collect();
            encode(&answers)
        }
        obj @ serde_json::Value::Object(_) => match serde_json::from_value::<RewardRequest>(obj) {
            Ok(r) => {
                let id = r.id.clone();
                encode(&WireResponse::from_result(&id, &executor.score(r)))
            }
            Err(e) => (400, error_body(&format!("not a reward request: {e}"))),
        },
        _ => (
            400,
            error_body("the body must be a reward request object or an array of them"),
        ),
    }
}

fn encode<T: Serialize>(answer: &T) -> (u16, String) {
    match serde_json::to_string(answer) {
        Ok(s) => (200, s),
        Err(e) => (500, error_body(&format!("cannot encode the answer: {e}"))),
    }
}
