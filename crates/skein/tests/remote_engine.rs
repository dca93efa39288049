//! The remote rollout engine for real: a `skein serve` subprocess on loopback generates every
//! rollout from token ids, and the trainer gives it the policy's weights after each step. At
//! the end the server's greedy answer equals the trained checkpoint's, so the weights it
//! generated with really were the trainer's.

mod common;
use common::step_metrics as steps;
use serde_json::{json, Value};
use skein::engine::{Engine, GenRequest, SamplingParams};
use skein::model::Model;
use skein::trainer::run::train;
use skein::trainer::TrainConfig;
use skein_text::Tokenizer;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(model: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
            .args(["serve", "--port", "0", "--model"])
            .arg(model)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("skein runs");
        let rx = common::watch_stderr(&mut child, |line| {
            let url = line.strip_prefix("skein serve: listening on ")?;
            Some(url.to_string())
        });
        let url = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("skein serve prints its address");
        Server { child, url }
    }

    fn post(&self, path: &str, body: &Value) -> Value {
        let text = match ureq::post(&format!("{}{path}", self.url))
            .set("Content-Type", "application/json")
            .send_string(&body.to_string())
        {
            Ok(r) => r.into_string().unwrap(),
            Err(ureq::Error::Status(code, r)) => panic!("{code}: {}", r.into_string().unwrap()),
            Err(e) => panic!("{e}"),
        };
        serde_json::from_str(&text).unwrap()
    }

    fn version(&self) -> u64 {
        let text = ureq::get(&format!("{}/health", self.url))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        serde_json::from_str::<Value>(&text).unwrap()["version"]
            .as_u64()
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skein-remote-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn base_config(task: &str, dir: &Path) -> TrainConfig {
    let mut cfg: TrainConfig = skein_config::load(None, "test", &[]).unwrap();
    cfg.run.dir = dir.display().to_string();
    cfg.task.name = task.into();
    cfg.task.difficulty = 1;
    cfg.trainer.steps = 3;
    cfg.rollout.prompts_per_step = 8;
    cfg.rollout.samples_per_prompt = 4;
    cfg.sft.steps = 0;
    cfg.eval.problems = 16;
    cfg.eval.every = 0;
    cfg
}

/// A from-scratch model directory for `task`, with the tokenizer the trainer would build.
fn initial_model(task: &str) -> PathBuf {
    // Tests run at once: each gets a directory of its own.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = temp_dir(&format!("{task}-init-{n}"));
    let mut cfg = base_config(task, &dir);
    cfg.trainer.steps = 1;
    cfg.rollout.prompts_per_step = 1;
    cfg.rollout.samples_per_prompt = 2;
    // One group makes one mini-batch.
    cfg.trainer.num_mini_batches = 1;
    train(&cfg).expect("initial run");
    dir.join("checkpoint")
}

#[test]
fn a_remote_engine_generates_with_the_weights_the_trainer_publishes() {
    trains_on_a_server(None);
}

/// With LoRA, the server gets the frozen base once and then only the adapters.
#[test]
fn a_remote_engine_applies_the_lora_adapters_the_trainer_publishes() {
    let dir = trains_on_a_server(Some(4));
    let published = dir.join("published");
    assert!(published
        .join("adapter/adapter_model.safetensors")
        .is_file());
    assert!(published.join("base/model.safetensors").is_file());
    assert!(
        !published.join("model.safetensors").exists(),
        "no whole model per step"
    );
}

/// Trains 3 steps on a `skein serve` engine (LoRA of `lora_rank`, publishing adapters, when
/// given), then checks the server holds the trained weights. Returns the run directory.
fn trains_on_a_server(lora_rank: Option<usize>) -> PathBuf {
    let init = initial_model("arithmetic");
    let server = Server::start(&init);
    let dir = temp_dir(&format!("arithmetic-run-{lora_rank:?}"));
    let mut cfg = base_config("arithmetic", &dir);
    cfg.model.path = init.display().to_string();
    cfg.sft.steps = 10;
    cfg.rollout.engine = skein::trainer::config::EngineKind::Remote;
    cfg.rollout.remote.url = server.url.clone();
    if let Some(rank) = lora_rank {
        cfg.lora.rank = rank;
        cfg.optim.lr = 1e-2;
        cfg.rollout.remote.publish = skein::engine::Publish::Adapter;
    }
    train(&cfg).expect("training with a remote engine");

    let steps = steps(&dir);
    assert_eq!(steps.len(), 3);
    for m in &steps {
        assert_eq!(m["rollout/engine_failed"].as_f64(), Some(0.0), "{m}");
        assert_eq!(m["batch/rows"].as_f64(), Some(32.0));
        assert!(m["tokens/generated"].as_f64().unwrap() > 0.0);
        // The server sampled with the weights the trainer published for this step.
        common::assert_logprobs_agree(m);
    }
    // Published once before the first rollout, then after each of the 3 steps.
    assert_eq!(server.version(), 4);

    // The server now holds the trained weights: its greedy completion of a prompt is the
    // trained checkpoint's.
    let ckpt = dir.join("checkpoint");
    let tokenizer = Tokenizer::from_dir(&ckpt).unwrap();
    let policy = Model::load_dir(&ckpt, tch::Device::Cpu).unwrap();
    let prompt = tokenizer.encode("12+7=", false).unwrap();
    let resp = server.post(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 6, "temperature": 0.0}),
    );
    let remote: Vec<u32> =
        serde_json::from_value(resp["choices"][0]["skein"]["completion_token_ids"].clone())
            .unwrap();
    let mut local = Vec::new();
    Engine::new(1).generate(
        &policy,
        0,
        vec![GenRequest {
            id: 0,
            prompt,
            resumed: Vec::new(),
            params: SamplingParams {
                temperature: 0.0,
                max_new_tokens: 6,
                stop_token_ids: tokenizer.eos_token_ids().to_vec(),
                ..Default::default()
            },
            budget: None,
            session: None,
            watch: None,
        }],
        |o| local = o.tokens,
    );
    assert_eq!(remote, local);
    dir
}

/// The agent loop's model calls go to the remote engine too.
#[test]
fn multi_turn_episodes_run_on_a_remote_engine() {
    let init = initial_model("guess");
    let server = Server::start(&init);
    let dir = temp_dir("guess-run");
    let mut cfg = base_config("guess", &dir);
    cfg.model.path = init.display().to_string();
    cfg.trainer.steps = 2;
    cfg.rollout.engine = skein::trainer::config::EngineKind::Remote;
    cfg.rollout.remote.url = server.url.clone();
    train(&cfg).expect("multi-turn training with a remote engine");
    let steps = steps(&dir);
    assert_eq!(steps.len(), 2);
    for m in &steps {
        assert_eq!(m["batch/failed_trajectories"].as_f64(), Some(0.0), "{m}");
        assert!(m["agent/turns_mean"].as_f64().unwrap() > 1.0);
        common::assert_logprobs_agree(m);
    }
    assert_eq!(server.version(), 3);
}

/// A server on loopback that loads weights (`/v1/reload` answers a version) but fails every
/// completion with HTTP 500: a server that broke after it started.
fn failing_server() -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                let n = stream.read(&mut buf).unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                let (status, body) = if head.starts_with("POST /v1/reload") {
                    ("200 OK", r#"{"version": 1}"#)
                } else {
                    ("500 Internal Server Error", r#"{"error": "out of memory"}"#)
                };
                let reply = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(reply.as_bytes());
            });
        }
    });
    url
}

/// Every model call of the agent loop fails on the server: each episode fails alone, and
/// the step counts them as the engine's failures.
#[test]
fn remote_failures_of_multi_turn_episodes_are_counted_as_the_engines() {
    let init = initial_model("guess");
    let dir = temp_dir("guess-failing");
    let mut cfg = base_config("guess", &dir);
    cfg.model.path = init.display().to_string();
    cfg.trainer.steps = 1;
    cfg.rollout.engine = skein::trainer::config::EngineKind::Remote;
    cfg.rollout.remote.url = failing_server();
    train(&cfg).expect("a step whose every episode fails ends normally");
    let m = &steps(&dir)[0];
    let failed = m["batch/failed_trajectories"].as_f64().unwrap();
    assert!(failed > 0.0, "{m}");
    assert_eq!(m["rollout/engine_failed"].as_f64(), Some(failed), "{m}");
}
