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
use skein_tasks::{AgentTask, Task, TaskRng};
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
            let task = WorkerTask::start(cfg)?;
            warn_of_repeated_seeds(cfg, task.problem_count());
            return Ok(Tasks::MultiTurn(Box::new(task)));
        }
        let tasks = match multi_turn_task(cfg)? {
            Some(task) => Tasks::MultiTurn(task),
            None => {
                let (task, data) = task_from_config(cfg)?;
                Tasks::Prompts { task, data }
            }
        };
        tasks.check_direct_share(cfg)?;
        Ok(tasks)
    }

    /// `sft.direct_share` needs demonstrations that can go without a tool.
    fn check_direct_share(&self, cfg: &TrainConfig) -> Result<()> {
        if cfg.sft.direct_share == 0.0 || cfg.sft.direct_steps == 0 {
            return Ok(());
        }
        let direct = match self {
            Tasks::MultiTurn(task) => {
                let problem = task.sample(&mut TaskRng::new(cfg.run.seed));
                task.direct_answer(&problem).is_some()
            }
            Tasks::Prompts { .. } => false,
        };
        anyhow::ensure!(
            direct,
            "`sft.direct_share` is {}, but the demonstrations of `{}` have no answer without \
             tools (only a multi-turn task with tools has them, such as `calculator`): set it to 0",
            cfg.sft.direct_share,
            self.name()
        );
        Ok(())
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

    /// What the run trains on, for its first line: an environment worker by its command and
    /// the environment its `info` names, a dataset by its files, a built-in task by its name
    /// and `task.difficulty` (which only a built-in task has).
    pub fn describe(&self, cfg: &TrainConfig) -> String {
        match self {
            Tasks::MultiTurn(task) if cfg.agent.kind == AgentKind::EnvWorker => {
                let problems = task
                    .problem_count()
                    .map_or(String::new(), |n| format!(", {n} problems"));
                format!(
                    "environment worker `{}` (environment `{}`{problems})",
                    cfg.agent.command.join(" "),
                    task.name()
                )
            }
            Tasks::Prompts { data: Some(_), .. } => self.name().to_string(),
            _ => format!(
                "task `{}` (difficulty {})",
                self.name(),
                cfg.task.difficulty
            ),
        }
    }

    /// Context a from-scratch model needs at least.
    pub fn min_positions(&self) -> usize {
        match self {
            Tasks::Prompts { .. } => 0,
            Tasks::MultiTurn(_) => MIN_AGENT_POSITIONS,
        }
    }

    /// A loaded dataset's longest prompt in tokens (None: the run has no dataset).
    pub fn longest_loaded_prompt(&self) -> Option<usize> {
        match self {
            Tasks::Prompts { data: Some(d), .. } => Some(d.longest_prompt),
            _ => None,
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

/// An environment worker's evaluation draws `eval.problems` distinct seeds, and the worker
/// maps them onto its problems in a way skein cannot see (the example, at random): two seeds
/// may be one problem, and with more seeds than `problems` some certainly are. Said once, at
/// start-up, in that case, so `eval/problems` is not read as distinct problems.
fn warn_of_repeated_seeds(cfg: &TrainConfig, problems: Option<u64>) {
    if let Some(k) = problems.filter(|&k| k < cfg.eval.problems as u64) {
        eprintln!(
            "skein: warning: the evaluation draws {} seeds of an environment of {k} problems: \
             some problems are evaluated several times, and `eval/accuracy` weighs each by how \
             many of its seeds were drawn (`eval/problems` counts seeds)",
            cfg.eval.problems
        );
    }
}

/// Context a from-scratch model for `cfg` gets at least (more for multi-turn episodes), known
/// before any environment starts.
pub fn min_positions(cfg: &TrainConfig) -> usize {
    if is_multi_turn(cfg) {
        MIN_AGENT_POSITIONS
    } else {
        0
    }
}

/// Whether `cfg` trains on episodes (environment workers, or a built-in multi-turn task), known
/// before any environment starts; a task that cannot be built counts as multi-turn, so its
/// error is reported where the task is loaded.
pub fn is_multi_turn(cfg: &TrainConfig) -> bool {
    cfg.agent.kind == AgentKind::EnvWorker || !matches!(multi_turn_task(cfg), Ok(None))
}

/// The built-in multi-turn task `task.name` names, if it is one (a dataset is always
/// single-turn; an environment worker replaces `task.name`).
pub fn multi_turn_task(cfg: &TrainConfig) -> Result<Option<Box<dyn AgentTask>>> {
    if !cfg.data.train_files.is_empty() || cfg.agent.kind == AgentKind::EnvWorker {
        return Ok(None);
    }
    Ok(skein_tasks::agent_task_by_name(&cfg.task.name, cfg.task.difficulty).transpose()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::SamplingParams;
    use tch::Device;

    fn config(task: &str, direct_share: f64) -> TrainConfig {
        let mut cfg = TrainConfig::default();
        cfg.task.name = task.into();
        cfg.task.difficulty = 1;
        cfg.sft.direct_steps = 100;
        cfg.sft.direct_share = direct_share;
        cfg
    }

    /// The workload `cfg` makes for a random model of `positions` positions, with its tokenizer
    /// and sampling settings that stop at its end-of-sequence token.
    fn workload_of(
        cfg: &TrainConfig,
        positions: usize,
    ) -> (Tokenizer, Box<dyn Workload>, SamplingParams) {
        let tasks = Tasks::from_config(cfg).unwrap();
        let tokenizer = Tokenizer::char_level(tasks.alphabet()).unwrap();
        let mc = cfg.model.tiny_config(tokenizer.vocab_size(), positions);
        let policy = Model::random(&mc, Device::Cpu, 0).unwrap();
        let workload = tasks.into_workload(cfg, &tokenizer, &policy, None).unwrap();
        let sampling = SamplingParams {
            stop_token_ids: tokenizer.eos_token_ids().to_vec(),
            ..SamplingParams::default()
        };
        (tokenizer, workload, sampling)
    }

    /// How many of `n` demonstration rows of `calculator` answer at once under
    /// `sft.direct_share`. A row that calls the tool holds the tool's reply, which carries no
    /// loss.
    fn direct_rows(direct_share: f64, n: usize) -> usize {
        let (tokenizer, mut workload, sampling) =
            workload_of(&config("calculator", direct_share), 256);
        (0..n)
            .filter(|_| {
                let row = workload
                    .demonstration(&tokenizer, &sampling, direct_share)
                    .unwrap();
                let text = tokenizer.decode(&row.tokens, true).unwrap();
                let direct = row.loss_mask.iter().all(|&m| m == 1);
                assert_eq!(direct, !text.contains("<tool_call>"), "{text}");
                direct
            })
            .count()
    }

    #[test]
    fn a_direct_share_of_calculator_demonstrations_answers_without_the_tool() {
        assert_eq!(direct_rows(0.0, 64), 0);
        assert_eq!(direct_rows(1.0, 64), 64);
        let half = direct_rows(0.5, 200);
        // Binomial(200, 0.5): 100 ± 7 (one standard deviation).
        assert!((70..=130).contains(&half), "{half} of 200");
    }

    /// The first `n` warm-up prompts of `arithmetic` for `seed`, with `sft.demonstrations`.
    fn warm_up_prompts(seed: u64, demonstrations: usize, n: usize) -> Vec<Vec<u32>> {
        let mut cfg = TrainConfig::default();
        cfg.run.seed = seed;
        cfg.task.difficulty = 3;
        cfg.sft.demonstrations = demonstrations;
        let (tokenizer, mut workload, sampling) = workload_of(&cfg, 64);
        (0..n)
            .map(|_| {
                let row = workload.demonstration(&tokenizer, &sampling, 0.0).unwrap();
                row.tokens[..row.prompt_len].to_vec()
            })
            .collect()
    }

    /// A fixed set of demonstrations is a dataset: the same problems whatever the seed. Without
    /// one, each seed draws its own.
    #[test]
    fn the_warm_up_set_is_the_same_for_every_seed() {
        assert_eq!(warm_up_prompts(0, 50, 20), warm_up_prompts(7, 50, 20));
        assert_ne!(warm_up_prompts(0, 0, 20), warm_up_prompts(7, 0, 20));
    }

    /// Only a built-in task has a difficulty; a dataset is named by its files.
    #[test]
    fn a_run_is_described_by_what_it_trains_on() {
        let cfg = config("guess", 0.0);
        let d = Tasks::from_config(&cfg).unwrap().describe(&cfg);
        assert_eq!(d, "task `guess` (difficulty 1)");
        let dir = std::env::temp_dir().join(format!("skein-describe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("train.jsonl");
        let row = r#"{"prompt":[{"role":"user","content":"1+1="}],"data_source":"d","reward_model":{"ground_truth":"2"}}"#;
        std::fs::write(&file, format!("{row}\n")).unwrap();
        let mut cfg = TrainConfig::default();
        cfg.data.train_files = vec![file.display().to_string()];
        let d = Tasks::from_config(&cfg).unwrap().describe(&cfg);
        assert_eq!(d, format!("dataset {}", file.display()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_direct_share_needs_a_task_that_can_answer_without_tools() {
        for task in ["arithmetic", "guess"] {
            let e = Tasks::from_config(&config(task, 0.5)).err().unwrap();
            let e = format!("{e:#}");
            assert!(e.contains("`sft.direct_share`") && e.contains(task), "{e}");
        }
        // Without its stage the share has nothing to act on.
        let mut cfg = config("arithmetic", 0.5);
        cfg.sft.direct_steps = 0;
        assert!(Tasks::from_config(&cfg).is_ok());
    }
}
