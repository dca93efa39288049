//! Cutting a prompt over `data.max_prompt_tokens` (`data.truncation = "left"` or `"right"`).
//!
//! A prompt rendered through a chat template is framed: the template's start (a system turn,
//! a BOS it writes), the messages, and the assistant header the model answers after. Cutting
//! the rendered tokens would drop that framing: a right cut the assistant header, so the model
//! continues the user's text instead of answering; a left cut the system turn and the
//! template's start. So the cut falls inside the question, the last user message's text, and
//! the framing stays whole. A prompt without a template is its text alone, cut as it is.

use anyhow::Result;
use skein_data::{ChatMessage, Truncation};
use skein_text::Tokenizer;
use std::ops::Range;

/// Where the question (the last user message's text) sits in `rendered`, the prompt as its
/// chat template wrote it; `None` when there is no user message or the template did not copy
/// its text (then the whole prompt is cut).
pub fn question_span(messages: &[ChatMessage], rendered: &str) -> Option<Range<usize>> {
    let question = messages.iter().rev().find(|m| m.role == "user")?;
    // A template may trim the text it copies.
    [question.content.as_str(), question.content.trim()]
        .into_iter()
        .filter(|text| !text.is_empty())
        .find_map(|text| rendered.rfind(text).map(|at| at..at + text.len()))
}

/// `prompt` (whose tokens `ids` are over `max`) cut inside `span` (its question, or all of a
/// prompt without a template) from `truncation`'s side until it re-encodes within `max`
/// tokens; `None` when even the whole span cut away leaves it over (the rest alone is too
/// long). A cut edge can re-encode into other tokens, or fall inside a character that a
/// byte-level vocabulary spells in several tokens, so the cut grows a token at a time until
/// the whole fits with no broken character at its edge.
pub fn cut_to_fit(
    tokenizer: &Tokenizer,
    prompt: &str,
    ids: &[u32],
    span: Range<usize>,
    max: usize,
    truncation: Truncation,
) -> Result<Option<String>> {
    let (before, body, after) = (
        &prompt[..span.start],
        &prompt[span.clone()],
        &prompt[span.end..],
    );
    let body_ids = tokenizer.encode(body, false)?;
    let mut keep = body_ids.len().saturating_sub(ids.len().saturating_sub(max));
    while keep > 0 {
        let (ids, edge): (_, fn(&str) -> Option<char>) = match truncation {
            Truncation::Left => (&body_ids[body_ids.len() - keep..], |t| t.chars().next()),
            _ => (&body_ids[..keep], |t| t.chars().next_back()),
        };
        let kept = tokenizer.decode(ids, false)?;
        let broken = edge(&kept) == Some(char::REPLACEMENT_CHARACTER);
        let text = format!("{before}{kept}{after}");
        if !broken && tokenizer.encode(&text, false)?.len() <= max {
            return Ok(Some(text));
        }
        keep -= 1;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A ChatML-like framing around a question of digits: each cut keeps the framing whole
    /// and takes its tokens from the question's side it names.
    #[test]
    fn a_cut_falls_inside_the_question_and_keeps_the_framing() {
        let tok = Tokenizer::char_level("<>|sytemuran:\n0123456789 ").unwrap();
        let messages = [message("system", "be terse"), message("user", "0123456789")];
        let rendered = "<|system|>\n be terse\n<|user|>\n 0123456789\n<|assistant|>\n";
        let ids = tok.encode(rendered, false).unwrap();
        let span = question_span(&messages, rendered);
        assert_eq!(span.clone().map(|s| &rendered[s]), Some("0123456789"));
        let span = span.unwrap();
        let max = ids.len() - 4;
        let right = cut_to_fit(&tok, rendered, &ids, span.clone(), max, Truncation::Right);
        assert_eq!(
            right.unwrap().unwrap(),
            "<|system|>\n be terse\n<|user|>\n 012345\n<|assistant|>\n"
        );
        let left = cut_to_fit(&tok, rendered, &ids, span.clone(), max, Truncation::Left);
        assert_eq!(
            left.unwrap().unwrap(),
            "<|system|>\n be terse\n<|user|>\n 456789\n<|assistant|>\n"
        );
        // The rest alone over the limit: no cut of the question makes it fit.
        let none = cut_to_fit(&tok, rendered, &ids, span, 10, Truncation::Right).unwrap();
        assert_eq!(none, None);
        // Without a template the whole text is the question.
        let plain = "0123456789";
        let ids = tok.encode(plain, false).unwrap();
        let cut = cut_to_fit(&tok, plain, &ids, 0..plain.len(), 4, Truncation::Left).unwrap();
        assert_eq!(cut.as_deref(), Some("6789"));
    }

    /// The span is the last user message's, found from the end (an earlier copy of its text
    /// in the system turn is not it), trimmed as a template may trim it; none without a user
    /// message.
    #[test]
    fn the_question_is_the_last_user_messages_text() {
        let messages = [message("system", "say 42"), message("user", " 42 \n")];
        let rendered = "system: say 42\nuser: 42\nassistant:";
        assert_eq!(question_span(&messages, rendered), Some(21..23));
        assert_eq!(
            question_span(&[message("system", "hi")], "system: hi"),
            None
        );
    }
}
