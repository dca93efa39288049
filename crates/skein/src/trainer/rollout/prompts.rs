//! Single-turn prompts as a workload: problems of a built-in task or a dataset, `n` samples
//! each, scored as they finish, with partial rollout (`buffer.rs`) or dynamic sampling
//! (`dynamic.rs`) when one is on.
//! [`PromptTask`] is what every single-turn source shares — the task, its sampler, the
//! held-out prompts, demonstrations and the reward sources — so external agents reuse it.

use super::buffer::{GroupBuffer, IterationConfig};
use super::dataset::{continuation_ids, eval_seed, prompt_batch, prompt_ids, rewarder, Data};
use super::dynamic::{DrawStats, DynamicSampling};
use super::judge::{answer_prompts, Answering, PromptBatch};
use super::stats::{SourceStats, StepRollout};
use super::trajectory_info::TrajectoryInfo;
use super::{draw, evaluation_problems, EvalResult, StepContext, Workload, WorkloadState};
use crate::engine::SamplingParams;
use crate::trainer::batch::TrainRow;
use crate::trainer::config::{CorrectBy, TrainConfig};
use crate::trainer::sft::sft_row;
use anyhow::Result;
use serde_json::Value;
use skein_plan::{Status, Trajectory};
use skein_reward::Rewarder;
use skein_tasks::{splits, Problem, Split, Task, TaskRng};
use skein_text::Tokenizer;
use tch::Device;

/// A single-turn task with its sampler, held-out prompts and reward sources.
pub struct PromptTask {
    pub task: Box<dyn Task>,
    pub data: Option<Data>,
    pub rng: TaskRng,
    /// Held-out prompts, drawn once from a seed training never uses.
    pub eval: PromptBatch,
    /// The `[reward]` sources; None: the task's checker is the reward.
    pub rewarder: Option<Rewarder>,
    /// What decides `correct`, in training and in evaluation (`eval.correct_by`).
    pub correct_by: CorrectBy,
    /// Training draws only training problems (the task is split).
    split: bool,
    /// Evaluation is on problems training never sees.
    pub held_out: bool,
    /// The longest prompt of a built-in task in tokens, over the evaluation problems and
    /// [`PROMPT_PROBE_DRAWS`] draws; 0 for a dataset, whose rows are checked one by one.
    longest_prompt: usize,
    /// With `sft.demonstrations`: the warm-up's problems come from a stream of their own,
    /// the same for every `run.seed`, as a dataset of written solutions is.
    warm_up_rng: Option<TaskRng>,
}

/// The seed of the warm-up's fixed set of problems (`sft.demonstrations`).
const WARM_UP_SET_SEED: u64 = 0x0005_e70f_de30;

/// Draws that measure how long a built-in task's prompts get.
const PROMPT_PROBE_DRAWS: usize = 1024;

impl PromptTask {
    pub fn new(
        cfg: &TrainConfig,
        task: Box<dyn Task>,
        data: Option<Data>,
        tokenizer: &Tokenizer,
        rng_state: u64,
        device: Device,
    ) -> Result<Self> {
        let rewarder = rewarder(cfg, data.as_ref(), device)?;
        let correct_by = cfg.correct_by().map_err(anyhow::Error::msg)?;
        let seed = eval_seed(cfg.run.seed);
        // A built-in task large enough is split; a dataset's held-out rows are its validation
        // files.
        let split = data.is_none() && splits(task.problem_count());
        let (eval, held_out) = match &data {
            Some(d) => (
                d.eval_batch(tokenizer, cfg.eval.problems, seed)?,
                !d.val.is_empty(),
            ),
            None => {
                let (problems, split) = evaluation_problems(
                    task.name(),
                    task.problem_count(),
                    cfg.eval.problems,
                    seed,
                    |r| task.sample(r),
                )?;
                (prompt_batch(problems, tokenizer, task.as_ref())?, split)
            }
        };
        let longest_prompt = match &data {
            Some(_) => 0,
            None => {
                let mut rng = TaskRng::new(seed ^ 0x5eed);
                let draws = (0..PROMPT_PROBE_DRAWS)
                    .map(|_| task.sample(&mut rng))
                    .collect();
                let probe = prompt_batch(draws, tokenizer, task.as_ref())?;
                eval.prompt_ids
                    .iter()
                    .chain(&probe.prompt_ids)
                    .map(Vec::len)
                    .max()
                    .unwrap_or(0)
            }
        };
        Ok(PromptTask {
            longest_prompt,
            warm_up_rng: (cfg.sft.demonstrations > 0).then(|| TaskRng::new(WARM_UP_SET_SEED)),
            task,
            data,
            rng: TaskRng::new(rng_state),
            eval,
            rewarder,
            correct_by,
            split,
            held_out,
        })
    }

    /// How this task's prompts are answered in `ctx`.
    pub fn answering<'a>(&'a self, ctx: &StepContext<'a>) -> Answering<'a> {
        Answering {
            engine: ctx.engine,
            policy: ctx.policy,
            version: ctx.version,
            task: self.task.as_ref(),
            tokenizer: ctx.tokenizer,
            params: ctx.sampling,
            rewarder: self.rewarder.as_ref(),
            correct_by: &self.correct_by,
        }
    }

    /// Greedy answers to the held-out prompts.
    pub fn evaluate(&self, ctx: &StepContext) -> EvalResult {
        let greedy = SamplingParams {
            temperature: 0.0,
            ..ctx.sampling.clone()
        };
        let a = Answering {
            params: &greedy,
            version: 0,
            ..self.answering(ctx)
        };
        let r = answer_prompts(&a, &self.eval, 1, "eval");
        EvalResult::of(r.trajectories.iter().zip(r.correct.iter().copied()))
    }

    /// A supervised row: a problem's prompt, then its demonstrated answer and the stop token.
    pub fn demonstration(
        &mut self,
        tokenizer: &Tokenizer,
        sampling: &SamplingParams,
    ) -> Result<TrainRow> {
        let eos = StepContext::stop_token(sampling)?;
        let problem = match &mut self.warm_up_rng {
            Some(rng) => {
                let task = self.task.as_ref();
                let split = self.split.then_some(Split::Train);
                draw(task.name(), split, rng, |r| task.sample(r))?
            }
            None => self.next_problem()?,
        };
        // A careless teacher's answers come from the same stream as the problems: a fixed set
        // (`sft.demonstrations`) is then the same, answers included, for every `run.seed`.
        let teacher = self.warm_up_rng.as_mut().unwrap_or(&mut self.rng);
        let demo = self.task.demonstration(&problem, teacher);
        let task = self.task.as_ref();
        let prompt = prompt_ids(tokenizer, task, &problem.prompt)?;
        let mut response = continuation_ids(tokenizer, task, &problem.prompt, &prompt, &demo)?;
        response.push(eos);
        Ok(sft_row(&prompt, &response))
    }

    /// The next training problem.
    pub fn next_problem(&mut self) -> Result<Problem> {
        let split = self.split.then_some(Split::Train);
        let task = self.task.as_ref();
        draw(task.name(), split, &mut self.rng, |r| task.sample(r))
    }

    pub fn state(&self, buffer: &GroupBuffer) -> WorkloadState {
        WorkloadState {
            task_rng: self.rng.state(),
            data_position: self.data.as_ref().map_or(0, |d| d.train.position()),
            buffer: buffer.clone(),
        }
    }

    pub fn data_metrics(&self, first: bool) -> Vec<(&'static str, Value)> {
        match (&self.data, first) {
            (Some(d), true) => d.counts.metrics().map(|(k, v)| (k, v.into())).to_vec(),
            (Some(d), false) => vec![("data/epoch", d.train.epoch().into())],
            (None, _) => Vec::new(),
        }
    }
}

/// Single-turn prompts answered by the trainer's engine.
pub struct Prompts {
    task: PromptTask,
    buffer: GroupBuffer,
    iteration: IterationConfig,
    /// With `rollout.skip_zero_variance_groups`.
    dynamic: Option<DynamicSampling>,
    /// What the last step's dynamic sampling drew, for its metrics.
    last_draw: Option<DrawStats>,
}

impl Prompts {
    /// `buffer` holds the groups a resumed run had in flight.
    pub fn new(cfg: &TrainConfig, task: PromptTask, buffer: GroupBuffer) -> Self {
        Prompts {
            task,
            buffer,
            iteration: IterationConfig::from_config(cfg),
            dynamic: DynamicSampling::from_config(cfg),
            last_draw: None,
        }
    }
}

impl Workload for Prompts {
    fn rollout(&mut self, ctx: &StepContext) -> Result<StepRollout> {
        let PromptTask {
            task,
            rng,
            rewarder,
            correct_by,
            split,
            ..
        } = &mut self.task;
        let train = split.then_some(Split::Train);
        let mut next_prompt = || -> Result<_> {
            let problem = draw(task.name(), train, rng, |r| task.sample(r))?;
            let ids = prompt_ids(ctx.tokenizer, task.as_ref(), &problem.prompt)?;
            Ok((problem, ids))
        };
        let answering = Answering {
            engine: ctx.engine,
            policy: ctx.policy,
            version: ctx.version,
            task: task.as_ref(),
            tokenizer: ctx.tokenizer,
            params: ctx.sampling,
            rewarder: rewarder.as_ref(),
            correct_by,
        };
        let (buffer, iteration) = (&mut self.buffer, &self.iteration);
        let (it, drawn) = match &self.dynamic {
            None => (
                buffer.collect_step(&answering, iteration, &mut next_prompt)?,
                None,
            ),
            Some(d) => {
                let context = ctx.policy.net.max_positions() as usize;
                let (it, draw) =
                    d.collect(buffer, &answering, iteration, &mut next_prompt, context)?;
                draw.warn_if_empty(ctx.step);
                let drawn = draw.groups.clone();
                self.last_draw = Some(draw);
                (it, Some(drawn))
            }
        };
        let source = SourceStats::Prompts {
            // Logged with partial rollout on, and in a resumed run's step that finishes groups
            // a run with it on carried: their tokens are stale, and the figures say how much.
            partial: (self.iteration.token_budget.is_some() || it.stats.resumed > 0)
                .then_some(it.stats),
            rewards: rewarder.as_ref().map(|r| it.rewards.metrics(r)),
        };
        let max_new_tokens = ctx.sampling.max_new_tokens;
        let remote = matches!(ctx.engine, crate::engine::Generator::Remote(_));
        let info = it
            .trajectories
            .iter()
            .zip(it.sources)
            .map(|(t, source)| TrajectoryInfo {
                source,
                cutoff: (t.status == Status::Truncated)
                    .then(|| cutoff(t, max_new_tokens, remote).into()),
                ..TrajectoryInfo::of(t)
            })
            .collect();
        let mut rollout =
            StepRollout::new(it.trajectories, it.correct, it.engine, ctx.version, source);
        if let Some(drawn) = drawn {
            rollout = rollout.with_drawn(drawn);
        }
        Ok(rollout.with_info(info))
    }

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
        self.task.state(&self.buffer)
    }

    fn data_metrics(&self, first: bool) -> Vec<(&'static str, Value)> {
        let mut m = self.task.data_metrics(first);
        if let (false, Some(draw)) = (first, &self.last_draw) {
            m.extend(draw.metrics());
        }
        m
    }

    fn held_out(&self) -> bool {
        self.task.held_out
    }

    fn eval_problems(&self) -> usize {
        self.task.eval.problems.len()
    }

    fn longest_prompt(&self) -> usize {
        self.task.longest_prompt
    }
}

/// Which limit cut a truncated single-turn sample: its response reached
/// `max_new_tokens`, or, shorter than that, it ran out of the engine's positions (a remote
/// server's may be fewer than the model's).
fn cutoff(t: &Trajectory, max_new_tokens: usize, remote: bool) -> &'static str {
    let response: usize = t.transitions.iter().map(|x| x.response.len()).sum();
    if response >= max_new_tokens {
        "the response length limit (rollout.sampling.max_new_tokens)"
    } else if remote {
        "the engine's context (model.max_positions, or the remote server's own)"
    } else {
        "the model's context (model.max_positions)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A truncated sample names the key that cut it, a real one: the length limit when its
    /// response reached it, the model's context when it stopped short of it.
    #[test]
    fn a_truncated_sample_names_the_limit_that_cut_it() {
        let sample = |response: usize| Trajectory {
            id: "t".into(),
            group: "g".into(),
            transitions: vec![skein_plan::Transition {
                prompt: vec![1; 4],
                response: vec![2; response],
                loss_mask: vec![1; response],
                logprobs: vec![0.0; response],
                versions: vec![0; response],
                kept: Default::default(),
                reward: None,
                state: None,
            }],
            reward: 0.0,
            status: Status::Truncated,
        };
        assert!(cutoff(&sample(8), 8, false).contains("(rollout.sampling.max_new_tokens)"));
        assert!(cutoff(&sample(5), 8, false).contains("(model.max_positions)"));
        assert!(cutoff(&sample(5), 8, true).contains("remote server"));
    }

    /// The first `n` warm-up rows of a run with `run_seed` (its training stream), a careless
    /// teacher and a fixed set of demonstrations.
    fn warm_up_rows(run_seed: u64, n: usize) -> Vec<Vec<u32>> {
        let mut cfg = TrainConfig::default();
        cfg.sft.demonstrations = 64;
        cfg.eval.problems = 4;
        let task = skein_tasks::task_with_teacher("arithmetic", 2, Some(0.7)).unwrap();
        let tokenizer = Tokenizer::char_level(task.alphabet()).unwrap();
        let mut t = PromptTask::new(&cfg, task, None, &tokenizer, run_seed, Device::Cpu).unwrap();
        let sampling = SamplingParams {
            stop_token_ids: tokenizer.eos_token_ids().to_vec(),
            ..SamplingParams::default()
        };
        (0..n)
            .map(|_| t.demonstration(&tokenizer, &sampling).unwrap().tokens)
            .collect()
    }

    /// A fixed set of demonstrations is the same for every run seed, the careless teacher's
    /// answers included: they come from the set's own stream, not the run's.
    #[test]
    fn a_fixed_warm_up_set_is_the_same_for_every_seed_answers_included() {
        let rows = warm_up_rows(1, 64);
        assert_eq!(rows, warm_up_rows(2, 64));
        assert_eq!(rows, warm_up_rows(99, 64));
    }
}
