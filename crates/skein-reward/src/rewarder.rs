//! `Rewarder`: the front door. Routes each request by its data source to weighted sources,
//! runs inline functions at once and queues the rest on their executors, and combines the
//! results. `submit` never blocks on scoring, so it can run in the rollout's finish callback;
//! `wait` collects the reward later.

use crate::config::{RewardConfig, ServiceConfig, SourceConfig};
use crate::{
    BatchScorer, Executor, ExecutorConfig, ExecutorMetrics, RemoteScorer, RewardError, RewardFn,
    RewardOutput, RewardRequest, Ticket, WorkerPool,
};
use skein_config::Validator;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Scorer counters reported even while zero, so the metric columns are stable.
const ALWAYS_REPORTED: [&str; 4] = [
    "worker_restarts",
    "timeouts",
    "remote_failures",
    "remote_retries",
];

enum Source {
    Inline(RewardFn),
    Queued(Executor),
}

/// A submitted request: its parts are answered or on their way.
pub struct Pending {
    parts: Vec<(String, f64, Ticket)>,
}

impl Pending {
    /// Whether every part is answered (`wait` will not block).
    pub fn is_ready(&mut self) -> bool {
        self.parts.iter_mut().all(|(_, _, t)| t.is_ready())
    }
}

pub struct Rewarder {
    sources: BTreeMap<String, Source>,
    routes: BTreeMap<String, Vec<(String, f64)>>,
    default_route: Vec<(String, f64)>,
    submitted: AtomicU64,
    /// Requests whose every part is in (rewarded or failed): whole requests, as `submitted`.
    answered: AtomicU64,
    failed: AtomicU64,
}

impl Rewarder {
    /// Validates `cfg` (keys under `reward`) and starts its sources. `scorers` supplies the
    /// `kind = "scorer"` sources by name (e.g. a reward model the program loaded).
    pub fn new(
        cfg: &RewardConfig,
        scorers: BTreeMap<String, Arc<dyn BatchScorer>>,
    ) -> Result<Rewarder, RewardError> {
        cfg.validate("reward")?;
        let mut v = Validator::new();
        for (name, s) in &cfg.sources {
            if matches!(s, SourceConfig::Service(ServiceConfig::Scorer {}))
                && !scorers.contains_key(name)
            {
                let given: Vec<&str> = scorers.keys().map(String::as_str).collect();
                v.problem(format!(
                    "invalid value for `reward.sources.{name}`: kind = \"scorer\" needs a scorer the program supplies under the name `{name}` (supplied: {})",
                    if given.is_empty() { "none".to_string() } else { given.join(", ") }
                ));
            }
        }
        v.finish()?;
        let mut sources = BTreeMap::new();
        for (name, s) in &cfg.sources {
            let key = format!("reward.sources.{name}");
            let source = match s {
                SourceConfig::Function(f) => Source::Inline(f.clone()),
                SourceConfig::Service(ServiceConfig::Worker(w)) => {
                    let pool: Arc<dyn BatchScorer> = Arc::new(WorkerPool::new(w, &key)?);
                    let exec = sized(&cfg.executor, w.processes, w.batch_size);
                    Source::Queued(Executor::new(pool, exec, &key, name)?)
                }
                SourceConfig::Service(ServiceConfig::Remote(r)) => {
                    let client: Arc<dyn BatchScorer> = Arc::new(RemoteScorer::new(r, &key)?);
                    let exec = sized(&cfg.executor, r.concurrency, r.batch_size);
                    Source::Queued(Executor::new(client, exec, &key, name)?)
                }
                SourceConfig::Service(ServiceConfig::Scorer {}) => match scorers.get(name) {
                    Some(scorer) => Source::Queued(Executor::new(
                        Arc::clone(scorer),
                        cfg.executor.clone(),
                        "reward.executor",
                        name,
                    )?),
                    None => continue, // Checked above.
                },
            };
            sources.insert(name.clone(), source);
        }
        Ok(Rewarder {
            sources,
            routes: cfg
                .routes
                .iter()
                .map(|(ds, r)| (ds.clone(), r.weighted()))
                .collect(),
            default_route: cfg.default_route.weighted(),
            submitted: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// Starts scoring `req`; never blocks on a source. Functions are evaluated here.
    pub fn submit(&self, req: RewardRequest) -> Pending {
        self.submitted.fetch_add(1, Ordering::Relaxed);
        let route = self
            .routes
            .get(&req.data_source)
            .unwrap_or(&self.default_route);
        if route.is_empty() {
            let known: Vec<&str> = self.routes.keys().map(String::as_str).collect();
            let e = RewardError::BadRequest(format!(
                "no reward route for data source `{}`: add `reward.routes.{}` or a `reward.default_route` (routes: {})",
                req.data_source,
                req.data_source,
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            ));
            return Pending {
                parts: vec![(String::new(), 0.0, Ticket::ready(Err(e)))],
            };
        }
        let mut parts = Vec::with_capacity(route.len());
        for (name, weight) in route {
            let ticket = match self.sources.get(name) {
                Some(Source::Inline(f)) => Ticket::ready(Ok(f.score(&req))),
                Some(Source::Queued(exec)) => exec.submit(req.clone()),
                None => Ticket::ready(Err(RewardError::BadRequest(format!(
                    "unknown reward source `{name}`"
                )))),
            };
            parts.push((name.clone(), *weight, ticket));
        }
        Pending { parts }
    }

    /// Blocks until every part of `pending` is in: the weighted sum of the parts' rewards, with
    /// each part's reward and metrics as `{source}/reward` and `{source}/{metric}`. Any failed
    /// part fails the request (counted in `reward/failed`).
    pub fn wait(&self, pending: Pending) -> Result<RewardOutput, RewardError> {
        let mut total = RewardOutput::new(0.0);
        let mut first_error = None;
        for (name, weight, ticket) in pending.parts {
            match ticket.wait() {
                Ok(out) => {
                    total.reward += weight * out.reward;
                    total.metrics.insert(format!("{name}/reward"), out.reward);
                    for (k, v) in out.metrics {
                        total.metrics.insert(format!("{name}/{k}"), v);
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.answered.fetch_add(1, Ordering::Relaxed);
        match first_error {
            Some(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
            None => Ok(total),
        }
    }

    /// `submit` then `wait`.
    pub fn score(&self, req: RewardRequest) -> Result<RewardOutput, RewardError> {
        let p = self.submit(req);
        self.wait(p)
    }

    /// Flat metrics: totals over all queued sources as `reward/...` (requests, completed and
    /// failed count whole requests; queue depths and busy times are summed over sources, so
    /// `reward/tokens_per_s` is per second of any one source's busy time, not of wall time
    /// where sources overlap), and each queued source's own as `reward/{source}/...`.
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let mut total = ExecutorMetrics::default();
        let mut out = BTreeMap::new();
        let mut counters: BTreeMap<String, f64> = ALWAYS_REPORTED
            .iter()
            .map(|k| (k.to_string(), 0.0))
            .collect();
        for (name, source) in &self.sources {
            if let Source::Queued(exec) = source {
                let m = exec.metrics();
                out.extend(m.to_map(&format!("reward/{name}")));
                total.merge(&m);
                for (k, v) in exec.scorer_counters() {
                    *counters.entry(k.to_string()).or_default() += v;
                }
            }
        }
        out.extend(total.to_map("reward"));
        for (k, v) in counters {
            out.insert(format!("reward/{k}"), v);
        }
        out.insert(
            "reward/requests".into(),
            self.submitted.load(Ordering::Relaxed) as f64,
        );
        out.insert(
            "reward/completed".into(),
            self.answered.load(Ordering::Relaxed) as f64,
        );
        out.insert(
            "reward/failed".into(),
            self.failed.load(Ordering::Relaxed) as f64,
        );
        out
    }
}

/// `base` with a source's own thread count and batch size.
fn sized(base: &ExecutorConfig, threads: usize, batch: usize) -> ExecutorConfig {
    ExecutorConfig {
        threads,
        max_batch_size: batch,
        ..base.clone()
    }
}
