//! External agents (`agent.kind = "external"`): the trainer serves its own policy over the
//! OpenAI-compatible API (`skein serve`'s routes, in this process), hands out each step's tasks
//! at `GET /tasks/next`, and trains on what the agents' calls recorded — token-exact, through
//! each rollout's own base URL — once they post the rewards. The agents are any programs
//! (`agent.command`, started `agent.workers` times; or started by hand against the printed URL).
//!
//! During the rollout the engine loop runs on the trainer's thread (it owns the policy), so the
//! agents' concurrent calls are batched together; between rollouts their calls wait in the
//! queue for the next phase.

use super::config::TrainConfig;
use super::partial::{PartialStats, StepRollout};
use super::reward::RewardStats;
use crate::engine::{self, Control, Engine, EngineHandle, EngineQueue};
use crate::model::Model;
use crate::serve::{self, RecordedRollout, RolloutStore, ServeConfig, ServeState, TaskSpec};
use anyhow::{bail, Context, Result};
use serde_json::json;
use skein_plan::{Status, Trajectory, Transition};
use skein_tasks::{Task, TaskRng};
use skein_text::Tokenizer;
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// What one step's external rollouts did.
#[derive(Debug, Clone, Default)]
pub struct ExternalStats {
    pub calls: usize,
    /// Rollouts the agents reported as failed.
    pub agent_failures: usize,
    /// Rollouts not closed within `agent.rollout_timeout_s`.
    pub timeouts: usize,
}

impl ExternalStats {
    pub fn metrics(&self, rollouts: usize) -> [(&'static str, f64); 3] {
        [
            (
                "agent/calls_mean",
                self.calls as f64 / rollouts.max(1) as f64,
            ),
            ("agent/failed_rollouts", self.agent_failures as f64),
            ("agent/timed_out_rollouts", self.timeouts as f64),
        ]
    }
}

pub struct ExternalAgents {
    handle: EngineHandle,
    queue: EngineQueue,
    store: Arc<RolloutStore>,
    /// Serves while the trainer lives; dropping it stops the server.
    _server: serve::BackgroundServer,
    workers: Vec<Child>,
    timeout: Duration,
    capacity: i64,
}

impl ExternalAgents {
    /// Starts the server on `agent.listen` and the configured agent processes.
    pub fn start(cfg: &TrainConfig, tokenizer: &Tokenizer, policy: &Model) -> Result<Self> {
        let a = &cfg.agent;
        let (handle, queue) = engine::channel();
        let capacity = policy.net.max_positions();
        let text = serve::TextSide::new(tokenizer.clone(), policy.net.config.vocab_size)?;
        let config = ServeConfig {
            api_key: (!a.api_key.is_empty()).then(|| a.api_key.clone()),
            model_name: "skein-policy".into(),
            default_max_tokens: cfg.rollout.sampling.max_new_tokens,
            capacity,
            ..ServeConfig::default()
        };
        let state = ServeState::new(handle.clone(), text, config);
        let store = state.store();
        let server = serve::spawn(&a.listen, state, 2)
            .with_context(|| format!("serving the policy on `agent.listen` = {}", a.listen))?;
        let url = format!("http://{}", server.addr());
        eprintln!(
            "skein: external agents: tasks at {url}/tasks/next, the policy at {url}/v1 \
             (model `skein-policy`)"
        );
        let mut workers = Vec::new();
        for i in 0..a.workers {
            workers.push(start_worker(&a.command, &url, &a.api_key, i)?);
        }
        Ok(ExternalAgents {
            handle,
            queue,
            store,
            _server: server,
            workers,
            timeout: Duration::from_secs_f64(a.rollout_timeout_s),
            capacity,
        })
    }

    /// One step: hands out `groups × samples` tasks, serves the agents' calls with the policy
    /// at `version` until every rollout is closed (or timed out, failing it), and returns the
    /// recorded trajectories.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        engine: &Engine,
        policy: &Model,
        version: u64,
        task: &dyn Task,
        rng: &mut TaskRng,
        step: usize,
        groups: usize,
        samples: usize,
    ) -> Result<(StepRollout, ExternalStats)> {
        let mut specs = Vec::with_capacity(groups * samples);
        for p in 0..groups {
            let problem = task.sample(rng);
            for k in 0..samples {
                specs.push(TaskSpec {
                    rollout_id: format!("s{step}-p{p}-s{k}"),
                    group: format!("s{step}-p{p}"),
                    task: json!({
                        "prompt": problem.prompt,
                        "expression": problem.prompt.trim_end_matches(['=', '?']),
                        "ground_truth": problem.ground_truth,
                        "data_source": problem.data_source,
                    }),
                });
            }
        }
        let ids: Vec<String> = specs.iter().map(|s| s.rollout_id.clone()).collect();
        let n = ids.len();
        if let Err(e) = self.store.add_tasks(specs) {
            bail!("handing out the tasks of step {step}: {e}");
        }
        // The watcher ends the engine phase once every rollout is closed or the time is up.
        let (store, handle, timeout) = (self.store.clone(), self.handle.clone(), self.timeout);
        let watcher = std::thread::spawn(move || {
            store.wait_closed_blocking(n, timeout);
            let _ = handle.control(Control::EndPhase);
        });
        let (engine_stats, _) = self.queue.run_phase(engine, policy, version, self.capacity);
        let _ = watcher.join();

        let mut recorded = self.store.take_closed();
        let mut stats = ExternalStats {
            agent_failures: recorded.iter().filter(|r| r.error.is_some()).count(),
            ..ExternalStats::default()
        };
        // Rollouts still open fail now (their agents' later calls find them gone).
        let why = format!(
            "not closed within {:.0}s (agent.rollout_timeout_s)",
            self.timeout.as_secs_f64()
        );
        for id in &ids {
            if self.store.close(id, 0.0, None, Some(why.clone())).is_ok() {
                stats.timeouts += 1;
            }
        }
        recorded.extend(self.store.take_closed());
        let order: HashMap<&str, usize> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), i))
            .collect();
        recorded.retain(|r| order.contains_key(r.rollout_id.as_str()));
        recorded.sort_by_key(|r| order[r.rollout_id.as_str()]);
        let mut out = StepRollout {
            trajectories: Vec::with_capacity(n),
            correct: Vec::with_capacity(n),
            engine: engine_stats,
            stats: PartialStats {
                rounds: 1,
                generated_tokens: engine_stats.generated_tokens,
                ..PartialStats::default()
            },
            rewards: RewardStats::default(),
        };
        for r in recorded {
            let (t, correct) = trajectory(r);
            stats.calls += t.transitions.len();
            if !t.is_failed() {
                out.stats.trained_tokens +=
                    t.transitions.iter().map(|x| x.loss_tokens()).sum::<usize>();
            }
            out.stats.requests += t.transitions.len();
            out.trajectories.push(t);
            out.correct.push(correct);
        }
        Ok((out, stats))
    }
}

/// A recorded rollout as a trajectory: one transition per call, exactly as generated.
pub fn trajectory(r: RecordedRollout) -> (Trajectory, bool) {
    let transitions: Vec<Transition> = r
        .calls
        .into_iter()
        .map(|c| Transition {
            loss_mask: vec![1; c.completion_ids.len()],
            prompt: c.prompt_ids,
            response: c.completion_ids,
            logprobs: c.logprobs,
            versions: c.versions,
            reward: None,
        })
        .collect();
    let status = match (&r.error, transitions.is_empty()) {
        (Some(e), _) => Status::Failed(format!("the agent reported: {e}")),
        (None, true) => Status::Failed("the agent made no model call".into()),
        (None, false) => Status::Finished,
    };
    let correct = r.correct.unwrap_or(r.reward > 0.0) && r.error.is_none();
    (
        Trajectory {
            id: r.rollout_id,
            group: r.group,
            transitions,
            reward: if r.error.is_some() { 0.0 } else { r.reward },
            status,
        },
        correct,
    )
}

/// Starts one agent process: `command` with `{server}` and `{api_key}` replaced, and the same
/// values in `SKEIN_SERVER` / `SKEIN_API_KEY`.
fn start_worker(command: &[String], url: &str, api_key: &str, index: usize) -> Result<Child> {
    let Some((program, args)) = command.split_first() else {
        bail!("`agent.workers` > 0 needs `agent.command`, the agent program and its arguments");
    };
    let fill = |s: &String| s.replace("{server}", url).replace("{api_key}", api_key);
    Command::new(fill(program))
        .args(args.iter().map(fill))
        .env("SKEIN_SERVER", url)
        .env("SKEIN_API_KEY", api_key)
        .env("SKEIN_WORKER", index.to_string())
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting the agent `{}` (agent.command)", command.join(" ")))
}

impl Drop for ExternalAgents {
    fn drop(&mut self) {
        for w in &mut self.workers {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}
