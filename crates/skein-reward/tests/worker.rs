//! Reward workers as real subprocesses: the shipped example, a crash and restart, a hang that
//! fails the requests held together, a worker given up on, and a pool of processes working in
//! parallel.

use skein_reward::worker::GIVE_UP_AFTER;
use skein_reward::{
    BatchScorer, Executor, ExecutorConfig, RewardError, RewardRequest, WorkerConfig, WorkerPool,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Writes a Python worker to a fresh temp dir: it answers reward = len(response), reports its
/// pid, and exits on `crash`, hangs on `hang`, sleeps on `sleep`.
fn test_worker(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skein-reward-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("worker.py");
    let script = r#"
import json, os, sys, time
for line in sys.stdin:
    req = json.loads(line)
    r = req["response"]
    if r == "crash":
        os._exit(3)
    if r == "hang":
        time.sleep(60)
    if r == "sleep":
        time.sleep(0.2)
    if r == "nan":
        print('{"id": %s, "reward": NaN}' % json.dumps(req["id"]), flush=True)
        continue
    print(json.dumps({"id": req["id"], "reward": len(r), "metrics": {"pid": os.getpid()}}), flush=True)
    if r == "quit":
        sys.exit(0)
"#;
    std::fs::write(&path, script).expect("write worker");
    path
}

fn pool(script: &Path, processes: usize, timeout_ms: u64) -> WorkerPool {
    let cfg = WorkerConfig {
        command: vec!["python3".into(), script.display().to_string()],
        processes,
        timeout_ms,
        start_timeout_ms: 5_000,
        batch_size: 8,
    };
    WorkerPool::new(&cfg, "reward.sources.test").expect("worker starts")
}

fn req(id: &str, response: &str) -> RewardRequest {
    RewardRequest {
        id: id.into(),
        response: response.into(),
        ..Default::default()
    }
}

#[test]
fn the_example_worker_scores_math_answers() {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/reward_worker_example.py");
    let cfg = WorkerConfig {
        command: vec!["python3".into(), script.display().to_string()],
        ..Default::default()
    };
    let pool = WorkerPool::new(&cfg, "reward.sources.py").expect("example worker starts");
    let mut right = req("a", r"so the answer is \boxed{1,000}.");
    right.ground_truth = "200 * 5 = 1000\n#### 1000".into();
    let mut wrong = req("b", "#### 999");
    wrong.ground_truth = "1000".into();
    let none = req("c", "no idea");
    let out = pool.score_batch(&[right, wrong, none]);
    let rewards: Vec<f64> = out
        .iter()
        .map(|r| r.as_ref().expect("scored").reward)
        .collect();
    assert_eq!(rewards, [1.0, 0.0, 0.0]);
    let found: Vec<f64> = out
        .iter()
        .map(|r| r.as_ref().unwrap().metrics["answer_found"])
        .collect();
    assert_eq!(found, [1.0, 1.0, 0.0]);
    assert_eq!(pool.restarts(), 0);
}

#[test]
fn a_crashed_worker_fails_its_request_and_is_restarted_for_the_rest() {
    let pool = pool(&test_worker("crash"), 1, 5_000);
    let out = pool.score_batch(&[req("1", "ab"), req("2", "crash"), req("3", "abcd")]);
    assert_eq!(out[0].as_ref().expect("before the crash").reward, 2.0);
    let e = out[1].as_ref().unwrap_err();
    assert!(matches!(e, RewardError::WorkerCrashed { .. }), "{e}");
    assert!(e.to_string().contains("worker.py"), "{e}");
    assert_eq!(out[2].as_ref().expect("after the restart").reward, 4.0);
    assert_eq!((pool.restarts(), pool.crashes()), (1, 1));
    // The replacement stays up for later batches.
    assert_eq!(
        pool.score_batch(&[req("4", "x")])[0]
            .as_ref()
            .unwrap()
            .reward,
        1.0
    );
    assert_eq!(pool.restarts(), 1);
}

/// An answer line that cannot be used (Python's `NaN` is not JSON) fails its request alone:
/// the worker answered, so it is neither restarted nor, however often it happens, given up on.
#[test]
fn an_unusable_answer_fails_its_request_alone() {
    let pool = pool(&test_worker("nan"), 1, 5_000);
    let n = GIVE_UP_AFTER as usize + 1;
    let mut batch: Vec<RewardRequest> = (0..n).map(|i| req(&i.to_string(), "nan")).collect();
    batch.push(req("last", "ab"));
    let out = pool.score_batch(&batch);
    for answer in &out[..n] {
        let e = answer.as_ref().unwrap_err();
        assert!(matches!(e, RewardError::Protocol { .. }), "{e}");
    }
    assert_eq!(out[n].as_ref().expect("answered").reward, 2.0);
    assert_eq!(pool.restarts(), 0);
    assert!(pool.given_up().is_none());
}

/// A worker that exits between batches is started again for the next one, which loses no
/// request to it.
#[test]
fn a_worker_that_exits_while_idle_is_restarted_before_its_next_batch() {
    let pool = pool(&test_worker("idle-exit"), 1, 5_000);
    assert_eq!(
        pool.score_batch(&[req("1", "quit")])[0]
            .as_ref()
            .unwrap()
            .reward,
        4.0
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let out = pool.score_batch(&[req("2", "ab")]);
    assert_eq!(
        out[0].as_ref().expect("answered by a new process").reward,
        2.0
    );
    assert_eq!((pool.restarts(), pool.crashes()), (1, 0));
}

/// A hung worker is killed after one timeout and fails every request it held at once; it is
/// started again once, for the next batch.
#[test]
fn a_hung_worker_fails_the_requests_it_held_together_and_is_restarted_once() {
    let pool = pool(&test_worker("hang"), 1, 300);
    // The first answer proves the worker is up, so the timeout below is the request's alone.
    assert_eq!(
        pool.score_batch(&[req("0", "a")])[0]
            .as_ref()
            .unwrap()
            .reward,
        1.0
    );
    let t0 = Instant::now();
    let out = pool.score_batch(&[req("1", "hang"), req("2", "abc"), req("3", "hang")]);
    let took = t0.elapsed();
    for e in &out {
        let e = e.as_ref().unwrap_err();
        assert_eq!(e.kind(), "timeout", "{e}");
        assert!(e.to_string().contains("0.300 s"), "{e}");
    }
    // One timeout and a kill: not one timeout (and a Python start-up) per request.
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_millis(1200), "{took:?}");
    assert_eq!((pool.timeouts(), pool.restarts()), (3, 0));
    let next = pool.score_batch(&[req("4", "abcd")]);
    assert_eq!(next[0].as_ref().expect("a new process").reward, 4.0);
    assert_eq!(pool.restarts(), 1);
    let counters: Vec<_> = pool.counters();
    assert!(counters.contains(&("timeouts", 3.0)), "{counters:?}");
}

/// A worker that never answers: three processes in a row time out, one batch each, and the
/// source is given up on; later requests fail at once, saying what to check.
#[test]
fn a_worker_that_never_answers_is_given_up_on_after_three_processes() {
    let cfg = WorkerConfig {
        command: vec!["python3".into(), test_worker("never").display().to_string()],
        processes: 1,
        timeout_ms: 200,
        start_timeout_ms: 100,
        batch_size: 8,
    };
    let pool = WorkerPool::new(&cfg, "reward.sources.slow").expect("worker starts");
    let t0 = Instant::now();
    for batch in 0..GIVE_UP_AFTER {
        let out = pool.score_batch(&[req("a", "hang"), req("b", "hang")]);
        assert!(
            out.iter()
                .all(|r| r.as_ref().is_err_and(|e| e.kind() == "timeout")),
            "batch {batch}: {out:?}"
        );
    }
    let hung = t0.elapsed();
    assert!(hung < Duration::from_secs(3), "{hung:?}");
    assert_eq!((pool.restarts(), pool.timeouts()), (2, 6));
    let t1 = Instant::now();
    let out = pool.score_batch(&[req("c", "x")]);
    assert!(
        t1.elapsed() < Duration::from_millis(50),
        "{:?}",
        t1.elapsed()
    );
    let e = out[0].as_ref().unwrap_err().to_string();
    for part in [
        "given up",
        "worker.py",
        "`reward.sources.slow.timeout_ms`",
        "`reward.sources.slow.start_timeout_ms`",
        "stderr",
    ] {
        assert!(e.contains(part), "{part}: {e}");
    }
    assert_eq!(pool.given_up().map(RewardError::kind), Some("scorer"));
    assert_eq!(pool.restarts(), 2, "no process is started once given up");
}

/// Answers between failures keep a worker that fails now and then in service.
#[test]
fn a_worker_that_answers_between_hangs_is_never_given_up_on() {
    let pool = pool(&test_worker("sometimes"), 1, 200);
    for round in 0..2 * GIVE_UP_AFTER {
        let out = pool.score_batch(&[req("a", "ab"), req("b", "hang")]);
        assert_eq!(out[0].as_ref().expect("answered").reward, 2.0, "{round}");
        assert_eq!(out[1].as_ref().unwrap_err().kind(), "timeout", "{round}");
    }
    assert!(pool.given_up().is_none());
    assert_eq!(pool.restarts(), 2 * GIVE_UP_AFTER - 1);
}

#[test]
fn a_pool_of_processes_scores_in_parallel_behind_the_executor() {
    let pool = Arc::new(pool(&test_worker("pool"), 2, 5_000));
    let cfg = ExecutorConfig {
        threads: 2,
        max_batch_size: 1,
        max_wait_ms: 0,
        ..Default::default()
    };
    let exec = Executor::new(pool.clone(), cfg, "reward.executor", "worker").expect("valid");
    // Warm up: both processes finish starting Python before the clock starts.
    let warm: Vec<_> = (0..2)
        .map(|i| exec.submit(req(&format!("w{i}"), "sleep")))
        .collect();
    for t in warm {
        t.wait().expect("warm-up scored");
    }
    let t0 = Instant::now();
    let tickets: Vec<_> = (0..4)
        .map(|i| exec.submit(req(&i.to_string(), "sleep")))
        .collect();
    let pids: BTreeSet<u64> = tickets
        .into_iter()
        .map(|t| t.wait().expect("scored").metrics["pid"] as u64)
        .collect();
    let took = t0.elapsed();
    assert_eq!(pids.len(), 2, "both processes worked: {pids:?}");
    // Four 200 ms requests on two processes: about 400 ms, not 800 ms.
    assert!(took < Duration::from_millis(750), "{took:?}");
    assert_eq!(exec.metrics().batches, 6);
}
