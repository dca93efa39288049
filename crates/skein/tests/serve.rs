//! `skein serve` for real: the binary as a subprocess (or the same server in-process, where the
//! test needs the rollout store), a real engine and a real model, HTTP over loopback.

mod common;
use common::require_python_with_openai;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use skein::engine::{self, Engine, SamplingParams};
use skein::model::Model;
use skein::serve::{self, RolloutStore, ServeConfig, ServeState, TaskSpec, TextSide};
use skein::trainer::config::ModelSection;
use skein_text::{Message, Tokenizer};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

const ALPHABET: &str = "abcdefghijklmnopqrstuvwxyz0123456789 +-*=?.,";
const CONTEXT: usize = 128;

fn tokenizer() -> Tokenizer {
    Tokenizer::char_level(ALPHABET).unwrap()
}

fn tiny_model(seed: i64) -> Model {
    let cfg = ModelSection::default().tiny_config(tokenizer().vocab_size(), CONTEXT);
    Model::random(&cfg, tch::Device::Cpu, seed).unwrap()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skein-serve-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A model directory in Hugging Face layout, as the trainer writes checkpoints.
fn save_model(dir: &Path, seed: i64) {
    let tok = tokenizer();
    let sampling = SamplingParams {
        stop_token_ids: tok.eos_token_ids().to_vec(),
        ..Default::default()
    };
    skein::trainer::checkpoint::save_model_dir(&tiny_model(seed), &tok, &sampling, dir).unwrap();
}

/// The `skein serve` binary on a free port; killed when dropped.
struct ServeProcess {
    child: Child,
    url: String,
}

impl ServeProcess {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
            .arg("serve")
            .args(["--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("skein runs");
        let rx = common::watch_stderr(&mut child, |line| {
            eprintln!("[skein serve] {line}");
            let url = line.strip_prefix("skein serve: listening on ")?;
            Some(url.to_string())
        });
        let url = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("skein serve prints its address");
        ServeProcess { child, url }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The same server in this process, so a test can reach its rollout store.
struct InProcess {
    url: String,
    store: Arc<RolloutStore>,
    _server: serve::BackgroundServer,
}

fn in_process(max_slots: usize, config: ServeConfig) -> InProcess {
    let model = tiny_model(3);
    let tok = tokenizer();
    let vocab = model.net.config.vocab_size;
    let (handle, queue) = engine::channel();
    let version = Arc::new(AtomicU64::new(0));
    let store = Arc::new(RolloutStore::new());
    let config = ServeConfig {
        capacity: CONTEXT as i64,
        ..config
    };
    let text = TextSide::new(tok, vocab).unwrap();
    let state = ServeState::from_parts(handle, text, config, store.clone(), version.clone());
    serve::spawn_engine_thread(
        model,
        Engine::new(max_slots),
        queue,
        CONTEXT as i64,
        version,
    )
    .unwrap();
    let server = serve::spawn("127.0.0.1:0", state, 2).unwrap();
    InProcess {
        url: format!("http://{}", server.addr()),
        store,
        _server: server,
    }
}

/// A server of a trainer's kind (rollouts sampled at temperature 1) with rollout `r` handed
/// out.
fn with_rollout_r() -> InProcess {
    let config = ServeConfig {
        rollout_temperature: Some(1.0),
        ..ServeConfig::default()
    };
    let server = in_process(4, config);
    let task = TaskSpec {
        rollout_id: "r".into(),
        group: "g".into(),
        task: json!({}),
    };
    server.store.add_tasks(vec![task]).unwrap();
    server
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn post(c: &Client, url: &str, body: Value) -> (StatusCode, Value) {
    let r = c.post(url).json(&body).send().await.unwrap();
    let status = r.status();
    let body = r.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// GET `url` and its JSON body.
async fn get_json(c: &Client, url: &str) -> Value {
    c.get(url).send().await.unwrap().json().await.unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of ids: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The engine's greedy completion of `prompt` on the model saved in `dir`, ended where a
/// server of it ends one (its tokenizer's stop ids, `max_tokens`): ids and log-probs.
fn greedy_locally(dir: &Path, prompt: Vec<u32>, max_tokens: usize) -> (Vec<u32>, Vec<f32>) {
    let model = Model::load_dir(dir, tch::Device::Cpu).unwrap();
    let tok = Tokenizer::from_dir(dir).unwrap();
    let request = engine::GenRequest {
        id: 0,
        prompt,
        resumed: Vec::new(),
        params: SamplingParams {
            temperature: 0.0,
            max_new_tokens: max_tokens,
            stop_token_ids: tok.stop_token_ids(),
            ..Default::default()
        },
        budget: None,
        session: None,
        watch: None,
    };
    let mut out = None;
    Engine::new(1).generate(&model, 0, vec![request], |o| out = Some(o));
    let out = out.expect("the engine finishes the request");
    (out.tokens, out.logprobs)
}

/// A served choice's completion ids and log-probs are `want`'s (the log-probs to 1e-5).
fn assert_same_completion(choice: &Value, want: &(Vec<u32>, Vec<f32>)) {
    let x = &choice["skein"];
    assert_eq!(ids(&x["completion_token_ids"]), want.0, "{choice}");
    let logprobs: Vec<f64> = x["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_f64().unwrap())
        .collect();
    assert_eq!(logprobs.len(), want.1.len(), "{choice}");
    for (got, want) in logprobs.iter().zip(&want.1) {
        assert!(
            (got - *want as f64).abs() < 1e-5,
            "{got} vs {want}: {choice}"
        );
    }
}

/// Chat and completions return the exact ids: the prompt ids are the tokenizer's encoding of
/// the rendered template (or the ids sent), and the completion ids decode to the text returned.
/// A greedy completion is the engine's own on the same model, ids and log-probs, and the `n`
/// choices of a greedy request are the same one.
#[test]
fn chat_and_completions_return_the_exact_token_ids() {
    let dir = temp_dir("exact");
    save_model(&dir, 1);
    let server = ServeProcess::start(&["--model", dir.to_str().unwrap(), "--name", "tiny"]);
    let tok = tokenizer();
    let template = tok.chat_template().unwrap().unwrap();
    runtime().block_on(async {
        let c = client();
        let models = get_json(&c, &format!("{}/v1/models", server.url)).await;
        assert_eq!(models["data"][0]["id"], "tiny");

        let messages = json!([{"role": "system", "content": "add"}, {"role": "user", "content": "what is 2+3?"}]);
        let (status, body) = post(
            &c,
            &format!("{}/v1/chat/completions", server.url),
            json!({"model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0, "n": 2}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let rendered = template
            .render(
                &[Message::system("add"), Message::user("what is 2+3?")],
                None,
                true,
            )
            .unwrap();
        let want_prompt = tok.encode(&rendered, false).unwrap();
        let choices = body["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 2);
        let mut completion_tokens = 0;
        for ch in choices {
            let x = &ch["skein"];
            assert_eq!(ids(&x["prompt_token_ids"]), want_prompt);
            let completion = ids(&x["completion_token_ids"]);
            assert!(!completion.is_empty() && completion.len() <= 12);
            assert_eq!(x["logprobs"].as_array().unwrap().len(), completion.len());
            assert!(x["logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .all(|l| l.as_f64().unwrap() <= 0.0));
            assert_eq!(ids(&x["versions"]), vec![0; completion.len()]);
            assert_eq!(
                ch["message"]["content"].as_str().unwrap(),
                tok.decode(&completion, true).unwrap()
            );
            let stopped = completion.last() == Some(&tok.eos_token_ids()[0]);
            let reason = if stopped { "stop" } else { "length" };
            assert_eq!(ch["finish_reason"], reason);
            completion_tokens += completion.len();
        }
        let greedy = greedy_locally(&dir, want_prompt.clone(), 12);
        for ch in choices {
            assert_same_completion(ch, &greedy);
        }
        assert_eq!(
            choices[0]["skein"]["completion_token_ids"],
            choices[1]["skein"]["completion_token_ids"]
        );
        assert_eq!(body["usage"]["prompt_tokens"], want_prompt.len());
        assert_eq!(body["usage"]["completion_tokens"], completion_tokens);
        assert_eq!(body["object"], "chat.completion");

        // A text prompt is encoded with the tokenizer; an id prompt is used as sent.
        let (status, body) = post(
            &c,
            &format!("{}/v1/completions", server.url),
            json!({"prompt": "12+3=", "max_tokens": 5, "temperature": 0}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let x = &body["choices"][0]["skein"];
        let plain = tok.encode_plain_prompt("12+3=").unwrap();
        assert_eq!(ids(&x["prompt_token_ids"]), plain);
        assert_same_completion(&body["choices"][0], &greedy_locally(&dir, plain, 5));
        let completion = ids(&x["completion_token_ids"]);
        assert_eq!(
            body["choices"][0]["text"].as_str().unwrap(),
            tok.decode(&completion, true).unwrap()
        );
        let sent = vec![6u32, 7, 8, 9, 10];
        let (status, body) = post(
            &c,
            &format!("{}/v1/completions", server.url),
            json!({"prompt": sent, "max_tokens": 4, "temperature": 0.7, "top_p": 0.9}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let x = &body["choices"][0]["skein"];
        assert_eq!(ids(&x["prompt_token_ids"]), sent);
        assert!(ids(&x["completion_token_ids"]).len() <= 4);
        assert_eq!(body["object"], "text_completion");

        // `stop_token_ids` (vLLM's extension) ends a completion at those ids too.
        let completions = format!("{}/v1/completions", server.url);
        let greedy = |stop: Value| {
            let body = json!({"prompt": sent, "max_tokens": 8, "temperature": 0, "stop_token_ids": stop});
            post(&c, &completions, body)
        };
        let (status, body) = greedy(json!([])).await;
        assert_eq!(status, 200, "{body}");
        let whole = ids(&body["choices"][0]["skein"]["completion_token_ids"]);
        let j = (0..whole.len())
            .find(|&j| !whole[..j].contains(&whole[j]))
            .unwrap_or(0);
        let (status, body) = greedy(json!([whole[j]])).await;
        assert_eq!(status, 200, "{body}");
        let cut = ids(&body["choices"][0]["skein"]["completion_token_ids"]);
        assert_eq!(cut, whole[..=j], "{body}");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        let (status, body) = greedy(json!([tok.vocab_size() + 1000])).await;
        assert_error(status, &body, 400, "`stop_token_ids`");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

fn assert_error(status: StatusCode, body: &Value, want: u16, says: &str) {
    assert_eq!(status.as_u16(), want, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(says),
        "error {want} should say {says:?}: {body}"
    );
    assert_eq!(body["error"]["code"], want, "{body}");
    assert!(body["error"]["type"].is_string(), "{body}");
}

/// Every bad request gets an OpenAI-shaped error with the right status and a message that says
/// what to change; the server keeps serving.
#[test]
fn bad_requests_get_openai_errors_that_say_what_to_change() {
    let server = ServeProcess::start(&["--api-key", "sekrit", "--max-body-bytes", "4096"]);
    let chat = format!("{}/v1/chat/completions", server.url);
    let good = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    runtime().block_on(async {
        let c = client();
        let send = |body: String, key: Option<&'static str>| {
            let mut r = c
                .post(&chat)
                .header("content-type", "application/json")
                .body(body);
            if let Some(k) = key {
                r = r.bearer_auth(k);
            }
            async move {
                let r = r.send().await.unwrap();
                let status = r.status();
                (status, r.json::<Value>().await.unwrap_or(Value::Null))
            }
        };
        let key = Some("sekrit");

        let (s, b) = send(good.to_string(), None).await;
        assert_error(s, &b, 401, "Authorization: Bearer");
        let (s, b) = send(good.to_string(), Some("wrong")).await;
        assert_error(s, &b, 401, "API key");
        let health = c
            .get(format!("{}/health", server.url))
            .send()
            .await
            .unwrap();
        assert_eq!(health.status(), 200, "/health needs no key");

        let (s, b) = send(good.to_string(), key).await;
        assert_eq!(s, 200, "{b}");

        let (s, b) = send("{\"messages\": [".into(), key).await;
        assert_error(s, &b, 400, "JSON");
        let (s, b) = send(
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"})
                .to_string(),
            key,
        )
        .await;
        assert_error(s, &b, 400, "max_tokens");
        let (s, b) = send(json!({"messages": "hi"}).to_string(), key).await;
        assert_error(s, &b, 400, "messages");
        let (s, b) = send(json!({"max_tokens": 3}).to_string(), key).await;
        assert_error(s, &b, 400, "`messages` is required");
        let (s, b) = send(
            json!({"messages": [{"role": "robot", "content": "hi"}]}).to_string(),
            key,
        )
        .await;
        assert_error(s, &b, 400, "robot");
        let big = "x".repeat(10_000);
        let (s, b) = send(
            json!({"messages": [{"role": "user", "content": big}]}).to_string(),
            key,
        )
        .await;
        assert_error(s, &b, 413, "larger");
        let (s, b) = send(
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            key,
        )
        .await;
        assert_error(s, &b, 404, "model `gpt-4o` not found (served: skein-tiny)");
        let (s, b) = send(
            json!({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}).to_string(),
            key,
        )
        .await;
        assert_error(s, &b, 400, "temperature");
        // The tiny model's context is 256 tokens.
        let (s, b) = send(
            json!({"messages": [{"role": "user", "content": "y".repeat(300)}]}).to_string(),
            key,
        )
        .await;
        assert_error(s, &b, 400, "shorten the prompt");

        let completions = format!("{}/v1/completions", server.url);
        let post_key = |url: String, body: Value| {
            let r = c.post(url).bearer_auth("sekrit").json(&body);
            async move {
                let r = r.send().await.unwrap();
                let status = r.status();
                (status, r.json::<Value>().await.unwrap_or(Value::Null))
            }
        };
        let (s, b) = post_key(completions.clone(), json!({"prompt": [5, 99999]})).await;
        assert_error(s, &b, 400, "outside the model's vocabulary");
        let (s, b) = post_key(completions.clone(), json!({"prompt": [5, -1]})).await;
        assert_error(s, &b, 400, "token ids");
        let (s, b) = post_key(completions.clone(), json!({"prompt": ["a", "b"]})).await;
        assert_error(s, &b, 400, "one prompt per request");
        let (s, b) = post_key(completions, json!({"prompt": []})).await;
        assert_error(s, &b, 400, "empty");

        let rollout = format!("{}/rollouts/nope/v1/chat/completions", server.url);
        let (s, b) = post_key(rollout.clone(), good.clone()).await;
        assert_error(s, &b, 404, "no open rollout `nope`");
        // A rollout's samples are training data: truncated sampling and greedy decoding are
        // refused there.
        for (key, value) in [
            ("top_p", json!(0.9)),
            ("top_k", json!(5)),
            ("temperature", json!(0)),
        ] {
            let mut truncated = good.clone();
            truncated[key] = value;
            let (s, b) = post_key(rollout.clone(), truncated).await;
            assert_error(s, &b, 400, "off-policy");
        }
        let (s, b) = post_key(
            format!("{}/rollouts/nope/reward", server.url),
            json!({"reward": 1.0}),
        )
        .await;
        assert_error(s, &b, 404, "nope");
        let (s, b) = post_key(
            format!("{}/tasks", server.url),
            json!({"tasks": [{"rollout_id": "a/b"}]}),
        )
        .await;
        assert_error(s, &b, 400, "rollout id");
        let (s, b) = post_key(
            format!("{}/v1/reload", server.url),
            json!({"path": "/nonexistent"}),
        )
        .await;
        assert_error(s, &b, 400, "/nonexistent");

        let r = c.get(&chat).bearer_auth("sekrit").send().await.unwrap();
        let (s, b) = (r.status(), r.json::<Value>().await.unwrap());
        assert_error(s, &b, 405, "does not take GET");
        let (s, b) = post_key(
            format!("{}/rollouts/%FF/reward", server.url),
            json!({"reward": 1.0}),
        )
        .await;
        assert_error(s, &b, 400, "rollout id");

        // Still serving after all that.
        let (s, b) = send(good.to_string(), key).await;
        assert_eq!(s, 200, "{b}");
    });
}

/// Over `--max-concurrent` requests in flight, the next is refused at once with 503 and
/// `Retry-After`; the others complete.
#[test]
fn requests_over_the_concurrency_limit_get_503_with_retry_after() {
    let server = ServeProcess::start(&["--max-concurrent", "3", "--max-slots", "1"]);
    let url = format!("{}/v1/completions", server.url);
    runtime().block_on(async {
        let c = client();
        let tasks: Vec<_> = (0..24)
            .map(|_| {
                let r = c
                    .post(&url)
                    .json(&json!({"prompt": "slow", "max_tokens": 200, "temperature": 1}));
                tokio::spawn(async move {
                    let r = r.send().await.unwrap();
                    let retry = r.headers().get("retry-after").cloned();
                    (r.status(), retry, r.json::<Value>().await.unwrap())
                })
            })
            .collect();
        let (mut ok, mut refused) = (0, 0);
        for t in tasks {
            let (status, retry, body) = t.await.unwrap();
            match status.as_u16() {
                200 => ok += 1,
                503 => {
                    refused += 1;
                    assert_eq!(retry.unwrap(), "1");
                    assert_error(status, &body, 503, "--max-concurrent");
                }
                other => panic!("unexpected {other}: {body}"),
            }
        }
        assert!(ok >= 3 && refused >= 1, "ok {ok}, refused {refused}");
    });
}

/// Two chat calls of one agent episode through its rollout URL, the second continuing the
/// first with the reply and a tool result: the recording holds exactly the ids the responses
/// carried, a reward closes it, and the trainer takes it from the store.
#[test]
fn rollout_calls_are_recorded_token_exactly_and_closed_by_the_reward() {
    let config = ServeConfig {
        rollout_temperature: Some(1.0),
        ..ServeConfig::default()
    };
    let server = in_process(8, config);
    let store = server.store.clone();
    let base = server.url.clone();
    // The trainer hands out its step's tasks through the store, as `External::rollout` does.
    let task = |id: &str, prompt: &str| TaskSpec {
        rollout_id: id.into(),
        group: "g".into(),
        task: json!({ "prompt": prompt }),
    };
    store
        .add_tasks(vec![task("r1", "what is 2+3?"), task("r2", "what is 4+4?")])
        .unwrap();
    let again = store.add_tasks(vec![task("r1", "")]).unwrap_err();
    assert!(again.to_string().contains("exists already"), "{again}");
    runtime().block_on(async move {
        let c = client();
        // A trainer's server takes its tasks and its weights from the trainer alone: tasks of
        // another's would end its step early, a reload its engine's phase.
        let (s, b) = post(
            &c,
            &format!("{base}/tasks"),
            json!({"tasks": [{"rollout_id": "s1-p0-s0"}]}),
        )
        .await;
        assert_error(s, &b, 409, "trainer's");
        let (s, b) = post(&c, &format!("{base}/v1/reload"), json!({"path": "/tmp"})).await;
        assert_error(s, &b, 409, "trainer's");

        let next = get_json(&c, &format!("{base}/tasks/next")).await;
        assert_eq!(next["rollout_id"], "r1");
        assert_eq!(next["base_url"], "/rollouts/r1/v1");
        let prompt = next["task"]["prompt"].as_str().unwrap().to_string();
        let url = format!(
            "{base}{}/chat/completions",
            next["base_url"].as_str().unwrap()
        );

        let mut messages = vec![json!({"role": "user", "content": prompt})];
        // The trainer recomputes log-probs at its own temperature: another one is refused.
        let (s, hot) = post(
            &c,
            &url,
            json!({"messages": messages, "max_tokens": 8, "temperature": 0.7}),
        )
        .await;
        assert_eq!(s, 400, "{hot}");
        assert!(hot.to_string().contains("off-policy"), "{hot}");
        let (s, first) = post(
            &c,
            &url,
            json!({"messages": messages, "max_tokens": 8, "temperature": 1}),
        )
        .await;
        assert_eq!(s, 200, "{first}");
        let reply = first["choices"][0]["message"]["content"].as_str().unwrap();
        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(json!({"role": "tool", "content": "5", "tool_call_id": "c1"}));
        let (s, second) = post(
            &c,
            &url,
            json!({"messages": messages, "max_tokens": 8, "temperature": 1}),
        )
        .await;
        assert_eq!(s, 200, "{second}");

        let recording = get_json(&c, &format!("{base}/rollouts/r1")).await;
        assert_eq!(recording["state"], "open");
        assert_eq!(recording["calls"].as_array().unwrap().len(), 2);

        let (s, b) = post(
            &c,
            &format!("{base}/rollouts/r1/reward"),
            json!({"reward": 0.5, "correct": false}),
        )
        .await;
        assert_eq!(s, 200, "{b}");
        let (s, b) = post(
            &c,
            &format!("{base}/rollouts/r1/reward"),
            json!({"reward": 1.0}),
        )
        .await;
        assert_error(s, &b, 409, "closed already");
        let (s, b) = post(&c, &url, json!({"messages": messages})).await;
        assert_error(s, &b, 404, "r1");
        let (s, b) = post(
            &c,
            &format!("{base}/rollouts/r2/fail"),
            json!({"error": "env crashed"}),
        )
        .await;
        assert_eq!(s, 200, "{b}");
        let r = c.get(format!("{base}/tasks/next")).send().await.unwrap();
        assert_eq!(r.status(), 204, "r2 closed before it was handed out");

        assert_eq!(store.wait_closed(2, Duration::from_secs(5)).await, 2);
        let closed = store.take_closed();
        assert_eq!(closed.len(), 2);
        let r1 = &closed[0];
        assert_eq!((r1.rollout_id.as_str(), r1.group.as_str()), ("r1", "g"));
        assert_eq!(
            (r1.reward, r1.correct, r1.error.as_deref()),
            (0.5, Some(false), None)
        );
        for (call, response) in r1.calls.iter().zip([&first, &second]) {
            let x = &response["choices"][0]["skein"];
            assert_eq!(call.prompt_ids, ids(&x["prompt_token_ids"]));
            assert_eq!(call.completion_ids, ids(&x["completion_token_ids"]));
            let logprobs: Vec<f32> = x["logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            assert_eq!(call.logprobs, logprobs);
            assert_eq!(call.versions, vec![0; call.completion_ids.len()]);
            assert_eq!(call.finish, response["choices"][0]["finish_reason"]);
        }
        assert_eq!(closed[1].error.as_deref(), Some("env crashed"));
        assert!(closed[1].calls.is_empty());
        let r = c.get(format!("{base}/rollouts/r1")).send().await.unwrap();
        assert_eq!(r.status(), 404, "a taken rollout is forgotten");
    });
}

/// New weights saved by the trainer are loaded on request: the version goes up, the tokens
/// carry it, and greedy outputs change.
#[test]
fn reload_loads_new_weights_and_bumps_the_version() {
    let dir = temp_dir("reload");
    let (a, b) = (dir.join("a"), dir.join("b"));
    save_model(&a, 1);
    save_model(&b, 2);
    let server = ServeProcess::start(&["--model", a.to_str().unwrap()]);
    runtime().block_on(async {
        let c = client();
        let greedy = || {
            let r = c
                .post(format!("{}/v1/completions", server.url))
                .json(&json!({"prompt": "the sum is", "max_tokens": 24, "temperature": 0}));
            async move {
                let body: Value = r.send().await.unwrap().json().await.unwrap();
                let x = &body["choices"][0]["skein"];
                (ids(&x["completion_token_ids"]), ids(&x["versions"]))
            }
        };
        let (before, versions) = greedy().await;
        assert!(versions.iter().all(|&v| v == 0));
        assert_eq!(greedy().await.0, before, "greedy is repeatable");
        let (s, body) = post(
            &c,
            &format!("{}/v1/reload", server.url),
            json!({"path": b.to_str().unwrap()}),
        )
        .await;
        assert_eq!(s, 200, "{body}");
        assert_eq!(body["version"], 1);
        let health = get_json(&c, &format!("{}/health", server.url)).await;
        assert_eq!(health, json!({"status": "ok", "version": 1}));
        let (after, versions) = greedy().await;
        assert!(versions.iter().all(|&v| v == 1), "{versions:?}");
        assert_ne!(after, before, "other weights, other greedy tokens");
        let (s, body) = post(
            &c,
            &format!("{}/v1/reload", server.url),
            json!({"path": a.to_str().unwrap()}),
        )
        .await;
        assert_eq!((s.as_u16(), body["version"].as_u64()), (200, Some(2)));
        assert_eq!(greedy().await.0, before, "the first weights again");

        // A model with a shorter context is refused, and the server goes on as it was; so is
        // one trained with another chat template (a reload keeps the served one).
        let refused = [
            ("short", "config.json", "max_position_embeddings", json!(16)),
            (
                "retemplated",
                "tokenizer_config.json",
                "chat_template",
                json!("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ),
        ];
        let reasons = ["shorter than the served model's", "in its chat template"];
        for ((name, file, key, value), reason) in refused.into_iter().zip(reasons) {
            let edited = dir.join(name);
            save_model(&edited, 2);
            let path = edited.join(file);
            let mut config: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            config[key] = value;
            std::fs::write(&path, config.to_string()).unwrap();
            let (s, body) = post(
                &c,
                &format!("{}/v1/reload", server.url),
                json!({"path": edited.to_str().unwrap()}),
            )
            .await;
            assert_error(s, &body, 400, reason);
        }
        // So is one whose KV cache takes more per token than the cache sized at start-up.
        let deeper = dir.join("deeper");
        let mut cfg = ModelSection::default().tiny_config(tokenizer().vocab_size(), CONTEXT);
        cfg.num_hidden_layers += 1;
        let tok = tokenizer();
        let sampling = SamplingParams {
            stop_token_ids: tok.eos_token_ids().to_vec(),
            ..Default::default()
        };
        let model = Model::random(&cfg, tch::Device::Cpu, 3).unwrap();
        skein::trainer::checkpoint::save_model_dir(&model, &tok, &sampling, &deeper).unwrap();
        let (s, body) = post(
            &c,
            &format!("{}/v1/reload", server.url),
            json!({"path": deeper.to_str().unwrap()}),
        )
        .await;
        assert_error(
            s,
            &body,
            400,
            "bytes per token, more than the served model's",
        );
        let (again, versions) = greedy().await;
        assert_eq!(again, before);
        assert!(versions.iter().all(|&v| v == 2), "{versions:?}");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// 1,000 agent calls at once, each through its own rollout's URL, then 1,000 rewards: no
/// errors, every call recorded, every rollout closed.
#[test]
fn a_thousand_concurrent_rollout_calls_are_all_recorded() {
    const N: usize = 1000;
    let server = in_process(128, ServeConfig::default());
    let tasks: Vec<TaskSpec> = (0..N)
        .map(|i| TaskSpec {
            rollout_id: format!("load-{i}"),
            group: format!("g{}", i / 10),
            task: json!({"prompt": format!("what is {i}+1?")}),
        })
        .collect();
    server.store.add_tasks(tasks).unwrap();
    let base = server.url.clone();
    let started = Instant::now();
    let sent = runtime().block_on(async move {
        let c = Client::builder()
            .timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(N)
            .build()
            .unwrap();
        let calls: Vec<_> = (0..N)
            .map(|i| {
                let c = c.clone();
                let base = base.clone();
                tokio::spawn(async move {
                    let url = format!("{base}/rollouts/load-{i}/v1/chat/completions");
                    let body = json!({"messages": [{"role": "user", "content": format!("what is {i}+1?")}],
                                      "max_tokens": 4, "temperature": 1});
                    let r = c.post(url).json(&body).send().await.map_err(|e| e.to_string())?;
                    let status = r.status();
                    let body: Value = r.json().await.map_err(|e| e.to_string())?;
                    if status != 200 {
                        return Err(format!("{status}: {body}"));
                    }
                    let completion = ids(&body["choices"][0]["skein"]["completion_token_ids"]);
                    let url = format!("{base}/rollouts/load-{i}/reward");
                    let r = c.post(url).json(&json!({"reward": 1.0})).send().await.map_err(|e| e.to_string())?;
                    if r.status() != 200 {
                        return Err(format!("reward: {}", r.status()));
                    }
                    Ok::<_, String>((i, completion))
                })
            })
            .collect();
        let mut sent = vec![Vec::new(); N];
        let mut errors = Vec::new();
        for call in calls {
            match call.await.unwrap() {
                Ok((i, completion)) => sent[i] = completion,
                Err(e) => errors.push(e),
            }
        }
        assert!(errors.is_empty(), "{} errors, first: {}", errors.len(), errors[0]);
        sent
    });
    let elapsed = started.elapsed();
    eprintln!(
        "{N} concurrent rollout calls + rewards: {:.2} s ({:.0} calls/s)",
        elapsed.as_secs_f64(),
        N as f64 / elapsed.as_secs_f64()
    );
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
    let closed = server.store.take_closed();
    assert_eq!(closed.len(), N, "every rollout closed");
    let mut calls = 0;
    for r in &closed {
        let i: usize = r.rollout_id["load-".len()..].parse().unwrap();
        assert_eq!(r.calls.len(), 1, "{}", r.rollout_id);
        assert_eq!(r.calls[0].completion_ids, sent[i], "{}", r.rollout_id);
        assert!(r.calls[0].completion_ids.len() <= 4);
        calls += r.calls.len();
    }
    assert_eq!(calls, N, "every call recorded");
    assert_eq!(server.store.pending_count(), 0);
}

/// The example agent (the official `openai` client) against `skein serve` with no arguments:
/// every task handed out, every rollout closed with its calls recorded, and the ids the agent
/// received are the ids recorded.
#[test]
fn example_agent_closes_every_rollout_it_is_given() {
    let python = require_python_with_openai();
    let server = ServeProcess::start(&["--api-key", "agent-key"]);
    let dir = temp_dir("agent");
    let log = dir.join("calls.jsonl");
    let tasks: Vec<Value> = (0..6)
        .map(|i| {
            json!({"rollout_id": format!("agent-{i}"), "group": "sums",
                   "task": {"prompt": format!("What is {i}+2?"), "expression": format!("{i}+2"),
                            "ground_truth": (i + 2).to_string()}})
        })
        .collect();
    runtime().block_on(async {
        let r = client()
            .post(format!("{}/tasks", server.url))
            .bearer_auth("agent-key")
            .json(&json!({ "tasks": tasks }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    });
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/example_agent.py"
    );
    let out = Command::new(&python)
        .arg(script)
        .args(["--server", &server.url, "--api-key", "agent-key"])
        .args(["--idle-exit", "1", "--max-tasks", "6", "--concurrency", "3"])
        .args(["--max-tokens", "8", "--log", log.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "agent failed:\n{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        (summary["tasks"].as_u64(), summary["failed"].as_u64()),
        (Some(6), Some(0))
    );

    let logged: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(logged.len(), 12, "two calls per rollout");
    runtime().block_on(async {
        let c = client();
        for i in 0..6 {
            let id = format!("agent-{i}");
            let rec: Value = c
                .get(format!("{}/rollouts/{id}", server.url))
                .bearer_auth("agent-key")
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(rec["state"], "closed", "{rec}");
            let calls = rec["calls"].as_array().unwrap();
            assert_eq!(calls.len(), 2, "{rec}");
            let mine: Vec<&Value> = logged.iter().filter(|l| l["rollout_id"] == id).collect();
            for call in calls {
                let n = ids(&call["completion_ids"]).len();
                assert!(n >= 1 && call["logprobs"].as_array().unwrap().len() == n);
                // Some call the agent received has exactly these ids.
                assert!(
                    mine.iter()
                        .any(|l| ids(&l["prompt_token_ids"]) == ids(&call["prompt_ids"])
                            && ids(&l["completion_token_ids"]) == ids(&call["completion_ids"])),
                    "{id}: recorded call not among the responses"
                );
            }
            // The second call carries the whole conversation so far.
            let first = ids(&calls[0]["prompt_ids"]);
            let second = ids(&calls[1]["prompt_ids"]);
            assert!(second.len() > first.len());
        }
        let r = c
            .get(format!("{}/tasks/next", server.url))
            .bearer_auth("agent-key")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// CPU seconds a process has used (user + system), from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // The kernel counts in USER_HZ, 100 on Linux.
    ticks / 100.0
}

/// Ten 4 MB prompts at once, as text and as chat: each is refused by its length in bytes
/// without being tokenized (tokenizing one took 2.6 s of CPU), and a normal request between
/// them is answered.
#[test]
fn prompts_too_long_in_bytes_are_refused_before_tokenizing() {
    let server = ServeProcess::start(&[]);
    let pid = server.child.id();
    let huge = "x".repeat(4_000_000);
    runtime().block_on(async {
        let c = client();
        let cpu_before = cpu_seconds(pid);
        let started = Instant::now();
        let requests = (0..10).map(|i| {
            let (route, body) = if i % 2 == 0 {
                ("completions", json!({"prompt": huge, "max_tokens": 2}))
            } else {
                let messages = [json!({"role": "user", "content": huge})];
                (
                    "chat/completions",
                    json!({"messages": messages, "max_tokens": 2}),
                )
            };
            let url = format!("{}/v1/{route}", server.url);
            let c = &c;
            async move { post(c, &url, body).await }
        });
        let answers = futures_util::future::join_all(requests).await;
        let wall = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds(pid) - cpu_before;
        eprintln!("ten 4 MB prompts refused in {wall:.2} s wall, {cpu:.2} s of server CPU");
        for (s, b) in &answers {
            assert_error(*s, b, 400, "bytes of text");
        }
        // Reading and parsing 40 MB of JSON is all that is left.
        assert!(
            cpu < 3.0,
            "the server spent {cpu:.2} s of CPU on ten refusals"
        );
        let (s, b) = post(
            &c,
            &format!("{}/v1/completions", server.url),
            json!({"prompt": "1+1=", "max_tokens": 2}),
        )
        .await;
        assert_eq!(s, 200, "{b}");
    });
}

/// `skein serve` with its stderr kept, for what it says at start-up.
fn serve_with_stderr(args: &[&str]) -> (ServeProcess, Arc<std::sync::Mutex<String>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(["serve", "--port", "0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("skein runs");
    let said = Arc::new(std::sync::Mutex::new(String::new()));
    let kept = said.clone();
    let rx = common::watch_stderr(&mut child, move |line| {
        eprintln!("[skein serve] {line}");
        kept.lock().unwrap().push_str(&format!("{line}\n"));
        let url = line.strip_prefix("skein serve: listening on ")?;
        Some(url.to_string())
    });
    let url = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("skein serve prints its address");
    // Reached through loopback, whatever address the server names.
    let url = url.replace("0.0.0.0", "127.0.0.1");
    (ServeProcess { child, url }, said)
}

/// Bound beyond loopback with no key, the server warns at start-up and refuses `/v1/reload`
/// (which reads any path and says whether it exists); with a key it reloads and is quiet.
#[test]
fn a_server_beyond_loopback_needs_a_key_to_reload() {
    let dir = temp_dir("exposed");
    save_model(&dir.join("a"), 1);
    let model = dir.join("a").display().to_string();
    let reload = json!({"path": model});

    let (open, said) = serve_with_stderr(&["--host", "0.0.0.0", "--model", &model]);
    let warning = said.lock().unwrap().clone();
    assert!(
        warning.contains("warning") && warning.contains("--api-key"),
        "{warning}"
    );
    runtime().block_on(async {
        let c = client();
        let (s, b) = post(&c, &format!("{}/v1/reload", open.url), reload.clone()).await;
        assert_error(s, &b, 403, "--api-key");
        let (s, b) = post(
            &c,
            &format!("{}/v1/completions", open.url),
            json!({"prompt": "1+1=", "max_tokens": 2}),
        )
        .await;
        assert_eq!(s, 200, "generation stays open: {b}");
    });
    drop(open);

    let (keyed, said) =
        serve_with_stderr(&["--host", "0.0.0.0", "--model", &model, "--api-key", "k"]);
    assert!(!said.lock().unwrap().contains("warning"));
    runtime().block_on(async {
        let r = client()
            .post(format!("{}/v1/reload", keyed.url))
            .bearer_auth("k")
            .json(&reload)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            (status.as_u16(), &body["version"]),
            (200, &json!(1)),
            "{body}"
        );
    });
    drop(keyed);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--dtype bfloat16` serves the weights in bfloat16, says so, and keeps it across a reload;
/// a dtype it does not know is refused naming the allowed ones.
#[test]
fn a_model_is_served_in_the_dtype_asked_for() {
    let dir = temp_dir("bf16");
    save_model(&dir.join("a"), 1);
    save_model(&dir.join("b"), 2);
    let model = dir.join("a").display().to_string();
    let (server, said) = serve_with_stderr(&["--model", &model, "--dtype", "bfloat16"]);
    assert!(
        said.lock().unwrap().contains("bfloat16 weights"),
        "{}",
        said.lock().unwrap()
    );
    runtime().block_on(async {
        let c = client();
        let completions = format!("{}/v1/completions", server.url);
        let complete = || post(&c, &completions, json!({"prompt": "1+1=", "max_tokens": 2}));
        let (s, b) = complete().await;
        assert_eq!(s, 200, "{b}");
        let reload = json!({"path": dir.join("b").display().to_string()});
        let (s, b) = post(&c, &format!("{}/v1/reload", server.url), reload).await;
        assert_eq!(s, 200, "{b}");
        let (s, b) = complete().await;
        assert_eq!(s, 200, "{b}");
    });
    drop(server);
    let out = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(["serve", "--port", "0", "--dtype", "fp8"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("allowed: float32, bfloat16"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A key no client can send (empty, blank, spaces at its ends) is refused before serving.
#[test]
fn an_api_key_no_client_can_send_is_refused_at_start_up() {
    for key in ["", "   ", " k", "k\u{e9}"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
            .args(["serve", "--port", "0", "--api-key", key])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("skein runs");
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        let code = status.and_then(|s| s.code());
        assert_eq!(code, Some(2), "{key:?} (still serving if None): {stderr}");
        assert!(stderr.contains("--api-key"), "{key:?}: {stderr}");
    }
}

/// OpenAI's `logprobs` and options skein does not have are answered 400 rather than silently
/// ignored, and so is a stop list too long to look for; their empty forms are fine.
#[test]
fn sampling_options_skein_does_not_have_are_refused_not_ignored() {
    let server = ServeProcess::start(&[]);
    let completions = format!("{}/v1/completions", server.url);
    let chat = format!("{}/v1/chat/completions", server.url);
    let stops: Vec<String> = (0..10_000).map(|i| format!("s{i}")).collect();
    runtime().block_on(async {
        let c = client();
        let prompt = |extra: Value| {
            let mut body = json!({"prompt": "1+1=", "max_tokens": 2});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            body
        };
        for (extra, says) in [
            (json!({"logprobs": 5}), "`logprobs`"),
            (json!({"top_logprobs": 3}), "`logprobs`"),
            (json!({"stop": stops}), "10000 entries"),
            (json!({"seed": 42}), "`seed`"),
            (json!({"presence_penalty": 0.5}), "`presence_penalty`"),
            (json!({"frequency_penalty": -1.0}), "`frequency_penalty`"),
            (json!({"repetition_penalty": 1.2}), "`repetition_penalty`"),
            (json!({"min_p": 0.05}), "`min_p`"),
            (json!({"logit_bias": {"13": -100}}), "`logit_bias`"),
            (
                json!({"response_format": {"type": "json_object"}}),
                "`response_format`",
            ),
            (json!({"echo": true}), "`echo`"),
            (json!({"best_of": 3}), "`best_of`"),
            (json!({"suffix": "end"}), "`suffix`"),
            (
                json!({"parallel_tool_calls": false}),
                "`parallel_tool_calls`",
            ),
            (json!({"ignore_eos": true}), "`ignore_eos`"),
            (json!({"min_tokens": 2}), "`min_tokens`"),
            (
                json!({"add_generation_prompt": false}),
                "`add_generation_prompt`",
            ),
            (
                json!({"continue_final_message": true}),
                "`continue_final_message`",
            ),
            // Fields skein does not know are refused by name, not dropped.
            (
                json!({"guided_choice": ["yes", "no"]}),
                "`guided_choice` is not a field skein reads",
            ),
            (
                json!({"max_new_tokens": 3}),
                "`max_new_tokens` is not a field",
            ),
            (json!({"top_k": -7}), "`top_k` is -7"),
            (json!({"max_tokens": 0}), "`max_tokens` must be at least 1"),
            (
                json!({"max_completion_tokens": 0}),
                "`max_completion_tokens` must be at least 1",
            ),
        ] {
            let (s, b) = post(&c, &completions, prompt(extra.clone())).await;
            assert_error(s, &b, 400, says);
        }
        let chat_body = json!({"messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 2, "logprobs": true});
        let (s, b) = post(&c, &chat, chat_body).await;
        assert_error(s, &b, 400, "skein.logprobs");
        for extra in [
            json!({"stop": [], "logprobs": null}),
            json!({"stop": null, "logprobs": false, "top_logprobs": 0}),
            json!({"seed": null, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                   "repetition_penalty": 1.0, "min_p": 0.0, "user": "u"}),
            json!({"logit_bias": {}, "response_format": {"type": "text"}, "echo": false,
                   "best_of": 1, "suffix": null, "parallel_tool_calls": true,
                   "ignore_eos": false, "min_tokens": 0}),
            json!({"add_generation_prompt": true, "continue_final_message": false, "top_k": -1,
                   "metadata": {"a": "b"}, "store": false, "stream_options": null}),
        ] {
            let (s, b) = post(&c, &completions, prompt(extra.clone())).await;
            assert_eq!(s, 200, "{extra}: {b}");
        }
    });
}

/// The events of a streamed answer, `[DONE]` last, as JSON (without `[DONE]`).
fn sse_chunks(body: &str) -> Vec<Value> {
    let data: Vec<&str> = body
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .expect("every event is a data line")
        })
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// The pieces of text a streamed answer sent for choice `index`, in order: chat deltas'
/// `content` or text completions' `text`, the empty ones left out.
fn pieces(chunks: &[Value], index: usize) -> Vec<String> {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().clone())
        .filter(|c| c["index"] == index && c["finish_reason"].is_null())
        .filter_map(|c| {
            let text = c["delta"]["content"].as_str().or(c["text"].as_str())?;
            (!text.is_empty()).then(|| text.to_string())
        })
        .collect()
}

/// Choice `index`'s last event: the one with its finish reason.
fn finish_event(chunks: &[Value], index: usize) -> Value {
    let mut finishes = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().clone())
        .filter(|c| c["index"] == index && !c["finish_reason"].is_null());
    let finish = finishes.next().expect("a finish event");
    assert!(finishes.next().is_none(), "one finish event per choice");
    finish
}

/// A prompt among a few whose greedy answer (choice 0 of `body`'s) has at least three
/// characters besides spaces. The in-process tiny model's weights depend on what else the
/// test binary runs while it is built (libtorch's generator is shared by every thread), and
/// on some weights a prompt's answer stops at once.
async fn talkative(c: &Client, url: &str, body: impl Fn(&str) -> Value) -> String {
    for prompt in [
        "2+3=", "hello", "7*8=", "why?", "a b c", "12-4=", "xyz", "ok.",
    ] {
        let (s, plain) = post(c, url, body(prompt)).await;
        assert_eq!(s, 200, "{plain}");
        let choice = &plain["choices"][0];
        let answer = choice["message"]["content"]
            .as_str()
            .or(choice["text"].as_str());
        if answer.is_some_and(|a| a.trim().chars().count() >= 3) {
            return prompt.to_string();
        }
    }
    panic!("no prompt got an answer of three characters from {url}");
}

/// `stream: true` sends the text in pieces as it is generated, and the pieces make the
/// greedy completion `stream: false` gets: chat and text completions, `n` choices, `stop`
/// strings (no piece holds one), each choice's last event with the token-exact record, and
/// when asked, the usage, and with tools offered. The official `openai` client reads the
/// chat stream.
#[test]
fn a_streamed_answer_comes_in_pieces_that_make_the_plain_answer() {
    let server = in_process(4, ServeConfig::default());
    let base = server.url.clone();
    let chat_of = |prompt: &str| {
        json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 12,
               "temperature": 0, "n": 2})
    };
    let text_of =
        |prompt: &str| json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "n": 2});
    let (chat_prompt, chat, text) = runtime().block_on(async {
        let c = client();
        let chat_prompt = talkative(&c, &format!("{base}/v1/chat/completions"), chat_of).await;
        let text_prompt = talkative(&c, &format!("{base}/v1/completions"), text_of).await;
        (
            chat_prompt.clone(),
            chat_of(&chat_prompt),
            text_of(&text_prompt),
        )
    });
    runtime().block_on(async {
        let c = client();
        let stream = |body: &Value, url: &str, usage: bool| {
            let mut body = body.clone();
            body["stream"] = json!(true);
            if usage {
                body["stream_options"] = json!({"include_usage": true});
            }
            let request = c.post(url).json(&body);
            async move {
                let r = request.send().await.unwrap();
                assert_eq!(r.status(), 200);
                assert_eq!(r.headers()["content-type"], "text/event-stream");
                sse_chunks(&r.text().await.unwrap())
            }
        };
        for (route, body) in [("chat/completions", &chat), ("completions", &text)] {
            let url = format!("{base}/v1/{route}");
            let (s, plain) = post(&c, &url, body.clone()).await;
            assert_eq!(s, 200, "{plain}");
            let chunks = stream(body, &url, true).await;
            let object = match route {
                "chat/completions" => "chat.completion.chunk",
                _ => "text_completion",
            };
            assert!(chunks.iter().all(|c| c["object"] == object), "{chunks:?}");
            for index in 0..2 {
                let choice = &plain["choices"][index];
                let whole = choice["message"]["content"]
                    .as_str()
                    .or(choice["text"].as_str())
                    .unwrap();
                assert!(whole.trim().chars().count() >= 3, "{whole:?}");
                let sent = pieces(&chunks, index);
                assert_eq!(sent.concat(), whole, "{chunks:?}");
                assert!(sent.len() >= 2, "sent whole, not as generated: {sent:?}");
                let last = finish_event(&chunks, index);
                assert_eq!(last["finish_reason"], choice["finish_reason"]);
                // The same tokens; the log-probs to float noise (the batch around differs).
                let record = &choice["skein"];
                let want = (
                    ids(&record["completion_token_ids"]),
                    record["logprobs"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|l| l.as_f64().unwrap() as f32)
                        .collect(),
                );
                assert_eq!(
                    last["skein"]["prompt_token_ids"],
                    record["prompt_token_ids"]
                );
                assert_same_completion(&last, &want);
            }
            if route == "chat/completions" {
                let role = &chunks[0]["choices"][0]["delta"];
                assert_eq!(
                    (&role["role"], &role["content"]),
                    (&json!("assistant"), &json!(""))
                );
            }
            let usage = chunks.last().unwrap();
            assert_eq!(usage["choices"], json!([]));
            assert_eq!(usage["usage"], plain["usage"]);
            let chunks = stream(body, &url, false).await;
            assert!(
                chunks.iter().all(|c| c.get("usage").is_none()),
                "{chunks:?}"
            );

            // A stop string two characters into the completion: the pieces end before it.
            let whole = pieces(&chunks, 0).concat();
            let chars: Vec<char> = whole.chars().collect();
            let stop: String = chars[1..3].iter().collect();
            let mut stopped = body.clone();
            stopped["stop"] = json!([stop]);
            let (_, plain) = post(&c, &url, stopped.clone()).await;
            let chunks = stream(&stopped, &url, false).await;
            let sent = pieces(&chunks, 0);
            assert!(sent.iter().all(|p| !p.contains(&stop)), "{sent:?}");
            let choice = &plain["choices"][0];
            let cut = choice["message"]["content"]
                .as_str()
                .or(choice["text"].as_str());
            assert_eq!(Some(sent.concat().as_str()), cut);
            assert_eq!(finish_event(&chunks, 0)["finish_reason"], "stop");
        }
        // Tools offered: the text streams up to a tool call (none here, which the tiny model
        // does not write), unless it starts with whitespace, which parsing them trims.
        let mut with_tools = chat.clone();
        with_tools["tools"] = json!([{"type": "function", "function": {"name": "add",
                                      "parameters": {"type": "object"}}}]);
        let url = format!("{base}/v1/chat/completions");
        let (_, plain) = post(&c, &url, with_tools.clone()).await;
        let chunks = stream(&with_tools, &url, false).await;
        let whole = plain["choices"][0]["message"]["content"].as_str().unwrap();
        let sent = pieces(&chunks, 0);
        assert_eq!(sent.concat(), whole);
        let shown = whole.chars().filter(|c| !c.is_whitespace()).count();
        match whole.starts_with(char::is_whitespace) {
            true => assert_eq!(sent.len(), 1, "{sent:?}"),
            false => assert!(sent.len() >= shown.min(2), "{sent:?}"),
        }
    });
    let python = require_python_with_openai();
    let script = r#"
import sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
    model="skein", messages=[{"role": "user", "content": sys.argv[2]}], max_tokens=12,
    temperature=0, stream=True) if c.choices]
print(len([p for p in parts if p]), "".join(parts), end="")
"#;
    let out = Command::new(&python)
        .args(["-c", script, &server.url, &chat_prompt])
        .output()
        .unwrap();
    let (streamed, errors) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{errors}");
    let (count, streamed) = streamed.split_once(' ').unwrap();
    assert!(count.parse::<usize>().unwrap() >= 2, "{count} pieces");
    let mut single = chat.clone();
    single["n"] = json!(1);
    let url = format!("{base}/v1/chat/completions");
    let plain = runtime().block_on(async { post(&client(), &url, single).await.1 });
    assert_eq!(
        streamed,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
}

/// A streamed call of a rollout is recorded as its events gave it: each choice's ids those of
/// its last event, its pieces their text. One the rollout cannot take (unknown, or its
/// prompt outside the vocabulary) is refused with its status, not inside a stream; and one
/// whose client leaves records nothing.
#[test]
fn a_streamed_rollout_call_records_what_it_sent_and_nothing_when_left() {
    let server = with_rollout_r();
    let store = server.store.clone();
    let base = server.url.clone();
    let url = format!("{base}/rollouts/r/v1/completions");
    let tok = tokenizer();
    runtime().block_on(async {
        let c = client();
        let body = json!({"prompt": "2+3=", "max_tokens": 12, "n": 6, "stream": true});
        let r = c.post(&url).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let chunks = sse_chunks(&r.text().await.unwrap());
        let (_, recorded) = store.get("r").unwrap();
        assert_eq!(recorded.calls.len(), 6);
        for (index, call) in recorded.calls.iter().enumerate() {
            let last = finish_event(&chunks, index);
            assert_eq!(
                ids(&last["skein"]["completion_token_ids"]),
                call.completion_ids
            );
            let text = tok.decode_message(&call.completion_ids).unwrap();
            assert_eq!(pieces(&chunks, index).concat(), text, "choice {index}");
        }
        let texts: Vec<String> = (0..6).map(|i| pieces(&chunks, i).concat()).collect();
        assert!(
            texts.iter().any(|t| t != &texts[0]),
            "sampled choices differ: {texts:?}"
        );

        for (route, body, status) in [
            ("/rollouts/nope/v1/completions", body.clone(), 404),
            (
                "/v1/completions",
                json!({"prompt": [999999], "stream": true}),
                400,
            ),
        ] {
            let (s, b) = post(&c, &format!("{base}{route}"), body).await;
            assert_eq!(s.as_u16(), status, "{route}: {b}");
            assert!(b["error"]["message"].is_string(), "{b}");
        }

        // The first event, then the client is gone. (Eight choices: a call ends with its
        // longest, which a stop id sampled early does not end.)
        let long = json!({"prompt": "2+3=", "max_tokens": 100, "n": 8, "stream": true});
        let mut r = c.post(&url).json(&long).send().await.unwrap();
        let first = r.chunk().await.unwrap().expect("an event");
        assert!(first.starts_with(b"data: "), "{first:?}");
        drop(r);
        // Far longer than 100 tokens of the tiny model take: a call that ran on would be
        // recorded by now.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (_, recorded) = store.get("r").unwrap();
        assert_eq!(recorded.calls.len(), 6, "nothing more was recorded");
    });
}

/// A stream counts against `--max-concurrent` until it ends: with a limit of one, a request
/// sent while a stream is generating is refused with 503, and one sent after it is served.
#[test]
fn a_stream_holds_its_place_in_the_concurrency_limit_until_it_ends() {
    let config = ServeConfig {
        max_concurrent: 1,
        ..ServeConfig::default()
    };
    let server = in_process(4, config);
    let url = format!("{}/v1/completions", server.url);
    runtime().block_on(async {
        let c = client();
        // Sixty-four choices: the stream ends with the longest, far after its first event.
        let long = json!({"prompt": "2+3=", "max_tokens": 100, "temperature": 1, "n": 64,
                          "stream": true});
        let mut r = c.post(&url).json(&long).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.chunk().await.unwrap().expect("a first event");
        let (s, b) = post(&c, &url, json!({"prompt": "1", "max_tokens": 1})).await;
        assert_error(s, &b, 503, "--max-concurrent");
        while r.chunk().await.unwrap().is_some() {}
        let (s, b) = post(&c, &url, json!({"prompt": "1", "max_tokens": 1})).await;
        assert_eq!(s, 200, "{b}");
    });
}

/// Sends `body` to `url` as an HTTP/1.1 request on a connection of its own, and closes the
/// connection after `wait`, before any answer came: a client that gave up.
async fn post_and_leave(url: &str, body: &Value, wait: Duration) {
    use tokio::io::AsyncWriteExt;
    let (host, path) = url
        .strip_prefix("http://")
        .unwrap()
        .split_once('/')
        .unwrap();
    let mut tcp = tokio::net::TcpStream::connect(host).await.unwrap();
    let body = body.to_string();
    let head = format!(
        "POST /{path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body.as_bytes()).await.unwrap();
    tokio::time::sleep(wait).await;
    let mut byte = [0u8; 1];
    let unanswered = tcp.try_read(&mut byte);
    assert!(
        unanswered.is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "{url} answered before its client left"
    );
}

/// A request (not streamed) whose client leaves ends at the next token, as a stream does: the
/// engine's one slot is free for the next request within seconds, not after the minutes of
/// decoding the request asked for, and a rollout records nothing of it.
#[test]
fn a_request_whose_client_leaves_ends_at_the_next_token() {
    let config = ServeConfig {
        max_n: 1024,
        rollout_temperature: Some(1.0),
        ..ServeConfig::default()
    };
    let server = in_process(1, config);
    let task = TaskSpec {
        rollout_id: "r".into(),
        group: "g".into(),
        task: json!({}),
    };
    server.store.add_tasks(vec![task]).unwrap();
    let base = server.url.clone();
    runtime().block_on(async {
        let c = client();
        // 1024 completions of up to 100 tokens, decoded one after another in the one slot.
        let long = json!({"prompt": "2+3=", "max_tokens": 100, "temperature": 1, "n": 1024});
        let short = json!({"prompt": "1", "max_tokens": 1});
        let url = format!("{base}/v1/completions");
        for route in ["/v1/completions", "/rollouts/r/v1/completions"] {
            post_and_leave(&format!("{base}{route}"), &long, Duration::from_secs(2)).await;
            let left = Instant::now();
            let next = post(&c, &url, short.clone());
            let (s, b) = tokio::time::timeout(Duration::from_secs(60), next)
                .await
                .unwrap_or_else(|_| panic!("{route}: the engine ran on for its client that left"));
            assert_eq!(s, 200, "{b}");
            eprintln!(
                "{route}: the next request was served {:?} after",
                left.elapsed()
            );
        }
        let (_, recorded) = server.store.get("r").unwrap();
        assert!(
            recorded.calls.is_empty(),
            "{} calls recorded",
            recorded.calls.len()
        );
    });
}

/// A token limit the context cannot hold after the prompt is refused with 400 naming the
/// field, the prompt's tokens and the context, as vLLM refuses it; one that fits exactly is
/// served, and so is a request that names none (the server's default, cut at the context).
#[test]
fn a_token_limit_past_the_context_is_refused_naming_it() {
    let server = in_process(2, ServeConfig::default());
    let base = server.url.clone();
    runtime().block_on(async {
        let c = client();
        let completions = format!("{base}/v1/completions");
        let chat = format!("{base}/v1/chat/completions");
        let prompt = [10, 11, 12, 13];
        let fits = CONTEXT - prompt.len();
        for (max_tokens, stream) in [(100_000, false), (fits + 1, false), (fits + 1, true)] {
            let body = json!({"prompt": prompt, "max_tokens": max_tokens, "stream": stream});
            let (s, b) = post(&c, &completions, body).await;
            assert_error(s, &b, 400, &format!("`max_tokens` is {max_tokens}"));
            let message = b["error"]["message"].as_str().unwrap();
            assert!(message.contains("the prompt is 4 tokens"), "{message}");
            assert!(message.contains(&format!("holds {CONTEXT}")), "{message}");
        }
        let (s, b) = post(
            &c,
            &chat,
            json!({"messages": [{"role": "user", "content": "hi"}],
                   "max_completion_tokens": 100_000, "max_tokens": 2}),
        )
        .await;
        assert_error(s, &b, 400, "`max_completion_tokens` is 100000");
        let (s, b) = post(
            &c,
            &completions,
            json!({"prompt": prompt, "max_tokens": fits}),
        )
        .await;
        assert_eq!(s, 200, "{b}");
        let tokens = b["usage"]["completion_tokens"].as_u64().unwrap() as usize;
        assert!(tokens <= fits, "{b}");
        // The server's default limit (256) is past the context too; it ends where prompt and
        // completion fill the context, not one token later. 64 choices: a random model samples
        // its end-of-text token now and then; about one in eight never does and reaches it.
        let (s, b) = post(&c, &completions, json!({"prompt": prompt, "n": 64})).await;
        assert_eq!(s, 200, "the default limit is not refused: {b}");
        let lengths: Vec<usize> = b["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                c["skein"]["completion_token_ids"]
                    .as_array()
                    .map_or(0, Vec::len)
            })
            .collect();
        assert!(lengths.iter().all(|&n| n <= fits), "{lengths:?}");
    });
}

/// `stop` strings end a completion where its text first holds one: the text stops before it,
/// the tokens at the one that completed it (what the policy sampled, and what a rollout
/// records), with finish reason `stop`; a string the completion never writes changes nothing.
#[test]
fn stop_strings_end_a_completion_at_the_first_they_complete() {
    let server = with_rollout_r();
    let store = server.store.clone();
    let base = server.url.clone();
    runtime().block_on(async move {
        let c = client();
        let url = format!("{base}/v1/completions");
        let greedy = |stop: Value| {
            json!({"prompt": "2+3=", "max_tokens": 24, "temperature": 0, "stop": stop})
        };
        let (s, whole) = post(&c, &url, greedy(Value::Null)).await;
        assert_eq!(s, 200, "{whole}");
        let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
        let every = ids(&whole["choices"][0]["skein"]["completion_token_ids"]);
        let chars: Vec<char> = text.chars().collect();
        assert!(chars.len() >= 6, "{text:?}");
        let stop: String = chars[3..5].iter().collect();
        let at = text.find(&stop).unwrap();
        let (s, cut) = post(&c, &url, greedy(json!(["never written", stop]))).await;
        assert_eq!(s, 200, "{cut}");
        let choice = &cut["choices"][0];
        assert_eq!(choice["text"], text[..at]);
        assert_eq!(choice["finish_reason"], "stop");
        // The tokens end at the first whose text completes the string.
        let kept = ids(&choice["skein"]["completion_token_ids"]);
        let tok = tokenizer();
        let reads = |ids: &[u32]| tok.decode_message(ids).unwrap();
        assert_eq!(kept, every[..kept.len()]);
        assert!(reads(&kept).contains(&stop), "{kept:?}");
        assert!(!reads(&kept[..kept.len() - 1]).contains(&stop), "{kept:?}");
        assert_eq!(
            choice["skein"]["logprobs"].as_array().unwrap().len(),
            kept.len()
        );
        let (_, same) = post(&c, &url, greedy(json!("never written"))).await;
        assert_eq!(same["choices"][0]["text"], text);
        let (s, b) = post(&c, &url, greedy(json!(5))).await;
        assert_error(s, &b, 400, "`stop` must be a string or a list of strings");

        // In a rollout the recorded call is the one returned, cut where it stopped.
        let (s, rolled) = post(
            &c,
            &format!("{base}/rollouts/r/v1/completions"),
            json!({"prompt": "2+3=", "max_tokens": 24, "stop": [stop, "+", "="]}),
        )
        .await;
        assert_eq!(s, 200, "{rolled}");
        let returned = ids(&rolled["choices"][0]["skein"]["completion_token_ids"]);
        let (_, recorded) = store.get("r").unwrap();
        assert_eq!(recorded.calls[0].completion_ids, returned);
        let text = rolled["choices"][0]["text"].as_str().unwrap();
        assert!(!text.contains('+') && !text.contains('='), "{text:?}");
    });
}

/// A run directory is served as `skein eval` takes it: its checkpoint, named after the run. A
/// LoRA adapter is refused naming what to serve instead, not a missing tokenizer.json.
#[test]
fn a_run_directory_serves_its_checkpoint_and_an_adapter_says_what_to_serve() {
    let run = temp_dir("run-dir");
    std::fs::write(run.join("config.toml"), "").unwrap();
    save_model(&run.join("checkpoint"), 1);
    let (server, said) = serve_with_stderr(&["--model", run.to_str().unwrap()]);
    let said = said.lock().unwrap().clone();
    assert!(
        said.contains(&format!(
            "is a run directory: serving {}",
            run.join("checkpoint").display()
        )),
        "{said}"
    );
    let name = run.file_name().unwrap().to_str().unwrap().to_string();
    runtime().block_on(async {
        let models = get_json(&client(), &format!("{}/v1/models", server.url)).await;
        assert_eq!(models["data"][0]["id"], name.as_str());
    });
    drop(server);

    let adapter = run.join("checkpoint/adapter");
    std::fs::create_dir_all(&adapter).unwrap();
    std::fs::write(
        adapter.join("adapter_config.json"),
        r#"{"base_model_name_or_path": "base", "peft_type": "LORA"}"#,
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(["serve", "--port", "0", "--model", adapter.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let checkpoint = run.join("checkpoint").display().to_string();
    for says in ["a LoRA adapter", &checkpoint, "`base`", "/v1/reload"] {
        assert!(err.contains(says), "expected {says:?} in {err}");
    }
    assert!(!err.contains("tokenizer.json"), "{err}");
    let _ = std::fs::remove_dir_all(&run);
}
