//! Built-in tasks with program-checked rewards. Tasks speak text: the engine tokenizes prompts
//! once and trains on the sampled ids; only the reward program sees the response as text.
//! Multi-turn tasks (`env`) answer each model message with environment messages until the
//! episode is over.

pub mod arithmetic;
pub mod calculator;
pub mod env;
pub mod guess;
pub mod reverse;
pub mod rng;
pub mod split;
pub mod task;

pub use env::{render_plain, AgentTask, Env, EnvError, EnvMessage, EnvRole, EnvStep, Turn};
pub use rng::TaskRng;
pub use split::{draw_in, split_of, splits, Split};
pub use task::{Problem, Score, Task};

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub struct TaskError(String);

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TaskError {}

const ALL_NAMES: &str = "arithmetic, reverse, guess, calculator";

fn check_difficulty(name: &str, difficulty: u32, max: u32) -> Result<(), TaskError> {
    if (1..=max).contains(&difficulty) {
        Ok(())
    } else {
        Err(TaskError(format!(
            "invalid value {difficulty} for `task.difficulty` of `{name}` (allowed: 1 to {max})"
        )))
    }
}

/// The built-in single-turn task called `name` at `difficulty`, with correct demonstrations.
pub fn task_by_name(name: &str, difficulty: u32) -> Result<Box<dyn Task>, TaskError> {
    task_with_teacher(name, difficulty, Some(0.0))
}

/// The built-in single-turn task called `name` at `difficulty`, its demonstrations written by a
/// teacher who drops each carry with probability `dropped_carries` (`task.dropped_carries`;
/// None: a correct teacher). Only the default job asks for a careless one
/// ([`arithmetic::DEFAULT_DROPPED_CARRIES`]), in its own config.
pub fn task_with_teacher(
    name: &str,
    difficulty: u32,
    dropped_carries: Option<f64>,
) -> Result<Box<dyn Task>, TaskError> {
    let additions = name == "arithmetic" && difficulty <= arithmetic::MAX_CARRY_DIFFICULTY;
    let dropped_carries = match dropped_carries {
        None => 0.0,
        Some(p) if !(0.0..=1.0).contains(&p) => {
            return Err(TaskError(format!(
                "invalid value {p} for `task.dropped_carries` (allowed: 0 to 1)"
            )))
        }
        Some(p) if p > 0.0 && !additions => {
            return Err(TaskError(format!(
                "`task.dropped_carries` = {p} applies only to task `arithmetic` at difficulty 1 \
                 to {} (additions), not `{name}` at difficulty {difficulty}: remove it",
                arithmetic::MAX_CARRY_DIFFICULTY
            )))
        }
        Some(p) => p,
    };
    match name {
        "arithmetic" => {
            check_difficulty(name, difficulty, arithmetic::MAX_DIFFICULTY)?;
            Ok(Box::new(arithmetic::Arithmetic {
                difficulty,
                dropped_carries,
            }))
        }
        "reverse" => {
            check_difficulty(name, difficulty, reverse::MAX_DIFFICULTY)?;
            Ok(Box::new(reverse::Reverse { difficulty }))
        }
        "guess" | "calculator" => Err(TaskError(format!(
            "task `{name}` is multi-turn, not a single-turn task"
        ))),
        other => Err(TaskError(format!(
            "unknown task `{other}` for `task.name` (allowed: {ALL_NAMES})"
        ))),
    }
}

/// The built-in multi-turn task called `name` at `difficulty`; `None` when `name` is not one
/// (it may still be a single-turn task: see `task_by_name`).
pub fn agent_task_by_name(
    name: &str,
    difficulty: u32,
) -> Option<Result<Box<dyn AgentTask>, TaskError>> {
    let task: Result<Box<dyn AgentTask>, TaskError> = match name {
        "guess" => check_difficulty(name, difficulty, guess::MAX_DIFFICULTY)
            .map(|()| Box::new(guess::Guess { difficulty }) as Box<dyn AgentTask>),
        "calculator" => check_difficulty(name, difficulty, calculator::MAX_DIFFICULTY)
            .map(|()| Box::new(calculator::Calculator { difficulty }) as Box<dyn AgentTask>),
        _ => return None,
    };
    Some(task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_and_difficulties_list_what_is_allowed() {
        let e = task_by_name("chess", 1).err().unwrap().to_string();
        assert!(e.contains("`task.name`") && e.contains("arithmetic"), "{e}");
        let e = task_by_name("arithmetic", 9).err().unwrap().to_string();
        assert!(e.contains("1 to 5"), "{e}");
        assert!(task_by_name("arithmetic", 2).is_ok());
        let e = task_by_name("chess", 1).err().unwrap().to_string();
        assert!(e.contains("reverse, guess, calculator"), "{e}");
        assert!(task_by_name("guess", 1).is_err());
    }

    #[test]
    fn only_additions_take_a_careless_teacher() {
        for bad in [-0.1, 1.5, f64::NAN] {
            let e = task_with_teacher("arithmetic", 2, Some(bad)).err().unwrap();
            assert!(e.to_string().contains("`task.dropped_carries`"), "{e}");
        }
        for (name, d) in [("arithmetic", 4), ("reverse", 1)] {
            let e = task_with_teacher(name, d, Some(0.5)).err().unwrap();
            assert!(e.to_string().contains("difficulty 1 to 3"), "{e}");
            assert!(task_with_teacher(name, d, None).is_ok());
            assert!(task_with_teacher(name, d, Some(0.0)).is_ok());
        }
        // Unset, a teacher is correct, additions included: only a config that asks (the
        // default job's) gets a careless one.
        let wrong = |dropped: Option<f64>| {
            let task = task_with_teacher("arithmetic", 3, dropped).unwrap();
            let mut rng = TaskRng::new(2);
            (0..200)
                .filter(|_| {
                    let p = task.sample(&mut rng);
                    task.demonstration(&p, &mut rng) != p.ground_truth
                })
                .count()
        };
        assert_eq!(wrong(None), 0);
        assert!(wrong(Some(0.7)) > 20, "{} of 200 wrong", wrong(Some(0.7)));
    }

    #[test]
    fn agent_tasks_are_found_by_name_and_checked() {
        assert!(agent_task_by_name("arithmetic", 1).is_none());
        assert!(agent_task_by_name("reverse", 1).is_none());
        assert!(agent_task_by_name("chess", 1).is_none());
        for name in ["guess", "calculator"] {
            let task = agent_task_by_name(name, 1).unwrap().unwrap();
            assert_eq!(task.name(), name);
            for bad in [0, 4] {
                let e = agent_task_by_name(name, bad)
                    .unwrap()
                    .err()
                    .unwrap()
                    .to_string();
                assert!(
                    e.contains("`task.difficulty`") && e.contains("1 to 3"),
                    "{e}"
                );
            }
        }
    }
}
