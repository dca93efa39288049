//! Built-in tasks with program-checked rewards. Tasks speak text: the engine tokenizes prompts
//! once and trains on the sampled ids; only the reward program sees the response as text.

pub mod arithmetic;
pub mod reverse;
pub mod rng;
pub mod task;

pub use rng::TaskRng;
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

/// The built-in task called `name` at `difficulty`.
pub fn task_by_name(name: &str, difficulty: u32) -> Result<Box<dyn Task>, TaskError> {
    match name {
        "arithmetic" => {
            if !(1..=arithmetic::MAX_DIFFICULTY).contains(&difficulty) {
                return Err(TaskError(format!(
                    "invalid value {difficulty} for `task.difficulty` of `arithmetic` (allowed: 1 to {})",
                    arithmetic::MAX_DIFFICULTY
                )));
            }
            Ok(Box::new(arithmetic::Arithmetic { difficulty }))
        }
        "reverse" => {
            if !(1..=reverse::MAX_DIFFICULTY).contains(&difficulty) {
                return Err(TaskError(format!(
                    "invalid value {difficulty} for `task.difficulty` of `reverse` (allowed: 1 to {})",
                    reverse::MAX_DIFFICULTY
                )));
            }
            Ok(Box::new(reverse::Reverse { difficulty }))
        }
        other => Err(TaskError(format!(
            "unknown task `{other}` for `task.name` (allowed: arithmetic, reverse)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_and_difficulties_list_what_is_allowed() {
        let e = task_by_name("chess", 1).err().unwrap().to_string();
        assert!(e.contains("`task.name`") && e.contains("arithmetic"), "{e}");
        let e = task_by_name("arithmetic", 9).err().unwrap().to_string();
        assert!(e.contains("1 to 4"), "{e}");
        assert!(task_by_name("arithmetic", 2).is_ok());
    }
}
