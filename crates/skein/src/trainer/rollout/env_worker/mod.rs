//! Environments in other processes (`agent.kind = "env-worker"`): long-lived worker processes
//! (`agent.command`, `agent.workers` of them) speak JSON lines (`protocol.rs`), and each
//! worker hosts many episodes at once. [`WorkerTask`] is an [`AgentTask`] like the built-in
//! ones, so the built-in agent loop runs these episodes unchanged: token-exact turns, KV reuse,
//! turn/token limits, and `agent.env_timeout_s` on every call.
//!
//! A problem is a seed. Held-out evaluation seeds are chosen the way built-in problems are (a
//! hash, [`skein_tasks::split_of`]), so training never draws one; `reset` says which split a
//! seed is from, for an environment that maps seeds onto fewer problems than there are seeds.
//! An environment whose `info` says it has fewer than [`skein_tasks::split::MIN_SPLIT_PROBLEMS`]
//! problems is not split (its evaluation is on training problems, and says so).

mod pool;
pub mod protocol;

use crate::trainer::config::TrainConfig;
use anyhow::{bail, Result};
use pool::{Answer, Home, Pool};
use protocol::Info;
use serde_json::{json, Value};
use skein_config::Validator;
use skein_tasks::{
    render_plain, split_of, splits, AgentTask, Env, EnvError, EnvStep, Problem, Split, TaskRng,
    Turn,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

/// Seeds are below 2^53, so every JSON reader keeps them exact.
const SEED_LIMIT: u64 = 1 << 53;

/// A multi-turn task whose environment runs in worker processes.
pub struct WorkerTask {
    pool: Arc<Pool>,
    info: Info,
    /// The task is split into training and held-out seeds.
    split: bool,
    episodes: AtomicU64,
}

impl WorkerTask {
    /// Starts `agent.workers` processes of `agent.command`, asks each for its `info`, and
    /// checks it against the config.
    pub fn start(cfg: &TrainConfig) -> Result<WorkerTask> {
        let a = &cfg.agent;
        let label = a.command.join(" ");
        let (pool, infos) = Pool::start(
            &a.command,
            a.workers,
            Duration::from_secs_f64(a.env_timeout_s),
            Duration::from_secs_f64(a.start_timeout_s),
            &protocol::info(),
        )
        .map_err(|e| {
            anyhow::anyhow!(
                "invalid value for `agent.command`: the environment worker does not start: {e}"
            )
        })?;
        let mut parsed = Vec::with_capacity(infos.len());
        for (i, answer) in infos.into_iter().enumerate() {
            let info = Info::parse(Value::Object(answer)).map_err(|e| {
                anyhow::anyhow!("environment worker `{label}` (process {}): {e}", i + 1)
            })?;
            parsed.push(info);
        }
        let Some(info) = parsed.first().cloned() else {
            bail!("invalid value for `agent.workers`: must be ≥ 1 (got 0)");
        };
        if let Some(i) = parsed.iter().position(|p| *p != info) {
            bail!(
                "environment worker `{label}`: process {} describes another environment than \
                 process 1 ({:?} vs {:?})",
                i + 1,
                parsed[i],
                info
            );
        }
        check_against_config(cfg, &info, &label)?;
        Ok(WorkerTask {
            pool: Arc::new(pool),
            split: splits(info.problems),
            info,
            episodes: AtomicU64::new(0),
        })
    }

    /// The `task` object of `problem` (its seed and split).
    fn task_of(&self, problem: &Problem) -> Value {
        let seed = problem.meta["seed"].as_u64().unwrap_or(0);
        protocol::task(seed, self.split && split_of(problem) == Split::HeldOut)
    }
}

/// What the worker's `info` must agree with: the keys the config sets for it.
fn check_against_config(cfg: &TrainConfig, info: &Info, label: &str) -> Result<()> {
    let mut v = Validator::new();
    let from_scratch = cfg.model.path.is_empty();
    v.check(
        !from_scratch || !info.alphabet.is_empty(),
        "model.path",
        &format!(
            "must name a model directory: environment worker `{label}` declares no \
             \"alphabet\", which a from-scratch character-level model is built on"
        ),
        "\"\"",
    );
    let need = info.max_message_chars + 1;
    v.check(
        !from_scratch || cfg.rollout.sampling.max_new_tokens >= need,
        "rollout.sampling.max_new_tokens",
        &format!(
            "must be at least {need} for environment `{}` (its longest message plus the stop \
             token), or a message is cut off mid-way",
            info.name
        ),
        cfg.rollout.sampling.max_new_tokens,
    );
    v.check(
        !cfg.sft.warms_up() || info.demonstrations,
        "sft.steps",
        &format!(
            "must be 0: environment worker `{label}` offers no demonstrations for the \
             supervised warm-up (its info has no \"demonstrations\": true)"
        ),
        cfg.sft.steps,
    );
    Ok(v.finish()?)
}

impl AgentTask for WorkerTask {
    fn name(&self) -> &str {
        &self.info.name
    }

    /// A seed; the first prompt comes from the worker when the episode begins.
    fn sample(&self, rng: &mut TaskRng) -> Problem {
        let seed = rng.below(SEED_LIMIT);
        Problem {
            prompt: String::new(),
            ground_truth: seed.to_string(),
            data_source: self.info.name.clone(),
            meta: json!({ "seed": seed }),
        }
    }

    fn start(&self, problem: &Problem) -> Box<dyn Env> {
        let n = self.episodes.fetch_add(1, Ordering::Relaxed);
        Box::new(WorkerEnv {
            pool: self.pool.clone(),
            id: format!("e{n}"),
            task: self.task_of(problem),
            home: None,
            done: false,
            state: None,
        })
    }

    fn demonstration_turn(
        &self,
        problem: &Problem,
        transcript: &[Turn],
        rng: &mut TaskRng,
    ) -> String {
        self.demonstrate(problem, transcript, rng)
            .unwrap_or_default()
    }

    fn demonstrate(
        &self,
        problem: &Problem,
        transcript: &[Turn],
        rng: &mut TaskRng,
    ) -> Result<String, EnvError> {
        if !self.info.demonstrations {
            return Err(EnvError::new(format!(
                "environment `{}` offers no demonstrations",
                self.info.name
            )));
        }
        let request =
            protocol::demonstrate(&self.task_of(problem), transcript, rng.below(SEED_LIMIT));
        let a = self.pool.call_new(&request)?;
        protocol::demonstrate_answer(&a.fields)
            .map_err(|e| self.pool.shape_error(a.home, "demonstrate", &e))
    }

    fn alphabet(&self) -> &str {
        &self.info.alphabet
    }

    fn max_turns(&self) -> usize {
        self.info.max_turns
    }

    fn max_message_chars(&self) -> usize {
        self.info.max_message_chars
    }

    fn problem_count(&self) -> Option<u64> {
        self.info.problems
    }

    fn counters(&self) -> Vec<(&'static str, f64)> {
        vec![("agent/env_worker_restarts", self.pool.restarts() as f64)]
    }
}

/// One episode, living in the worker process that answered its `reset`.
struct WorkerEnv {
    pool: Arc<Pool>,
    id: String,
    task: Value,
    /// Its process, and that process's stdin (for `close`), once it has begun.
    home: Option<(Home, Sender<String>)>,
    /// The worker said `done` (and forgot the episode).
    done: bool,
    /// The state its last answer named, if the worker names states.
    state: Option<String>,
}

impl WorkerEnv {
    fn home(&self) -> Result<Home, EnvError> {
        match &self.home {
            Some((home, _)) => Ok(*home),
            None => Err(EnvError::new(
                "environment worker: a step before the episode began",
            )),
        }
    }
}

impl Env for WorkerEnv {
    /// `reset`: the first prompt is its messages as plain text (`render_plain`).
    fn open(&mut self) -> Result<Option<String>, EnvError> {
        let Answer {
            fields,
            home,
            stdin,
        } = self.pool.call_new(&protocol::reset(&self.id, &self.task))?;
        self.home = Some((home, stdin));
        let messages = protocol::reset_answer(&fields)
            .map_err(|e| self.pool.shape_error(home, "reset", &e))?;
        self.state = protocol::state_answer(&fields)
            .map_err(|e| self.pool.shape_error(home, "reset", &e))?;
        Ok(Some(render_plain(&messages)))
    }

    fn step(&mut self, message: &str) -> Result<EnvStep, EnvError> {
        if self.done {
            return Err(EnvError::new(
                "environment worker: a step after the episode ended",
            ));
        }
        let home = self.home()?;
        let a = self
            .pool
            .call_home(home, &protocol::step(&self.id, message))?;
        let step = protocol::step_answer(&a.fields)
            .map_err(|e| self.pool.shape_error(home, "step", &e))?;
        self.state = protocol::state_answer(&a.fields)
            .map_err(|e| self.pool.shape_error(home, "step", &e))?;
        self.done = matches!(step, EnvStep::Done(_));
        Ok(step)
    }

    fn state_key(&self) -> Option<String> {
        self.state.clone()
    }

    /// The pool times each request from when its process takes it (`agent.env_timeout_s`,
    /// plus `agent.start_timeout_s` for a process's first answer), not while it waits for a
    /// process busy with other episodes' requests.
    fn keeps_own_time(&self) -> bool {
        true
    }
}

impl Drop for WorkerEnv {
    /// An episode that ends before the worker said `done` (cut off, failed) is closed: a line
    /// without an answer, so dropping never waits.
    fn drop(&mut self) {
        if let (Some((_, stdin)), false) = (&self.home, self.done) {
            let _ = stdin.send(format!("{}\n", protocol::close(&self.id)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skein_tasks::guess::Guess;

    /// The repository's Python, else the system's.
    fn python() -> String {
        let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python");
        if std::path::Path::new(venv).is_file() {
            venv.into()
        } else {
            "python3".into()
        }
    }

    fn config(args: &[&str]) -> TrainConfig {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/env_worker_example.py"
        );
        let mut cfg = TrainConfig::default();
        cfg.agent.kind = crate::trainer::config::AgentKind::EnvWorker;
        cfg.agent.command = [python(), script.into()]
            .into_iter()
            .chain(args.iter().map(|s| s.to_string()))
            .collect();
        cfg.agent.workers = 2;
        cfg.agent.env_timeout_s = 1.0;
        cfg
    }

    /// Plays `task` with `policy` until it ends or is cut off; each message, and what the
    /// environment answered to it.
    fn play(
        task: &dyn AgentTask,
        problem: &Problem,
        mut policy: impl FnMut(&[Turn]) -> String,
    ) -> (
        String,
        Vec<Turn>,
        Result<Option<skein_tasks::Score>, EnvError>,
    ) {
        let mut env = task.start(problem);
        let prompt = match env.open() {
            Ok(p) => p.unwrap_or_default(),
            Err(e) => return (String::new(), Vec::new(), Err(e)),
        };
        let mut transcript = Vec::new();
        for _ in 0..task.max_turns() {
            let message = policy(&transcript);
            match env.step(&message) {
                Err(e) => return (prompt, transcript, Err(e)),
                Ok(EnvStep::Done(score)) => {
                    transcript.push(Turn {
                        message,
                        reply: vec![],
                    });
                    return (prompt, transcript, Ok(Some(score)));
                }
                Ok(EnvStep::Continue { messages, .. }) => transcript.push(Turn {
                    message,
                    reply: messages,
                }),
            }
        }
        (prompt, transcript, Ok(None))
    }

    /// The Python game is the built-in one: same prompt, limits and alphabet, and for the
    /// secret an episode found, the built-in environment answers every message the same way
    /// and gives the same score.
    #[test]
    fn the_python_guessing_game_plays_like_the_built_in_one() {
        let task = WorkerTask::start(&config(&[])).unwrap();
        let rust = Guess { difficulty: 1 };
        assert_eq!(task.name(), "guess");
        assert_eq!(task.alphabet(), rust.alphabet());
        assert_eq!(task.max_turns(), rust.max_turns());
        assert_eq!(task.max_message_chars(), rust.max_message_chars());
        assert_eq!(task.problem_count(), Some(16));
        assert!(!task.split, "16 secrets are too few to hold any out");
        let mut rng = TaskRng::new(5);
        let (mut wins, mut replies) = (0, 0);
        for _ in 0..60 {
            let problem = task.sample(&mut rng);
            let (prompt, transcript, score) = play(&task, &problem, |t| {
                task.demonstrate(&problem, t, &mut rng).unwrap()
            });
            assert_eq!(prompt, "guess 1-16\n");
            let Some(score) = score.unwrap() else {
                continue;
            };
            wins += 1;
            let mut built_in = rust.sample(&mut TaskRng::new(0));
            built_in.ground_truth = transcript.last().unwrap().message.clone();
            let mut env = rust.start(&built_in);
            for turn in &transcript[..transcript.len() - 1] {
                let EnvStep::Continue { messages, .. } = env.step(&turn.message).unwrap() else {
                    panic!("the built-in game ended early");
                };
                assert_eq!(messages, turn.reply);
                replies += 1;
            }
            let last = &transcript.last().unwrap().message;
            assert_eq!(env.step(last).unwrap(), EnvStep::Done(score));
        }
        assert!(wins >= 50, "{wins} of 60 demonstrations won");
        assert!(replies > 60, "too few replies compared: {replies}");
        assert_eq!(task.pool.restarts(), 0);
    }

    /// The worker names its states as the built-in game does: the guesses and replies so far.
    #[test]
    fn the_python_game_names_its_states_like_the_built_in_one() {
        let task = WorkerTask::start(&config(&[])).unwrap();
        let mut rng = TaskRng::new(9);
        let mut checked = 0;
        for _ in 0..8 {
            let problem = task.sample(&mut rng);
            let mut env = task.start(&problem);
            env.open().unwrap();
            assert_eq!(env.state_key().as_deref(), Some(""));
            let mut want = String::new();
            for message in ["8", "x", "12"] {
                let EnvStep::Continue { messages, .. } = env.step(message).unwrap() else {
                    break;
                };
                want.push_str(&match messages[0].content.as_str() {
                    "higher" => format!("{message}> "),
                    "lower" => format!("{message}< "),
                    _ => "? ".into(),
                });
                assert_eq!(env.state_key(), Some(want.clone()));
                checked += 1;
            }
        }
        assert!(checked >= 16, "{checked}");
    }

    /// A worker that crashes fails the episodes it held, naming itself; it is started again
    /// and later episodes play on.
    #[test]
    fn a_crashing_worker_fails_only_its_episodes_and_is_restarted() {
        let task = WorkerTask::start(&config(&["--crash-every", "7"])).unwrap();
        let mut rng = TaskRng::new(1);
        let (mut failed, mut finished) = (0, 0);
        for _ in 0..40 {
            let problem = task.sample(&mut rng);
            let (_, _, outcome) = play(&task, &problem, |_| "0".into());
            match outcome {
                Err(e) => {
                    assert!(e.worker_failed, "{e}");
                    assert!(e.message.contains("env_worker_example.py"), "{e}");
                    assert!(e.message.contains("died"), "{e}");
                    failed += 1;
                }
                Ok(_) => finished += 1,
            }
        }
        assert!(
            failed > 0 && finished > 0,
            "{failed} failed, {finished} finished"
        );
        // One crash per failed episode (they run one at a time); each slot restarts its
        // process when it next gets an episode.
        let restarts = task.pool.restarts() as usize;
        assert!(
            restarts <= failed && restarts + 2 >= failed,
            "{restarts} vs {failed}"
        );
        assert_eq!(task.counters()[0].0, "agent/env_worker_restarts");
    }

    #[test]
    fn info_that_disagrees_with_the_config_names_the_key() {
        let mut cfg = config(&[]);
        cfg.rollout.sampling.max_new_tokens = 2;
        cfg.sft.steps = 10;
        let e = WorkerTask::start(&cfg).err().unwrap().to_string();
        assert!(e.contains("`rollout.sampling.max_new_tokens`"), "{e}");
        let mut cfg = config(&[]);
        cfg.agent.command = vec![python(), "-c".into(), "import sys; sys.exit(1)".into()];
        let e = WorkerTask::start(&cfg).err().unwrap().to_string();
        assert!(e.contains("`agent.command`") && e.contains("died"), "{e}");
        let mut cfg = config(&[]);
        let info = r#"import json, sys
request = json.loads(sys.stdin.readline())
print(json.dumps({"id": request["id"], "name": "x", "max_turns": 2, "max_message_chars": 1}),
      flush=True)
sys.stdin.read()"#;
        cfg.agent.command = vec![python(), "-c".into(), info.into()];
        let e = WorkerTask::start(&cfg).err().unwrap().to_string();
        assert!(
            e.contains("`sft.steps`") && e.contains("demonstrations"),
            "{e}"
        );
        assert!(e.contains("`model.path`") && e.contains("alphabet"), "{e}");
    }
}
