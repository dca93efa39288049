//! A remote reward service over HTTP: the worker's JSON, one request object (or an array for a
//! whole batch) per `POST`, with a per-call timeout and bounded retries with exponential
//! backoff. A service that stays down fails the affected requests with an error naming the URL.

use crate::{BatchScorer, RewardError, RewardOutput, RewardRequest, WireResponse};
use serde::{Deserialize, Serialize};
use skein_config::Validator;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The longest backoff between two attempts, however many retries are configured.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// A remote source as written in the config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemoteConfig {
    /// The scoring endpoint, e.g. `http://10.0.0.5:8700/score` (plain HTTP).
    pub url: String,
    /// One HTTP call's limit, connecting included, in milliseconds.
    pub timeout_ms: u64,
    /// Further attempts after a failed one (connection errors, timeouts, 5xx, 429).
    pub retries: u32,
    /// Wait before the first retry, doubled for each one after, in milliseconds.
    pub backoff_ms: u64,
    /// Send a batch as one JSON array (the service must accept arrays, as `serve` does).
    pub batch: bool,
    /// HTTP calls in flight at once (the executor's threads for this source).
    pub concurrency: usize,
    /// Requests in one batch at most.
    pub batch_size: usize,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            url: String::new(),
            timeout_ms: 30_000,
            retries: 2,
            backoff_ms: 200,
            batch: true,
            concurrency: 4,
            batch_size: 32,
        }
    }
}

impl RemoteConfig {
    pub fn validate(&self, key: &str, v: &mut Validator) {
        v.check(
            self.url.starts_with("http://") && self.url.len() > "http://".len(),
            &format!("{key}.url"),
            "must be a plain http:// URL of the scoring endpoint, e.g. http://127.0.0.1:8700/score",
            format!("{:?}", self.url),
        );
        v.at_least(&format!("{key}.timeout_ms"), self.timeout_ms, 1);
        v.at_least(&format!("{key}.concurrency"), self.concurrency, 1);
        v.at_least(&format!("{key}.batch_size"), self.batch_size, 1);
    }
}

/// The client side of a reward service.
pub struct RemoteScorer {
    cfg: RemoteConfig,
    agent: ureq::Agent,
    failures: AtomicU64,
    retried: AtomicU64,
}

/// Why one HTTP attempt failed, and whether trying again can help.
struct Attempt {
    detail: String,
    retry: bool,
}

impl RemoteScorer {
    pub fn new(cfg: &RemoteConfig, key: &str) -> Result<RemoteScorer, RewardError> {
        let mut v = Validator::new();
        cfg.validate(key, &mut v);
        v.finish()?;
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(timeout)
            .timeout(timeout)
            .build();
        Ok(RemoteScorer {
            cfg: cfg.clone(),
            agent,
            failures: AtomicU64::new(0),
            retried: AtomicU64::new(0),
        })
    }

    /// Requests that failed because the service could not be reached or kept failing.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Retries made, over all calls.
    pub fn retries(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }

    fn attempt(&self, body: &str) -> Result<String, Attempt> {
        let sent = self
            .agent
            .post(&self.cfg.url)
            .set("Content-Type", "application/json")
            .send_string(body);
        match sent {
            Ok(resp) => resp.into_string().map_err(|e| Attempt {
                detail: format!("reading the answer failed: {e}"),
                retry: true,
            }),
            Err(ureq::Error::Status(code, resp)) => {
                let text = resp.into_string().unwrap_or_default();
                Err(Attempt {
                    detail: format!("HTTP {code}: {}", crate::request::clip(text.trim(), 300)),
                    retry: code >= 500 || code == 429,
                })
            }
            Err(ureq::Error::Transport(t)) => Err(Attempt {
                detail: t.to_string(),
                retry: true,
            }),
        }
    }

    /// POSTs `body`, retrying what may pass on a second try; the answer body or the last error.
    fn post(&self, body: &str, requests: usize) -> Result<String, RewardError> {
        let mut backoff = Duration::from_millis(self.cfg.backoff_ms);
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.attempt(body) {
                Ok(text) => return Ok(text),
                Err(a) if a.retry && attempts <= self.cfg.retries => {
                    self.retried.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(a) => {
                    self.failures.fetch_add(requests as u64, Ordering::Relaxed);
                    return Err(RewardError::Remote {
                        url: self.cfg.url.clone(),
                        attempts,
                        detail: a.detail,
                    });
                }
            }
        }
    }

    fn protocol(&self, detail: String) -> RewardError {
        RewardError::Protocol {
            source: self.cfg.url.clone(),
            detail,
        }
    }

    fn score_one(&self, req: &RewardRequest) -> Result<RewardOutput, RewardError> {
        let body = serde_json::to_string(req).map_err(|e| self.protocol(e.to_string()))?;
        let text = self.post(&body, 1)?;
        WireResponse::parse(&text, &self.cfg.url)?.into_result(&req.id, &self.cfg.url)
    }

    fn score_array(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        let answers = serde_json::to_string(batch)
            .map_err(|e| self.protocol(e.to_string()))
            .and_then(|body| self.post(&body, batch.len()))
            .and_then(|text| {
                serde_json::from_str::<Vec<WireResponse>>(&text).map_err(|e| {
                    self.protocol(format!(
                        "the answer to a batch is not a JSON array of answers: {e}"
                    ))
                })
            });
        match answers {
            Ok(answers) if answers.len() == batch.len() => answers
                .into_iter()
                .zip(batch)
                .map(|(a, r)| a.into_result(&r.id, &self.cfg.url))
                .collect(),
            Ok(answers) => {
                let e = self.protocol(format!(
                    "{} answers for a batch of {}",
                    answers.len(),
                    batch.len()
                ));
                vec![Err(e); batch.len()]
            }
            Err(e) => vec![Err(e); batch.len()],
        }
    }
}

impl BatchScorer for RemoteScorer {
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        if self.cfg.batch && batch.len() > 1 {
            self.score_array(batch)
        } else {
            batch.iter().map(|r| self.score_one(r)).collect()
        }
    }

    fn counters(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("remote_failures", self.failures() as f64),
            ("remote_retries", self.retries() as f64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_limits_are_validated_with_their_keys() {
        let cfg = RemoteConfig {
            url: "https://rm.example/score".into(),
            timeout_ms: 0,
            concurrency: 0,
            ..Default::default()
        };
        let e = RemoteScorer::new(&cfg, "reward.sources.rm")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("`reward.sources.rm.url`: must be a plain http:// URL"),
            "{e}"
        );
        assert!(e.contains("`reward.sources.rm.timeout_ms`"), "{e}");
        assert!(e.contains("`reward.sources.rm.concurrency`"), "{e}");
    }
}
