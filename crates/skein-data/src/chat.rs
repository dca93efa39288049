//! Chat JSONL for supervised fine-tuning: one `{"messages": [{role, content}, ...]}` per line,
//! with at least one assistant message (the tokens the loss trains on).

use crate::error::DataError;
use crate::row::{kind, messages, ChatMessage};
use crate::rows::{ReadOptions, Rows};
use serde_json::Value;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
}

/// Reads one conversation; the error names the field.
pub fn conversation_from_json(value: &Value) -> Result<Conversation, String> {
    let list = match value.get("messages") {
        Some(Value::Array(items)) => messages(items, "messages")?,
        None | Some(Value::Null) => {
            return Err(format!(
                "missing `messages` (expected {{\"messages\": [{{\"role\": ..., \"content\": ...}}]}}, got {})",
                kind(value)
            ))
        }
        Some(other) => return Err(format!("`messages` must be a list, got {}", kind(other))),
    };
    if !list.iter().any(|m| m.role == "assistant") {
        return Err("no `assistant` message: nothing to train on".into());
    }
    Ok(Conversation { messages: list })
}

/// Reads chat JSONL files; bad lines are errors or counted skips, as for prompts.
pub fn load_conversations(
    files: &[PathBuf],
    opts: &ReadOptions,
) -> Result<Rows<Conversation>, DataError> {
    let mut all = Rows::default();
    for file in files {
        let rows = crate::jsonl::read(file, opts, conversation_from_json)?;
        all.extend(rows);
    }
    if all.rows.is_empty() {
        return Err(all.none_left(files, "conversations"));
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conversations_need_an_assistant_turn() {
        let ok = json!({"messages": [{"role": "user", "content": "hi"},
                                     {"role": "assistant", "content": "hello"}]});
        assert_eq!(conversation_from_json(&ok).unwrap().messages.len(), 2);
        let no_reply = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert!(conversation_from_json(&no_reply)
            .unwrap_err()
            .contains("no `assistant`"));
        assert!(conversation_from_json(&json!({"text": "x"}))
            .unwrap_err()
            .contains("missing `messages`"));
        assert!(conversation_from_json(&json!({"messages": "x"}))
            .unwrap_err()
            .contains("must be a list"));
    }

    /// Files whose every line was skipped as bad say why the first was.
    #[test]
    fn no_conversation_left_names_the_first_bad_line() {
        let dir = std::env::temp_dir().join(format!("skein-chat-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("chat.jsonl");
        let line = r#"{"messages": [{"role": "user", "content": "hi"}]}"#;
        std::fs::write(&file, format!("{line}\n{line}\n")).unwrap();
        let opts = ReadOptions {
            skip_bad_rows: true,
        };
        let err = load_conversations(std::slice::from_ref(&file), &opts).unwrap_err();
        let err = err.to_string();
        assert!(err.contains("all 2 were bad"), "{err}");
        assert!(
            err.contains("chat.jsonl, row 1: no `assistant` message"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
