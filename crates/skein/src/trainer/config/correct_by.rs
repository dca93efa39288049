//! `eval.correct_by`: what decides that a response is correct. One judge serves every accuracy
//! of a run — the training samples' `reward/accuracy`, the held-out `eval/accuracy` (and the
//! warm-up's `sft/eval_accuracy`) — and `skein eval` resolves it from the run's config.toml, so
//! the same number means the same thing in training and after.
//!
//! The judge is a verdict skein computes itself from the response text: the task's own checker,
//! or a built-in answer check of `[reward.sources]` (`math`, `exact_match`), correct exactly
//! when that source's reward is 1. Workers, remote services and reward models return a score,
//! not a verdict (a cosine, a partial credit: no threshold would mean "correct" for all of
//! them), and `format` and `overlong` judge something other than the answer, so none of them
//! can be the judge. That also keeps an accuracy reproducible offline: it never depends on a
//! service being up.

use super::TrainConfig;
use skein_reward::{RewardConfig, RewardFn, ServiceConfig, SourceConfig};
use std::collections::BTreeSet;

/// The value that names the task's own checker (also the name of its `scorer` source).
pub const TASK: &str = "task";

/// What a dataset's own checker counts as correct (`dataset::score_math`).
pub const DATASET_CHECKER: &str =
    r"the dataset's math check: a \boxed{}, #### or bare-number answer";

const KEY: &str = "eval.correct_by";

/// `eval.correct_by`, resolved against the run's `[reward]`.
#[derive(Debug, Clone, PartialEq)]
pub enum CorrectBy {
    /// The task's own checker: a built-in task's program, a dataset's math check
    /// ([`DATASET_CHECKER`]), a multi-turn task's environment.
    Task,
    /// A `[reward.sources]` function with a verdict ([`RewardFn::verdict`]), by its name.
    Source { name: String, check: RewardFn },
}

impl CorrectBy {
    /// The judge `correct_by` names (None: derived from `reward`: the one source with a verdict
    /// that its routes use, the `task` scorer included; none: the task's checker). The error is
    /// the whole problem, naming the key and the allowed values.
    pub fn resolve(
        correct_by: Option<&str>,
        reward: Option<&RewardConfig>,
    ) -> Result<CorrectBy, String> {
        let Some(reward) = reward else {
            return match correct_by {
                None | Some(TASK) => Ok(CorrectBy::Task),
                Some(other) => Err(format!(
                    "invalid value for `{KEY}`: without a `[reward]` section the only judge is \
                     the task's own checker (allowed: {TASK}) (got `{other}`)"
                )),
            };
        };
        if let Some(source) = reward.sources.get(TASK) {
            if !matches!(source, SourceConfig::Service(ServiceConfig::Scorer {})) {
                return Err(format!(
                    "invalid key `reward.sources.{TASK}`: the name `{TASK}` is the task's own \
                     checker (kind = \"scorer\", and the value `{TASK}` of `{KEY}`), not a \
                     `{}` source: give this source another name",
                    kind(source)
                ));
            }
        }
        let allowed = || {
            let mut names = vec![TASK.to_string()];
            names.extend(
                reward
                    .sources
                    .iter()
                    .filter(|(_, s)| verdict_fn(s).is_some())
                    .map(|(n, _)| n.clone()),
            );
            names.join(", ")
        };
        let name = match correct_by {
            Some(name) => name,
            None => {
                let routed: BTreeSet<&str> = reward
                    .routes
                    .values()
                    .chain([&reward.default_route])
                    .flat_map(|r| r.sources.iter().map(String::as_str))
                    .collect();
                let judges: Vec<&str> = routed
                    .into_iter()
                    .filter(|n| {
                        *n == TASK
                            || reward
                                .sources
                                .get(*n)
                                .is_some_and(|s| verdict_fn(s).is_some())
                    })
                    .collect();
                match judges[..] {
                    [] => TASK,
                    [one] => one,
                    _ => {
                        return Err(format!(
                            "`{KEY}` is not set and the reward routes use several sources that \
                             judge answers ({}): set `{KEY}` to the one whose verdict is \
                             `correct` (allowed: {})",
                            judges.join(", "),
                            allowed()
                        ))
                    }
                }
            }
        };
        if name == TASK {
            return Ok(CorrectBy::Task);
        }
        match reward.sources.get(name) {
            None => Err(format!(
                "invalid value for `{KEY}`: no reward source `{name}` (allowed: {}) (got `{name}`)",
                allowed()
            )),
            Some(source) => match verdict_fn(source) {
                Some(check) => Ok(CorrectBy::Source {
                    name: name.to_string(),
                    check: check.clone(),
                }),
                None => Err(format!(
                    "invalid value for `{KEY}`: `reward.sources.{name}` is a `{}` source, whose \
                     reward is not a verdict of correct or not (allowed: {}; a `math` or \
                     `exact_match` source judges even when no route uses it) (got `{name}`)",
                    kind(source),
                    allowed()
                )),
            },
        }
    }

    /// Whether `response` is correct, given the task checker's own verdict on it.
    pub fn correct(&self, task_verdict: bool, response: &str, ground_truth: &str) -> bool {
        match self {
            CorrectBy::Task => task_verdict,
            CorrectBy::Source { check, .. } => check.verdict(response, ground_truth) == Some(true),
        }
    }

    /// The judge in words, e.g. "reward source `answer` (math, flexible: last number)";
    /// `task_checker` describes the task's own checker ([`TrainConfig::task_checker`]).
    pub fn describe(&self, task_checker: &str) -> String {
        match self {
            CorrectBy::Task => task_checker.to_string(),
            CorrectBy::Source { name, check } => format!(
                "reward source `{name}` ({})",
                check.verdict_rule().unwrap_or("its verdict")
            ),
        }
    }
}

impl TrainConfig {
    /// The run's judge of correctness (`eval.correct_by` against `[reward]`).
    pub fn correct_by(&self) -> Result<CorrectBy, String> {
        CorrectBy::resolve(self.eval.correct_by.as_deref(), self.reward.as_ref())
    }

    /// The task's own checker in words, for [`CorrectBy::describe`].
    pub fn task_checker(&self) -> String {
        if !self.data.train_files.is_empty() {
            DATASET_CHECKER.to_string()
        } else if self.agent.kind == super::AgentKind::EnvWorker {
            "the environment worker's verdict".to_string()
        } else {
            builtin_checker(&self.task.name)
        }
    }
}

/// A built-in task's own checker in words.
pub fn builtin_checker(task: &str) -> String {
    format!("the checker of task `{task}`")
}

/// The function of a source whose reward is a verdict on the answer.
fn verdict_fn(source: &SourceConfig) -> Option<&RewardFn> {
    match source {
        SourceConfig::Function(f) if f.verdict_rule().is_some() => Some(f),
        _ => None,
    }
}

/// A source's `kind`, as its config writes it.
fn kind(source: &SourceConfig) -> String {
    serde_json::to_value(source)
        .ok()
        .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string))
        .unwrap_or_else(|| "service".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use skein_reward::RouteConfig;

    fn reward(sources: &[(&str, serde_json::Value)], routed: &[&str]) -> RewardConfig {
        RewardConfig {
            sources: sources
                .iter()
                .map(|(n, s)| (n.to_string(), serde_json::from_value(s.clone()).unwrap()))
                .collect(),
            routes: Default::default(),
            default_route: RouteConfig {
                sources: routed.iter().map(|s| s.to_string()).collect(),
                weights: Vec::new(),
            },
            ..Default::default()
        }
    }

    fn flexible() -> (&'static str, serde_json::Value) {
        (
            "answer",
            serde_json::json!({"kind": "math", "flexible": true}),
        )
    }

    #[test]
    fn a_flexible_math_source_takes_the_last_number_and_the_task_checker_does_not() {
        let r = reward(&[flexible()], &["answer"]);
        let judge = CorrectBy::resolve(None, Some(&r)).unwrap();
        assert_eq!(
            judge.describe("unused"),
            "reward source `answer` (math, flexible: last number)"
        );
        // Whatever the task's checker said (a dataset's wants a bare or marked answer).
        assert!(judge.correct(false, "25 + 49 = 74", "74"));
        assert!(!judge.correct(true, "25 + 49 = 72", "74"));

        let strict = reward(
            &[("answer", serde_json::json!({"kind": "math"}))],
            &["answer"],
        );
        let judge = CorrectBy::resolve(None, Some(&strict)).unwrap();
        assert!(!judge.correct(false, "25 + 49 = 74", "74"));
        assert!(judge.correct(false, r"so \boxed{74}", "74"));
        assert_eq!(
            judge.describe("unused"),
            r"reward source `answer` (math: \boxed{} or ####)"
        );
        // The task's checker is asked for nothing but its own verdict.
        assert!(CorrectBy::Task.correct(true, "anything", "74"));
        assert_eq!(CorrectBy::Task.describe(DATASET_CHECKER), DATASET_CHECKER);
    }

    #[test]
    fn the_default_follows_the_routes_and_is_the_task_without_a_verdict_among_them() {
        assert_eq!(CorrectBy::resolve(None, None), Ok(CorrectBy::Task));
        let rm = ("rm", serde_json::json!({"kind": "scorer"}));
        let fmt = ("fmt", serde_json::json!({"kind": "format", "boxed": true}));
        // A reward model and a format check give no verdict: the task's checker judges.
        let r = reward(&[rm.clone(), fmt.clone()], &["rm", "fmt"]);
        assert_eq!(CorrectBy::resolve(None, Some(&r)), Ok(CorrectBy::Task));
        // An answer check on a route is the judge, wherever the route is.
        let mut r = reward(&[rm.clone(), flexible()], &["rm"]);
        assert_eq!(CorrectBy::resolve(None, Some(&r)), Ok(CorrectBy::Task));
        r.routes.insert(
            "gsm8k".into(),
            RouteConfig {
                sources: vec!["answer".into()],
                weights: Vec::new(),
            },
        );
        let judge = CorrectBy::resolve(None, Some(&r)).unwrap();
        assert!(matches!(judge, CorrectBy::Source { ref name, .. } if name == "answer"));
        // The default `[reward]` (strict math) judges as its reward does.
        let judge = CorrectBy::resolve(None, Some(&RewardConfig::default())).unwrap();
        assert_eq!(
            judge,
            CorrectBy::Source {
                name: "math".into(),
                check: RewardFn::math()
            }
        );
        // Named, an unrouted answer check judges beside a reward model's reward.
        let r = reward(&[rm, flexible()], &["rm"]);
        let judge = CorrectBy::resolve(Some("answer"), Some(&r)).unwrap();
        assert!(matches!(judge, CorrectBy::Source { .. }));
        assert_eq!(
            CorrectBy::resolve(Some("task"), Some(&r)),
            Ok(CorrectBy::Task)
        );
    }

    #[test]
    fn judges_without_a_verdict_or_a_choice_are_refused_naming_the_key_and_values() {
        let rm = ("rm", serde_json::json!({"kind": "scorer"}));
        let worker = (
            "py",
            serde_json::json!({"kind": "worker", "command": ["x"]}),
        );
        let exact = ("exact", serde_json::json!({"kind": "exact_match"}));
        let fmt = ("fmt", serde_json::json!({"kind": "format", "boxed": true}));
        let r = reward(&[rm, worker, exact, fmt, flexible()], &["rm"]);
        for (name, kind) in [("rm", "scorer"), ("py", "worker"), ("fmt", "format")] {
            let e = CorrectBy::resolve(Some(name), Some(&r)).unwrap_err();
            assert!(
                e.contains("`eval.correct_by`")
                    && e.contains(&format!("is a `{kind}` source"))
                    && e.contains("(allowed: task, answer, exact;"),
                "{e}"
            );
        }
        let e = CorrectBy::resolve(Some("nope"), Some(&r)).unwrap_err();
        assert!(
            e.contains("no reward source `nope` (allowed: task, answer, exact)"),
            "{e}"
        );
        let e = CorrectBy::resolve(Some("answer"), None).unwrap_err();
        assert!(
            e.contains("`eval.correct_by`") && e.contains("(allowed: task)"),
            "{e}"
        );
        // Two routed answer checks (the task's scorer counts): the key must choose.
        let task = ("task", serde_json::json!({"kind": "scorer"}));
        let r = reward(&[task, flexible()], &["task", "answer"]);
        let e = CorrectBy::resolve(None, Some(&r)).unwrap_err();
        assert!(
            e.contains("several sources that judge answers (answer, task)")
                && e.contains("(allowed: task, answer)"),
            "{e}"
        );
        assert_eq!(
            CorrectBy::resolve(Some("task"), Some(&r)),
            Ok(CorrectBy::Task)
        );
        // `task` names the task's checker only.
        let r = reward(&[("task", serde_json::json!({"kind": "math"}))], &["task"]);
        let e = CorrectBy::resolve(None, Some(&r)).unwrap_err();
        assert!(
            e.contains("`reward.sources.task`") && e.contains("`math`"),
            "{e}"
        );
    }
}
