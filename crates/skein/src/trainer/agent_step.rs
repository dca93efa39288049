//! The trainer's side of multi-turn tasks: a step's episodes (groups of `samples_per_prompt`
//! episodes of one problem), held-out evaluation, and demonstration episodes for the
//! supervised warm-up, all through the same token-exact turn rule as training.

use super::agent::{AgentContext, AgentLimits, AgentStats, EpisodeSpec, TurnFormat};
use super::config::TrainConfig;
use super::eval::EvalResult;
use super::microbatch::TrainRow;
use super::partial::{PartialStats, StepRollout};
use super::reward::RewardStats;
use super::sft::sft_row_masked;
use crate::engine::{Generator, SamplingParams};
use crate::model::Model;
use anyhow::{bail, Context, Result};
use skein_tasks::{AgentTask, EnvStep, Problem, TaskRng, Turn};
use skein_text::{Message, Tokenizer};
use std::time::Duration;

/// Context a from-scratch model gets for a multi-turn task at least (episodes are longer than
/// single answers; positions cost nothing until used).
pub const MIN_AGENT_POSITIONS: usize = 256;

/// A multi-turn task with what running it needs.
pub struct AgentWork {
    pub task: Box<dyn AgentTask>,
    pub format: TurnFormat,
    pub limits: AgentLimits,
    runtime: tokio::runtime::Runtime,
}

/// The multi-turn task `task.name` names, if it is one.
pub fn agent_task(cfg: &TrainConfig) -> Result<Option<Box<dyn AgentTask>>> {
    if !cfg.data.train_files.is_empty() {
        return Ok(None);
    }
    Ok(skein_tasks::agent_task_by_name(&cfg.task.name, cfg.task.difficulty).transpose()?)
}

impl AgentWork {
    /// `max_positions` is the policy's context; the chat template is used when the model has
    /// one and is not the built-in character-level model.
    pub fn new(
        cfg: &TrainConfig,
        task: Box<dyn AgentTask>,
        tokenizer: &Tokenizer,
        max_positions: usize,
    ) -> Result<Self> {
        let a = &cfg.agent;
        let format = match (cfg.model.path.is_empty(), tokenizer.chat_template()?) {
            (false, Some(t)) => TurnFormat::Chat(Box::new(t)),
            _ => TurnFormat::Plain,
        };
        let max_tokens = match a.max_tokens {
            0 => max_positions,
            n => n.min(max_positions),
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
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("skein-agents")
            .enable_all()
            .build()
            .context("starting the runtime of the agent episodes")?;
        Ok(AgentWork {
            task,
            format,
            limits,
            runtime,
        })
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

    /// One training step's episodes: `groups` problems × `samples` episodes each.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &self,
        engine: &Generator,
        policy: &Model,
        version: u64,
        tokenizer: &Tokenizer,
        params: &SamplingParams,
        rng: &mut TaskRng,
        step: usize,
        groups: usize,
        samples: usize,
    ) -> (StepRollout, AgentStats) {
        let mut specs = Vec::with_capacity(groups * samples);
        for p in 0..groups {
            let problem = self.task.sample(rng);
            for k in 0..samples {
                specs.push(EpisodeSpec {
                    id: format!("s{step}-p{p}-s{k}"),
                    group: format!("s{step}-p{p}"),
                    problem: problem.clone(),
                });
            }
        }
        let ctx = self.context(tokenizer, params);
        let r = ctx.run(engine, policy, version, &self.runtime, specs);
        let mut stats = PartialStats {
            requests: r.stats.turns,
            generated_tokens: r.engine.generated_tokens,
            rounds: 1,
            ..PartialStats::default()
        };
        let (mut trajectories, mut correct) = (Vec::new(), Vec::new());
        for e in r.episodes {
            if !e.trajectory.is_failed() {
                stats.trained_tokens += e
                    .trajectory
                    .transitions
                    .iter()
                    .map(|t| t.loss_tokens())
                    .sum::<usize>();
            }
            trajectories.push(e.trajectory);
            correct.push(e.correct);
        }
        let out = StepRollout {
            trajectories,
            correct,
            engine: r.engine,
            stats,
            rewards: RewardStats::default(),
        };
        (out, r.stats)
    }

    /// Greedy episodes of `problems`: the fraction the environment judged correct and the
    /// mean reward.
    pub fn evaluate(
        &self,
        engine: &Generator,
        policy: &Model,
        tokenizer: &Tokenizer,
        params: &SamplingParams,
        problems: &[Problem],
    ) -> EvalResult {
        let greedy = SamplingParams {
            temperature: 0.0,
            ..params.clone()
        };
        let specs = problems
            .iter()
            .enumerate()
            .map(|(i, p)| EpisodeSpec {
                id: format!("eval-p{i}"),
                group: format!("eval-p{i}"),
                problem: p.clone(),
            })
            .collect();
        let ctx = self.context(tokenizer, &greedy);
        let r = ctx.run(engine, policy, 0, &self.runtime, specs);
        let n = r.episodes.len().max(1) as f64;
        EvalResult {
            accuracy: r.episodes.iter().filter(|e| e.correct).count() as f64 / n,
            mean_reward: r.episodes.iter().map(|e| e.trajectory.reward).sum::<f64>() / n,
        }
    }

    /// A demonstration episode as one supervised row: the task's demonstrated messages (each
    /// ending with `eos`) are trained on; the environment's replies between them, inserted by
    /// the same rule as in rollouts, are not.
    pub fn demonstration_row(
        &self,
        tokenizer: &Tokenizer,
        params: &SamplingParams,
        eos: u32,
        rng: &mut TaskRng,
    ) -> Result<TrainRow> {
        let ctx = self.context(tokenizer, params);
        let problem = self.task.sample(rng);
        let mut tokens = ctx.prompt_ids(&problem)?;
        let prompt_len = tokens.len();
        let mut mask = Vec::new();
        let mut env = self.task.start(&problem);
        let mut messages = vec![Message::user(&problem.prompt)];
        let mut transcript: Vec<Turn> = Vec::new();
        for _ in 0..self.limits.max_turns {
            let message = self.task.demonstration_turn(&problem, &transcript, rng);
            let mut ids = tokenizer.encode(&message, false)?;
            ids.push(eos);
            mask.extend(std::iter::repeat_n(1u8, ids.len()));
            tokens.extend(ids);
            match env.step(&message)? {
                EnvStep::Done(_) => break,
                EnvStep::Continue {
                    messages: reply, ..
                } => {
                    let inserted = ctx.inserted_text(&mut messages, &message, &reply)?;
                    let ids = tokenizer.encode(&inserted, false)?;
                    mask.extend(std::iter::repeat_n(0u8, ids.len()));
                    tokens.extend(ids);
                    transcript.push(Turn { message, reply });
                }
            }
        }
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
