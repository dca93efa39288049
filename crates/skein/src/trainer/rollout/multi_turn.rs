//! Multi-turn tasks as a workload: a step's episodes (groups of `samples_per_prompt`
//! episodes of one problem), held-out evaluation, and demonstration episodes for the
//! supervised warm-up, all through the same token-exact turn rule as training
//! (`episodes.rs` runs them).

use super::dataset::eval_seed;
use super::episodes::{
    AgentContext, AgentLimits, Episode, EpisodeRuntime, EpisodeSpec, TurnFormat,
};
use super::stats::{SourceStats, StepRollout};
use super::{
    draw, evaluation_problems, AgentEval, EvalResult, StepContext, Workload, WorkloadState,
};
use crate::engine::SamplingParams;
use crate::model::Model;
use crate::trainer::batch::TrainRow;
use crate::trainer::config::TrainConfig;
use crate::trainer::sft::sft_row_masked;
use anyhow::{bail, Result};
use skein_tasks::{AgentTask, EnvError, EnvStep, Problem, Split, TaskRng, Turn};
use skein_text::{Message, SpelledSpecials, Tokenizer, UnknownChars};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Context a from-scratch model gets for a multi-turn task at least (episodes are longer than
/// single answers; positions cost nothing until used).
pub const MIN_AGENT_POSITIONS: usize = 256;

/// Demonstration episodes that may fail in a row in their environment (an error it reports,
/// or its worker process failing) before the warm-up stops: a flaky environment, as in
/// rollouts, costs the episodes it fails, and a broken one still stops the run, soon.
const DEMONSTRATION_FAILURES_IN_A_ROW: usize = 16;

fn env_failed(e: &anyhow::Error) -> bool {
    e.downcast_ref::<EnvError>().is_some()
}

/// A multi-turn task with what running it needs.
pub struct MultiTurn {
    pub task: Box<dyn AgentTask>,
    pub format: TurnFormat,
    pub limits: AgentLimits,
    runtime: EpisodeRuntime,
    rng: TaskRng,
    /// Evaluation problems, drawn once from a seed of their own: held out when `split`.
    eval: Vec<Problem>,
    /// Training draws only training problems (the task is large enough to split).
    split: bool,
    /// Groups (problems) and episodes per group of a step.
    groups: usize,
    samples: usize,
    /// The environment's text had characters the tokenizer lacks, and the run was told.
    unknown_warned: AtomicBool,
    /// Whether the run said that an environment spelled special tokens.
    specials_warned: AtomicBool,
    /// Demonstration episodes that failed in their environment during the warm-up.
    demonstration_failures: usize,
}

impl MultiTurn {
    /// The policy's context bounds an episode; the chat template is used when the model has
    /// one and is not the built-in character-level model.
    pub fn new(
        cfg: &TrainConfig,
        task: Box<dyn AgentTask>,
        tokenizer: &Tokenizer,
        policy: &Model,
        rng_state: u64,
    ) -> Result<Self> {
        let max_positions = policy.net.max_positions() as usize;
        let a = &cfg.agent;
        // Decided by the tokenizer, not by where the model came from: a built-in model saved
        // and loaded back through `model.path` must see the plain turns it was trained on.
        let format = match tokenizer.chat_template()? {
            Some(t) if !tokenizer.is_char_level() => TurnFormat::Chat(Box::new(t)),
            _ => TurnFormat::Plain,
        };
        let max_tokens = match a.max_tokens {
            0 => max_positions,
            n if n > max_positions => bail!(
                "invalid value for `agent.max_tokens`: {n} is more than the model's context of \
                 {max_positions} positions, which no episode can outgrow; lower it (0: the \
                 model's context)"
            ),
            n => n,
        };
        let limits = AgentLimits {
            max_turns: match a.max_turns {
                0 => task.max_turns(),
                n => n,
            },
            max_tokens,
            env_timeout: Duration::from_secs_f64(a.env_timeout_s),
            reuse_prefix: a.reuse_prefix,
        };
        let runtime = EpisodeRuntime::new()?;
        let (eval, split) = evaluation_problems(
            task.name(),
            task.problem_count(),
            cfg.eval.problems,
            eval_seed(cfg.run.seed),
            |r| task.sample(r),
        )?;
        Ok(MultiTurn {
            split,
            task,
            format,
            limits,
            runtime,
            rng: TaskRng::new(rng_state),
            eval,
            groups: cfg.rollout.prompts_per_step,
            samples: cfg.rollout.samples_per_prompt,
            unknown_warned: AtomicBool::new(false),
            specials_warned: AtomicBool::new(false),
            demonstration_failures: 0,
        })
    }

    /// Says once, the first time it happens, that the environment's text has characters the
    /// tokenizer lacks (each step counts them as `agent/unknown_chars`).
    fn warn_unknown(&self, unknown: &UnknownChars, seen_in: &str) {
        if unknown.is_empty() || self.unknown_warned.swap(true, Ordering::Relaxed) {
            return;
        }
        eprintln!(
            "skein: warning: environment `{}` sent {unknown} in {seen_in}, which the model reads \
             as its unknown token (counted per step as agent/unknown_chars; an episode whose \
             first prompt has no other character fails)",
            self.task.name()
        );
    }

    /// Says once that an environment's text spelled special tokens: the model read control
    /// tokens there (a turn's end, a system turn's start) where text was meant.
    fn warn_spelled(&self, spelled: &SpelledSpecials, seen_in: &str) {
        if spelled.is_empty() || self.specials_warned.swap(true, Ordering::Relaxed) {
            return;
        }
        eprintln!(
            "skein: warning: environment `{}` sent {spelled} in {seen_in}, which the tokenizer \
             reads as those control tokens, not as text: the model sees the turn structure they \
             spell (counted per step as agent/special_token_texts); escape them in the \
             environment if they are data",
            self.task.name()
        );
    }

    pub fn context<'a>(
        &'a self,
        tokenizer: &'a Tokenizer,
        params: &'a SamplingParams,
    ) -> AgentContext<'a> {
        AgentContext {
            task: self.task.as_ref(),
            tokenizer,
            format: &self.format,
            params,
            limits: &self.limits,
        }
    }

    /// A demonstration episode as one supervised row: the task's demonstrated messages (each
    /// ending with `eos`) are trained on; the environment's replies between them, inserted by
    /// the same rule as in rollouts, are not.
    fn demonstration_row(
        &mut self,
        tokenizer: &Tokenizer,
        params: &SamplingParams,
        direct_share: f64,
    ) -> Result<TrainRow> {
        let eos = StepContext::stop_token(params)?;
        let rng = &mut self.rng;
        let ctx = AgentContext {
            task: self.task.as_ref(),
            tokenizer,
            format: &self.format,
            params,
            limits: &self.limits,
        };
        let train = self.split.then_some(Split::Train);
        let problem = draw(self.task.name(), train, rng, |r| self.task.sample(r))?;
        let mut env = self.task.start(&problem);
        let prompt = env.open()?.unwrap_or_else(|| problem.prompt.clone());
        if prompt.trim().is_empty() {
            // As in a rollout: the model would answer nothing at all.
            return Err(EnvError::new(format!(
                "the environment opened the episode with an empty first prompt ({prompt:?})"
            ))
            .into());
        }
        let mut tokens = ctx.prompt_ids(&prompt)?;
        let mut unknown = tokenizer.unknown_chars(&prompt)?;
        let prompt_len = tokens.len();
        let mut mask = Vec::new();
        let mut messages = vec![Message::user(&prompt)];
        let mut transcript: Vec<Turn> = Vec::new();
        // The first message, when this demonstration answers at once. The coin is drawn only
        // when a share is asked for, so a run without one keeps its stream of problems.
        let mut direct = (direct_share > 0.0 && rng.f64() < direct_share)
            .then(|| self.task.direct_answer(&problem))
            .flatten();
        for _ in 0..self.limits.max_turns {
            let message = match direct.take() {
                Some(answer) => answer,
                None => self.task.demonstrate(&problem, &transcript, rng)?,
            };
            let (mut ids, u) = tokenizer.encode_checked(&message, false)?;
            unknown.add(&u);
            ids.push(eos);
            mask.extend(std::iter::repeat_n(1u8, ids.len()));
            tokens.extend(ids);
            match env.step(&message)? {
                EnvStep::Done(_) => break,
                EnvStep::Continue {
                    messages: reply, ..
                } => {
                    let inserted = ctx.inserted_text(&mut messages, &message, &reply)?;
                    let (ids, u) = tokenizer.encode_checked(&inserted, false)?;
                    unknown.add(&u);
                    mask.extend(std::iter::repeat_n(0u8, ids.len()));
                    tokens.extend(ids);
                    transcript.push(Turn { message, reply });
                }
            }
        }
        self.warn_unknown(
            &unknown,
            "a demonstration episode (the warm-up trains on it)",
        );
        if tokens.len() > self.limits.max_tokens {
            bail!(
                "a demonstration episode of `{}` takes {} tokens, more than the {} an episode \
                 may have (agent.max_tokens, model.max_positions): raise them",
                self.task.name(),
                tokens.len(),
                self.limits.max_tokens
            );
        }
        Ok(sft_row_masked(tokens, prompt_len, mask))
    }
}

impl Workload for MultiTurn {
    /// `groups` problems × `samples` episodes each.
    fn rollout(&mut self, ctx: &StepContext) -> Result<StepRollout> {
        let step = ctx.step;
        let mut specs = Vec::with_capacity(self.groups * self.samples);
        for p in 0..self.groups {
            let train = self.split.then_some(Split::Train);
            let task = self.task.as_ref();
            let problem = draw(task.name(), train, &mut self.rng, |r| task.sample(r))?;
            for k in 0..self.samples {
                specs.push(EpisodeSpec {
                    id: format!("s{step}-p{p}-s{k}"),
                    group: format!("s{step}-p{p}"),
                    problem: problem.clone(),
                });
            }
        }
        let sources: Vec<String> = specs
            .iter()
            .map(|s| s.problem.data_source.clone())
            .collect();
        let agent = self.context(ctx.tokenizer, ctx.sampling);
        let counters_before = self.task.counters();
        let mut r = agent.run(
            ctx.engine,
            ctx.policy,
            ctx.version,
            &self.runtime,
            specs,
            &|| {},
        );
        self.warn_unknown(&r.stats.unknown, &format!("the episodes of step {step}"));
        self.warn_spelled(
            &r.stats.spelled_specials,
            &format!("the episodes of step {step}"),
        );
        if !counters_before.is_empty() {
            let grown = self.task.counters().into_iter().zip(&counters_before);
            r.stats.task_counters =
                Some(grown.map(|((k, now), (_, was))| (k, now - was)).collect());
        }
        let info = r
            .episodes
            .iter()
            .zip(sources)
            .map(|(e, s)| e.info(s))
            .collect();
        let (trajectories, correct) = r
            .episodes
            .into_iter()
            .map(|e| (e.trajectory, e.correct))
            .unzip();
        let rollout = StepRollout::new(
            trajectories,
            correct,
            r.engine,
            ctx.version,
            SourceStats::Episodes(r.stats),
        );
        Ok(rollout.with_info(info))
    }

    /// Greedy episodes of the held-out problems.
    fn evaluate(&self, ctx: &StepContext) -> EvalResult {
        let greedy = SamplingParams {
            temperature: 0.0,
            ..ctx.sampling.clone()
        };
        let specs = self
            .eval
            .iter()
            .enumerate()
            .map(|(i, p)| EpisodeSpec {
                id: format!("eval-p{i}"),
                group: format!("eval-p{i}"),
                problem: p.clone(),
            })
            .collect();
        let agent = self.context(ctx.tokenizer, &greedy);
        let counted = ctx.on_episode_end.unwrap_or(&|| {});
        let r = agent.run(ctx.engine, ctx.policy, 0, &self.runtime, specs, counted);
        self.warn_unknown(&r.stats.unknown, "the evaluation episodes");
        self.warn_spelled(&r.stats.spelled_specials, "the evaluation episodes");
        let n = r.episodes.len().max(1) as f64;
        let turns = |e: &Episode| e.trajectory.transitions.len() as f64;
        let solved: Vec<f64> = r.episodes.iter().filter(|e| e.correct).map(turns).collect();
        EvalResult {
            agent: Some(AgentEval {
                turns_mean: r.episodes.iter().map(turns).sum::<f64>() / n,
                solved_turns_mean: solved.iter().sum::<f64>() / solved.len() as f64,
                tool_calls_mean: r.stats.tool_calls as f64 / n,
            }),
            ..EvalResult::of(r.episodes.iter().map(|e| (&e.trajectory, e.correct)))
        }
    }

    /// A demonstration episode; one whose environment failed is drawn again, until
    /// [`DEMONSTRATION_FAILURES_IN_A_ROW`] have failed in a row. The failures are told as their
    /// count reaches 1, 2, 4, 8, …: a flaky environment is seen without a line per episode.
    fn demonstration(
        &mut self,
        tokenizer: &Tokenizer,
        sampling: &SamplingParams,
        direct_share: f64,
    ) -> Result<TrainRow> {
        let mut in_a_row = 0;
        loop {
            match self.demonstration_row(tokenizer, sampling, direct_share) {
                Err(e) if env_failed(&e) => {
                    in_a_row += 1;
                    self.demonstration_failures += 1;
                    let n = self.demonstration_failures;
                    if in_a_row == DEMONSTRATION_FAILURES_IN_A_ROW {
                        return Err(e.context(format!(
                            "{in_a_row} demonstration episodes in a row failed in the \
                             environment ({n} in the warm-up so far); the last"
                        )));
                    }
                    if n.is_power_of_two() {
                        eprintln!(
                            "skein: {n} demonstration episode{} failed in the environment so \
                             far, each drawn again; the latest: {e:#}",
                            if n == 1 { "" } else { "s" }
                        );
                    }
                }
                r => return r,
            }
        }
    }

    fn state(&self) -> WorkloadState {
        WorkloadState {
            task_rng: self.rng.state(),
            ..WorkloadState::default()
        }
    }

    fn data_metrics(&self, _first: bool) -> Vec<(&'static str, serde_json::Value)> {
        Vec::new()
    }

    fn held_out(&self) -> bool {
        self.split
    }

    fn eval_problems(&self) -> usize {
        self.eval.len()
    }
}
