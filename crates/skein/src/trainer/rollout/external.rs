//! External agents (`agent.kind = "external"`): the trainer serves its own policy over the
//! OpenAI-compatible API (`skein serve`'s routes, in this process), hands out each step's tasks
//! at `GET /tasks/next`, and trains on what the agents' calls recorded — token-exact, through
//! each rollout's own base URL — once they post the rewards. The agents are any programs
//! (`agent.command`, started `agent.workers` times; or started by hand against the printed URL).
//!
//! During the rollout the engine loop runs on the trainer's thread (it owns the policy), so the
//! agents' concurrent calls are batched together; between rollouts their calls wait in the
//! queue for the next phase.

use super::prompts::PromptTask;
use super::stats::{ExternalStats, SourceStats, StepRollout};
use super::{EvalResult, StepContext, Workload, WorkloadState};
use crate::engine::{self, Control, EngineHandle, EngineQueue, Generator, SamplingParams};
use crate::model::Model;
use crate::serve::{self, RecordedRollout, RolloutStore, ServeConfig, ServeState, TaskSpec};
use crate::trainer::batch::TrainRow;
use crate::trainer::config::TrainConfig;
use anyhow::{bail, Context, Result};
use serde_json::json;
use skein_plan::{Status, Trajectory, Transition};

use skein_reward::lines::reaper::{self, Recorded};
use skein_text::Tokenizer;
use std::collections::HashMap;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How often a step's watcher looks whether the agent processes still live.
const WORKER_POLL: Duration = Duration::from_millis(200);
/// A command that exits with status 0 this soon after it started, leaving nothing in its
/// process group, is a launcher that started its agent elsewhere; one that ran longer was an
/// agent that served and quit.
const LAUNCHER_EXIT: Duration = Duration::from_secs(5);

/// The policy served to external agents, and the single-turn task whose problems they get.
pub struct External {
    task: PromptTask,
    groups: usize,
    samples: usize,
    handle: EngineHandle,
    queue: EngineQueue,
    store: Arc<RolloutStore>,
    /// The policy version the server's `/health` reports: the step's, stored as it starts.
    version: Arc<AtomicU64>,
    /// Serves while the trainer lives; dropping it stops the server.
    _server: serve::BackgroundServer,
    /// The agent processes started here (`agent.workers`), shared with each step's watcher;
    /// dropping them kills them.
    workers: Arc<Mutex<Vec<AgentProcess>>>,
    /// How to start one again: `agent.command`, the server's URL and `agent.api_key`.
    command: Vec<String>,
    url: String,
    api_key: String,
    timeout: Duration,
    capacity: i64,
}

impl External {
    /// Starts the server on `agent.listen` and the configured agent processes.
    pub fn start(
        cfg: &TrainConfig,
        task: PromptTask,
        tokenizer: &Tokenizer,
        policy: &Model,
    ) -> Result<Self> {
        let a = &cfg.agent;
        let (handle, queue) = engine::channel();
        let capacity = policy.net.max_positions();
        let text = serve::TextSide::new(tokenizer.clone(), policy.net.config.vocab_size)?
            .with_stop_ids(&cfg.rollout.sampling.stop_token_ids)?;
        let config = ServeConfig {
            api_key: (!a.api_key.is_empty()).then(|| a.api_key.clone()),
            model_name: "skein-policy".into(),
            default_max_tokens: cfg.rollout.sampling.max_new_tokens,
            capacity,
            rollout_temperature: Some(cfg.rollout.sampling.temperature),
            ..ServeConfig::default()
        };
        let version = Arc::new(AtomicU64::new(0));
        let store = Arc::new(RolloutStore::new());
        let state =
            ServeState::from_parts(handle.clone(), text, config, store.clone(), version.clone());
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
        Ok(External {
            task,
            groups: cfg.rollout.prompts_per_step,
            samples: cfg.rollout.samples_per_prompt,
            handle,
            queue,
            store,
            version,
            _server: server,
            workers: Arc::new(Mutex::new(workers)),
            command: a.command.clone(),
            url,
            api_key: a.api_key.clone(),
            timeout: Duration::from_secs_f64(a.rollout_timeout_s),
            capacity,
        })
    }

    /// Starts again every agent process that exited since the last step (an agent that quits
    /// when idle, one that crashed), saying so; the count is logged as
    /// `agent/restarted_workers`.
    fn restart_exited_workers(&mut self) -> Result<usize> {
        let mut workers = lock(&self.workers);
        let (mut restarted, live) = (0, LiveGroups::default());
        for (i, worker) in workers.iter_mut().enumerate() {
            if let Some(status) = worker.exited(&live) {
                eprintln!(
                    "skein: warning: agent {i} (`agent.command`) exited ({status}); starting \
                     it again"
                );
                *worker = start_worker(&self.command, &self.url, &self.api_key, i)?;
                restarted += 1;
            }
        }
        Ok(restarted)
    }
}

/// Why a step's engine phase ended.
enum Ended {
    AllClosed,
    TimedOut,
    /// Every agent process the trainer started had exited: the reason for the rollouts left.
    AgentsExited(String),
}

/// Waits until `n` rollouts are closed, `timeout` has passed, or every agent process in
/// `workers` has exited (none is left to close the rest; agents started by hand are not
/// watched).
fn watch(
    store: &RolloutStore,
    n: usize,
    timeout: Duration,
    workers: &Mutex<Vec<AgentProcess>>,
) -> Ended {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if store.wait_closed_blocking(n, left.min(WORKER_POLL)) >= n {
            return Ended::AllClosed;
        }
        let mut workers = lock(workers);
        let live = LiveGroups::default();
        let statuses: Vec<Option<ExitStatus>> =
            workers.iter_mut().map(|w| w.exited(&live)).collect();
        if !statuses.is_empty() && statuses.iter().all(Option::is_some) {
            let last = statuses.iter().flatten().last().map(ToString::to_string);
            return Ended::AgentsExited(format!(
                "every agent process (`agent.command`) exited before closing it, the last \
                 with {}; its output above says why",
                last.unwrap_or_default()
            ));
        }
        if Instant::now() >= deadline {
            return Ended::TimedOut;
        }
    }
}

fn lock(workers: &Mutex<Vec<AgentProcess>>) -> MutexGuard<'_, Vec<AgentProcess>> {
    workers.lock().unwrap_or_else(|e| e.into_inner())
}

impl Workload for External {
    /// Hands out `groups × samples` tasks, serves the agents' calls with the policy at the
    /// step's version until every rollout is closed (or timed out, failing it), and returns
    /// the recorded trajectories.
    fn rollout(&mut self, ctx: &StepContext) -> Result<StepRollout> {
        let Generator::Local(engine) = ctx.engine else {
            bail!("external agents need rollout.engine = \"local\" (they call this engine)");
        };
        let (step, version) = (ctx.step, ctx.version);
        self.version.store(version, Ordering::SeqCst);
        let mut specs = Vec::with_capacity(self.groups * self.samples);
        for p in 0..self.groups {
            let problem = self.task.next_problem()?;
            for k in 0..self.samples {
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
        let restarted = self.restart_exited_workers()?;
        if let Err(e) = self.store.add_tasks(specs) {
            bail!("handing out the tasks of step {step}: {e}");
        }
        // The watcher ends the engine phase once every rollout is closed, the time is up, or
        // no agent process is left to close the rest.
        let (store, handle) = (self.store.clone(), self.handle.clone());
        let (workers, timeout) = (self.workers.clone(), self.timeout);
        let watcher = std::thread::spawn(move || {
            let ended = watch(&store, n, timeout, &workers);
            let _ = handle.control(Control::EndPhase);
            ended
        });
        let (engine_stats, _) = self
            .queue
            .run_phase(engine, ctx.policy, version, self.capacity, n);
        let ended = watcher.join().unwrap_or(Ended::AllClosed);

        let mut recorded = self.store.take_closed();
        let mut stats = ExternalStats {
            agent_failures: recorded.iter().filter(|r| r.error.is_some()).count(),
            restarted_workers: restarted,
            ..ExternalStats::default()
        };
        // Rollouts still open fail now (their agents' later calls find them gone), for the
        // trainer's reason, not as the agents' report.
        let why = match &ended {
            Ended::AllClosed | Ended::TimedOut => format!(
                "not closed within {:.0}s (agent.rollout_timeout_s)",
                self.timeout.as_secs_f64()
            ),
            Ended::AgentsExited(why) => why.clone(),
        };
        let mut closed_here = std::collections::HashSet::new();
        for id in &ids {
            if self.store.close(id, 0.0, None, Some(why.clone())).is_ok() {
                closed_here.insert(id.clone());
            }
        }
        match ended {
            Ended::AgentsExited(_) => stats.orphaned = closed_here.len(),
            _ => stats.timeouts = closed_here.len(),
        }
        recorded.extend(self.store.take_closed());
        let order: HashMap<&str, usize> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), i))
            .collect();
        recorded.retain(|r| order.contains_key(r.rollout_id.as_str()));
        recorded.sort_by_key(|r| order[r.rollout_id.as_str()]);
        let (mut trajectories, mut correct) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for r in recorded {
            let by_trainer = closed_here.contains(&r.rollout_id);
            if !by_trainer && r.error.is_none() && r.calls.is_empty() {
                stats.uncalled += 1;
            }
            let (mut t, ok) = trajectory(r);
            if by_trainer {
                t.status = Status::Failed(why.clone());
            }
            stats.add(&t);
            trajectories.push(t);
            correct.push(ok);
        }
        Ok(StepRollout::new(
            trajectories,
            correct,
            engine_stats,
            version,
            SourceStats::External(stats),
        ))
    }

    /// The held-out prompts, answered by the trainer's own engine.
    fn evaluate(&self, ctx: &StepContext) -> EvalResult {
        self.task.evaluate(ctx)
    }

    fn demonstration(
        &mut self,
        tokenizer: &Tokenizer,
        sampling: &SamplingParams,
        _direct_share: f64,
    ) -> Result<TrainRow> {
        self.task.demonstration(tokenizer, sampling)
    }

    fn state(&self) -> WorkloadState {
        self.task.state(&Default::default())
    }

    fn data_metrics(&self, first: bool) -> Vec<(&'static str, serde_json::Value)> {
        self.task.data_metrics(first)
    }

    fn held_out(&self) -> bool {
        self.task.held_out
    }

    fn eval_problems(&self) -> usize {
        self.task.eval.problems.len()
    }
}

/// A recorded rollout as a trajectory: one transition per call, exactly as generated. Calls
/// whose prompts extend the previous call's prompt and completion merge into one row; an agent
/// whose later prompt renders the history afresh (a template that drops earlier reasoning, a
/// trimmed context, a sub-agent's own conversation) trains step-wise, a row per call.
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
            kept: Default::default(),
            reward: None,
            state: None,
        })
        .collect();
    let status = match (&r.error, transitions.is_empty()) {
        (Some(e), _) => Status::Failed(format!("the agent reported: {e}")),
        (None, true) => Status::Failed("the agent made no model call".into()),
        (None, false) => Status::Finished,
    };
    // A failed rollout is not correct, whatever its agent posted: one without a model call
    // was not answered by the policy.
    let finished = status == Status::Finished;
    let correct = r.correct.unwrap_or(r.reward > 0.0) && finished;
    (
        Trajectory {
            id: r.rollout_id,
            group: r.group,
            transitions,
            // A failed rollout keeps no reward: it trains nothing, and its trajectory shows
            // the trainer's verdict, not what the agent posted.
            reward: if finished { r.reward } else { 0.0 },
            status,
        },
        correct,
    )
}

/// An agent process the trainer started, in a process group of its own: a Ctrl-C at the
/// terminal reaches the trainer alone, which finishes its step with the agents still
/// answering (they would die with it, and the step would wait out `agent.rollout_timeout_s`
/// for rollouts no one closes). The group is recorded, so the agents never outlive the
/// trainer, and killed whole when it is done with them.
struct AgentProcess {
    child: Child,
    recorded: Option<Recorded>,
    /// Set once it has exited and been reaped.
    status: Option<ExitStatus>,
    /// It exited with status 0 and something of its process group ran on after it.
    group_outlived_it: bool,
    /// It exited with status 0 within [`LAUNCHER_EXIT`] of its start, leaving nothing
    /// running in its process group: a launcher that started its agent elsewhere (`setsid`,
    /// `docker run -d`). skein cannot see that agent, so it neither watches nor restarts it:
    /// starting the launcher again each step would leave copies running that nothing stops.
    detached: bool,
    started: Instant,
    /// When it exited, seen by [`exit_time`]'s thread: the first look at it may come much
    /// later (a step begins after the warm-up).
    exited_at: Arc<OnceLock<Instant>>,
}

impl AgentProcess {
    /// Its exit status once it has ended; `None` while it runs, and for a
    /// [`detached`](Self::detached) one. A launcher that exited with status 0 having started
    /// its agents in the background runs as long as anything of its process group does
    /// (`live` says: it stays unreaped until then, keeping its id the group's). Any other exit
    /// ends the agent: what it left in its group is killed, and the group forgotten before it
    /// is reaped, while its id cannot be reused yet.
    fn exited(&mut self, live: &LiveGroups) -> Option<ExitStatus> {
        if self.status.is_none() && !self.detached {
            let pid = libc::id_t::try_from(self.child.id()).ok()?;
            // SAFETY: waitid(2) with WNOWAIT only reads this child's state into `info`, which
            // it owns; the child stays a zombie, to be reaped below.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let peeked = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            // SAFETY: `info` was filled by waitid (zeroed when nothing has exited).
            if peeked != 0 || unsafe { info.si_pid() } == 0 {
                return None;
            }
            // SAFETY: as above; a child that exited has its status there.
            let clean = info.si_code == libc::CLD_EXITED && unsafe { info.si_status() } == 0;
            if clean && live.has(self.child.id()) {
                self.group_outlived_it = true;
                return None;
            }
            // Without its exit time (the waiting thread could not start), a launcher is the
            // safe guess: an agent taken for one is warned of, a launcher started again each
            // step would leave a copy running each time.
            let launcher = self
                .exited_at
                .get()
                .is_none_or(|t| t.duration_since(self.started) < LAUNCHER_EXIT);
            if clean && !self.group_outlived_it && launcher {
                eprintln!(
                    "skein: warning: an agent process (`agent.command`, pid {}) exited with \
                     status 0 as it started, leaving nothing running in its process group: if \
                     it started the agent elsewhere (setsid, docker run -d), skein neither \
                     watches nor stops it, nor starts it again when it exits. Run the agent in \
                     the foreground (`exec` it) so skein can watch it and start it again when \
                     it exits",
                    self.child.id()
                );
                self.detached = true;
                self.recorded.take();
                let _ = self.child.wait();
                return None;
            }
            self.kill_group();
            self.recorded.take();
            self.status = self.child.wait().ok();
        }
        self.status
    }

    fn kill_group(&self) {
        if let Ok(group) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) with a negative pid signals the group this child leads, which
            // is still ours (the child is not reaped yet); it touches no memory of ours.
            unsafe {
                libc::kill(-group, libc::SIGKILL);
            }
        }
    }
}

/// Starts one agent process: `command` with `{server}` and `{api_key}` replaced, and the same
/// values in `SKEIN_SERVER` / `SKEIN_API_KEY`.
fn start_worker(
    command: &[String],
    url: &str,
    api_key: &str,
    index: usize,
) -> Result<AgentProcess> {
    use std::os::unix::process::CommandExt;
    let Some((program, args)) = command.split_first() else {
        bail!("`agent.workers` > 0 needs `agent.command`, the agent program and its arguments");
    };
    let fill = |s: &String| s.replace("{server}", url).replace("{api_key}", api_key);
    let mut cmd = Command::new(fill(program));
    cmd.args(args.iter().map(fill))
        .env("SKEIN_SERVER", url)
        .env("SKEIN_API_KEY", api_key)
        .env("SKEIN_WORKER", index.to_string())
        .stdin(Stdio::null())
        .process_group(0);
    let child = reaper::spawn(cmd)
        .with_context(|| format!("starting the agent `{}` (agent.command)", command.join(" ")))?;
    let recorded = Some(Recorded::new(child.id()));
    let exited_at = exit_time(child.id());
    Ok(AgentProcess {
        child,
        recorded,
        status: None,
        group_outlived_it: false,
        detached: false,
        started: Instant::now(),
        exited_at,
    })
}

/// The moment child `pid` exits, set by a thread that waits for it without reaping it (the
/// trainer reaps it when it next looks); never set if that thread cannot start.
fn exit_time(pid: u32) -> Arc<OnceLock<Instant>> {
    let seen = Arc::new(OnceLock::new());
    let set = Arc::clone(&seen);
    let pid: libc::id_t = pid;
    let _ = std::thread::Builder::new()
        .name("skein-agent-exit".into())
        .spawn(move || loop {
            // SAFETY: waitid(2) with WNOWAIT blocks until this child exits and only reads its
            // state into `info`, which the thread owns; the child stays to be reaped.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let waited =
                unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
            let interrupted =
                std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
            if waited == 0 {
                let _ = set.set(Instant::now());
            }
            if waited == 0 || !interrupted {
                return;
            }
        });
    seen
}

/// The process groups that have a live process (not a zombie), read from /proc once, when
/// first asked: a step's watcher asks about every agent at one look.
#[derive(Default)]
struct LiveGroups(std::cell::OnceCell<std::collections::HashSet<u32>>);

impl LiveGroups {
    /// Whether a live process is in `group`. An exited launcher is a zombie and does not count;
    /// nor do finished agents no one has reaped yet (as when skein is a container's PID 1).
    fn has(&self, group: u32) -> bool {
        self.0.get_or_init(scan_live_groups).contains(&group)
    }
}

/// Every live process's group, from /proc/PID/stat: its state and group are the first and
/// third fields after the command's name (in parentheses, which may hold spaces and
/// parentheses itself).
fn scan_live_groups() -> std::collections::HashSet<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Default::default();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|stat| {
            let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
            let state = fields.next()?;
            let group = fields.nth(1)?.parse().ok()?;
            (!matches!(state, "Z" | "X")).then_some(group)
        })
        .collect()
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        // A reaped agent's id may be another process's by now; its group was killed then
        // (or, detached, left nothing in it).
        if self.status.is_some() || self.detached {
            return;
        }
        self.kill_group();
        // Forgotten before the reap frees the id for reuse.
        self.recorded.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::RecordedCall;
    use crate::trainer::batch::{build_step_batch, StepBatchConfig};

    fn call(prompt: &[u32], completion: &[u32], logprob: f32) -> RecordedCall {
        RecordedCall {
            prompt_ids: prompt.to_vec(),
            completion_ids: completion.to_vec(),
            logprobs: vec![logprob; completion.len()],
            versions: vec![4; completion.len()],
            finish: "stop".into(),
        }
    }

    /// A rollout the agent failed, or closed without a model call, fails: it keeps no reward
    /// and is not correct, trains no row, and is counted as failed by the batch.
    #[test]
    fn failed_and_empty_rollouts_fail_and_train_nothing() {
        let rollout = |id: &str, calls, error: Option<&str>| RecordedRollout {
            rollout_id: id.into(),
            group: "g".into(),
            calls,
            reward: 1.0,
            correct: Some(true),
            error: error.map(String::from),
        };
        let recorded = [
            rollout("ok", vec![call(&[1, 2], &[3, 4], -0.5)], None),
            rollout("bad", vec![call(&[1, 2], &[5], -0.1)], Some("tool crashed")),
            rollout("empty", vec![], None),
        ];
        let (trajectories, correct): (Vec<Trajectory>, Vec<bool>) =
            recorded.into_iter().map(trajectory).unzip();
        assert_eq!(correct, [true, false, false]);
        assert_eq!(trajectories[0].status, Status::Finished);
        assert_eq!(
            trajectories[1].status,
            Status::Failed("the agent reported: tool crashed".into())
        );
        let rewards: Vec<f64> = trajectories.iter().map(|t| t.reward).collect();
        assert_eq!(rewards, [1.0, 0.0, 0.0]);
        assert_eq!(
            trajectories[2].status,
            Status::Failed("the agent made no model call".into())
        );
        let cfg = TrainConfig::default();
        let batch =
            build_step_batch(&trajectories, &StepBatchConfig::from_config(&cfg, 8), 5).unwrap();
        assert_eq!(batch.failed_trajectories, 2);
        assert_eq!(batch.real_rows, 1);
        assert!(batch.origins.iter().all(|o| o.trajectory == 0));
    }

    /// An agent whose second call does not extend its first (the history was rendered without
    /// the first answer's reasoning, ids 7 8) trains step-wise: the rollout is not failed, each
    /// call is its own row with its own prompt and behavior log-probs, both rows in one
    /// mini-batch, and it is counted as step-wise; one whose second call extends the first
    /// merges and is counted as merged.
    #[test]
    fn a_later_call_that_does_not_extend_the_first_trains_as_stepwise_rows() {
        let rollout = |id: &str, group: &str, calls, reward| RecordedRollout {
            rollout_id: id.into(),
            group: group.into(),
            calls,
            reward,
            correct: None,
            error: None,
        };
        let stepwise = |id, reward| {
            let first = call(&[1, 2, 3], &[7, 8, 9, 2], -0.5);
            let second = call(&[1, 2, 3, 9, 2, 5, 6, 3], &[4, 2], -0.25);
            rollout(id, "g0", vec![first, second], reward)
        };
        let merged = |id, reward| {
            let first = call(&[1, 2, 3], &[7, 8, 9, 2], -0.5);
            let second = call(&[1, 2, 3, 7, 8, 9, 2, 5, 6, 3], &[4, 2], -0.25);
            rollout(id, "g1", vec![first, second], reward)
        };
        let recorded = [
            stepwise("a", 1.0),
            stepwise("b", 0.0),
            merged("c", 1.0),
            merged("d", 0.0),
        ];
        let mut stats = ExternalStats::default();
        let trajectories: Vec<Trajectory> = recorded
            .into_iter()
            .map(|r| {
                let (t, _) = trajectory(r);
                assert_eq!(t.status, Status::Finished);
                stats.add(&t);
                t
            })
            .collect();
        assert_eq!((stats.calls, stats.merged, stats.stepwise), (8, 2, 2));
        let m: HashMap<_, _> = stats.metrics(4).into_iter().collect();
        assert_eq!(m["agent/stepwise_trajectories"], 2.0);
        assert_eq!(m["agent/merged_trajectories"], 2.0);

        let mut cfg = TrainConfig::default();
        cfg.trainer.num_mini_batches = 2;
        let batch =
            build_step_batch(&trajectories, &StepBatchConfig::from_config(&cfg, 8), 5).unwrap();
        assert_eq!(batch.failed_trajectories, 0);
        // Two rows each for the step-wise rollouts, one for each merged one.
        assert_eq!(batch.real_rows, 6);
        for (i, o) in batch.origins.iter().enumerate() {
            let row = &batch.rows[i];
            let t = &trajectories[o.trajectory];
            match o.transition {
                Some(k) => {
                    assert!(o.trajectory < 2, "only the step-wise rollouts split");
                    let x = &t.transitions[k];
                    assert_eq!(row.tokens[..row.prompt_len], x.prompt[..]);
                    assert_eq!(row.tokens[row.prompt_len..], x.response[..]);
                    assert_eq!(row.behavior_logp, x.logprobs);
                }
                None => assert!(o.trajectory >= 2, "the append-only rollouts merge"),
            }
            let mini_batches: Vec<usize> = (0..batch.plan.len())
                .filter(|&mb| {
                    batch.plan[mb].iter().flatten().any(|&r| {
                        r < batch.real_rows && batch.origins[r].trajectory == o.trajectory
                    })
                })
                .collect();
            assert_eq!(mini_batches.len(), 1, "rollout {} is split", t.id);
        }
    }
}
