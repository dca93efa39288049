//! What a run trains on, chosen once from the config: single-turn prompts (a built-in task or
//! a dataset) or a multi-turn environment (built in, or in environment workers). The choice is
//! made before the policy exists (a from-scratch model needs the task's alphabet and context),
//! and becomes a [`Workload`] once it does.

use super::dataset::{task_from_config, Data};
use super::env_worker::WorkerTask;
use super::external::External;
use super::multi_turn::{MultiTurn, MIN_AGENT_POSITIONS};
use super::prompts::{PromptTask, Prompts};
use super::{Workload, WorkloadState};
use crate::model::Model;
use crate::trainer::config::{AgentKind, TrainConfig};
use anyhow::Result;
use skein_tasks::{AgentTask, Task};
use skein_text::Tokenizer;

pub enum Tasks {
    /// Single prompts, answered once each (by the trainer's engine, or by external agents).
    Prompts {
        task: Box<dyn Task>,
        data: Option<Data>,
    },
    /// Episodes of a multi-turn environment.
    MultiTurn(Box<dyn AgentTask>),
}

impl Tasks {
    pub fn from_config(cfg: &TrainConfig) -> Result<Self> {
        if cfg.agent.kind == AgentKind::EnvWorker {
            return Ok(Tasks::MultiTurn(Box::new(WorkerTask::start(cfg)?)));
        }
        if let Some(task) = multi_turn_task(cfg)? {
            return Ok(Tasks::MultiTurn(task));
        }
        let (task, data) = task_from_config(cfg)?;
        Ok(Tasks::Prompts { task, data })
    }

    /// Every character the task's text uses: the vocabulary of a from-scratch model.
    pub fn alphabet(&self) -> &str {
        match self {
            Tasks::Prompts { task, .. } => task.alphabet(),
            Tasks::MultiTurn(task) => task.alphabet(),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Tasks::Prompts { task, .. } => task.name(),
            Tasks::MultiTurn(task) => task.name(),
        }
    }

    /// Context a from-scratch model needs at least.
    pub fn min_positions(&self) -> usize {
        match self {
            Tasks::Prompts { .. } => 0,
            Tasks::MultiTurn(_) => MIN_AGENT_POSITIONS,
        }
    }

    /// The run's rollout source, continuing from `state` (a resumed run's) or from the seed.
    pub fn into_workload(
        self,
        cfg: &TrainConfig,
        tokenizer: &Tokenizer,
        policy: &Model,
        state: Option<&WorkloadState>,
    ) -> Result<Box<dyn Workload>> {
        let rng_state = state.map_or(cfg.run.seed, |s| s.task_rng);
        match self {
            Tasks::MultiTurn(task) => Ok(Box::new(MultiTurn::new(
                cfg, task, tokenizer, policy, rng_state,
            )?)),
            Tasks::Prompts { task, data } => {
                if let (Some(d), Some(s)) = (&data, state) {
                    d.train.seek(s.data_position);
                }
                let device = policy.vs.device();
                let prompts = PromptTask::new(cfg, task, data, tokenizer, rng_state, device)?;
                match cfg.agent.kind {
                    AgentKind::External => {
                        Ok(Box::new(External::start(cfg, prompts, tokenizer, policy)?))
                    }
                    // An environment worker is always multi-turn (above).
                    AgentKind::Builtin | AgentKind::EnvWorker => {
                        let buffer = state.map(|s| s.buffer.clone()).unwrap_or_default();
                        Ok(Box::new(Prompts::new(cfg, prompts, buffer)))
                    }
                }
            }
        }
    }
}

/// The built-in multi-turn task `task.name` names, if it is one (a dataset is always
/// single-turn; an environment worker replaces `task.name`).
pub fn multi_turn_task(cfg: &TrainConfig) -> Result<Option<Box<dyn AgentTask>>> {
    if !cfg.data.train_files.is_empty() || cfg.agent.kind == AgentKind::EnvWorker {
        return Ok(None);
    }
    Ok(skein_tasks::agent_task_by_name(&cfg.task.name, cfg.task.difficulty).transpose()?)
}
