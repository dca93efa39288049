//! Tool calls in the Qwen/Hermes format, read back from a model's text:
//! `<tool_call>{"name": "calc", "arguments": {"expr": "1+2"}}</tool_call>`.
//!
//! The text is untrusted model output, so every failure is an error that says what is wrong and
//! quotes a short piece of the text; nothing here panics.

use crate::chat_template::ToolCall;
use serde_json::Value;
use std::fmt;

/// Where a tool call begins in a model's text.
pub const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// The tags around a call, which a message's text must keep.
pub const TAGS: [&str; 2] = [OPEN, CLOSE];
/// Characters of offending text an error quotes.
const QUOTE_CHARS: usize = 40;

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallError(String);

impl fmt::Display for ToolCallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ToolCallError {}

/// A short, char-boundary-safe excerpt for error messages.
fn quote(text: &str) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(QUOTE_CHARS).collect();
    if chars.next().is_some() {
        format!("{head:?}…")
    } else {
        format!("{head:?}")
    }
}

/// The bodies of the blocks of `text`, or the first structural error.
fn blocks(text: &str) -> Result<Vec<&str>, ToolCallError> {
    let mut out = Vec::new();
    let mut pos = 0;
    loop {
        let rest = &text[pos..];
        let open = rest.find(OPEN);
        if let Some(c) = rest.find(CLOSE).filter(|&c| open.is_none_or(|o| c < o)) {
            return Err(ToolCallError(format!(
                "`{CLOSE}` without an opening `{OPEN}` at {}",
                quote(&rest[c..])
            )));
        }
        let Some(o) = open else {
            return Ok(out);
        };
        let body_start = pos + o + OPEN.len();
        let Some(c) = text[body_start..].find(CLOSE) else {
            return Err(ToolCallError(format!(
                "unclosed `{OPEN}`: {}",
                quote(&text[pos + o..])
            )));
        };
        let body = &text[body_start..body_start + c];
        if body.contains(OPEN) {
            return Err(ToolCallError(format!(
                "`{OPEN}` inside another tool call: {}",
                quote(body.trim())
            )));
        }
        let end = body_start + c + CLOSE.len();
        out.push(body);
        pos = end;
    }
}

fn parse_one(body: &str) -> Result<ToolCall, ToolCallError> {
    let body = body.trim();
    let value: Value = serde_json::from_str(body).map_err(|e| {
        ToolCallError(format!(
            "tool call is not valid JSON ({e}): {}",
            quote(body)
        ))
    })?;
    let Value::Object(mut obj) = value else {
        return Err(ToolCallError(format!(
            "tool call is not a JSON object: {}",
            quote(body)
        )));
    };
    let name = match obj.remove("name") {
        Some(Value::String(name)) if !name.is_empty() => name,
        Some(_) => {
            return Err(ToolCallError(format!(
                "tool call `name` is not a non-empty string: {}",
                quote(body)
            )))
        }
        None => {
            return Err(ToolCallError(format!(
                "tool call has no `name`: {}",
                quote(body)
            )))
        }
    };
    // A call without arguments is a call with none; a string is kept as the JSON text it is
    // (the OpenAI shape `ToolCall` also allows), once it is seen to hold an object: clients
    // parse it, and a tool reads its arguments from it.
    let arguments = match obj.remove("arguments") {
        None => Value::Object(Default::default()),
        Some(a @ Value::Object(_)) => a,
        Some(Value::String(text)) => {
            if !matches!(serde_json::from_str(&text), Ok(Value::Object(_))) {
                return Err(ToolCallError(format!(
                    "tool call `arguments` is a string that is not a JSON object: {}",
                    quote(body)
                )));
            }
            Value::String(text)
        }
        Some(_) => {
            return Err(ToolCallError(format!(
                "tool call `arguments` is neither an object nor a JSON string: {}",
                quote(body)
            )))
        }
    };
    // Any other key is a call in another shape (e.g. `parameters` for the arguments): taken
    // as a call without arguments, it would run with none and say nothing.
    if let Some(key) = obj.keys().next() {
        return Err(ToolCallError(format!(
            "tool call has key `{key}` besides `name` and `arguments`: {}",
            quote(body)
        )));
    }
    Ok(ToolCall::function(name, arguments))
}

/// Every `<tool_call>...</tool_call>` block of `text`, in order. Whitespace around the JSON is
/// allowed; text outside the blocks is ignored. No blocks: an empty list.
pub fn parse_tool_calls(text: &str) -> Result<Vec<ToolCall>, ToolCallError> {
    blocks(text)?.into_iter().map(parse_one).collect()
}

/// The text outside complete tool-call blocks, trimmed. A malformed block's text is kept.
pub fn strip_tool_calls(text: &str) -> String {
    let mut out = String::new();
    let mut pos = 0;
    while let Some(o) = text[pos..].find(OPEN) {
        let body_start = pos + o + OPEN.len();
        let Some(c) = text[body_start..].find(CLOSE) else {
            break;
        };
        out.push_str(&text[pos..pos + o]);
        pos = body_start + c + CLOSE.len();
    }
    out.push_str(&text[pos..]);
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_compact_and_spaced_blocks() {
        let text = "Let me compute.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"1+2\"}}\n</tool_call>\
                    <tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}</tool_call>";
        let calls = parse_tool_calls(text).unwrap();
        assert_eq!(
            calls,
            vec![
                ToolCall::function("calc", json!({"expr": "1+2"})),
                ToolCall::function("f", json!("{\"x\":1}")),
            ]
        );
        assert_eq!(strip_tool_calls(text), "Let me compute.");
        assert_eq!(
            parse_tool_calls("<tool_call>{\"name\":\"g\"}</tool_call>").unwrap(),
            vec![ToolCall::function("g", json!({}))]
        );
    }

    #[test]
    fn no_blocks_is_an_empty_list() {
        for text in ["", "42", "just text with <tool and tags>"] {
            assert_eq!(parse_tool_calls(text).unwrap(), vec![]);
            assert_eq!(strip_tool_calls(text), text.trim());
        }
    }

    #[test]
    fn malformed_blocks_say_what_is_wrong() {
        let cases = [
            ("<tool_call>{\"name\": \"calc\"", "unclosed"),
            ("<tool_call>{name: calc}</tool_call>", "not valid JSON"),
            ("<tool_call>[1, 2]</tool_call>", "not a JSON object"),
            ("<tool_call>{\"arguments\": {}}</tool_call>", "no `name`"),
            ("<tool_call>{\"name\": 3}</tool_call>", "`name`"),
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>",
                "`arguments`",
            ),
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": \"oops\"}</tool_call>",
                "string that is not a JSON object",
            ),
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": \"[1]\"}</tool_call>",
                "string that is not a JSON object",
            ),
            (
                "<tool_call>{\"name\": \"calc\", \"parameters\": {\"expr\": \"1\"}}</tool_call>",
                "key `parameters` besides",
            ),
            ("x</tool_call>", "without an opening"),
            (
                "<tool_call><tool_call>{}</tool_call></tool_call>",
                "inside another",
            ),
        ];
        for (text, want) in cases {
            let e = parse_tool_calls(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let long = format!("<tool_call>{}</tool_call>", "x".repeat(500));
        let e = parse_tool_calls(&long).unwrap_err().to_string();
        assert!(e.len() < 200 && e.contains('…'), "{e}");
    }

    #[test]
    fn arbitrary_text_never_panics() {
        let pieces = [
            "<tool_call>",
            "</tool_call>",
            "{",
            "}",
            "\"name\"",
            ":",
            "\"calc\"",
            ",",
            "\"arguments\"",
            "é🙂",
            " ",
            "<",
            "tool_call>",
            "\n",
        ];
        let mut state = 7u64;
        for _ in 0..3000 {
            let mut text = String::new();
            for _ in 0..(state % 12) {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                text.push_str(pieces[(state >> 33) as usize % pieces.len()]);
            }
            let _ = parse_tool_calls(&text);
            let _ = strip_tool_calls(&text);
        }
    }
}
