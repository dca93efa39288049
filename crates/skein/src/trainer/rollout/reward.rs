//! The trainer's side of rewards: builds the `Rewarder` of `[reward]` (with the reward models
//! of `[reward_models]` and the task's own checker as `scorer` sources), turns a finished
//! response into a `RewardRequest`, and collects the rewards a round of generation submitted
//! once generation is over, measuring how much reward time generation hid.

use crate::reward_model::{RewardKind, RewardModel, RewardModelPool};
use crate::trainer::config::TrainConfig;
use anyhow::{Context, Result};
use serde_json::Value;
use skein_config::Validator;
use skein_plan::Status;
use skein_reward::{
    BatchScorer, Pending, RewardConfig, RewardError, RewardOutput, RewardRequest, Rewarder,
    ServiceConfig, SourceConfig,
};
use skein_tasks::{Problem, Task};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use tch::Device;

/// The `scorer` source name under which the task's own checker is always available.
pub const TASK_SCORER: &str = "task";

/// The task's program as a batch scorer: the built-in reward, combinable with other sources.
pub struct TaskScorer {
    task: Box<dyn Task>,
}

impl TaskScorer {
    pub fn new(task: Box<dyn Task>) -> Self {
        TaskScorer { task }
    }
}

impl BatchScorer for TaskScorer {
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        batch
            .iter()
            .map(|r| {
                let problem = Problem {
                    prompt: r.prompt.clone(),
                    ground_truth: r.ground_truth.clone(),
                    data_source: r.data_source.clone(),
                    meta: r.metadata.clone(),
                };
                let s = self.task.score(&problem, &r.response);
                Ok(RewardOutput::new(s.reward)
                    .with_metric("correct", f64::from(u8::from(s.correct)))
                    .with_metric("formatted", f64::from(u8::from(s.formatted))))
            })
            .collect()
    }

    fn cost(&self, _req: &RewardRequest) -> usize {
        1
    }
}

/// A reward model as a batch scorer, on a pool of handles (one per executor thread, same
/// weights). Similarity models compare the response with the ground truth; classifiers score
/// the prompt followed by the response.
pub struct ModelScorer {
    pool: RewardModelPool,
    source: String,
}

impl ModelScorer {
    pub fn load(dir: &Path, device: Device, threads: usize, source: &str) -> Result<Self> {
        let model = RewardModel::load(dir, device)
            .with_context(|| format!("loading `reward_models.{source}`"))?;
        Ok(ModelScorer {
            pool: RewardModelPool::new(model, threads.max(1))?,
            source: source.to_string(),
        })
    }

    fn item(&self, r: &RewardRequest) -> (String, String) {
        let other = match self.pool.kind() {
            RewardKind::Similarity => &r.ground_truth,
            RewardKind::Classifier => &r.prompt,
        };
        (r.response.clone(), other.clone())
    }
}

impl BatchScorer for ModelScorer {
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        let items: Vec<_> = batch.iter().map(|r| self.item(r)).collect();
        let fail = |e: anyhow::Error| RewardError::Scorer {
            source: format!("reward_models.{}", self.source),
            detail: format!("{e:#}"),
        };
        // libtorch's errors (out of memory, an id past the embedding) surface as panics in
        // tch's plain calls: caught here, they fail the batch as an error does, so its items
        // are then scored one by one and only the bad one fails.
        let score = |items: &[_]| without_panics(|| self.pool.score_batch(items));
        match score(&items) {
            Ok(scores) => scores
                .into_iter()
                .map(|s| model_reward(&self.source, s))
                .collect(),
            // One bad item must not fail its batch-mates: score them one by one.
            Err(_) if items.len() > 1 => items
                .iter()
                .map(|it| {
                    let scores = score(std::slice::from_ref(it));
                    scores
                        .map_err(fail)
                        .and_then(|s| model_reward(&self.source, s[0]))
                })
                .collect(),
            Err(e) => vec![Err(fail(e))],
        }
    }
}

/// `score()`, with a panic inside it an error saying what the panic said.
fn without_panics<T>(score: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(score)).unwrap_or_else(|panic| {
        let said = crate::panic_message::panic_message(&*panic);
        Err(anyhow::anyhow!("the reward model panicked: {said}"))
    })
}

/// A reward model's score as a reward. A non-finite score (weights or a dtype that overflow)
/// fails its request here, naming the model, rather than later as a reward out of range.
fn model_reward(source: &str, score: f64) -> Result<RewardOutput, RewardError> {
    if score.is_finite() {
        return Ok(RewardOutput::new(score));
    }
    Err(RewardError::Scorer {
        source: format!("reward_models.{source}"),
        detail: format!(
            "the model scored {score}, not a finite number; check its weights (a reward model \
             runs in float32, whatever `model.dtype` the policy has)"
        ),
    })
}

/// Problems with `[reward_models]`, with their keys: every entry must be a model directory and
/// be used by a `scorer` source of that name; every `scorer` source other than `task` needs one.
pub fn check_reward_models(
    reward: Option<&RewardConfig>,
    models: &BTreeMap<String, String>,
    v: &mut Validator,
) {
    let scorers: Vec<&str> = reward
        .map(|r| {
            r.sources
                .iter()
                .filter(|(_, s)| matches!(s, SourceConfig::Service(ServiceConfig::Scorer {})))
                .map(|(n, _)| n.as_str())
                .collect()
        })
        .unwrap_or_default();
    for name in &scorers {
        if *name != TASK_SCORER && !models.contains_key(*name) {
            v.problem(format!(
                "invalid value for `reward.sources.{name}`: kind = \"scorer\" needs \
                 `reward_models.{name} = \"<model directory>\"` (or the source name `{TASK_SCORER}` \
                 for the task's own checker)"
            ));
        }
    }
    for (name, dir) in models {
        let key = format!("reward_models.{name}");
        if name == TASK_SCORER {
            v.problem(format!(
                "invalid key `{key}`: `{TASK_SCORER}` is the task's own checker; pick another name"
            ));
        } else if !scorers.contains(&name.as_str()) {
            v.problem(format!(
                "invalid key `{key}`: no `reward.sources.{name}` with kind = \"scorer\" uses it"
            ));
        }
        let path = Path::new(dir);
        if !path.is_dir() {
            v.problem(format!(
                "invalid value for `{key}`: the directory `{dir}` does not exist"
            ));
        } else if !path.join("config.json").is_file() {
            v.problem(format!(
                "invalid value for `{key}`: `{dir}` has no config.json (a Hugging Face model \
                 directory is needed)"
            ));
        }
    }
}

/// Starts the sources of `reward`: the reward models of `models`, each with one handle per
/// executor thread, and (when `task` is given) the task's checker as source `task`.
pub fn build_rewarder(
    reward: &RewardConfig,
    models: &BTreeMap<String, String>,
    task: Option<Box<dyn Task>>,
    device: Device,
) -> Result<Rewarder> {
    let mut scorers: BTreeMap<String, Arc<dyn BatchScorer>> = BTreeMap::new();
    if let Some(task) = task {
        scorers.insert(TASK_SCORER.into(), Arc::new(TaskScorer::new(task)));
    }
    for (name, dir) in models {
        let model = ModelScorer::load(Path::new(dir), device, reward.executor.threads, name)?;
        scorers.insert(name.clone(), Arc::new(model));
    }
    Ok(Rewarder::new(reward, scorers)?)
}

/// The run's rewarder, or None when `[reward]` is absent (the task scores inline).
pub fn from_config(cfg: &TrainConfig, device: Device) -> Result<Option<Rewarder>> {
    let Some(reward) = &cfg.reward else {
        return Ok(None);
    };
    let task = skein_tasks::task_by_name(&cfg.task.name, cfg.task.difficulty)?;
    build_rewarder(reward, &cfg.reward_models, Some(task), device).map(Some)
}

/// The request for one finished response.
pub fn request(
    id: String,
    problem: &Problem,
    prompt_ids: &[u32],
    response_ids: &[u32],
    text: String,
) -> RewardRequest {
    RewardRequest {
        id,
        data_source: problem.data_source.clone(),
        prompt: problem.prompt.clone(),
        response: text,
        prompt_ids: prompt_ids.to_vec(),
        response_ids: response_ids.to_vec(),
        ground_truth: problem.ground_truth.clone(),
        metadata: problem.meta.clone(),
    }
}

/// Reward figures of one or more rounds.
#[derive(Debug, Clone, Default)]
pub struct RewardStats {
    /// Executor busy time that fell within generation, and all of it up to the last reward.
    pub overlapped_s: f64,
    pub busy_s: f64,
    /// Wall time spent waiting for rewards after generation ended.
    pub wait_s: f64,
    pub scored: usize,
    pub failed: usize,
    /// Sum and count of each `{source}/{metric}` the sources reported.
    pub parts: BTreeMap<String, (f64, usize)>,
}

impl RewardStats {
    pub fn add(&mut self, o: &RewardStats) {
        self.overlapped_s += o.overlapped_s;
        self.busy_s += o.busy_s;
        self.wait_s += o.wait_s;
        self.scored += o.scored;
        self.failed += o.failed;
        for (k, (s, n)) in &o.parts {
            let e = self.parts.entry(k.clone()).or_default();
            e.0 += s;
            e.1 += n;
        }
    }

    /// The fraction of reward time that ran while the policy was still generating (1 when no
    /// source spent any time: there was nothing to hide).
    pub fn hidden_fraction(&self) -> f64 {
        if self.busy_s > 1e-9 {
            (self.overlapped_s / self.busy_s).clamp(0.0, 1.0)
        } else {
            1.0
        }
    }

    /// The step's reward metrics: the rewarder's counters, the hidden fraction, the wait after
    /// generation, and the step mean of each source's reward and metrics (`score/...`).
    pub fn metrics(&self, rewarder: &Rewarder) -> Vec<(String, Value)> {
        let mut m: Vec<(String, Value)> = rewarder
            .metrics()
            .into_iter()
            .map(|(k, v)| (k, v.into()))
            .collect();
        for (k, v) in [
            ("reward/hidden_fraction", self.hidden_fraction()),
            ("reward/step_busy_s", self.busy_s),
            ("time/reward_wait_s", self.wait_s),
        ] {
            m.push((k.into(), v.into()));
        }
        // The calls of every draw round (dynamic sampling draws several a step), so that
        // failed over calls is a rate; the step's kept trajectories are fewer.
        m.push((
            "reward/step_calls".into(),
            (self.scored + self.failed).into(),
        ));
        m.push(("reward/step_failed".into(), self.failed.into()));
        for (k, (s, n)) in &self.parts {
            m.push((format!("score/{k}"), (s / (*n).max(1) as f64).into()));
        }
        m
    }
}

fn busy_s(rewarder: &Rewarder) -> f64 {
    rewarder
        .metrics()
        .get("reward/busy_s")
        .copied()
        .unwrap_or(0.0)
}

/// Rewards submitted during one round of generation, keyed by the caller's slot. Lives only
/// within the round: nothing of it is checkpointed.
pub struct RoundRewards<'a, K> {
    rewarder: Option<&'a Rewarder>,
    pending: Vec<(K, Pending)>,
    busy_at_start: f64,
}

impl<'a, K> RoundRewards<'a, K> {
    pub fn new(rewarder: Option<&'a Rewarder>) -> Self {
        RoundRewards {
            rewarder,
            pending: Vec::new(),
            busy_at_start: rewarder.map_or(0.0, busy_s),
        }
    }

    /// Whether rewards come from the sources (else the task's score is the reward).
    pub fn active(&self) -> bool {
        self.rewarder.is_some()
    }

    /// Queues the request; never blocks on a source.
    pub fn submit(&mut self, key: K, req: RewardRequest) {
        if let Some(r) = self.rewarder {
            self.pending.push((key, r.submit(req)));
        }
    }

    /// Call right after generation: waits for every reward and hands each to `apply`.
    pub fn finish(
        self,
        mut apply: impl FnMut(K, Result<RewardOutput, RewardError>),
    ) -> RewardStats {
        let mut stats = RewardStats::default();
        let Some(rewarder) = self.rewarder else {
            return stats;
        };
        let generation_end = busy_s(rewarder);
        let t = std::time::Instant::now();
        for (key, pending) in self.pending {
            let result = rewarder.wait(pending);
            match &result {
                Ok(out) => {
                    stats.scored += 1;
                    for (k, v) in &out.metrics {
                        let e = stats.parts.entry(k.clone()).or_default();
                        e.0 += v;
                        e.1 += 1;
                    }
                }
                Err(_) => stats.failed += 1,
            }
            apply(key, result);
        }
        stats.wait_s = t.elapsed().as_secs_f64();
        stats.overlapped_s = generation_end - self.busy_at_start;
        stats.busy_s = busy_s(rewarder) - self.busy_at_start;
        stats
    }
}

/// A failed reward fails its trajectory (excluded from training and counted), not the run.
pub fn failed_status(e: &RewardError) -> Status {
    Status::Failed(format!("reward ({}): {e}", e.kind()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use skein_tasks::{task_by_name, TaskRng};

    #[test]
    fn the_task_scorer_scores_like_the_task_from_the_request_alone() {
        let task = task_by_name("arithmetic", 1).unwrap();
        let problem = task.sample(&mut TaskRng::new(4));
        let scorer = TaskScorer::new(task_by_name("arithmetic", 1).unwrap());
        for (text, want) in [(problem.ground_truth.clone(), 1.0), ("x".to_string(), 0.0)] {
            let req = request("a".into(), &problem, &[1], &[2], text.clone());
            let out = scorer.score_batch(&[req]).remove(0).unwrap();
            assert_eq!(out.reward, task.score(&problem, &text).reward);
            assert_eq!((out.reward, out.metrics["correct"]), (want, want));
        }
    }

    #[test]
    fn a_non_finite_model_score_fails_its_request_naming_the_model() {
        assert_eq!(model_reward("rm", 0.25).unwrap().reward, 0.25);
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let e = model_reward("rm", bad).unwrap_err();
            assert_eq!(e.kind(), "scorer");
            assert!(e.to_string().contains("reward_models.rm"), "{e}");
        }
    }

    /// A panic in scoring (how tch reports libtorch's errors) becomes an error, so the
    /// batch falls back to scoring its items one by one as it does for an error.
    #[test]
    fn a_panic_while_scoring_is_an_error() {
        let e = without_panics(|| -> Result<()> { panic!("CUDA out of memory") }).unwrap_err();
        assert!(
            e.to_string().contains("panicked: CUDA out of memory"),
            "{e}"
        );
        assert_eq!(without_panics(|| Ok(3)).unwrap(), 3);
    }

    #[test]
    fn hidden_fraction_is_overlap_over_busy_time() {
        let mut s = RewardStats {
            overlapped_s: 0.9,
            busy_s: 1.0,
            ..Default::default()
        };
        assert!((s.hidden_fraction() - 0.9).abs() < 1e-12);
        s.add(&RewardStats {
            overlapped_s: 0.1,
            busy_s: 1.0,
            ..Default::default()
        });
        assert!((s.hidden_fraction() - 0.5).abs() < 1e-12);
        assert_eq!(RewardStats::default().hidden_fraction(), 1.0);
    }
}
