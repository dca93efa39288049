//! A remote rollout engine: an OpenAI-compatible server (another `skein serve`, or vLLM/SGLang
//! with a token-id extension) generates instead of the embedded engine. Prompts go out as token
//! ids on `/v1/completions`; token ids and behavior log-probs come back in each choice's `skein`
//! field, so nothing is retokenized on either side. After each optimizer step the trainer
//! publishes its weights as a Hugging Face directory and asks the server to load them.

use super::continuous::{EngineStats, Finish, GenOutput, GenRequest};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

/// `[rollout.remote]`: where the remote engine is and how to talk to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemoteEngineConfig {
    /// The server's base URL, e.g. `http://127.0.0.1:8000` (plain HTTP).
    pub url: String,
    /// Route that loads new weights: `POST {"path": dir}` → `{"version": N}`.
    pub reload_path: String,
    /// Sent as `Authorization: Bearer …` when not empty.
    pub api_key: String,
    /// One HTTP call's limit, in milliseconds.
    pub timeout_ms: u64,
    /// Completions in flight at once.
    pub concurrency: usize,
    /// What the trainer gives the server after each step: the whole model ("merged"), or
    /// with LoRA only the adapters ("adapter": megabytes instead of the model; the server
    /// loads the frozen base once).
    pub publish: Publish,
}

/// See [`RemoteEngineConfig::publish`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Publish {
    #[default]
    Merged,
    Adapter,
}

impl Default for RemoteEngineConfig {
    fn default() -> Self {
        RemoteEngineConfig {
            url: String::new(),
            reload_path: "/v1/reload".into(),
            api_key: String::new(),
            timeout_ms: 120_000,
            concurrency: 64,
            publish: Publish::Merged,
        }
    }
}

#[derive(Clone)]
pub struct RemoteEngine {
    cfg: RemoteEngineConfig,
    agent: ureq::Agent,
    /// The policy's vocabulary: a token id the server returns must be below it.
    vocab_size: usize,
    /// The policy's context: a request asks for no more tokens than fit after its prompt. A
    /// server refuses a limit past its context (vLLM and `skein serve` answer 400), where the
    /// embedded engine ends the sample at the context's end.
    context: usize,
}

/// The `skein` field of a completion choice.
#[derive(Deserialize)]
struct Exact {
    completion_token_ids: Vec<u32>,
    logprobs: Vec<f32>,
}

/// Largest log-prob a sampled token may have: 0, give or take the server's float rounding.
const MAX_LOGPROB: f32 = 1e-4;

/// Refuses a completion that cannot be training data: ids outside the policy's vocabulary
/// (a server with another tokenizer; the trainer's forward would index past its embedding
/// table), log-probs that are no log-probabilities, more tokens than were asked for, or
/// tokens after one of `stop_ids` (a server that ignored them: the embedded engine ends a
/// sample at the first). Its trajectory fails alone, rather than the run at the update.
fn check_completion(
    exact: &Exact,
    max_tokens: usize,
    vocab_size: usize,
    stop_ids: &[u32],
) -> Result<()> {
    let (ids, logprobs) = (&exact.completion_token_ids, &exact.logprobs);
    if logprobs.len() != ids.len() {
        bail!("the completion's token ids and log-probs differ in length");
    }
    let before_last = &ids[..ids.len().saturating_sub(1)];
    if let Some(k) = before_last.iter().position(|id| stop_ids.contains(id)) {
        bail!(
            "the completion goes on past stop id {} (token {} of {}): does the server honour \
             the request's `stop_token_ids`?",
            ids[k],
            k + 1,
            ids.len()
        );
    }
    if ids.len() > max_tokens {
        bail!(
            "the completion has {} tokens, over the {max_tokens} asked for",
            ids.len()
        );
    }
    if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
        bail!(
            "the completion has token id {id}, outside the policy's vocabulary of {vocab_size}: \
             does the server run the policy's tokenizer?"
        );
    }
    if let Some(lp) = logprobs
        .iter()
        .find(|lp| !(lp.is_finite() && **lp <= MAX_LOGPROB))
    {
        bail!("the completion has log-prob {lp}, which no probability has");
    }
    Ok(())
}

impl RemoteEngine {
    /// An engine at `cfg.url` for a policy of `vocab_size` tokens and `context` positions.
    pub fn new(cfg: &RemoteEngineConfig, vocab_size: usize, context: usize) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_millis(cfg.timeout_ms.max(1)))
            .build();
        RemoteEngine {
            cfg: cfg.clone(),
            agent,
            vocab_size,
            context,
        }
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let url = format!("{}{}", self.cfg.url.trim_end_matches('/'), path);
        let mut req = self
            .agent
            .post(&url)
            .set("Content-Type", "application/json");
        if !self.cfg.api_key.is_empty() {
            req = req.set("Authorization", &format!("Bearer {}", self.cfg.api_key));
        }
        let text = match req.send_string(&body.to_string()) {
            Ok(resp) => resp.into_string()?,
            Err(ureq::Error::Status(code, resp)) => {
                let text = resp.into_string().unwrap_or_default();
                bail!("{url} answered {code}: {}", text.trim());
            }
            Err(ureq::Error::Transport(t)) => {
                bail!("{url} is unreachable ({t}); is the server running (rollout.remote.url)?")
            }
        };
        serde_json::from_str(&text).with_context(|| format!("{url} answered with invalid JSON"))
    }

    /// Generates one request on the server. The server records its own version; the tokens
    /// are attributed to `version`, the trainer's, whose weights it was last given.
    pub fn generate_one(&self, req: &GenRequest, version: u64) -> Result<GenOutput> {
        let p = &req.params;
        let remaining = p.max_new_tokens.saturating_sub(req.resumed.len()).max(1);
        let asked = req.budget.map_or(remaining, |b| b.min(remaining));
        let mut prompt = req.prompt.clone();
        prompt.extend_from_slice(&req.resumed);
        let fits = self.context.saturating_sub(prompt.len()).max(1);
        let max_tokens = asked.min(fits);
        let body = json!({
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "top_k": p.top_k,
            // The run's stop ids (vLLM's name): a sample ends at them, as on the local engine.
            "stop_token_ids": p.stop_token_ids,
        });
        let resp = self.post("/v1/completions", &body)?;
        let choice = resp
            .get("choices")
            .and_then(|c| c.get(0))
            .ok_or_else(|| anyhow!("the completion has no choices: {resp}"))?;
        let exact: Exact = serde_json::from_value(
            choice
                .get("skein")
                .cloned()
                .ok_or_else(|| anyhow!("the completion carries no token ids (`skein` field)"))?,
        )
        .context("the completion's `skein` field")?;
        check_completion(&exact, max_tokens, self.vocab_size, &p.stop_token_ids)?;
        let n = exact.completion_token_ids.len();
        let stopped = exact
            .completion_token_ids
            .last()
            .is_some_and(|t| p.stop_token_ids.contains(t));
        let finish = if stopped {
            Finish::Stop
        } else if n >= asked && asked < remaining && asked < fits {
            // This call's budget ended it, not the sample's limit or the context.
            Finish::Paused
        } else {
            Finish::Length
        };
        Ok(GenOutput {
            id: req.id,
            tokens: exact.completion_token_ids,
            logprobs: exact.logprobs,
            versions: vec![version; n],
            // A remote server samples without recording a kept set: training refuses
            // top-k/top-p with it.
            kept: skein_plan::KeptSets::default(),
            finish,
            error: None,
        })
    }

    /// Generates every request, `concurrency` at a time, calling `on_finish` on this thread as
    /// each completes. A request that fails comes back empty with `Finish::Failed` and its
    /// error (its trajectory fails with it; the rest go on); the first error of a call is
    /// printed once.
    pub fn generate(
        &self,
        version: u64,
        requests: Vec<GenRequest>,
        mut on_finish: impl FnMut(GenOutput),
    ) -> EngineStats {
        let mut stats = EngineStats::default();
        let mut errors = 0usize;
        let queue = Mutex::new(requests.into_iter());
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            for _ in 0..self.cfg.concurrency.max(1) {
                let (tx, queue) = (tx.clone(), &queue);
                s.spawn(move || loop {
                    let next = queue.lock().ok().and_then(|mut q| q.next());
                    let Some(req) = next else { break };
                    let out = self.generate_one(&req, version);
                    if tx.send((req, out)).is_err() {
                        break;
                    }
                });
            }
            drop(tx);
            for (req, out) in rx {
                match out {
                    Ok(out) => {
                        stats.prefill_tokens += req.prompt.len() + req.resumed.len();
                        stats.generated_tokens += out.tokens.len();
                        on_finish(out)
                    }
                    Err(e) => {
                        if errors == 0 {
                            eprintln!("skein: remote engine: {e:#}");
                        }
                        errors += 1;
                        on_finish(GenOutput {
                            error: Some(format!("{e:#}")),
                            ..GenOutput::empty(req.id, Finish::Failed)
                        });
                    }
                }
            }
        });
        stats.failed = errors;
        stats
    }

    /// Whether the server gets adapters only (`publish = "adapter"`).
    pub fn publishes_adapters(&self) -> bool {
        self.cfg.publish == Publish::Adapter
    }

    /// Asks the server to load the weights in `dir`; returns the server's new version.
    pub fn reload(&self, dir: &Path) -> Result<u64> {
        let path = dir
            .canonicalize()
            .with_context(|| format!("publishing weights: {}", dir.display()))?;
        let resp = self.post(
            &self.cfg.reload_path,
            &json!({"path": path.display().to_string()}),
        )?;
        resp.get("version")
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("the reload answer has no `version`: {resp}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request the server refuses comes back failed with the server's own words, which
    /// its trajectory's reason then carries: a server on loopback answers 400 once.
    #[test]
    fn a_failed_request_carries_the_servers_error() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut request = [0u8; 4096];
            let _ = conn.read(&mut request).unwrap();
            let body = r#"{"error": "prompt token 99 is outside the vocabulary"}"#;
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(answer.as_bytes()).unwrap();
        });
        let cfg = RemoteEngineConfig {
            url,
            concurrency: 1,
            ..RemoteEngineConfig::default()
        };
        let request = GenRequest {
            id: 3,
            prompt: vec![1, 2],
            resumed: Vec::new(),
            params: crate::engine::SamplingParams::default(),
            budget: None,
            session: None,
            watch: None,
        };
        let mut outs = Vec::new();
        let stats = RemoteEngine::new(&cfg, 10, 64).generate(0, vec![request], |o| outs.push(o));
        server.join().unwrap();
        assert_eq!(stats.failed, 1);
        assert_eq!((outs[0].id, outs[0].finish), (3, Finish::Failed));
        let error = outs[0].error.as_deref().unwrap();
        assert!(
            error.contains("answered 400") && error.contains("token 99"),
            "{error}"
        );
    }

    /// A request asks for no more tokens than fit in the policy's context after its prompt,
    /// and a sample that reaches the context's end is cut by length, not paused.
    #[test]
    fn a_request_asks_for_what_fits_in_the_context() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut chunk = [0u8; 4096];
            // Headers, then the JSON body (its braces balanced once it is whole).
            while !String::from_utf8_lossy(&request).trim_end().ends_with('}') {
                let n = conn.read(&mut chunk).unwrap();
                request.extend_from_slice(&chunk[..n]);
            }
            let text = String::from_utf8_lossy(&request).into_owned();
            let body: Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
            let asked = body["max_tokens"].as_u64().unwrap() as usize;
            let answer = json!({"choices": [{"skein": {
                "completion_token_ids": vec![5; asked],
                "logprobs": vec![-0.5; asked],
            }}]})
            .to_string();
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
            conn.write_all(reply.as_bytes()).unwrap();
            asked
        });
        let cfg = RemoteEngineConfig {
            url,
            concurrency: 1,
            ..RemoteEngineConfig::default()
        };
        let request = GenRequest {
            id: 1,
            prompt: vec![1; 60],
            resumed: Vec::new(),
            params: crate::engine::SamplingParams {
                max_new_tokens: 32,
                ..Default::default()
            },
            // A partial rollout's budget past what fits.
            budget: Some(8),
            session: None,
            watch: None,
        };
        let mut outs = Vec::new();
        let stats = RemoteEngine::new(&cfg, 10, 64).generate(0, vec![request], |o| outs.push(o));
        assert_eq!(server.join().unwrap(), 4, "64 positions hold 4 after 60");
        assert_eq!(stats.failed, 0);
        assert_eq!((outs[0].tokens.len(), outs[0].finish), (4, Finish::Length));
    }

    fn exact(ids: &[u32], logprobs: &[f32]) -> Exact {
        Exact {
            completion_token_ids: ids.to_vec(),
            logprobs: logprobs.to_vec(),
        }
    }

    #[test]
    fn a_completion_that_cannot_be_training_data_is_refused_naming_why() {
        let ok = exact(&[3, 9], &[-0.5, -1e-7]);
        assert!(
            check_completion(&ok, 2, 10, &[9]).is_ok(),
            "a stop id ends it"
        );
        for (bad, why) in [
            (
                exact(&[3, 10], &[-0.5, -0.5]),
                "outside the policy's vocabulary",
            ),
            (exact(&[3], &[0.5]), "log-prob 0.5"),
            (exact(&[3], &[f32::NAN]), "log-prob NaN"),
            (exact(&[3], &[f32::NEG_INFINITY]), "log-prob -inf"),
            (exact(&[3, 4, 5], &[-1.0; 3]), "over the 2 asked for"),
            (exact(&[3, 4], &[-1.0]), "differ in length"),
            (exact(&[9, 4], &[-1.0; 2]), "past stop id 9 (token 1 of 2)"),
        ] {
            let e = check_completion(&bad, 2, 10, &[9]).unwrap_err().to_string();
            assert!(e.contains(why), "{why}: {e}");
        }
    }
}
