//! The environment-worker protocol: one JSON object per line each way, answered in order.
//! Every request but `close` also carries an `"id"` (a number, added by the pool), and its
//! answer must echo it: an answer with another id or none means the worker's answers no
//! longer line up with the requests, and it is restarted.
//!
//! | request | answer |
//! | --- | --- |
//! | `{"op":"info"}` | `{"name":…,"alphabet":…,"max_turns":N,"max_message_chars":N,"problems":N\|null,"demonstrations":bool}` |
//! | `{"op":"reset","episode":ID,"task":{"seed":N,"split":"train"\|"eval"}}` | `{"messages":[{"role":"user"\|"tool","content":…},…]}` |
//! | `{"op":"step","episode":ID,"message":TEXT}` | `{"messages":[…],"reward":x\|null,"done":false}` or `{"done":true,"reward":x,"correct":bool,"formatted":bool}` |
//! | `{"op":"demonstrate","task":{…},"transcript":[{"message":…,"reply":[…]},…],"seed":N}` | `{"message":TEXT}` |
//! | `{"op":"close","episode":ID}` | none |
//!
//! Any request may be answered `{"id":…,"error":"…"}`: that request (its episode) fails, and the
//! worker goes on. `close` is sent for an episode that ends before the worker said `done`
//! (a limit cut it off, or it failed); a worker forgets an episode once it answers `done`.

use serde::Deserialize;
use serde_json::{json, Map, Value};
use skein_tasks::{EnvMessage, EnvStep, Score, Turn};

/// Longest alphabet a worker may declare: a character-level vocabulary, one row per char.
pub const MAX_ALPHABET_CHARS: usize = 4096;

/// What a worker says about its environment (`{"op":"info"}`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Info {
    pub name: String,
    /// Every character its prompts, replies and demonstrations use (for the built-in
    /// character-level model; may be empty with a Hugging Face model).
    #[serde(default)]
    pub alphabet: String,
    pub max_turns: usize,
    pub max_message_chars: usize,
    /// Distinct problems its seeds map to (absent or null: too many to matter).
    #[serde(default)]
    pub problems: Option<u64>,
    /// Whether it answers `demonstrate` (needed by the supervised warm-up).
    #[serde(default)]
    pub demonstrations: bool,
}

impl Info {
    /// The answer to `info`, checked.
    pub fn parse(answer: Value) -> Result<Info, String> {
        let info: Info = serde_json::from_value(answer).map_err(|e| {
            format!(
                "its answer to {{\"op\":\"info\"}} is not {{\"name\", \"alphabet\", \
                 \"max_turns\", \"max_message_chars\", \"problems\", \"demonstrations\"}}: {e}"
            )
        })?;
        let problem = if info.name.trim().is_empty() {
            Some("an empty \"name\"".to_string())
        } else if info.max_turns == 0 {
            Some("\"max_turns\": 0 (must be ≥ 1)".into())
        } else if info.max_message_chars == 0 {
            Some("\"max_message_chars\": 0 (must be ≥ 1)".into())
        } else if info.alphabet.chars().count() > MAX_ALPHABET_CHARS {
            Some(format!(
                "an \"alphabet\" of {} characters (at most {MAX_ALPHABET_CHARS})",
                info.alphabet.chars().count()
            ))
        } else if info.problems == Some(0) {
            Some("\"problems\": 0 (must be ≥ 1, or null)".into())
        } else {
            None
        };
        match problem {
            Some(p) => Err(format!("its info has {p}")),
            None => Ok(info),
        }
    }
}

/// Which problems an episode's seed is drawn for.
pub fn task(seed: u64, held_out: bool) -> Value {
    json!({ "seed": seed, "split": if held_out { "eval" } else { "train" } })
}

pub fn info() -> Value {
    json!({ "op": "info" })
}

pub fn reset(episode: &str, task: &Value) -> Value {
    json!({ "op": "reset", "episode": episode, "task": task })
}

pub fn step(episode: &str, message: &str) -> Value {
    json!({ "op": "step", "episode": episode, "message": message })
}

pub fn close(episode: &str) -> Value {
    json!({ "op": "close", "episode": episode })
}

pub fn demonstrate(task: &Value, transcript: &[Turn], seed: u64) -> Value {
    let transcript: Vec<Value> = transcript
        .iter()
        .map(|t| json!({ "message": t.message, "reply": t.reply }))
        .collect();
    json!({ "op": "demonstrate", "task": task, "transcript": transcript, "seed": seed })
}

/// The messages of a `reset` or `step` answer.
fn messages(answer: &Map<String, Value>, required: bool) -> Result<Vec<EnvMessage>, String> {
    match answer.get("messages") {
        None | Some(Value::Null) if !required => Ok(Vec::new()),
        None => Err("it has no \"messages\"".into()),
        Some(m) => serde_json::from_value(m.clone()).map_err(|e| {
            format!("its \"messages\" are not a list of {{\"role\": \"user\"|\"tool\", \"content\": text}}: {e}")
        }),
    }
}

/// The first prompt's messages from a `reset` answer: at least one.
pub fn reset_answer(answer: &Map<String, Value>) -> Result<Vec<EnvMessage>, String> {
    let m = messages(answer, true)?;
    if m.is_empty() {
        return Err("its \"messages\" are empty: the first prompt needs one".into());
    }
    Ok(m)
}

/// A `step` answer as the loop's step.
pub fn step_answer(answer: &Map<String, Value>) -> Result<EnvStep, String> {
    let done = match answer.get("done") {
        Some(Value::Bool(d)) => *d,
        Some(other) => return Err(format!("its \"done\" is {other}, not true or false")),
        None => return Err("it has no \"done\"".into()),
    };
    let reward = match answer.get("reward") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_f64().filter(|r| r.is_finite()) {
            Some(r) => Some(r),
            None => return Err(format!("its \"reward\" {n} is not a finite number")),
        },
        Some(other) => return Err(format!("its \"reward\" is {other}, not a number or null")),
    };
    let flag = |key: &str, default: bool| match answer.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("its \"{key}\" is {other}, not true or false")),
    };
    if !done {
        return Ok(EnvStep::Continue {
            messages: messages(answer, false)?,
            reward,
        });
    }
    let Some(reward) = reward else {
        return Err("it says \"done\": true without a \"reward\"".into());
    };
    Ok(EnvStep::Done(Score {
        reward,
        correct: flag("correct", reward > 0.0)?,
        formatted: flag("formatted", true)?,
    }))
}

/// The optional `"state"` of a `reset` or `step` answer: the key of the state the next
/// message is written in (for step groups).
pub fn state_answer(answer: &Map<String, Value>) -> Result<Option<String>, String> {
    match answer.get("state") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("its \"state\" is {other}, not text or null")),
    }
}

/// The message of a `demonstrate` answer.
pub fn demonstrate_answer(answer: &Map<String, Value>) -> Result<String, String> {
    match answer.get("message") {
        Some(Value::String(m)) => Ok(m.clone()),
        _ => Err("it has no \"message\" text".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn info_is_checked_and_names_what_is_wrong() {
        let good = json!({"name": "guess", "alphabet": "0123", "max_turns": 6,
                          "max_message_chars": 2, "problems": 16, "demonstrations": true});
        let info = Info::parse(good.clone()).unwrap();
        assert_eq!((info.max_turns, info.problems), (6, Some(16)));
        let minimal = json!({"name": "g", "max_turns": 1, "max_message_chars": 1});
        let info = Info::parse(minimal).unwrap();
        assert!(!info.demonstrations && info.problems.is_none() && info.alphabet.is_empty());
        for (key, value, says) in [
            ("max_turns", json!(0), "max_turns"),
            ("name", json!(" "), "name"),
            ("max_message_chars", json!(-1), "max_message_chars"),
            ("colour", json!("red"), "colour"),
            ("problems", json!(0), "problems"),
        ] {
            let mut bad = good.clone();
            bad[key] = value;
            let e = Info::parse(bad).unwrap_err();
            assert!(e.contains(says), "{key}: {e}");
        }
    }

    #[test]
    fn states_are_optional_text() {
        let state = |v: Value| state_answer(v.as_object().unwrap());
        assert_eq!(state(json!({})), Ok(None));
        assert_eq!(state(json!({"state": null})), Ok(None));
        assert_eq!(state(json!({"state": "8> "})), Ok(Some("8> ".into())));
        let err = state(json!({"state": 3})).unwrap_err();
        assert!(err.contains("\"state\" is 3"), "{err}");
    }

    #[test]
    fn step_answers_continue_or_finish_and_reject_what_is_malformed() {
        let go = obj(json!({"messages": [{"role": "user", "content": "higher"}], "done": false}));
        assert_eq!(
            step_answer(&go).unwrap(),
            EnvStep::Continue {
                messages: vec![EnvMessage::user("higher")],
                reward: None
            }
        );
        let done = obj(json!({"done": true, "reward": 0.5}));
        let EnvStep::Done(s) = step_answer(&done).unwrap() else {
            panic!()
        };
        assert!(s.correct && s.formatted && s.reward == 0.5);
        for (bad, says) in [
            (json!({"messages": []}), "no \"done\""),
            (json!({"done": "yes"}), "\"done\""),
            (json!({"done": true}), "without a \"reward\""),
            (json!({"done": false, "reward": "1"}), "\"reward\""),
            (
                json!({"done": false, "messages": [{"role": "system", "content": "x"}]}),
                "\"messages\"",
            ),
            (
                json!({"done": true, "reward": 1, "correct": 1}),
                "\"correct\"",
            ),
        ] {
            let e = step_answer(&obj(bad.clone())).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_reset_needs_a_first_message_and_requests_carry_the_episode() {
        assert!(reset_answer(&obj(json!({"messages": []})))
            .unwrap_err()
            .contains("empty"));
        assert!(reset_answer(&obj(json!({}))).is_err());
        let r = reset("e1", &task(7, true));
        assert_eq!(r["task"], json!({"seed": 7, "split": "eval"}));
        assert_eq!(step("e1", "8")["episode"], "e1");
        let turns = [Turn {
            message: "8".into(),
            reply: vec![EnvMessage::user("lower")],
        }];
        let d = demonstrate(&task(1, false), &turns, 3);
        assert_eq!(d["transcript"][0]["reply"][0]["content"], "lower");
    }
}
