//! Multi-turn rollouts: every episode is an async task that asks the engine for the model's
//! next message, hands the decoded message to its environment (on a blocking thread, under a
//! timeout), and appends the environment's reply as tokens. All episodes share one engine loop,
//! so their model calls are batched together whatever turn each one is at.
//!
//! What the model sees at each turn: without a chat template, the prompt of turn k+1 is the
//! prompt of turn k, then the tokens the model sampled, then the environment's reply rendered as
//! plain text (tokenized once, loss mask 0). With a chat template it is the template's rendering
//! of the whole conversation so far, tokenized — exactly what the model would be given at
//! inference. When that rendering extends the previous prompt and the sampled ids token for
//! token (an append-only template such as ChatML), the planner merges the episode into one row;
//! when it does not (a template that drops earlier reasoning, as Qwen3's does, or sampled ids
//! that are not the tokenization of their own text), the episode is step-wise: each turn is a
//! row of its own, with its own prompt. Either way a transition keeps the ids the engine sampled
//! with their log-probs; they are never retokenized.

use super::judge::text_ids;
use super::trajectory_info::TrajectoryInfo;
use crate::engine::{
    self, EngineHandle, EngineStats, Finish, GenOutput, GenRequest, Generator, RemoteEngine,
    SamplingParams,
};
use crate::model::Model;
use crate::panic_message::panic_message;
use anyhow::{bail, Context, Result};
use futures_util::FutureExt;
use skein_plan::{extends_token_for_token, Status, Trajectory, Transition};
use skein_tasks::{
    render_plain, AgentTask, Env, EnvError, EnvMessage, EnvRole, EnvStep, Problem, Turn,
};
use skein_text::{ChatTemplate, Message, SpecialTexts, SpelledSpecials, Tokenizer, UnknownChars};
use std::panic::AssertUnwindSafe;
use std::time::Duration;

/// The runtime the episodes run on. Dropped, it does not wait for its blocking threads: an
/// in-process environment stuck past `agent.env_timeout_s` still holds one (a thread cannot
/// be killed), and a plain runtime's drop would wait for it, hanging the run at its end.
pub struct EpisodeRuntime(Option<tokio::runtime::Runtime>);

impl EpisodeRuntime {
    pub fn new() -> Result<EpisodeRuntime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("skein-agents")
            .enable_all()
            .build()
            .context("starting the runtime of the agent episodes")?;
        Ok(EpisodeRuntime(Some(runtime)))
    }
}

impl std::ops::Deref for EpisodeRuntime {
    type Target = tokio::runtime::Runtime;

    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0
            .as_ref()
            .expect("the runtime is taken only when dropped")
    }
}

impl Drop for EpisodeRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Where an episode is cut off.
#[derive(Debug, Clone)]
pub struct AgentLimits {
    pub max_turns: usize,
    /// Most tokens of a whole episode: first prompt, messages and inserted replies.
    pub max_tokens: usize,
    /// Longest an environment may take to answer one message.
    pub env_timeout: Duration,
    /// Keep each episode's keys/values in its engine slot between turns (else every turn
    /// prefills the whole context again).
    pub reuse_prefix: bool,
}

/// How environment messages become the text inserted between turns.
pub enum TurnFormat {
    /// Plain text (`render_plain`), for models without a chat template (the built-in
    /// character-level model): the first prompt is the problem's text, and each reply is
    /// appended to the context.
    Plain,
    /// The model's chat template: the first prompt is the problem as a user message, and each
    /// later prompt the template's rendering of the whole conversation.
    Chat(Box<ChatTemplate>),
}

/// Everything an episode needs apart from the engine; shared by all episodes of a rollout.
pub struct AgentContext<'a> {
    pub task: &'a dyn AgentTask,
    pub tokenizer: &'a Tokenizer,
    pub format: &'a TurnFormat,
    pub params: &'a SamplingParams,
    pub limits: &'a AgentLimits,
}

/// Why an episode did not reach an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cutoff {
    /// `max_turns` messages without an outcome.
    Turns,
    /// The episode's token budget ran out.
    Tokens,
    /// The environment returned an error or panicked, or the task's code panicked.
    EnvError,
    /// The environment took longer than `env_timeout`.
    EnvTimeout,
    /// The process hosting the environment crashed, broke its protocol, or was restarted
    /// under the episode (an environment worker).
    EnvWorker,
    /// The engine failed the model call (a remote server's error, or the engine stopped).
    Engine,
    /// Text or template trouble (a message that does not decode, a reply that does not
    /// render).
    Other,
}

pub struct Episode {
    pub trajectory: Trajectory,
    pub correct: bool,
    /// What the model said and what the environment answered, turn by turn.
    pub transcript: Vec<Turn>,
    pub cutoff: Option<Cutoff>,
    /// Characters of the environment's prompt and replies outside the tokenizer's vocabulary
    /// (the model read each as its unknown token).
    pub unknown: UnknownChars,
    /// Special-token strings the environment's prompt and replies spelled (the model read
    /// each as that control token).
    pub spelled_specials: SpelledSpecials,
    /// Messages cut at `rollout.sampling.max_new_tokens` with room left in the episode, and
    /// handed to the environment as they were.
    pub cut_turns: usize,
}

impl Cutoff {
    /// What cut the episode off, for a reader of its trajectory.
    pub fn describe(self) -> &'static str {
        match self {
            Cutoff::Turns => "the turn limit (agent.max_turns)",
            Cutoff::Tokens => "the token limit (agent.max_tokens or the model's context)",
            Cutoff::EnvError => "an environment error",
            Cutoff::EnvTimeout => "an environment timeout (agent.env_timeout_s)",
            Cutoff::EnvWorker => "its environment worker's failure",
            Cutoff::Engine => "an engine failure",
            Cutoff::Other => "a text or template failure",
        }
    }
}

impl Episode {
    /// Messages answered by a tool.
    fn tool_calls(&self) -> usize {
        self.transcript
            .iter()
            .filter(|t| t.reply.iter().any(|m| m.role == EnvRole::Tool))
            .count()
    }

    /// Messages with a tool-call block that does not parse (the environment answered them
    /// with an error, or took them for an answer).
    fn tool_call_errors(&self) -> usize {
        self.transcript
            .iter()
            .filter(|t| skein_text::parse_tool_calls(&t.message).is_err())
            .count()
    }

    /// What the trajectory log shows of the episode beyond its tokens.
    pub fn info(&self, source: String) -> TrajectoryInfo {
        TrajectoryInfo {
            source,
            turns: TrajectoryInfo::of(&self.trajectory).turns,
            tool_calls: self.tool_calls(),
            cutoff: self.cutoff.map(|c| c.describe().to_string()),
        }
    }
}

/// What one batch of episodes did, for the step's metrics.
#[derive(Debug, Clone, Default)]
pub struct AgentStats {
    pub episodes: usize,
    pub turns: usize,
    /// Episodes solved, and their turns.
    pub solved: usize,
    pub solved_turns: usize,
    pub turn_limit: usize,
    /// Episodes stopped by a token limit, failed ones included (`agent/token_limit`).
    pub token_limit: usize,
    /// Of those, the ones that did not fail: trained on as cut off
    /// (`response/truncated_fraction`, over the episodes that did not fail).
    pub truncated: usize,
    pub env_errors: usize,
    pub env_timeouts: usize,
    pub env_worker_failures: usize,
    /// Episodes whose model call the engine failed (`rollout/engine_failed` with a remote
    /// engine).
    pub engine_failures: usize,
    pub other_failures: usize,
    /// Messages cut at `rollout.sampling.max_new_tokens` and handed on as they were.
    pub cut_turns: usize,
    /// Tokens inserted between turns (environment replies; never trained on): each later
    /// prompt's tokens past what it shares with the context before it.
    pub inserted_tokens: usize,
    /// Trained episodes (failed ones train no row) whose every prompt extends the context
    /// before it (one merged row; an episode of one turn counts here).
    pub merged: usize,
    /// Trained episodes with a prompt that does not (a template that re-renders earlier
    /// turns): one row per turn.
    pub stepwise: usize,
    /// Calls of tools (messages answered with a tool message).
    pub tool_calls: usize,
    /// Messages with a malformed tool call.
    pub tool_call_errors: usize,
    /// How much each of the task's own counters (`AgentTask::counters`) grew; None for a
    /// task without any (a built-in one), which logs no worker metrics.
    pub task_counters: Option<Vec<(&'static str, f64)>>,
    /// Characters the environments sent that the tokenizer lacks, over all episodes.
    pub unknown: UnknownChars,
    /// Special-token strings the environments sent, over all episodes.
    pub spelled_specials: SpelledSpecials,
}

impl AgentStats {
    fn of(episodes: &[Episode]) -> Self {
        let mut stats = AgentStats::default();
        for e in episodes {
            stats.add(e);
        }
        stats
    }

    fn add(&mut self, e: &Episode) {
        self.episodes += 1;
        self.turns += e.trajectory.transitions.len();
        if e.correct {
            self.solved += 1;
            self.solved_turns += e.trajectory.transitions.len();
        }
        self.tool_calls += e.tool_calls();
        self.tool_call_errors += e.tool_call_errors();
        self.cut_turns += e.cut_turns;
        self.unknown.add(&e.unknown);
        self.spelled_specials.add(&e.spelled_specials);
        let ts = &e.trajectory.transitions;
        for w in ts.windows(2) {
            let context = w[0].prompt.iter().chain(&w[0].response);
            let shared = context
                .zip(&w[1].prompt)
                .take_while(|(a, b)| a == b)
                .count();
            self.inserted_tokens += w[1].prompt.len() - shared;
        }
        // A failed episode trains no row, merged or not.
        if !e.trajectory.is_failed() {
            *self.rows_of(&e.trajectory) += 1;
        }
        match e.cutoff {
            Some(Cutoff::Turns) => self.turn_limit += 1,
            Some(Cutoff::Tokens) => {
                self.token_limit += 1;
                self.truncated += usize::from(!e.trajectory.is_failed());
            }
            Some(Cutoff::EnvError) => self.env_errors += 1,
            Some(Cutoff::EnvTimeout) => self.env_timeouts += 1,
            Some(Cutoff::EnvWorker) => self.env_worker_failures += 1,
            Some(Cutoff::Engine) => self.engine_failures += 1,
            Some(Cutoff::Other) => self.other_failures += 1,
            None => {}
        }
    }

    /// Takes out of the figures of trained episodes one that failed after it ended (a reward
    /// out of range, a row longer than the model's context), called before it is marked
    /// failed: `solved` says whether it was solved, `cut_by_tokens` whether a token limit
    /// stopped it. Its turns, tool calls and limits still count: it did play them.
    pub fn forget_trained(&mut self, t: &Trajectory, solved: bool, cut_by_tokens: bool) {
        if solved {
            self.solved = self.solved.saturating_sub(1);
            self.solved_turns = self.solved_turns.saturating_sub(t.transitions.len());
        }
        if cut_by_tokens {
            self.truncated = self.truncated.saturating_sub(1);
        }
        let rows = self.rows_of(t);
        *rows = rows.saturating_sub(1);
    }

    /// The count a trained episode falls in: merged into one row, or a row per turn.
    fn rows_of(&mut self, t: &Trajectory) -> &mut usize {
        match extends_token_for_token(t) {
            true => &mut self.merged,
            false => &mut self.stepwise,
        }
    }

    pub fn turns_mean(&self) -> f64 {
        self.turns as f64 / self.episodes.max(1) as f64
    }

    pub fn metrics(&self) -> Vec<(&'static str, f64)> {
        let per_episode = |n: usize| n as f64 / self.episodes.max(1) as f64;
        let mut m = vec![
            ("agent/turns_mean", self.turns_mean()),
            ("agent/tool_calls_mean", per_episode(self.tool_calls)),
            ("agent/turn_limit", self.turn_limit as f64),
            ("agent/token_limit", self.token_limit as f64),
            ("agent/env_errors", self.env_errors as f64),
            ("agent/env_timeouts", self.env_timeouts as f64),
            ("agent/tool_calls", self.tool_calls as f64),
            ("agent/tool_call_errors", self.tool_call_errors as f64),
            ("agent/cut_turns", self.cut_turns as f64),
            ("agent/inserted_tokens", self.inserted_tokens as f64),
            ("agent/merged_trajectories", self.merged as f64),
            ("agent/stepwise_trajectories", self.stepwise as f64),
            ("agent/unknown_chars", self.unknown.count as f64),
            (
                "agent/special_token_texts",
                self.spelled_specials.count as f64,
            ),
        ];
        if self.solved > 0 {
            let turns = self.solved_turns as f64 / self.solved as f64;
            m.push(("agent/solved_turns_mean", turns));
        }
        if let Some(counters) = &self.task_counters {
            m.push(("agent/env_worker_failures", self.env_worker_failures as f64));
            m.extend(counters.iter().cloned());
        }
        m
    }
}

pub struct EpisodeBatch {
    pub episodes: Vec<Episode>,
    pub engine: EngineStats,
    pub stats: AgentStats,
}

/// One episode to run: its ids and problem.
pub struct EpisodeSpec {
    pub id: String,
    pub group: String,
    pub problem: Problem,
}

impl AgentContext<'_> {
    /// The first prompt's token ids, from its text: plain text after the tokenizer's start
    /// tokens (a BOS), or the chat template's rendering, which writes its own.
    pub fn prompt_ids(&self, prompt: &str) -> Result<Vec<u32>> {
        match self.format {
            TurnFormat::Plain => self.tokenizer.encode_plain_prompt(prompt),
            TurnFormat::Chat(t) => {
                let text = t.render(&[Message::user(prompt)], None, true)?;
                self.tokenizer.encode(&text, false)
            }
        }
    }

    /// Runs every episode to its end with the policy at `version`, the episodes on `runtime`:
    /// with the embedded engine its loop runs on this thread (which owns the model); a remote
    /// engine is called from the episodes directly. `on_episode_end` is called as each ends.
    pub fn run(
        &self,
        generator: &Generator,
        policy: &Model,
        version: u64,
        runtime: &tokio::runtime::Runtime,
        specs: Vec<EpisodeSpec>,
        on_episode_end: &(dyn Fn() + Sync),
    ) -> EpisodeBatch {
        let (episodes, mut engine_stats) = match generator {
            Generator::Local(engine) => {
                let (handle, mut queue) = engine::channel();
                let capacity = self.limits.max_tokens as i64;
                // A slot per episode at most: each keeps its context there between turns.
                let episodes = specs.len();
                std::thread::scope(|s| {
                    let episodes_run = s.spawn(move || {
                        self.play_all(Caller::Local(handle), runtime, specs, on_episode_end)
                    });
                    let (stats, _) = queue.run_phase(engine, policy, version, capacity, episodes);
                    // Each episode catches its own panics; one that escapes them is skein's
                    // own fault, and losing the step's episodes to it silently would hide it.
                    let episodes = episodes_run
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    (episodes, stats)
                })
            }
            Generator::Remote(remote) => {
                let caller = Caller::Remote(remote.clone(), version);
                let episodes = self.play_all(caller, runtime, specs, on_episode_end);
                let generated = episodes
                    .iter()
                    .flat_map(|e| &e.trajectory.transitions)
                    .map(|t| t.response.len())
                    .sum();
                let stats = EngineStats {
                    generated_tokens: generated,
                    ..EngineStats::default()
                };
                (episodes, stats)
            }
        };
        let stats = AgentStats::of(&episodes);
        if matches!(generator, Generator::Remote(_)) {
            // A remote call fails its episode only, with the server's error as its reason;
            // counted as the single-turn rollout counts its failed requests.
            engine_stats.failed = stats.engine_failures;
            if let Some(why) =
                episodes
                    .iter()
                    .find_map(|e| match (&e.cutoff, &e.trajectory.status) {
                        (Some(Cutoff::Engine), Status::Failed(why)) => Some(why),
                        _ => None,
                    })
            {
                eprintln!(
                    "skein: the remote engine failed {} episode(s) this step, e.g.: {why}",
                    stats.engine_failures
                );
            }
        }
        EpisodeBatch {
            stats,
            episodes,
            engine: engine_stats,
        }
    }

    /// Plays every episode on `runtime`, their model calls going to `caller`; returns when all
    /// have ended (and drops the caller, which ends an embedded engine's phase).
    fn play_all(
        &self,
        caller: Caller,
        runtime: &tokio::runtime::Runtime,
        specs: Vec<EpisodeSpec>,
        on_episode_end: &(dyn Fn() + Sync),
    ) -> Vec<Episode> {
        // Each episode is a session of the engine: its slot keeps the context between turns.
        let specials = SpecialTexts::of(self.tokenizer);
        let specials = &specials;
        let runs = specs.into_iter().enumerate().map(|(i, spec)| {
            let c = caller.clone();
            async move {
                let episode = self.episode(c, spec, i as u64, specials).await;
                on_episode_end();
                episode
            }
        });
        runtime.block_on(futures_util::future::join_all(runs))
    }

    /// One episode; `specials` are the tokenizer's special tokens, found once for all.
    async fn episode(
        &self,
        handle: Caller,
        spec: EpisodeSpec,
        session: u64,
        specials: &SpecialTexts,
    ) -> Episode {
        let mut run = EpisodeRun {
            transitions: Vec::new(),
            transcript: Vec::new(),
            unknown: UnknownChars::default(),
            specials,
            spelled: SpelledSpecials::default(),
            cut_turns: 0,
        };
        // The task's own code runs in here (`AgentTask::start`, `Env::state_key`), not all of
        // it on a guarded blocking thread: a panic in it fails this episode alone.
        let outcome = AssertUnwindSafe(self.play(&handle, &spec.problem, session, &mut run))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| {
                Err((
                    Cutoff::EnvError,
                    format!("the task's code panicked: {}", panic_message(&*panic)),
                ))
            });
        let (reward, correct, status, cutoff) = match outcome {
            Ok(Outcome::Done(score)) => (score.reward, score.correct, Status::Finished, None),
            Ok(Outcome::Cut(c)) => (0.0, false, Status::Truncated, Some(c)),
            Err((c, reason)) => (0.0, false, Status::Failed(reason), Some(c)),
        };
        Episode {
            trajectory: Trajectory {
                id: spec.id,
                group: spec.group,
                transitions: run.transitions,
                reward,
                status,
            },
            correct,
            transcript: run.transcript,
            cutoff,
            unknown: run.unknown,
            spelled_specials: run.spelled,
            cut_turns: run.cut_turns,
        }
    }

    /// Plays turns until the environment reports an outcome or a limit cuts the episode off.
    async fn play(
        &self,
        handle: &Caller,
        problem: &Problem,
        session: u64,
        run: &mut EpisodeRun<'_>,
    ) -> std::result::Result<Outcome, (Cutoff, String)> {
        let other = |e: anyhow::Error| (Cutoff::Other, format!("{e:#}"));
        let (mut env, prompt) = self.open_env(problem).await?;
        self.check_first_prompt(&prompt, run)?;
        let mut context = self.prompt_ids(&prompt).map_err(other)?;
        let mut messages = vec![Message::user(&prompt)];
        for _ in 0..self.limits.max_turns {
            let room = self.limits.max_tokens.saturating_sub(context.len());
            if room == 0 && run.transitions.is_empty() {
                // Nothing was sampled: there is no trajectory to train on, so the episode
                // fails (counted, with the reason) instead of ending empty.
                return Err((
                    Cutoff::Tokens,
                    format!(
                        "the first prompt is {} tokens, and an episode holds at most {} \
                         (agent.max_tokens or the model's context): no room to answer",
                        context.len(),
                        self.limits.max_tokens
                    ),
                ));
            }
            if room == 0 {
                return Ok(Outcome::Cut(Cutoff::Tokens));
            }
            let state = env.state_key();
            let (tokens, finish) = self
                .sample_turn(handle, &context, room, session, state, run)
                .await?;
            context.extend_from_slice(&tokens);
            if finish != Finish::Stop && context.len() >= self.limits.max_tokens {
                return Ok(Outcome::Cut(Cutoff::Tokens));
            }
            // Cut at the turn's token limit, not the episode's: the environment reads the
            // message as it is, counted so a run whose turns are too short says so.
            run.cut_turns += usize::from(finish == Finish::Length);
            let ids = text_ids(self.tokenizer, &tokens);
            let text = self.tokenizer.decode_message(ids).map_err(other)?;
            let (back, step) = self.step_env(env, text.clone()).await?;
            env = back;
            match step {
                EnvStep::Done(score) => {
                    run.transcript.push(Turn {
                        message: text,
                        reply: Vec::new(),
                    });
                    return Ok(Outcome::Done(score));
                }
                EnvStep::Continue {
                    messages: reply,
                    reward,
                } => {
                    if let Some(t) = run.transitions.last_mut() {
                        t.reward = reward;
                    }
                    let replied = render_plain(&reply);
                    run.unknown
                        .add(&self.tokenizer.unknown_chars(&replied).map_err(other)?);
                    run.spelled.add(&run.specials.find(&replied));
                    context = self
                        .next_prompt(&mut messages, context, &text, &reply)
                        .map_err(other)?;
                    run.transcript.push(Turn {
                        message: text,
                        reply,
                    });
                }
            }
        }
        Ok(Outcome::Cut(Cutoff::Turns))
    }

    /// Opens the episode's environment: it and its first prompt (the problem's own when the
    /// environment has none). An empty first prompt is an environment fault: the model would
    /// answer nothing at all.
    async fn open_env(
        &self,
        problem: &Problem,
    ) -> std::result::Result<(Box<dyn Env>, String), (Cutoff, String)> {
        let mut env = self.task.start(problem);
        let own_time = env.keeps_own_time();
        let (env, opened) = self
            .blocking_env_call(own_time, move || {
                let prompt = env.open()?;
                Ok((env, prompt))
            })
            .await?;
        let prompt = opened.unwrap_or_else(|| problem.prompt.clone());
        if prompt.trim().is_empty() {
            return Err((
                Cutoff::EnvError,
                format!(
                    "the environment opened the episode with an empty first prompt ({prompt:?})"
                ),
            ));
        }
        Ok((env, prompt))
    }

    /// Counts the first prompt's characters that the tokenizer lacks; a prompt of nothing else
    /// is an environment fault, as an empty one is: the model would read only unknown tokens.
    fn check_first_prompt(
        &self,
        prompt: &str,
        run: &mut EpisodeRun<'_>,
    ) -> std::result::Result<(), (Cutoff, String)> {
        let unknown = self
            .tokenizer
            .unknown_chars(prompt)
            .map_err(|e| (Cutoff::Other, format!("{e:#}")))?;
        run.unknown.add(&unknown);
        run.spelled.add(&run.specials.find(prompt));
        if unknown.is_total() {
            return Err((
                Cutoff::EnvError,
                format!(
                    "the environment opened the episode with a first prompt of which no \
                     character is in the tokenizer's vocabulary ({}): the model would read only \
                     unknown tokens",
                    unknown.examples_text()
                ),
            ));
        }
        Ok(())
    }

    /// Samples one turn from `context` (at most `room` new tokens) and records it in `run` as
    /// a transition taken in environment state `state`. Returns its tokens and how it ended.
    async fn sample_turn(
        &self,
        handle: &Caller,
        context: &[u32],
        room: usize,
        session: u64,
        state: Option<String>,
        run: &mut EpisodeRun<'_>,
    ) -> std::result::Result<(Vec<u32>, Finish), (Cutoff, String)> {
        let req = GenRequest {
            id: 0,
            prompt: context.to_vec(),
            resumed: Vec::new(),
            params: SamplingParams {
                max_new_tokens: self.params.max_new_tokens.min(room),
                ..self.params.clone()
            },
            budget: None,
            session: self.limits.reuse_prefix.then_some(session),
            watch: None,
        };
        let out = handle
            .generate(req)
            .await
            .map_err(|e| (Cutoff::Engine, e))?;
        if out.finish == Finish::ContextTooLong {
            return Err((
                Cutoff::Tokens,
                format!(
                    "a context of {} tokens is longer than the engine's cache \
                     (model.max_positions)",
                    context.len()
                ),
            ));
        }
        let n = out.tokens.len();
        run.transitions.push(Transition {
            prompt: context.to_vec(),
            response: out.tokens.clone(),
            loss_mask: vec![1; n],
            logprobs: out.logprobs,
            versions: out.versions,
            kept: out.kept,
            reward: None,
            state,
        });
        Ok((out.tokens, out.finish))
    }

    /// Steps the environment on a blocking thread, so a slow or stuck one holds up only its
    /// own episode; it gets the environment back to continue with.
    async fn step_env(
        &self,
        mut env: Box<dyn Env>,
        message: String,
    ) -> std::result::Result<(Box<dyn Env>, EnvStep), (Cutoff, String)> {
        let own_time = env.keeps_own_time();
        self.blocking_env_call(own_time, move || {
            let step = env.step(&message)?;
            Ok((env, step))
        })
        .await
    }

    /// Runs `call` (an environment's work, which may block) on a blocking thread under
    /// `env_timeout`, unless the environment keeps its own time (`own_time`); its failure,
    /// panic or lateness is the episode's cut-off.
    async fn blocking_env_call<T: Send + 'static>(
        &self,
        own_time: bool,
        call: impl FnOnce() -> std::result::Result<T, EnvError> + Send + 'static,
    ) -> std::result::Result<T, (Cutoff, String)> {
        let timeout = self.limits.env_timeout;
        let call = tokio::task::spawn_blocking(call);
        let answered = if own_time {
            Ok(call.await)
        } else {
            tokio::time::timeout(timeout, call).await
        };
        match answered {
            Err(_) => Err((
                Cutoff::EnvTimeout,
                format!(
                    "the environment took longer than {:.1}s (agent.env_timeout_s)",
                    timeout.as_secs_f64()
                ),
            )),
            Ok(Err(join)) => Err((
                Cutoff::EnvError,
                match join.try_into_panic() {
                    Ok(panic) => format!("the environment panicked: {}", panic_message(&*panic)),
                    Err(_) => "the environment's thread was cancelled".into(),
                },
            )),
            Ok(Ok(Err(e))) if e.timed_out => Err((Cutoff::EnvTimeout, e.message)),
            Ok(Ok(Err(e))) if e.worker_failed => Err((Cutoff::EnvWorker, e.message)),
            Ok(Ok(Err(e))) => Err((Cutoff::EnvError, format!("environment error: {e}"))),
            Ok(Ok(Ok(v))) => Ok(v),
        }
    }

    /// The prompt of the turn after the model's `message` and the environment's `reply`.
    /// Plain: `context` (the last prompt and the sampled ids), then the reply rendered on its
    /// own. Chat: the template's rendering of the whole conversation (`messages`, which grows
    /// by the message and the reply) with the assistant opener, tokenized. It starts with
    /// `context` when the template is append-only and the sampled ids are the tokenization of
    /// their text, and otherwise is a step-wise turn (see the module's comment).
    pub(crate) fn next_prompt(
        &self,
        messages: &mut Vec<Message>,
        context: Vec<u32>,
        message: &str,
        reply: &[EnvMessage],
    ) -> Result<Vec<u32>> {
        match self.format {
            TurnFormat::Plain => {
                let mut next = context;
                next.extend(self.tokenizer.encode(&render_plain(reply), false)?);
                Ok(next)
            }
            TurnFormat::Chat(template) => {
                push_turn(messages, message, reply);
                let text = template.render(messages, None, true)?;
                self.tokenizer.encode(&text, false)
            }
        }
    }

    /// The text inserted after the model's `message`, for a demonstration row built as one
    /// sequence: the reply rendered on its own (plain), or the chat template's delta, from the
    /// end of the model's turn (its stop token) to the opening of the next assistant turn.
    pub(crate) fn inserted_text(
        &self,
        messages: &mut Vec<Message>,
        message: &str,
        reply: &[EnvMessage],
    ) -> Result<String> {
        let template = match self.format {
            TurnFormat::Plain => return Ok(render_plain(reply)),
            TurnFormat::Chat(t) => t,
        };
        messages.push(Message::assistant(message));
        let before = template.render(messages, None, false)?;
        messages.extend(reply.iter().map(reply_message));
        let after = template.render(messages, None, true)?;
        chat_delta(&before, &after, template.eos_token())
    }
}

/// Appends the model's message and the environment's reply to a conversation.
fn push_turn(messages: &mut Vec<Message>, message: &str, reply: &[EnvMessage]) {
    messages.push(Message::assistant(message));
    messages.extend(reply.iter().map(reply_message));
}

fn reply_message(m: &EnvMessage) -> Message {
    match m.role {
        EnvRole::User => Message::user(&m.content),
        EnvRole::Tool => Message::tool(&m.content, None),
    }
}

/// The text after the end of the model's turn in `before` (its stop token, `eos`) through the
/// end of `after`. Fails when `after` does not extend `before` (a template that rewrites earlier
/// turns cannot be continued token for token, so a demonstration cannot be one sequence).
pub fn chat_delta(before: &str, after: &str, eos: &str) -> Result<String> {
    let Some(new) = after.strip_prefix(before) else {
        bail!(
            "the chat template renders earlier turns differently once a reply follows (it drops \
             earlier reasoning or tool output), so a demonstration episode cannot be one \
             sequence for the supervised warm-up: set sft.steps = 0"
        );
    };
    let turn_end = if eos.is_empty() {
        None
    } else {
        before.rfind(eos)
    };
    let tail = turn_end
        .map(|i| &before[i + eos.len()..])
        .context("the chat template does not end the assistant turn with its eos token")?;
    Ok(format!("{tail}{new}"))
}

/// Where an episode's model calls go.
#[derive(Clone)]
enum Caller {
    Local(EngineHandle),
    /// A remote engine, and the trainer's version its weights are.
    Remote(RemoteEngine, u64),
    /// Answers from a script instead of a model.
    #[cfg(test)]
    Scripted(std::sync::Arc<dyn Fn(&GenRequest) -> GenOutput + Send + Sync>),
}

impl Caller {
    async fn generate(&self, req: GenRequest) -> std::result::Result<GenOutput, String> {
        match self {
            Caller::Local(h) => h.generate(req).await.map_err(|e| e.to_string()),
            Caller::Remote(r, version) => {
                let (r, v) = (r.clone(), *version);
                tokio::task::spawn_blocking(move || r.generate_one(&req, v))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("remote engine: {e:#}"))
            }
            #[cfg(test)]
            Caller::Scripted(answer) => Ok(answer(&req)),
        }
    }
}

struct EpisodeRun<'s> {
    transitions: Vec<Transition>,
    transcript: Vec<Turn>,
    unknown: UnknownChars,
    /// The tokenizer's special tokens, and where the environment's text spelled them.
    specials: &'s SpecialTexts,
    spelled: SpelledSpecials,
    cut_turns: usize,
}

enum Outcome {
    Done(skein_tasks::Score),
    Cut(Cutoff),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Engine;
    use crate::model::ModelConfig;
    use skein_tasks::{agent_task_by_name, Score, TaskRng};
    use tch::Device;

    /// A failed episode trains no row: it counts as neither merged nor step-wise (with no
    /// turn, it would otherwise pass for merged), while its failure is counted.
    #[test]
    fn a_failed_episode_is_neither_merged_nor_stepwise() {
        let failed = Episode {
            trajectory: Trajectory {
                id: "e0".into(),
                group: "g0".into(),
                transitions: Vec::new(),
                reward: 0.0,
                status: Status::Failed("the environment failed to open".into()),
            },
            correct: false,
            transcript: Vec::new(),
            cutoff: Some(Cutoff::EnvError),
            unknown: UnknownChars::default(),
            spelled_specials: SpelledSpecials::default(),
            cut_turns: 0,
        };
        let stats = AgentStats::of(&[failed]);
        assert_eq!((stats.merged, stats.stepwise), (0, 0));
        assert_eq!(stats.env_errors, 1);
        let mut external = super::super::stats::ExternalStats::default();
        external.add(&Trajectory {
            id: "r0".into(),
            group: "g0".into(),
            transitions: Vec::new(),
            reward: 0.0,
            status: Status::Failed("timed out".into()),
        });
        assert_eq!((external.merged, external.stepwise), (0, 0));
    }

    fn runtime() -> EpisodeRuntime {
        EpisodeRuntime::new().unwrap()
    }

    fn model(tokenizer: &Tokenizer) -> Model {
        let cfg = ModelConfig::tiny_qwen2(tokenizer.vocab_size(), 32, 1, 2, 1, 64, 256);
        Model::random(&cfg, Device::Cpu, 3).unwrap()
    }

    fn limits() -> AgentLimits {
        AgentLimits {
            max_turns: 6,
            max_tokens: 200,
            env_timeout: Duration::from_secs(5),
            reuse_prefix: true,
        }
    }

    /// A first prompt longer than the episode may hold fails that episode, with its reason
    /// and counted at the token limit; the batch goes on (it used to end with a trajectory
    /// that had no transitions, which stopped the run).
    #[test]
    fn a_first_prompt_beyond_the_token_limit_fails_its_episode() {
        let task = agent_task_by_name("guess", 1).unwrap().unwrap();
        let tokenizer = Tokenizer::char_level(task.alphabet()).unwrap();
        let params = params(&tokenizer);
        let limits = AgentLimits {
            max_tokens: 3,
            ..limits()
        };
        let ctx = AgentContext {
            task: task.as_ref(),
            tokenizer: &tokenizer,
            format: &TurnFormat::Plain,
            params: &params,
            limits: &limits,
        };
        let r = ctx.run(
            &Generator::Local(Engine::new(4)),
            &model(&tokenizer),
            0,
            &runtime(),
            specs(task.as_ref(), 2),
            &|| {},
        );
        assert_eq!(r.episodes.len(), 2);
        for e in &r.episodes {
            let t = &e.trajectory;
            assert!(t.transitions.is_empty() && t.validate().is_ok());
            match &t.status {
                Status::Failed(reason) => assert!(reason.contains("first prompt"), "{reason}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(r.stats.token_limit, 2);
        assert_eq!(
            r.stats.truncated, 0,
            "a failed episode is not a truncated response"
        );
    }

    /// The guess task, but its environments open with `first` as the prompt.
    struct Opening {
        inner: Box<dyn AgentTask>,
        first: &'static str,
    }

    struct OpeningEnv(Box<dyn skein_tasks::Env>, &'static str);

    impl skein_tasks::Env for OpeningEnv {
        fn open(&mut self) -> std::result::Result<Option<String>, skein_tasks::EnvError> {
            Ok(Some(self.1.to_string()))
        }
        fn step(
            &mut self,
            message: &str,
        ) -> std::result::Result<skein_tasks::EnvStep, skein_tasks::EnvError> {
            self.0.step(message)
        }
    }

    impl AgentTask for Opening {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn sample(&self, rng: &mut TaskRng) -> Problem {
            self.inner.sample(rng)
        }
        fn start(&self, problem: &Problem) -> Box<dyn skein_tasks::Env> {
            Box::new(OpeningEnv(self.inner.start(problem), self.first))
        }
        fn demonstration_turn(&self, p: &Problem, t: &[Turn], rng: &mut TaskRng) -> String {
            self.inner.demonstration_turn(p, t, rng)
        }
        fn alphabet(&self) -> &str {
            self.inner.alphabet()
        }
        fn max_turns(&self) -> usize {
            self.inner.max_turns()
        }
        fn max_message_chars(&self) -> usize {
            self.inner.max_message_chars()
        }
    }

    /// An environment that opens with an empty or blank prompt fails that episode, counted
    /// as an environment error, instead of sampling an answer to nothing.
    #[test]
    fn an_empty_first_prompt_fails_its_episode_as_an_environment_error() {
        for first in ["", " \n "] {
            let task = Opening {
                inner: agent_task_by_name("guess", 1).unwrap().unwrap(),
                first,
            };
            let tokenizer = Tokenizer::char_level(task.alphabet()).unwrap();
            let params = params(&tokenizer);
            let ctx = AgentContext {
                task: &task,
                tokenizer: &tokenizer,
                format: &TurnFormat::Plain,
                params: &params,
                limits: &limits(),
            };
            let r = ctx.run(
                &Generator::Local(Engine::new(4)),
                &model(&tokenizer),
                0,
                &runtime(),
                specs(&task, 2),
                &|| {},
            );
            for e in &r.episodes {
                let t = &e.trajectory;
                assert!(t.transitions.is_empty(), "{first:?}: nothing sampled");
                match &t.status {
                    Status::Failed(why) => assert!(why.contains("empty first prompt"), "{why}"),
                    other => panic!("{first:?}: {other:?}"),
                }
            }
            assert_eq!(r.stats.env_errors, 2, "{first:?}");
        }
    }

    /// Characters of an environment's text outside the vocabulary are counted per step
    /// (`agent/unknown_chars`); a first prompt of nothing else fails its episode as an
    /// environment error, with the characters in the reason. A special token's spelling is
    /// counted apart (`agent/special_token_texts`): the model read it as that control token.
    #[test]
    fn unknown_characters_are_counted_and_a_first_prompt_of_only_those_fails() {
        for (first, fails, spelled) in [
            ("guess 1-16 ¿\n", false, 0),
            ("¿¡ ¿\n", true, 0),
            ("guess 1-16 ¿<|im_end|>\n", false, 1),
        ] {
            let task = Opening {
                inner: agent_task_by_name("guess", 1).unwrap().unwrap(),
                first,
            };
            let tokenizer = Tokenizer::char_level(task.alphabet()).unwrap();
            let params = params(&tokenizer);
            let ctx = AgentContext {
                task: &task,
                tokenizer: &tokenizer,
                format: &TurnFormat::Plain,
                params: &params,
                limits: &limits(),
            };
            let r = ctx.run(
                &Generator::Local(Engine::new(4)),
                &model(&tokenizer),
                0,
                &runtime(),
                specs(&task, 2),
                &|| {},
            );
            let per_episode = if fails { 3 } else { 1 };
            for e in &r.episodes {
                assert_eq!(e.spelled_specials.count, spelled, "{first:?}");
                assert_eq!(e.unknown.count, per_episode, "{first:?}");
                assert_eq!(e.unknown.examples[0], "¿", "{first:?}");
                match (&e.trajectory.status, fails) {
                    (Status::Failed(why), true) => {
                        assert!(why.contains("vocabulary") && why.contains("'¿'"), "{why}")
                    }
                    (Status::Failed(why), false) => panic!("{first:?}: {why}"),
                    (_, true) => panic!("{first:?}: ran"),
                    _ => {}
                }
            }
            let m: std::collections::HashMap<_, _> = r.stats.metrics().into_iter().collect();
            assert_eq!(
                m["agent/unknown_chars"],
                2.0 * per_episode as f64,
                "{first:?}"
            );
            assert_eq!(r.stats.env_errors, if fails { 2 } else { 0 }, "{first:?}");
            assert_eq!(m["agent/special_token_texts"], 2.0 * spelled as f64);
        }
    }

    fn specs(task: &dyn AgentTask, n: usize) -> Vec<EpisodeSpec> {
        let mut rng = TaskRng::new(4);
        (0..n)
            .map(|i| EpisodeSpec {
                id: format!("e{i}"),
                group: format!("g{}", i / 2),
                problem: task.sample(&mut rng),
            })
            .collect()
    }

    fn params(tokenizer: &Tokenizer) -> SamplingParams {
        SamplingParams {
            max_new_tokens: 4,
            stop_token_ids: tokenizer.eos_token_ids().to_vec(),
            ..Default::default()
        }
    }

    /// The ids the model saw at each turn: without a template, the previous turn's ids, then
    /// what it sampled, then the tokens of the environment's reply; with ChatML, the template's
    /// rendering of the conversation, which extends the previous context token for token
    /// whenever the sampled ids are the tokenization of their own text. Each transition keeps
    /// the sampled ids, and the counters say which episodes merge.
    #[test]
    fn each_turn_is_the_rendered_history_and_append_only_turns_extend_the_last() {
        for format in [TurnFormat::Plain, TurnFormat::Chat(Box::new(chatml()))] {
            let task = agent_task_by_name("guess", 1).unwrap().unwrap();
            let tokenizer = Tokenizer::char_level(task.alphabet()).unwrap();
            let (params, limits) = (params(&tokenizer), limits());
            let ctx = AgentContext {
                task: task.as_ref(),
                tokenizer: &tokenizer,
                format: &format,
                params: &params,
                limits: &limits,
            };
            let specs = specs(task.as_ref(), 24);
            let problems: std::collections::HashMap<String, Problem> = specs
                .iter()
                .map(|s| (s.id.clone(), s.problem.clone()))
                .collect();
            let r = ctx.run(
                &Generator::Local(Engine::new(16)),
                &model(&tokenizer),
                2,
                &runtime(),
                specs,
                &|| {},
            );
            let (mut multi_turn, mut extended, mut merged) = (0, 0, 0);
            for e in &r.episodes {
                let ts = &e.trajectory.transitions;
                let problem = &problems[&e.trajectory.id];
                assert_eq!(ts[0].prompt, ctx.prompt_ids(&problem.prompt).unwrap());
                let mut messages = vec![Message::user(&problem.prompt)];
                for (k, w) in ts.windows(2).enumerate() {
                    let turn = &e.transcript[k];
                    let mut context = w[0].prompt.clone();
                    context.extend(&w[0].response);
                    let want = match &format {
                        TurnFormat::Plain => {
                            let mut want = context.clone();
                            let reply = render_plain(&turn.reply);
                            want.extend(tokenizer.encode(&reply, false).unwrap());
                            want
                        }
                        TurnFormat::Chat(t) => {
                            push_turn(&mut messages, &turn.message, &turn.reply);
                            let text = t.render(&messages, None, true).unwrap();
                            tokenizer.encode(&text, false).unwrap()
                        }
                    };
                    let at = format!("episode {}, turn {}", e.trajectory.id, k + 1);
                    assert_eq!(w[1].prompt, want, "{at}");
                    // Sampled ids that decode to text which encodes back to them (no special
                    // token but the stop token) are extended token for token.
                    let text = tokenizer.decode(&w[0].response, true).unwrap();
                    let mut plain = tokenizer.encode(&text, false).unwrap();
                    plain.extend(
                        w[0].response
                            .last()
                            .filter(|t| params.stop_token_ids.contains(t)),
                    );
                    if plain == w[0].response {
                        assert!(w[1].prompt.starts_with(&context), "{at}");
                        extended += 1;
                    }
                    assert!(w[1].versions.iter().all(|&v| v == 2));
                    multi_turn += 1;
                }
                merged += usize::from(extends_token_for_token(&e.trajectory));
            }
            assert!(multi_turn > 10, "too few multi-turn episodes to check");
            assert!(extended > 5, "too few append-only turns to check");
            assert_eq!(r.stats.episodes, 24);
            assert_eq!((r.stats.merged, r.stats.stepwise), (merged, 24 - merged));
            if let TurnFormat::Plain = format {
                assert_eq!(r.stats.merged, 24, "plain text only ever appends");
            }
        }
    }

    /// The trainer scores merged episode rows with the ids the model saw: recomputed
    /// log-probs of the sampled tokens equal the engine's behavior log-probs.
    #[test]
    fn merged_rows_recompute_the_behavior_logprobs() {
        let task = agent_task_by_name("guess", 1).unwrap().unwrap();
        let tokenizer = Tokenizer::char_level(task.alphabet()).unwrap();
        let params = params(&tokenizer);
        let policy = model(&tokenizer);
        let mut batch = plain_episode_rows(task.as_ref(), &tokenizer, &params, &policy);
        assert_eq!(batch.real_rows, 16, "one merged row per episode");
        recomputed_logprobs_are_the_behavior_ones(&policy, &mut batch.rows, params.temperature);
    }

    /// The step batch of 16 plain-text episodes of `task` sampled by `policy` with `params`.
    fn plain_episode_rows(
        task: &dyn AgentTask,
        tokenizer: &Tokenizer,
        params: &SamplingParams,
        policy: &Model,
    ) -> crate::trainer::batch::StepBatch {
        use crate::trainer::batch::{build_step_batch, StepBatchConfig};
        let limits = limits();
        let ctx = AgentContext {
            task,
            tokenizer,
            format: &TurnFormat::Plain,
            params,
            limits: &limits,
        };
        let r = ctx.run(
            &Generator::Local(Engine::new(16)),
            policy,
            0,
            &runtime(),
            specs(task, 16),
            &|| {},
        );
        let trajectories: Vec<Trajectory> = r.episodes.into_iter().map(|e| e.trajectory).collect();
        let mut cfg = crate::trainer::TrainConfig::default();
        cfg.algorithm.normalize_std = false;
        let batch_cfg = StepBatchConfig::from_config(&cfg, 8);
        build_step_batch(&trajectories, &batch_cfg, 1).unwrap()
    }

    /// Sampling truncated by top-p or top-k stays on-policy: the engine records the ids it
    /// kept, and the trainer's recomputed log-prob of every sampled token, over those ids
    /// renormalised, equals the behavior one to round-off, in merged multi-turn rows (whose
    /// inserted tokens have no set) padded, packed and with shared prompts. Without the sets
    /// the recomputed log-probs are the whole distribution's, and differ: the check would fail
    /// were the truncation ignored.
    #[test]
    fn truncated_sampling_recomputes_the_behavior_logprobs() {
        use crate::trainer::config::Batching;
        use crate::trainer::prepare::recompute_logprobs;
        let task = agent_task_by_name("guess", 1).unwrap().unwrap();
        let tokenizer = Tokenizer::char_level(task.alphabet()).unwrap();
        let policy = model(&tokenizer);
        for (top_p, top_k) in [(0.9, 0), (1.0, 5)] {
            let params = SamplingParams {
                top_p,
                top_k,
                ..params(&tokenizer)
            };
            let mut batch = plain_episode_rows(task.as_ref(), &tokenizer, &params, &policy);
            assert!(batch.rows.iter().any(|r| !r.kept.is_empty()));
            recomputed_logprobs_are_the_behavior_ones(&policy, &mut batch.rows, params.temperature);
            // The whole distribution's log-probs of the same tokens are higher (a truncated
            // set renormalises to more mass per kept token) on some tokens by far more than
            // round-off.
            for row in batch.rows.iter_mut() {
                row.kept = Default::default();
            }
            let needs_old = vec![true; batch.rows.len()];
            let batching = Batching::padded(4096);
            recompute_logprobs(&policy, None, &mut batch.rows, &needs_old, &batching, 1.0);
            let gap = batch
                .rows
                .iter()
                .flat_map(|r| r.behavior_logp.iter().zip(&r.old_logp).zip(&r.loss_mask))
                .filter(|(_, &m)| m == 1)
                .map(|((b, o), _)| (b - o) as f64)
                .fold(0.0, f64::max);
            assert!(
                gap > 0.01,
                "top_p {top_p}, top_k {top_k}: largest gap {gap}"
            );
        }
    }

    /// Recomputes every row's log-probs padded, packed, and packed with shared prompts, and
    /// checks each sampled token's against the behavior log-prob the engine recorded.
    fn recomputed_logprobs_are_the_behavior_ones(
        policy: &Model,
        rows: &mut [crate::trainer::batch::TrainRow],
        temperature: f64,
    ) {
        use crate::trainer::config::Batching;
        use crate::trainer::prepare::recompute_logprobs;
        let needs_old = vec![true; rows.len()];
        let mut checked = 0;
        for (packing, shared_prefix) in [(false, false), (true, false), (true, true)] {
            let batching = Batching {
                micro_batch_tokens: 4096,
                packing,
                shared_prefix,
            };
            recompute_logprobs(policy, None, rows, &needs_old, &batching, temperature);
            for row in rows.iter() {
                for (k, &m) in row.loss_mask.iter().enumerate() {
                    if m == 1 {
                        let (a, b) = (row.old_logp[k], row.behavior_logp[k]);
                        assert!(
                            (a - b).abs() < 1e-4,
                            "token {k}: recomputed {a} vs sampled {b}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 150);
    }

    /// Trains step-wise rows as the engine scored them: a template that re-renders earlier
    /// turns makes most episodes step-wise (one row per turn, each with its own prompt, the
    /// engine's session keeping only what the prompts share), and the recomputed log-probs of
    /// every sampled token equal its behavior log-prob, padded, packed and with shared prefixes.
    #[test]
    fn stepwise_rows_recompute_the_behavior_logprobs() {
        use crate::trainer::batch::{build_step_batch, StepBatchConfig};
        let task = agent_task_by_name("guess", 1).unwrap().unwrap();
        let tokenizer = Tokenizer::char_level(&format!("{}|", task.alphabet())).unwrap();
        let format = TurnFormat::Chat(Box::new(marker_template()));
        let (params, limits) = (params(&tokenizer), limits());
        let ctx = AgentContext {
            task: task.as_ref(),
            tokenizer: &tokenizer,
            format: &format,
            params: &params,
            limits: &limits,
        };
        let policy = model(&tokenizer);
        let r = ctx.run(
            &Generator::Local(Engine::new(16)),
            &policy,
            0,
            &runtime(),
            specs(task.as_ref(), 16),
            &|| {},
        );
        assert!(r.stats.stepwise >= 4, "{:?}", r.stats);
        assert!(
            r.engine.reused_tokens > 0,
            "sessions kept their shared prefixes"
        );
        let trajectories: Vec<Trajectory> = r.episodes.into_iter().map(|e| e.trajectory).collect();
        let mut cfg = crate::trainer::TrainConfig::default();
        cfg.algorithm.normalize_std = false;
        let batch_cfg = StepBatchConfig::from_config(&cfg, 8);
        let mut batch = build_step_batch(&trajectories, &batch_cfg, 1).unwrap();
        let per_turn = batch.origins.iter().filter(|o| o.transition.is_some());
        assert!(per_turn.count() >= 8, "too few step-wise rows to check");
        recomputed_logprobs_are_the_behavior_ones(&policy, &mut batch.rows, params.temperature);
    }

    /// ChatML except that an assistant message a reply follows is shown with only what it
    /// wrote after its last `|`: a one-character stand-in for a reasoning model's `</think>`,
    /// which a random character-level model writes often.
    fn marker_template() -> ChatTemplate {
        let source = r#"{%- set ns = namespace(last_reply=-1) %}
{%- for m in messages %}{%- if m.role != 'assistant' %}{%- set ns.last_reply = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
{%- set content = m.content %}
{%- if m.role == 'assistant' and loop.index0 < ns.last_reply %}{%- set content = content.split('|')[-1] %}{%- endif %}
{{- '<|im_start|>' + m.role + '\n' + content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"#;
        ChatTemplate::new(source, None, Some("<|im_end|>")).unwrap()
    }

    /// What `scripts/make_think_template_fixture.py` recorded with transformers: a
    /// conversation, and for each of its assistant messages the ids `apply_chat_template` gives
    /// the history before it, under a Qwen3-style template that drops earlier reasoning
    /// (`think`, the tokenizer's own) and under plain ChatML (`chatml`).
    #[derive(serde::Deserialize)]
    struct ThinkFixture {
        messages: Vec<Message>,
        chatml_template: String,
        turns: std::collections::HashMap<String, Vec<RecordedTurn>>,
    }

    #[derive(Clone, serde::Deserialize)]
    struct RecordedTurn {
        prompt_ids: Vec<u32>,
        completion_ids: Vec<u32>,
    }

    fn think_fixture() -> (Tokenizer, ThinkFixture) {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/think-template");
        let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
        (
            Tokenizer::from_dir(&dir).unwrap(),
            serde_json::from_str(&text).unwrap(),
        )
    }

    /// The fixture's conversation as an environment: each assistant message must be the
    /// scripted one, and is answered with the messages after it; the last one ends the episode
    /// with the problem's ground truth as its reward.
    struct Conversation(Vec<Message>);

    struct ConversationEnv {
        messages: Vec<Message>,
        next: usize,
        reward: f64,
    }

    impl Env for ConversationEnv {
        fn step(&mut self, message: &str) -> Result<EnvStep, EnvError> {
            let want = &self.messages[self.next].content;
            if message != want {
                return Err(EnvError::new(format!("said {message:?}, not {want:?}")));
            }
            self.next += 1;
            let mut reply = Vec::new();
            let is_reply = |m: &&Message| m.role != "assistant";
            while let Some(m) = self.messages.get(self.next).filter(is_reply) {
                reply.push(match m.role.as_str() {
                    "tool" => EnvMessage::tool(&m.content),
                    _ => EnvMessage::user(&m.content),
                });
                self.next += 1;
            }
            if reply.is_empty() {
                return Ok(EnvStep::Done(Score {
                    reward: self.reward,
                    correct: true,
                    formatted: true,
                }));
            }
            Ok(EnvStep::Continue {
                messages: reply,
                reward: None,
            })
        }
    }

    impl AgentTask for Conversation {
        fn name(&self) -> &str {
            "conversation"
        }
        fn sample(&self, _: &mut TaskRng) -> Problem {
            unreachable!("the test writes its problems")
        }
        fn start(&self, p: &Problem) -> Box<dyn Env> {
            Box::new(ConversationEnv {
                messages: self.0.clone(),
                next: 1,
                reward: p.ground_truth.parse().unwrap(),
            })
        }
        fn demonstration_turn(&self, _: &Problem, _: &[Turn], _: &mut TaskRng) -> String {
            unreachable!("no warm-up here")
        }
        fn alphabet(&self) -> &str {
            ""
        }
        fn max_turns(&self) -> usize {
            6
        }
        fn max_message_chars(&self) -> usize {
            200
        }
    }

    /// Plays the fixture's conversation through the agent loop, the model's messages sampled
    /// from a script (turn k of every episode samples the recorded ids of message k, with
    /// made-up log-probs): the ids the model is given at each turn are exactly transformers'
    /// rendering of the history, each transition keeps the sampled ids and log-probs, and the
    /// planner keeps a row per turn of a step-wise episode, all in one mini-batch. Under the
    /// reasoning-dropping template every episode is step-wise; under ChatML every one merges.
    #[test]
    fn a_reasoning_template_gives_stepwise_turns_of_exactly_what_transformers_renders() {
        use crate::trainer::batch::{build_step_batch, StepBatchConfig};
        use std::sync::{Arc, Mutex};
        let (tokenizer, fixture) = think_fixture();
        let think = tokenizer.chat_template().unwrap().unwrap();
        let chatml = ChatTemplate::new(&fixture.chatml_template, None, Some("<|im_end|>")).unwrap();
        let task = Conversation(fixture.messages.clone());
        let params = params(&tokenizer);
        let limits = AgentLimits {
            max_tokens: 1000,
            ..limits()
        };
        let logprob = |turn: usize, j: usize| -0.5 - turn as f32 - 0.01 * j as f32;
        for (name, template, stepwise) in [("think", think, true), ("chatml", chatml, false)] {
            let recorded = Arc::new(fixture.turns[name].clone());
            let format = TurnFormat::Chat(Box::new(template));
            let ctx = AgentContext {
                task: &task,
                tokenizer: &tokenizer,
                format: &format,
                params: &params,
                limits: &limits,
            };
            // The prompts the "model" was given: (episode, turn, ids).
            let seen = Arc::new(Mutex::new(Vec::new()));
            let turns = Mutex::new(std::collections::HashMap::new());
            let (rec, log) = (recorded.clone(), seen.clone());
            // Under ChatML the first message says it was cut at its token limit: the loop
            // hands it on all the same, and counts it.
            let cut_first = !stepwise;
            let answer = move |req: &GenRequest| {
                let session = req.session.expect("each episode is an engine session");
                let mut turns = turns.lock().unwrap();
                let k: &mut usize = turns.entry(session).or_default();
                log.lock().unwrap().push((session, *k, req.prompt.clone()));
                let tokens = rec[*k].completion_ids.clone();
                let out = GenOutput {
                    id: req.id,
                    logprobs: (0..tokens.len()).map(|j| logprob(*k, j)).collect(),
                    versions: vec![7; tokens.len()],
                    kept: Default::default(),
                    tokens,
                    finish: if cut_first && *k == 0 {
                        Finish::Length
                    } else {
                        Finish::Stop
                    },
                    error: None,
                };
                *k += 1;
                out
            };
            let specs = (0..4)
                .map(|i| EpisodeSpec {
                    id: format!("e{i}"),
                    group: format!("g{}", i / 2),
                    problem: Problem {
                        prompt: fixture.messages[0].content.clone(),
                        ground_truth: i.to_string(),
                        data_source: "conversation".into(),
                        meta: serde_json::Value::Null,
                    },
                })
                .collect();
            let caller = Caller::Scripted(Arc::new(answer));
            let episodes = ctx.play_all(caller, &runtime(), specs, &|| {});
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 4 * recorded.len(), "{name}");
            for (session, k, prompt) in seen.iter() {
                assert_eq!(
                    *prompt, recorded[*k].prompt_ids,
                    "{name}: episode {session}, turn {k}: the prompt is not transformers' rendering"
                );
            }
            for e in &episodes {
                assert_eq!(e.trajectory.status, Status::Finished, "{name}");
                assert_eq!(e.cut_turns, usize::from(cut_first), "{name}");
                let ts = &e.trajectory.transitions;
                assert_eq!(ts.len(), recorded.len());
                for (k, (t, want)) in ts.iter().zip(recorded.iter()).enumerate() {
                    assert_eq!(t.prompt, want.prompt_ids, "{name}, turn {k}");
                    assert_eq!(t.response, want.completion_ids, "{name}, turn {k}");
                    let lp: Vec<f32> = (0..t.response.len()).map(|j| logprob(k, j)).collect();
                    assert_eq!(t.logprobs, lp);
                    assert!(t.versions.iter().all(|&v| v == 7));
                }
                assert_eq!(extends_token_for_token(&e.trajectory), !stepwise, "{name}");
            }
            let stats = AgentStats::of(&episodes);
            let (merged, split) = if stepwise { (0, 4) } else { (4, 0) };
            assert_eq!((stats.merged, stats.stepwise), (merged, split), "{name}");
            let m: std::collections::HashMap<_, _> = stats.metrics().into_iter().collect();
            assert_eq!(m["agent/merged_trajectories"], merged as f64);
            assert_eq!(m["agent/stepwise_trajectories"], split as f64);

            // Rows: one per turn (step-wise) or one per episode, whole in one mini-batch.
            let trajectories: Vec<Trajectory> =
                episodes.into_iter().map(|e| e.trajectory).collect();
            let mut cfg = crate::trainer::TrainConfig::default();
            cfg.trainer.num_mini_batches = 2;
            let batch_cfg = StepBatchConfig::from_config(&cfg, 64);
            let batch = build_step_batch(&trajectories, &batch_cfg, 3).unwrap();
            let rows_each = if stepwise { recorded.len() } else { 1 };
            assert_eq!(batch.real_rows, 4 * rows_each, "{name}");
            for (i, o) in batch.origins.iter().enumerate() {
                let row = &batch.rows[i];
                let sampled: Vec<f32> = row
                    .loss_mask
                    .iter()
                    .zip(&row.behavior_logp)
                    .filter(|(&m, _)| m == 1)
                    .map(|(_, &lp)| lp)
                    .collect();
                let turns = match o.transition {
                    Some(k) => k..k + 1,
                    None => 0..recorded.len(),
                };
                let want_lp: Vec<f32> = turns
                    .clone()
                    .flat_map(|k| (0..recorded[k].completion_ids.len()).map(move |j| logprob(k, j)))
                    .collect();
                assert_eq!(sampled, want_lp, "{name}: row {i}");
                let last = &recorded[turns.end - 1];
                let mut tokens = last.prompt_ids.clone();
                tokens.extend(&last.completion_ids);
                assert_eq!(row.tokens, tokens, "{name}: row {i}");
                assert_eq!(o.transition.is_some(), stepwise, "{name}: row {i}");
            }
            for t in 0..4 {
                let holding: Vec<usize> = (0..batch.plan.len())
                    .filter(|&mb| {
                        batch.plan[mb]
                            .iter()
                            .flatten()
                            .any(|&r| r < batch.real_rows && batch.origins[r].trajectory == t)
                    })
                    .collect();
                assert_eq!(
                    holding.len(),
                    1,
                    "{name}: trajectory {t} in mini-batches {holding:?}"
                );
            }
        }
    }

    fn chatml() -> ChatTemplate {
        Tokenizer::char_level("0123456789")
            .unwrap()
            .chat_template()
            .unwrap()
            .unwrap()
    }

    #[test]
    fn the_chat_delta_runs_from_the_stop_token_to_the_next_assistant_turn() {
        let t = chatml();
        let mut messages = vec![Message::user("q"), Message::assistant("a")];
        let before = t.render(&messages, None, false).unwrap();
        messages.push(Message::tool("42", None));
        let after = t.render(&messages, None, true).unwrap();
        let delta = chat_delta(&before, &after, t.eos_token()).unwrap();
        assert!(delta.starts_with('\n'), "{delta:?}");
        assert!(delta.contains("42") && delta.ends_with("<|im_start|>assistant\n"));
        assert!(chat_delta("abc", "xbcd", "<|im_end|>").is_err());
    }

    /// A test task of numbered problems (ground truths `0..kinds`): its environment for a
    /// problem is `start`'s for the number, whose kind of behaviour the test chooses.
    struct ByKind(i64, fn(u8) -> Box<dyn Env>);

    impl AgentTask for ByKind {
        fn name(&self) -> &str {
            "by-kind"
        }
        fn sample(&self, rng: &mut TaskRng) -> Problem {
            Problem {
                prompt: "12".into(),
                ground_truth: rng.range(0, self.0).to_string(),
                data_source: "by-kind".into(),
                meta: serde_json::Value::Null,
            }
        }
        fn start(&self, p: &Problem) -> Box<dyn Env> {
            (self.1)(p.ground_truth.parse().unwrap_or(u8::MAX))
        }
        fn demonstration_turn(&self, _: &Problem, _: &[Turn], _: &mut TaskRng) -> String {
            "1".into()
        }
        fn alphabet(&self) -> &str {
            "0123456789"
        }
        fn max_turns(&self) -> usize {
            2
        }
        fn max_message_chars(&self) -> usize {
            1
        }
    }

    /// Runs `n` episodes of `task` on the embedded engine; returns each one's kind and the
    /// batch.
    fn run_by_kind(task: &ByKind, limits: AgentLimits, n: usize) -> (Vec<String>, EpisodeBatch) {
        let tokenizer = Tokenizer::char_level(task.alphabet()).unwrap();
        let params = params(&tokenizer);
        let ctx = AgentContext {
            task,
            tokenizer: &tokenizer,
            format: &TurnFormat::Plain,
            params: &params,
            limits: &limits,
        };
        let specs = specs(task, n);
        let kinds = specs
            .iter()
            .map(|s| s.problem.ground_truth.clone())
            .collect();
        let batch = ctx.run(
            &Generator::Local(Engine::new(8)),
            &model(&tokenizer),
            0,
            &runtime(),
            specs,
            &|| {},
        );
        (kinds, batch)
    }

    /// A task whose own code panics outside the guarded environment calls (`start` for one
    /// kind of problem, `state_key` for another) fails those episodes alone, with the panic's
    /// message, counted as environment errors; the others of the step finish. It used to drop
    /// every episode of the step with the embedded engine.
    #[test]
    fn a_panic_in_the_tasks_own_code_fails_its_episode_alone() {
        struct PanickyEnv(u8);
        impl Env for PanickyEnv {
            fn step(&mut self, _: &str) -> Result<EnvStep, EnvError> {
                Ok(EnvStep::Done(Score {
                    reward: 1.0,
                    correct: true,
                    formatted: true,
                }))
            }
            fn state_key(&self) -> Option<String> {
                assert_ne!(self.0, 1, "no key for this state");
                None
            }
        }
        let task = ByKind(5, |kind| {
            assert_ne!(kind, 0, "cannot start this problem");
            Box::new(PanickyEnv(kind))
        });
        let (kinds, r) = run_by_kind(&task, limits(), 30);
        assert_eq!(r.episodes.len(), kinds.len());
        for (e, kind) in r.episodes.iter().zip(&kinds) {
            match (kind.as_str(), &e.trajectory.status) {
                ("0", Status::Failed(why)) => assert!(why.contains("cannot start"), "{why}"),
                ("1", Status::Failed(why)) => assert!(why.contains("no key"), "{why}"),
                ("0" | "1", s) => panic!("episode {kind} should have failed: {s:?}"),
                (_, s) => assert_eq!(*s, Status::Finished),
            }
        }
        let failing = kinds.iter().filter(|k| *k == "0" || *k == "1").count();
        assert!(failing > 0 && failing < kinds.len(), "{kinds:?}");
        assert_eq!(r.stats.env_errors, failing);
    }

    /// An environment that errors, one that hangs, and healthy ones: the first two fail their
    /// own episode with a reason, counted; the rest finish. The hung ones' threads (a minute
    /// each) do not hold up the batch's end, where the runtime is dropped.
    #[test]
    fn env_errors_and_timeouts_fail_one_episode_each() {
        struct FlakyEnv(u8);
        impl Env for FlakyEnv {
            fn step(&mut self, _: &str) -> Result<EnvStep, EnvError> {
                match self.0 {
                    0 => Err(EnvError::new("the simulator crashed")),
                    1 => {
                        std::thread::sleep(Duration::from_secs(60));
                        Ok(EnvStep::Done(Score {
                            reward: 1.0,
                            correct: true,
                            formatted: true,
                        }))
                    }
                    _ => Ok(EnvStep::Done(Score {
                        reward: 1.0,
                        correct: true,
                        formatted: true,
                    })),
                }
            }
        }
        let task = ByKind(9, |kind| Box::new(FlakyEnv(kind)));
        let limits = AgentLimits {
            env_timeout: Duration::from_millis(300),
            ..limits()
        };
        let started = std::time::Instant::now();
        let (kinds, r) = run_by_kind(&task, limits, 40);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the batch waited for its hung environments: {:?}",
            started.elapsed()
        );
        for (e, kind) in r.episodes.iter().zip(&kinds) {
            match (kind.as_str(), &e.trajectory.status) {
                ("0", Status::Failed(why)) => assert!(why.contains("crashed"), "{why}"),
                ("1", Status::Failed(why)) => assert!(why.contains("env_timeout_s"), "{why}"),
                ("0" | "1", s) => panic!("episode {kind} should have failed: {s:?}"),
                (_, s) => assert_eq!(*s, Status::Finished),
            }
        }
        let count = |k: &str| kinds.iter().filter(|x| x.as_str() == k).count();
        assert_eq!(r.stats.env_errors, count("0"));
        assert_eq!(r.stats.env_timeouts, count("1"));
        assert!(r.stats.env_errors > 0 && r.stats.env_timeouts > 0);
    }
}
