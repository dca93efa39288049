//! The rollout of single-turn prompts for one training step, with partial rollout: every sample may generate at most
//! a token budget per iteration; one that reaches it pauses with its token ids, behavior
//! log-probs and policy versions, and continues first in the next iteration, from those ids,
//! under the then-current weights (the engine recomputes its KV cache from the ids). A group
//! enters training only when all its samples have finished, and a group whose oldest token
//! would be more than `max_staleness` versions behind the trainer is dropped whole or
//! finished first. With no budget this is the ordinary synchronous rollout.
//!
//! The buffer of groups in flight is plain data (serde), so a checkpoint carries it.

use super::judge::{apply_reward, score_response, single_turn, Answering, Sampled};
use super::reward::{request, RewardStats, RoundRewards};
use crate::engine::{EngineStats, Finish, GenRequest, SamplingParams};
use crate::trainer::config::{OnStale, TrainConfig};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use skein_plan::Trajectory;
use skein_tasks::Problem;

#[derive(Debug, Clone)]
pub struct IterationConfig {
    /// Samples per group.
    pub samples: usize,
    /// New groups started at the beginning of each iteration.
    pub new_groups: usize,
    /// Complete groups the step needs; later rounds of the same iteration start more groups
    /// until it has them (at most `new_groups + min_groups` new groups per iteration).
    pub min_groups: usize,
    /// Most new tokens per sample and iteration; None runs every sample to its end.
    pub token_budget: Option<usize>,
    pub max_staleness: u64,
    pub on_stale: OnStale,
    /// Versions one training step advances (mini-batches × epochs).
    pub versions_per_step: u64,
}

impl IterationConfig {
    /// Synchronous (every sample to its end) unless partial rollout is on.
    pub fn from_config(cfg: &TrainConfig) -> Self {
        let p = &cfg.rollout.partial;
        let groups = cfg.rollout.prompts_per_step;
        IterationConfig {
            samples: cfg.rollout.samples_per_prompt,
            new_groups: groups,
            min_groups: if p.enabled && p.min_groups > 0 {
                p.min_groups
            } else {
                groups
            },
            token_budget: p.enabled.then_some(p.token_budget),
            // Without partial rollout, the groups a resumed run carries (paused by a run that
            // had it on) all finish in its first step, whatever their age: none is dropped by
            // a cap this run does not set.
            max_staleness: if p.enabled { p.max_staleness } else { u64::MAX },
            on_stale: p.on_stale,
            versions_per_step: (cfg.trainer.num_mini_batches * cfg.trainer.ppo_epochs) as u64,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Sample {
    /// Submitted to the engine in the current round.
    Running,
    /// Tokens it generated so far.
    Paused(Sampled),
    Done {
        trajectory: Trajectory,
        correct: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub id: String,
    pub problem: Problem,
    pub prompt: Vec<u32>,
    pub samples: Vec<Sample>,
}

impl Group {
    fn is_complete(&self) -> bool {
        self.samples
            .iter()
            .all(|s| matches!(s, Sample::Done { .. }))
    }

    /// The policy version of the group's oldest sampled token, finished samples included
    /// (they wait for their siblings and age with them).
    fn oldest_version(&self) -> Option<u64> {
        self.samples
            .iter()
            .flat_map(|s| -> Box<dyn Iterator<Item = u64> + '_> {
                match s {
                    Sample::Running => Box::new(std::iter::empty()),
                    Sample::Paused(p) => Box::new(p.versions.iter().copied()),
                    Sample::Done { trajectory, .. } => Box::new(
                        trajectory
                            .transitions
                            .iter()
                            .flat_map(|t| t.versions.iter().copied()),
                    ),
                }
            })
            .min()
    }

    fn paused(&self) -> usize {
        self.samples
            .iter()
            .filter(|s| matches!(s, Sample::Paused(_)))
            .count()
    }
}

/// How a waiting group's paused samples take part in a round.
#[derive(Debug, Clone, Copy)]
enum Resume {
    /// Not in this round.
    Wait,
    /// At most this many more tokens each.
    Budget(usize),
    /// To their end.
    ToEnd,
}

/// Groups in flight between iterations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupBuffer {
    pub groups: Vec<Group>,
    /// Numbers the groups, so ids stay unique across steps and resumes.
    pub next_group: u64,
}

/// What one iteration did, for the step's metrics.
#[derive(Debug, Clone, Default)]
pub struct PartialStats {
    /// Requests the engine ran (new samples and resumed ones).
    pub requests: usize,
    /// Samples that reached the budget and were paused.
    pub paused: usize,
    /// Paused samples continued in this iteration.
    pub resumed: usize,
    /// Samples discarded because their group exceeded the staleness cap.
    pub dropped_stale: usize,
    /// Groups still waiting in the buffer after this iteration.
    pub waiting_groups: usize,
    pub rounds: usize,
    /// Waiting groups run to their end because the iteration was still short of
    /// `min_groups` complete after starting all the new groups it may.
    pub filled_groups: usize,
}

impl PartialStats {
    pub fn budget_hit_fraction(&self) -> f64 {
        self.paused as f64 / self.requests.max(1) as f64
    }
}

/// What one iteration produced: the complete groups, flattened (groups in order, samples in
/// order), and its counters.
#[derive(Default)]
pub struct Iteration {
    pub trajectories: Vec<Trajectory>,
    /// Parallel to `trajectories`: whether the task judged the answer correct.
    pub correct: Vec<bool>,
    /// Parallel to `trajectories`: the `data_source` of its problem.
    pub sources: Vec<String>,
    pub engine: EngineStats,
    pub stats: PartialStats,
    /// Rewards of every sample that finished in this iteration's rounds.
    pub rewards: RewardStats,
}

/// An iteration so far: its complete groups and its counters.
#[derive(Default)]
struct Tally {
    complete: Vec<Group>,
    engine: EngineStats,
    stats: PartialStats,
    rewards: RewardStats,
}

impl Iteration {
    /// The complete groups' trajectories, flattened, with the iteration's counters.
    fn of(tally: Tally) -> Iteration {
        let mut out = Iteration {
            trajectories: Vec::new(),
            correct: Vec::new(),
            sources: Vec::new(),
            engine: tally.engine,
            stats: tally.stats,
            rewards: tally.rewards,
        };
        for g in tally.complete {
            for s in g.samples {
                if let Sample::Done {
                    trajectory,
                    correct,
                } = s
                {
                    out.trajectories.push(trajectory);
                    out.correct.push(correct);
                    out.sources.push(g.problem.data_source.clone());
                }
            }
        }
        out
    }
}

/// Where new prompts come from: a problem and its prompt token ids.
pub type PromptSource<'a> = dyn FnMut() -> Result<(Problem, Vec<u32>)> + 'a;

impl GroupBuffer {
    /// Paused samples waiting for the next iteration.
    pub fn paused_samples(&self) -> usize {
        self.groups.iter().map(Group::paused).sum()
    }

    /// Runs one iteration at policy `version`: resumes paused samples first, starts new
    /// groups, and returns every group that is complete: at least `min_groups` of them.
    pub fn collect_step(
        &mut self,
        r: &Answering,
        cfg: &IterationConfig,
        next_prompt: &mut PromptSource,
    ) -> Result<Iteration> {
        let mut tally = Tally::default();
        let finish_now = self.enforce_staleness(r.version, cfg, &mut tally.stats);
        let mut started = 0;
        let limit = cfg.new_groups + cfg.min_groups;
        loop {
            // Request id i answers sample `slots[i]` (group, sample): a table, not arithmetic
            // on `cfg.samples`, so a group resumed from a checkpoint keeps its own size.
            let mut slots = Vec::new();
            let mut requests = Vec::new();
            let to_start = if tally.stats.rounds == 0 {
                let resume = |gi: usize| match cfg.token_budget {
                    Some(budget) if !finish_now[gi] => Resume::Budget(budget),
                    _ => Resume::ToEnd,
                };
                requests = self.resume_requests(r.params, resume, &mut slots);
                tally.stats.resumed = requests.len();
                cfg.new_groups
            } else {
                cfg.min_groups
                    .saturating_sub(tally.complete.len())
                    .min(limit.saturating_sub(started))
            };
            if tally.stats.rounds > 0 && to_start == 0 {
                break;
            }
            for _ in 0..to_start {
                let (problem, prompt) = next_prompt()?;
                self.start_group(problem, prompt, r.params, cfg, &mut slots, &mut requests);
            }
            started += to_start;
            self.round(r, slots, requests, &mut tally);
            if tally.complete.len() >= cfg.min_groups {
                break;
            }
        }
        // Still short after starting all the groups it may: the oldest waiting groups run to
        // their end, as a synchronous step's would. A step then never trains fewer groups than
        // it needs, and while nothing trains the policy version stands still, so the staleness
        // cap alone would never finish them.
        let short = cfg.min_groups.saturating_sub(tally.complete.len());
        if short > 0 && !self.groups.is_empty() {
            let resume = |gi: usize| {
                if gi < short {
                    Resume::ToEnd
                } else {
                    Resume::Wait
                }
            };
            let mut slots = Vec::new();
            let requests = self.resume_requests(r.params, resume, &mut slots);
            tally.stats.resumed += requests.len();
            tally.stats.filled_groups = short.min(self.groups.len());
            self.round(r, slots, requests, &mut tally);
        }
        tally.stats.paused = self.paused_samples();
        tally.stats.waiting_groups = self.groups.len();
        Ok(Iteration::of(tally))
    }

    /// Adds a group for `problem`, its samples' requests and their slots.
    fn start_group(
        &mut self,
        problem: Problem,
        prompt: Vec<u32>,
        params: &SamplingParams,
        cfg: &IterationConfig,
        slots: &mut Vec<(usize, usize)>,
        requests: &mut Vec<GenRequest>,
    ) {
        let gi = self.groups.len();
        for k in 0..cfg.samples {
            slots.push((gi, k));
            requests.push(GenRequest {
                id: (slots.len() - 1) as u64,
                prompt: prompt.clone(),
                resumed: Vec::new(),
                params: params.clone(),
                budget: cfg.token_budget,
                session: None,
                watch: None,
            });
        }
        self.groups.push(Group {
            id: format!("g{}", self.next_group),
            problem,
            prompt,
            samples: vec![Sample::Running; cfg.samples],
        });
        self.next_group += 1;
    }

    /// Runs one round of `requests`, counts it in `tally`, and moves the groups it completed
    /// there (the rest keep their order in the buffer: oldest first).
    fn round(
        &mut self,
        r: &Answering,
        slots: Vec<(usize, usize)>,
        requests: Vec<GenRequest>,
        tally: &mut Tally,
    ) {
        tally.stats.requests += requests.len();
        let (round, round_rewards) = self.run_round(r, &slots, requests);
        tally.rewards.add(&round_rewards);
        tally.engine = std::mem::take(&mut tally.engine).combined(round);
        tally.stats.rounds += 1;
        let (done, waiting): (Vec<Group>, Vec<Group>) = std::mem::take(&mut self.groups)
            .into_iter()
            .partition(Group::is_complete);
        self.groups = waiting;
        tally.complete.extend(done);
    }

    /// Drops groups already past the cap; returns, per group, whether its paused samples must
    /// finish in this iteration (`finish-first`: waiting one more step would pass the cap).
    fn enforce_staleness(
        &mut self,
        version: u64,
        cfg: &IterationConfig,
        stats: &mut PartialStats,
    ) -> Vec<bool> {
        let mut kept = Vec::with_capacity(self.groups.len());
        let mut finish_now = Vec::with_capacity(self.groups.len());
        for g in std::mem::take(&mut self.groups) {
            let oldest = g.oldest_version().unwrap_or(version);
            let behind = version.saturating_sub(oldest);
            let next_behind = behind + cfg.versions_per_step;
            let drop = match cfg.on_stale {
                OnStale::Drop => behind > cfg.max_staleness,
                // Normally unreachable (finished in time), but a resumed run may have a
                // tighter cap than the one that paused the samples.
                OnStale::FinishFirst => behind > cfg.max_staleness,
            };
            if drop {
                stats.dropped_stale += g.samples.len();
                continue;
            }
            finish_now
                .push(cfg.on_stale == OnStale::FinishFirst && next_behind > cfg.max_staleness);
            kept.push(g);
        }
        self.groups = kept;
        finish_now
    }

    /// Requests for the paused samples of the groups `resume` does not keep waiting.
    fn resume_requests(
        &self,
        params: &SamplingParams,
        resume: impl Fn(usize) -> Resume,
        slots: &mut Vec<(usize, usize)>,
    ) -> Vec<GenRequest> {
        let mut requests = Vec::new();
        for (gi, g) in self.groups.iter().enumerate() {
            let budget = match resume(gi) {
                Resume::Wait => continue,
                Resume::Budget(b) => Some(b),
                Resume::ToEnd => None,
            };
            for (k, s) in g.samples.iter().enumerate() {
                if let Sample::Paused(p) = s {
                    slots.push((gi, k));
                    requests.push(GenRequest {
                        id: (slots.len() - 1) as u64,
                        prompt: g.prompt.clone(),
                        resumed: p.tokens.clone(),
                        params: params.clone(),
                        budget,
                        session: None,
                        watch: None,
                    });
                }
            }
        }
        requests
    }

    /// Generates `requests`; each output is joined to what its sample had before, then
    /// paused again or scored the moment it finishes: the task's checker inline, configured
    /// reward sources submitted there and collected once generation is over.
    fn run_round(
        &mut self,
        r: &Answering,
        slots: &[(usize, usize)],
        requests: Vec<GenRequest>,
    ) -> (EngineStats, RewardStats) {
        let groups = &mut self.groups;
        let mut round = RoundRewards::new(r.rewarder);
        let stats = r.engine.generate(r.policy, r.version, requests, |out| {
            let (gi, k) = slots[out.id as usize];
            let g = &mut groups[gi];
            let mut part = match std::mem::replace(&mut g.samples[k], Sample::Running) {
                Sample::Paused(p) => p,
                _ => Sampled::default(),
            };
            part.kept
                .extend(part.tokens.len(), &out.kept, out.tokens.len());
            part.tokens.extend(out.tokens);
            part.logprobs.extend(out.logprobs);
            part.versions.extend(out.versions);
            g.samples[k] = if out.finish == Finish::Paused {
                Sample::Paused(part)
            } else {
                let mut judged = score_response(
                    r.task,
                    r.correct_by,
                    r.tokenizer,
                    &g.problem,
                    &part.tokens,
                    out.finish,
                    out.error.as_deref(),
                );
                let id = format!("{}-s{k}", g.id);
                if let (true, Some(text)) = (round.active(), judged.text.take()) {
                    let req = request(id.clone(), &g.problem, &g.prompt, &part.tokens, text);
                    round.submit((gi, k), req);
                }
                let correct = judged.correct;
                Sample::Done {
                    trajectory: single_turn(id, g.id.clone(), g.prompt.clone(), part, judged),
                    correct,
                }
            };
        });
        let rewards = round.finish(|(gi, k), result| {
            if let Sample::Done { trajectory, .. } = &mut self.groups[gi].samples[k] {
                apply_reward(trajectory, result);
            }
        });
        (stats, rewards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Generator;
    use crate::model::{Model, ModelConfig};
    use skein_tasks::Task;
    use skein_tasks::{task_by_name, TaskRng};
    use skein_text::Tokenizer;
    use std::collections::HashMap;
    use tch::Device;

    struct Setup {
        task: Box<dyn Task>,
        tokenizer: Tokenizer,
        model: Model,
        params: SamplingParams,
        rng: TaskRng,
    }

    /// An untrained model: its response lengths are geometric, a natural long tail.
    fn setup() -> Setup {
        let task = task_by_name("reverse", 1).unwrap();
        let tokenizer = Tokenizer::char_level(task.alphabet()).unwrap();
        let cfg = ModelConfig::tiny_qwen2(tokenizer.vocab_size(), 32, 1, 2, 1, 64, 96);
        let model = Model::random(&cfg, Device::Cpu, 3).unwrap();
        let params = SamplingParams {
            max_new_tokens: 24,
            stop_token_ids: tokenizer.eos_token_ids().to_vec(),
            ..Default::default()
        };
        Setup {
            task,
            tokenizer,
            model,
            params,
            rng: TaskRng::new(11),
        }
    }

    fn iteration(budget: Option<usize>, on_stale: OnStale) -> IterationConfig {
        IterationConfig {
            samples: 4,
            new_groups: 6,
            min_groups: 6,
            token_budget: budget,
            max_staleness: 4,
            on_stale,
            versions_per_step: 2,
        }
    }

    fn step(s: &mut Setup, buf: &mut GroupBuffer, v: u64, cfg: &IterationConfig) -> Iteration {
        let (task, tokenizer, rng) = (&s.task, &s.tokenizer, &mut s.rng);
        let mut next = || -> Result<(Problem, Vec<u32>)> {
            let p = task.sample(rng);
            let ids = tokenizer.encode(&p.prompt, false)?;
            Ok((p, ids))
        };
        let engine = Generator::Local(crate::engine::Engine::new(64));
        let rollout = Answering {
            engine: &engine,
            policy: &s.model,
            version: v,
            task: s.task.as_ref(),
            tokenizer: &s.tokenizer,
            params: &s.params,
            rewarder: None,
            correct_by: &crate::trainer::config::CorrectBy::Task,
        };
        buf.collect_step(&rollout, cfg, &mut next).unwrap()
    }

    fn check_whole_groups(out: &Iteration, n: usize) {
        let mut per_group: HashMap<&str, usize> = HashMap::new();
        for t in &out.trajectories {
            *per_group.entry(t.group.as_str()).or_default() += 1;
        }
        assert!(per_group.values().all(|&c| c == n), "{per_group:?}");
    }

    #[test]
    fn without_a_budget_every_group_completes_in_one_round() {
        let mut s = setup();
        let mut buf = GroupBuffer::default();
        let out = step(&mut s, &mut buf, 0, &iteration(None, OnStale::Drop));
        assert_eq!(out.trajectories.len(), 24);
        assert_eq!((out.stats.paused, out.stats.rounds), (0, 1));
        assert!(buf.groups.is_empty());
        check_whole_groups(&out, 4);
    }

    /// The buffer's paused samples by trajectory id, as they paused.
    fn paused(buf: &GroupBuffer) -> HashMap<String, Sampled> {
        buf.groups
            .iter()
            .flat_map(|g| {
                g.samples
                    .iter()
                    .enumerate()
                    .filter_map(move |(i, x)| match x {
                        Sample::Paused(p) => Some((format!("{}-s{i}", g.id), p.clone())),
                        _ => None,
                    })
            })
            .collect()
    }

    /// Groups leave the buffer only when all their samples have finished, and a paused
    /// sample resumes with exactly the tokens, log-probs and versions it paused with.
    #[test]
    fn only_complete_groups_train_and_paused_samples_resume_exactly() {
        let mut s = setup();
        let cfg = iteration(Some(3), OnStale::FinishFirst);
        let mut buf = GroupBuffer::default();
        let mut resumed_checked = 0;
        for k in 0..4u64 {
            let before = paused(&buf);
            let out = step(&mut s, &mut buf, 2 * k, &cfg);
            check_whole_groups(&out, 4);
            // Short of min_groups, more rounds start new groups, up to their limit.
            if out.trajectories.len() < 24 {
                assert!(out.stats.rounds > 1);
            }
            for g in &buf.groups {
                assert!(!g.is_complete(), "a complete group was left waiting");
                assert!(g.samples.iter().all(|x| !matches!(x, Sample::Running)));
            }
            for t in &out.trajectories {
                if let Some(p) = before.get(&t.id) {
                    let tr = &t.transitions[0];
                    let n = p.tokens.len();
                    assert!(tr.response.len() > n);
                    assert_eq!(&tr.response[..n], &p.tokens[..]);
                    assert_eq!(&tr.logprobs[..n], &p.logprobs[..]);
                    assert_eq!(&tr.versions[..n], &p.versions[..]);
                    assert!(tr.versions[n..].iter().all(|&v| v == 2 * k));
                    resumed_checked += 1;
                }
            }
            if k > 0 {
                assert!(out.stats.resumed > 0);
            }
        }
        assert!(resumed_checked > 0, "no paused sample finished");
    }

    /// With a budget far below the responses' lengths, no group completes within its rounds.
    /// The step still trains `min_groups` groups: the oldest waiting ones run to their end.
    /// (Before, such steps trained nothing, the version stood still, so the staleness cap never
    /// finished a group either, and the run stopped after three of them.)
    #[test]
    fn a_step_short_of_min_groups_finishes_its_oldest_waiting_groups() {
        let mut s = setup();
        let cfg = iteration(Some(1), OnStale::FinishFirst);
        let mut buf = GroupBuffer::default();
        for _ in 0..3 {
            let before: Vec<String> = buf.groups.iter().map(|g| g.id.clone()).collect();
            let out = step(&mut s, &mut buf, 0, &cfg);
            check_whole_groups(&out, 4);
            assert!(out.trajectories.len() >= 24, "{}", out.trajectories.len());
            assert!(out.stats.filled_groups > 0, "{:?}", out.stats);
            assert!(out.stats.rounds > 2, "{:?}", out.stats);
            // The filled groups are the oldest: the step's first waiting group trains.
            let trained: std::collections::HashSet<&str> =
                out.trajectories.iter().map(|t| t.group.as_str()).collect();
            if let Some(oldest) = before.first() {
                assert!(trained.contains(oldest.as_str()), "{oldest} still waits");
            }
            for g in &buf.groups {
                assert!(!g.is_complete());
            }
        }
    }

    /// A run resumed with partial rollout turned off finishes every group it carried in its
    /// first step, however far behind, and drops none; the iteration's counters say so.
    #[test]
    fn carried_groups_finish_whole_when_partial_rollout_is_turned_off() {
        let mut s = setup();
        let mut buf = GroupBuffer::default();
        step(&mut s, &mut buf, 0, &iteration(Some(2), OnStale::Drop));
        let carried: Vec<String> = buf.groups.iter().map(|g| g.id.clone()).collect();
        assert!(!carried.is_empty(), "nothing was carried");
        let mut cfg = crate::trainer::TrainConfig::default();
        cfg.rollout.prompts_per_step = 2;
        let sync = IterationConfig::from_config(&cfg);
        assert_eq!(sync.token_budget, None);
        let out = step(&mut s, &mut buf, 1000, &sync);
        assert_eq!(out.stats.dropped_stale, 0);
        assert!(out.stats.resumed > 0);
        let trained: std::collections::HashSet<&str> =
            out.trajectories.iter().map(|t| t.group.as_str()).collect();
        for g in &carried {
            assert!(trained.contains(g.as_str()), "{g} was not trained");
        }
        assert!(buf.groups.is_empty());
    }

    /// A run resumed with another `rollout.samples_per_prompt` finishes the groups it carried
    /// at their own size, each sample continuing its own tokens under its own prompt, and
    /// starts new groups at the new size.
    #[test]
    fn carried_groups_keep_their_size_when_samples_per_prompt_changes() {
        let mut s = setup();
        let mut buf = GroupBuffer::default();
        step(
            &mut s,
            &mut buf,
            0,
            &iteration(Some(3), OnStale::FinishFirst),
        );
        let before = paused(&buf);
        let carried: HashMap<String, usize> = buf
            .groups
            .iter()
            .map(|g| (g.id.clone(), g.samples.len()))
            .collect();
        assert!(
            !before.is_empty() && !carried.is_empty(),
            "nothing was carried"
        );
        let fewer = IterationConfig {
            samples: 2,
            ..iteration(Some(3), OnStale::FinishFirst)
        };
        let mut finished_carried = 0;
        for k in 1..4u64 {
            let groups: HashMap<String, Vec<u32>> = buf
                .groups
                .iter()
                .map(|g| (g.id.clone(), g.prompt.clone()))
                .collect();
            let out = step(&mut s, &mut buf, 2 * k, &fewer);
            let mut sizes: HashMap<&str, usize> = HashMap::new();
            for t in &out.trajectories {
                *sizes.entry(t.group.as_str()).or_default() += 1;
                let tr = &t.transitions[0];
                if let Some(prompt) = groups.get(&t.group) {
                    assert_eq!(&tr.prompt, prompt, "{} answered another prompt", t.id);
                }
                if let Some(p) = before.get(&t.id) {
                    assert_eq!(&tr.response[..p.tokens.len()], &p.tokens[..], "{}", t.id);
                }
            }
            for (group, n) in sizes {
                let want = carried.get(group).copied().unwrap_or(2);
                finished_carried += usize::from(carried.contains_key(group));
                assert_eq!(n, want, "group {group}");
            }
        }
        assert!(finished_carried > 0, "no carried group finished");
    }

    /// Under top-k sampling a paused sample resumes with the kept sets of its first part,
    /// and every finished trajectory has one set per token, holding that token.
    #[test]
    fn paused_samples_keep_their_kept_sets() {
        let mut s = setup();
        s.params.top_k = 3;
        let cfg = iteration(Some(3), OnStale::FinishFirst);
        let mut buf = GroupBuffer::default();
        let mut resumed = 0;
        for k in 0..3u64 {
            let before = paused(&buf);
            let out = step(&mut s, &mut buf, 2 * k, &cfg);
            for t in &out.trajectories {
                let tr = &t.transitions[0];
                assert_eq!(tr.kept.len(), tr.response.len(), "{}", t.id);
                for (j, tok) in tr.response.iter().enumerate() {
                    assert!(tr.kept.get(j).contains(tok) && tr.kept.get(j).len() >= 3);
                }
                if let Some(p) = before.get(&t.id) {
                    assert_eq!(p.kept.len(), p.tokens.len());
                    for j in 0..p.tokens.len() {
                        assert_eq!(tr.kept.get(j), p.kept.get(j));
                    }
                    resumed += 1;
                }
            }
        }
        assert!(resumed > 0, "no paused sample finished");
    }

    #[test]
    fn staleness_never_exceeds_the_cap_in_either_mode() {
        for mode in [OnStale::Drop, OnStale::FinishFirst] {
            let mut s = setup();
            let cfg = iteration(Some(2), mode);
            let mut buf = GroupBuffer::default();
            let mut dropped = 0;
            for k in 0..6u64 {
                let out = step(&mut s, &mut buf, 2 * k, &cfg);
                let staleness_max = crate::trainer::rollout::stats::StepRollout::new(
                    out.trajectories.clone(),
                    out.correct.clone(),
                    out.engine,
                    2 * k,
                    Default::default(),
                )
                .stats
                .staleness_max;
                assert!(
                    staleness_max <= cfg.max_staleness,
                    "{mode:?}: {} > {}",
                    staleness_max,
                    cfg.max_staleness
                );
                for t in &out.trajectories {
                    let oldest = t.transitions[0].versions.iter().min().copied();
                    assert!(oldest.is_none_or(|o| 2 * k - o <= cfg.max_staleness));
                }
                dropped += out.stats.dropped_stale;
            }
            match mode {
                OnStale::Drop => assert!(dropped > 0, "budget 2 of 24 tokens must drop some"),
                OnStale::FinishFirst => assert_eq!(dropped, 0),
            }
        }
    }

    #[test]
    fn the_buffer_round_trips_through_json() {
        let mut s = setup();
        let mut buf = GroupBuffer::default();
        step(&mut s, &mut buf, 0, &iteration(Some(3), OnStale::Drop));
        assert!(buf.paused_samples() > 0);
        let text = serde_json::to_string(&buf).unwrap();
        let back: GroupBuffer = serde_json::from_str(&text).unwrap();
        assert_eq!(back, buf);
    }
}
