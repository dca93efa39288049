//! The reward service for real on loopback: the server in front of an executor, the client
//! against it, malformed and oversized bodies, a flaky service, and a service that is down.

use skein_reward::{
    serve, BatchScorer, Executor, ExecutorConfig, RemoteConfig, RemoteScorer, RewardError,
    RewardFn, RewardOutput, RewardRequest, ServeConfig,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Math reward with a fixed cost per batch, like one model forward pass.
struct SlowMath {
    per_batch: Duration,
}

impl BatchScorer for SlowMath {
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        std::thread::sleep(self.per_batch);
        RewardFn::math().score_batch(batch)
    }
}

fn executor(per_batch_ms: u64) -> Arc<Executor> {
    let scorer = Arc::new(SlowMath {
        per_batch: Duration::from_millis(per_batch_ms),
    });
    let cfg = ExecutorConfig {
        threads: 1,
        max_batch_size: 16,
        max_wait_ms: 10,
        ..Default::default()
    };
    Arc::new(Executor::new(scorer, cfg, "reward.executor", "math").expect("valid"))
}

fn client(url: String, batch: bool) -> RemoteScorer {
    let cfg = RemoteConfig {
        url,
        timeout_ms: 5_000,
        retries: 0,
        batch,
        ..Default::default()
    };
    RemoteScorer::new(&cfg, "reward.sources.remote").expect("valid")
}

fn req(id: usize, answer: &str, truth: &str) -> RewardRequest {
    RewardRequest {
        id: format!("r{id}"),
        response: format!(r"\boxed{{{answer}}}"),
        ground_truth: truth.into(),
        ..Default::default()
    }
}

#[test]
fn the_client_scores_through_the_server_singly_and_in_arrays() {
    let exec = executor(0);
    let server = serve("127.0.0.1:0", exec.clone(), &ServeConfig::default()).expect("listens");
    let batch = [req(0, "4", "4"), req(1, "5", "4"), req(2, "1,000", "1000")];
    for batched in [true, false] {
        let out = client(server.score_url(), batched).score_batch(&batch);
        let rewards: Vec<f64> = out
            .iter()
            .map(|r| r.as_ref().expect("scored").reward)
            .collect();
        assert_eq!(rewards, [1.0, 0.0, 1.0], "batched: {batched}");
        assert_eq!(out[0].as_ref().unwrap().metrics["answer_found"], 1.0);
    }
    assert_eq!(exec.metrics().completed, 6);
}

#[test]
fn single_requests_from_many_clients_are_batched_by_the_server() {
    let exec = executor(30);
    let server = serve("127.0.0.1:0", exec.clone(), &ServeConfig::default()).expect("listens");
    let url = server.score_url();
    std::thread::scope(|s| {
        for c in 0..12 {
            let url = url.clone();
            s.spawn(move || {
                let client = client(url, false);
                let r = req(c, &c.to_string(), &c.to_string());
                let out = client.score_batch(std::slice::from_ref(&r));
                assert_eq!(out[0].as_ref().expect("scored").reward, 1.0);
            });
        }
    });
    let m = exec.metrics();
    assert_eq!(m.completed, 12);
    assert!(m.batches < 12, "12 requests in {} batches", m.batches);
    assert!(m.batch_size_max >= 2);
}

fn post(url: &str, body: &str) -> (u16, String) {
    match ureq::post(url).send_string(body) {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("transport error: {e}"),
    }
}

#[test]
fn bad_bodies_get_400_or_413_with_a_reason_and_health_answers() {
    let exec = executor(0);
    let cfg = ServeConfig {
        max_body_bytes: 1_000,
        http_threads: 2,
    };
    let server = serve("127.0.0.1:0", exec, &cfg).expect("listens");
    let url = server.score_url();
    let (code, body) = post(&url, "{not json");
    assert_eq!(code, 400);
    assert!(body.contains("malformed JSON"), "{body}");
    let (code, body) = post(&url, r#"[{"id": "a"}, {"id": 7}]"#);
    assert_eq!(code, 400);
    assert!(body.contains("request [1]"), "{body}");
    let (code, _) = post(&url, "42");
    assert_eq!(code, 400);
    let (code, body) = post(
        &url,
        &format!(r#"{{"id":"a","prompt":"{}"}}"#, "x".repeat(2_000)),
    );
    assert_eq!(code, 413);
    assert!(body.contains("1000 bytes"), "{body}");
    let health = ureq::get(&format!("http://{}/health", server.addr()))
        .call()
        .expect("up");
    assert_eq!(
        health.into_string().unwrap_or_default(),
        r#"{"status":"ok"}"#
    );
    let metrics = ureq::get(&format!("http://{}/metrics", server.addr()))
        .call()
        .expect("up");
    assert!(metrics
        .into_string()
        .unwrap_or_default()
        .contains("reward/queue_depth_max"));
    match ureq::get(&format!("http://{}/nope", server.addr())).call() {
        Err(ureq::Error::Status(404, _)) => {}
        other => panic!("expected 404, got {other:?}"),
    }
}

#[test]
fn a_flaky_service_is_retried_with_backoff() {
    // Fails twice with 503, then answers.
    let server = tiny_http::Server::http("127.0.0.1:0").expect("listens");
    let addr = server.server_addr().to_ip().expect("ip");
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let handle = std::thread::spawn(move || {
        for mut rq in server.incoming_requests().take(3) {
            let mut body = String::new();
            let _ = rq.as_reader().read_to_string(&mut body);
            let n = seen.fetch_add(1, Ordering::SeqCst);
            let resp = if n < 2 {
                tiny_http::Response::from_string("busy").with_status_code(503)
            } else {
                tiny_http::Response::from_string(r#"{"id":"r0","reward":0.25}"#)
            };
            let _ = rq.respond(resp);
        }
    });
    let cfg = RemoteConfig {
        url: format!("http://{addr}/score"),
        retries: 3,
        backoff_ms: 20,
        ..Default::default()
    };
    let client = RemoteScorer::new(&cfg, "reward.sources.remote").expect("valid");
    let t0 = Instant::now();
    let out = client.score_batch(&[req(0, "1", "1")]);
    assert_eq!(out[0].as_ref().expect("third try works").reward, 0.25);
    // Backoff 20 ms then 40 ms.
    assert!(
        t0.elapsed() >= Duration::from_millis(60),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!((client.retries(), client.failures()), (2, 0));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    handle.join().expect("server thread");
}

#[test]
fn a_service_that_stays_down_fails_requests_with_a_counted_error_naming_the_url() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let url = format!("http://127.0.0.1:{port}/score");
    let cfg = RemoteConfig {
        url: url.clone(),
        timeout_ms: 500,
        retries: 2,
        backoff_ms: 10,
        ..Default::default()
    };
    let client = RemoteScorer::new(&cfg, "reward.sources.remote").expect("valid");
    let out = client.score_batch(&[req(0, "1", "1"), req(1, "2", "2")]);
    for r in &out {
        let e = r.as_ref().unwrap_err();
        assert_eq!(e.kind(), "remote");
        let msg = e.to_string();
        assert!(msg.contains(&url) && msg.contains("3 attempt"), "{msg}");
    }
    assert_eq!((client.failures(), client.retries()), (2, 2));
    let counters = client.counters();
    assert!(counters.contains(&("remote_failures", 2.0)), "{counters:?}");
}
