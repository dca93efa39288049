//! One prompt row, and its validation from a JSON value (JSONL lines and parquet records both
//! arrive here as JSON, so both formats accept and reject exactly the same rows).

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// A validated prompt row.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRow {
    pub prompt: Vec<ChatMessage>,
    pub data_source: String,
    pub ground_truth: String,
    /// Anything the row carries besides; `null` when absent.
    pub extra_info: Value,
}

impl PromptRow {
    /// The row as a JSON object in the verl layout (what `from_json` reads).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "prompt": self.prompt,
            "data_source": self.data_source,
            "reward_model": {"ground_truth": self.ground_truth},
            "extra_info": self.extra_info,
        })
    }
}

const LISTED_PROMPT: &str = "`prompt` is the JSON text of a message list, which would be one \
    user message of that text: store the list itself (a list column in parquet, a JSON list \
    here)";

/// Reads a row; the error says which field is wrong and how (the caller adds file and row).
pub fn from_json(value: &Value) -> Result<PromptRow, String> {
    let Value::Object(obj) = value else {
        return Err(format!(
            "expected a JSON object with `prompt`, `data_source` and `reward_model`, got {}",
            kind(value)
        ));
    };
    let prompt = match obj.get("prompt") {
        None | Some(Value::Null) => return Err("missing `prompt`".into()),
        Some(Value::String(s)) if is_message_list_text(s) => return Err(LISTED_PROMPT.into()),
        Some(Value::String(s)) => vec![ChatMessage {
            role: "user".into(),
            content: s.clone(),
        }],
        Some(Value::Array(items)) => messages(items, "prompt")?,
        Some(other) => {
            return Err(format!(
                "`prompt` must be a list of chat messages or a string, got {}",
                kind(other)
            ))
        }
    };
    let data_source = match obj.get("data_source") {
        None | Some(Value::Null) => return Err("missing `data_source`".into()),
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::String(_)) => return Err("`data_source` is empty".into()),
        Some(other) => {
            return Err(format!(
                "`data_source` must be a string, got {}",
                kind(other)
            ))
        }
    };
    let ground_truth = match obj.get("reward_model") {
        None | Some(Value::Null) => return Err("missing `reward_model.ground_truth`".into()),
        Some(Value::Object(rm)) => match rm.get("ground_truth") {
            None | Some(Value::Null) => return Err("missing `reward_model.ground_truth`".into()),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => numeric_truth(n)?,
            Some(other) => {
                return Err(format!(
                    "`reward_model.ground_truth` must be a string or a number, got {}",
                    kind(other)
                ))
            }
        },
        Some(other) => {
            return Err(format!(
                "`reward_model` must be an object with `ground_truth`, got {}",
                kind(other)
            ))
        }
    };
    Ok(PromptRow {
        prompt,
        data_source,
        ground_truth,
        extra_info: obj.get("extra_info").cloned().unwrap_or(Value::Null),
    })
}

/// Whether a string prompt is a message list written as JSON text (`json.dumps(messages)`, as
/// some pipelines store it to avoid nested columns), not a question.
fn is_message_list_text(prompt: &str) -> bool {
    let text = prompt.trim();
    if !text.starts_with('[') {
        return false;
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) => {
            !items.is_empty()
                && items
                    .iter()
                    .all(|m| m.get("role").is_some() && m.get("content").is_some())
        }
        _ => false,
    }
}

/// A numeric ground truth as its decimal text: `42` and `"42"` mean the same answer, and so do
/// `0.000001` and `"0.000001"` (JSON's own text of a float that small is in exponent form,
/// `1e-6`, which no answer writes). A float that is a whole number from 2^53 on is refused:
/// its last digits may be lost (an integer beyond 64 bits, or 12345678901234567.0, reads back
/// as ...568), so the row could never be solved.
fn numeric_truth(n: &serde_json::Number) -> Result<String, String> {
    let text = n.to_string();
    let exact = |f: f64| f.is_finite() && (f.fract() != 0.0 || f.abs() < 2f64.powi(53));
    let float = n.as_f64().filter(|_| n.is_f64());
    match float {
        None => Ok(text),
        Some(f) if exact(f) && !text.contains(['e', 'E']) => Ok(text),
        Some(f) if exact(f) => Ok(format!("{f}")),
        Some(_) => Err(format!(
            "`reward_model.ground_truth` is the number {text}, a whole number too large for a \
             float to hold every digit of (an integer beyond 64 bits loses its last ones): \
             store it as a string of the answer as written"
        )),
    }
}

/// The roles of the OpenAI chat format, which chat templates render. Any other role would be
/// dropped or rejected by the template at training time, after the run has started.
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// A non-empty list of `{role, content}` objects; `field` names it in errors.
pub fn messages(items: &[Value], field: &str) -> Result<Vec<ChatMessage>, String> {
    if items.is_empty() {
        return Err(format!("`{field}` has no messages"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(m) = m else {
                return Err(format!(
                    "`{field}[{i}]` must be an object with `role` and `content`, got {}",
                    kind(m)
                ));
            };
            let text = |key: &str| match m.get(key) {
                Some(Value::String(s)) => Ok(s.clone()),
                None | Some(Value::Null) => Err(format!("`{field}[{i}]` has no `{key}`")),
                Some(other) => Err(format!(
                    "`{field}[{i}].{key}` must be a string, got {}",
                    kind(other)
                )),
            };
            // Structured calls would be dropped without a word (only `content` is read), and
            // the assistant turn trained as empty.
            let calls = m.get("tool_calls");
            if calls.is_some_and(|c| !c.is_null() && c.as_array().is_none_or(|a| !a.is_empty())) {
                return Err(format!(
                    "`{field}[{i}]` has `tool_calls`, which skein does not read: write the calls \
                     in its `content`, as the model writes them (e.g. \
                     <tool_call>{{\"name\": …, \"arguments\": …}}</tool_call>)"
                ));
            }
            let role = text("role")?;
            if !ROLES.contains(&role.as_str()) {
                return Err(format!(
                    "`{field}[{i}].role` is `{role}` (allowed: {})",
                    ROLES.join(", ")
                ));
            }
            Ok(ChatMessage {
                role,
                content: text("content")?,
            })
        })
        .collect()
}

/// What a JSON value is, for error messages: its type and, when short, the value itself.
pub fn kind(v: &Value) -> String {
    let name = match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    let text = v.to_string();
    if text.chars().count() <= 40 && !matches!(v, Value::Null) {
        format!("{name} ({text})")
    } else {
        name.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_field_problem_is_named() {
        let ok = json!({"prompt": [{"role": "user", "content": "1+1="}], "data_source": "a",
                        "reward_model": {"ground_truth": 2}});
        let row = from_json(&ok).unwrap();
        assert_eq!(row.ground_truth, "2");
        assert_eq!(row.extra_info, Value::Null);
        let cases = [
            (json!([1]), "expected a JSON object"),
            (
                json!({"data_source": "a", "reward_model": {"ground_truth": "1"}}),
                "missing `prompt`",
            ),
            (
                json!({"prompt": 3, "data_source": "a", "reward_model": {"ground_truth": "1"}}),
                "`prompt` must be a list",
            ),
            (
                json!({"prompt": [], "data_source": "a", "reward_model": {"ground_truth": "1"}}),
                "`prompt` has no messages",
            ),
            (
                json!({"prompt": ["hi"], "data_source": "a", "reward_model": {"ground_truth": "1"}}),
                "`prompt[0]` must be an object",
            ),
            (
                json!({"prompt": [{"role": "user"}], "data_source": "a", "reward_model": {"ground_truth": "1"}}),
                "`prompt[0]` has no `content`",
            ),
            (
                json!({"prompt": [{"role": 1, "content": "x"}], "data_source": "a", "reward_model": {"ground_truth": "1"}}),
                "`prompt[0].role` must be a string",
            ),
            (
                json!({"prompt": [{"role": "wizard", "content": "x"}], "data_source": "a", "reward_model": {"ground_truth": "1"}}),
                "`prompt[0].role` is `wizard` (allowed: system, developer, user, assistant, tool)",
            ),
            (
                json!({"prompt": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc"}}]}], "data_source": "a", "reward_model": {"ground_truth": "1"}}),
                "`prompt[0]` has `tool_calls`, which skein does not read",
            ),
            (
                json!({"prompt": "x", "reward_model": {"ground_truth": "1"}}),
                "missing `data_source`",
            ),
            (
                json!({"prompt": "x", "data_source": 7, "reward_model": {"ground_truth": "1"}}),
                "`data_source` must be a string",
            ),
            (
                json!({"prompt": "x", "data_source": "a"}),
                "missing `reward_model.ground_truth`",
            ),
            (
                json!({"prompt": "x", "data_source": "a", "reward_model": "1"}),
                "`reward_model` must be an object",
            ),
            (
                json!({"prompt": "x", "data_source": "a", "reward_model": {"style": "rule"}}),
                "missing `reward_model.ground_truth`",
            ),
            (
                json!({"prompt": "x", "data_source": "a", "reward_model": {"ground_truth": [1]}}),
                "`reward_model.ground_truth` must be a string or a number",
            ),
        ];
        let listed = r#"[{"role": "user", "content": "2+2="}]"#;
        let cases = cases.into_iter().chain([(
            json!({"prompt": listed, "data_source": "a", "reward_model": {"ground_truth": "4"}}),
            "`prompt` is the JSON text of a message list",
        )]);
        for (value, needle) in cases {
            let err = from_json(&value).unwrap_err();
            assert!(err.contains(needle), "{value}: {err}");
        }
    }

    /// A numeric ground truth is its decimal text, never exponent form; one beyond the 64-bit
    /// integers, whose digits were lost, is refused rather than never matched.
    #[test]
    fn numeric_ground_truths_are_their_decimal_text_or_refused() {
        let truth = |number: &str| {
            let row = format!(
                r#"{{"prompt": "x", "data_source": "a", "reward_model": {{"ground_truth": {number}}}}}"#
            );
            from_json(&serde_json::from_str(&row).unwrap()).map(|r| r.ground_truth)
        };
        for (number, text) in [
            ("42", "42"),
            ("-7", "-7"),
            ("2.5", "2.5"),
            ("18446744073709551615", "18446744073709551615"),
            ("-9223372036854775808", "-9223372036854775808"),
            ("0.000001", "0.000001"),
            ("1e-7", "0.0000001"),
            ("-2.5E-6", "-0.0000025"),
            ("123456789012345.0", "123456789012345.0"),
        ] {
            assert_eq!(truth(number).unwrap(), text);
        }
        for number in [
            "18446744073709551616",
            "-9223372036854775809",
            "1e20",
            "12345678901234567.0",
            "9007199254740993.0",
        ] {
            let err = truth(number).unwrap_err();
            assert!(err.contains("store it as a string"), "{number}: {err}");
        }
    }

    #[test]
    fn a_string_prompt_is_one_user_message_and_rows_round_trip() {
        // Text that only looks like JSON is a question like any other.
        for prompt in ["[1, 2] + [3] = ?", "[{\"a\": 1}] has how many keys?", "[]"] {
            let row = from_json(&json!({"prompt": prompt, "data_source": "s",
                "reward_model": {"ground_truth": "x"}}))
            .unwrap();
            assert_eq!(row.prompt[0].content, prompt);
        }
        let row = from_json(&json!({"prompt": "2+3=", "data_source": "s",
            "reward_model": {"ground_truth": "5"}, "extra_info": {"index": 4}}))
        .unwrap();
        assert_eq!(
            row.prompt,
            vec![ChatMessage {
                role: "user".into(),
                content: "2+3=".into()
            }]
        );
        assert_eq!(from_json(&row.to_json()).unwrap(), row);
        // No calls (null or none) is no call.
        for calls in [Value::Null, json!([])] {
            let m = json!([{"role": "assistant", "content": "7", "tool_calls": calls}]);
            assert!(messages(m.as_array().unwrap(), "messages").is_ok());
        }
    }
}
