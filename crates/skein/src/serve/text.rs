//! The text side of the served model: chat messages become prompt ids once (template, then
//! tokenizer), and sampled ids become text only for the response body. Clients get the ids
//! themselves too, so nothing downstream ever retokenizes.

use super::error::ApiError;
use crate::engine::TokenWatch;
use skein_text::{ChatTemplate, Message, Tokenizer, UnknownChars};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Tokenizer, chat template and stop ids of the served model.
pub struct TextSide {
    /// Shared with the engine's stop-string tests.
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    eos: Vec<u32>,
    /// Rows of the model's embedding table: token-id prompts must stay below it.
    vocab_size: usize,
    /// The most bytes of text one token can stand for: a prompt longer than the context times
    /// this cannot fit, and is refused before the tokenizer spends time on it.
    bytes_per_token: usize,
    /// A prompt had characters outside the vocabulary, and the server said so.
    unknown_warned: AtomicBool,
    /// A request offered tools the chat template does not render, and the server said so.
    unrendered_tools_warned: AtomicBool,
}

/// Adds each id of `extra` to `ids` once; the first one outside a vocabulary of `vocab_size`
/// is the error, and adds nothing after it.
pub fn add_stop_ids(ids: &mut Vec<u32>, extra: &[u32], vocab_size: usize) -> Result<(), u32> {
    for &id in extra {
        if id as usize >= vocab_size {
            return Err(id);
        }
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(())
}

/// A token that stands for one character the vocabulary lacks covers up to four bytes.
const MIN_BYTES_PER_TOKEN: usize = 4;

impl TextSide {
    /// `vocab_size` is the model's (its embedding rows), which may exceed the tokenizer's.
    pub fn new(tokenizer: Tokenizer, vocab_size: usize) -> anyhow::Result<Self> {
        let template = tokenizer.chat_template()?;
        let eos = tokenizer.stop_token_ids();
        // A vocabulary entry is spelled in at least as many bytes as the text it matches
        // (byte-level and metaspace spellings take more, never fewer).
        let longest = tokenizer
            .inner()
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max();
        Ok(TextSide {
            tokenizer: Arc::new(tokenizer),
            template,
            eos,
            vocab_size,
            bytes_per_token: longest.unwrap_or(0).max(MIN_BYTES_PER_TOKEN),
            unknown_warned: AtomicBool::new(false),
            unrendered_tools_warned: AtomicBool::new(false),
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Ids that end a completion.
    pub fn stop_ids(&self) -> &[u32] {
        &self.eos
    }

    /// Rows of the model's embedding table.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The same, with `extra` ending every completion too (a trainer's
    /// `rollout.sampling.stop_token_ids`, so its agents' turns end where its own engine's do).
    pub fn with_stop_ids(mut self, extra: &[u32]) -> anyhow::Result<Self> {
        if let Err(id) = add_stop_ids(&mut self.eos, extra, self.vocab_size) {
            anyhow::bail!(
                "stop token id {id} is outside the vocabulary of {} tokens",
                self.vocab_size
            );
        }
        Ok(self)
    }

    /// The rendered chat prompt (generation prompt appended, the template's extra `variables`
    /// set) and its ids, refused unread when its text is too long to fit in `capacity` tokens.
    pub fn chat_prompt(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        variables: &serde_json::Map<String, serde_json::Value>,
        capacity: usize,
    ) -> Result<(String, Vec<u32>), ApiError> {
        let template = self.template.as_ref().ok_or_else(|| {
            ApiError::bad_request(
                "the served model has no chat template: use /v1/completions with a prompt",
            )
        })?;
        let render = |tools| {
            template
                .render_with(messages, tools, true, variables)
                .map_err(|e| ApiError::bad_request(format!("rendering the chat template: {e:#}")))
        };
        let text = render(tools)?;
        let offered = match tools {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Array(list)) => !list.is_empty(),
            Some(_) => true,
        };
        // A model trained on its tools may call them unseen, so the request is served; but an
        // agent whose schemas never reach the model should hear of it.
        if offered
            && !self.unrendered_tools_warned.load(Ordering::Relaxed)
            && render(None)? == text
            && !self.unrendered_tools_warned.swap(true, Ordering::Relaxed)
        {
            eprintln!(
                "skein serve: warning: the model's chat template does not render `tools` (a \
                 request's prompt is the same with and without them), so the model does not \
                 see them; its tool calls are still read. Describe the tools in a message, or \
                 serve a model whose template renders them (reported once)"
            );
        }
        self.check_bytes(&text, capacity)?;
        let (ids, _) = self.encode(&text, false)?;
        // The template's own text is in the vocabulary: what counts is the messages'.
        let contents: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
        let (_, unknown) = self.encode(&contents.join("\n"), false)?;
        self.check_unknown(&unknown, "the messages")?;
        Ok((text, ids))
    }

    /// Ids of a plain-text prompt as training gives them ([`Tokenizer::encode_plain_prompt`]):
    /// after what the tokenizer puts before a text (e.g. a BOS), and without an EOS its
    /// post-processor may put after it, which would end the completion before it began;
    /// refused unread when it is too long to fit in `capacity` tokens.
    pub fn text_prompt(&self, text: &str, capacity: usize) -> Result<Vec<u32>, ApiError> {
        self.check_bytes(text, capacity)?;
        let (ids, unknown) = self
            .tokenizer
            .encode_plain_prompt_checked(text)
            .map_err(|e| {
                ApiError::bad_request(format!("the tokenizer cannot encode the prompt: {e:#}"))
            })?;
        self.check_unknown(&unknown, "the prompt")?;
        Ok(ids)
    }

    /// Refuses a prompt of which no character is in the vocabulary (the model would read only
    /// unknown tokens); the first prompt with some such characters is reported on the
    /// server's standard error, once.
    fn check_unknown(&self, unknown: &UnknownChars, what: &str) -> Result<(), ApiError> {
        if unknown.is_total() {
            return Err(ApiError::bad_request(format!(
                "none of the characters of {what} is in the model's vocabulary ({}): the model \
                 would read only unknown tokens",
                unknown.examples_text()
            )));
        }
        if !unknown.is_empty() && !self.unknown_warned.swap(true, Ordering::Relaxed) {
            eprintln!(
                "skein serve: warning: a request's prompt has {unknown}, which the model reads \
                 as its unknown token (reported for the first such request only)"
            );
        }
        Ok(())
    }

    /// Refuses text whose every token would have to stand for more bytes than any token does:
    /// it cannot fit in `capacity` tokens (with one left for the completion).
    fn check_bytes(&self, text: &str, capacity: usize) -> Result<(), ApiError> {
        let limit = capacity.saturating_mul(self.bytes_per_token);
        if text.len() >= limit {
            return Err(ApiError::bad_request(format!(
                "the prompt is {} bytes; the model's context of {capacity} tokens holds at most \
                 {limit} bytes of text (no token is longer than {} bytes): shorten the prompt",
                text.len(),
                self.bytes_per_token
            )));
        }
        Ok(())
    }

    /// Ids of `text`, and its characters outside the vocabulary.
    fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<(Vec<u32>, UnknownChars), ApiError> {
        self.tokenizer
            .encode_checked(text, add_special_tokens)
            .map_err(|e| {
                ApiError::bad_request(format!("the tokenizer cannot encode the prompt: {e:#}"))
            })
    }

    /// Checks a token-id prompt against the model's vocabulary.
    pub fn check_ids(&self, ids: &[u32]) -> Result<(), ApiError> {
        match ids.iter().position(|&id| id as usize >= self.vocab_size) {
            Some(i) => Err(ApiError::bad_request(format!(
                "prompt token {i} is id {}, outside the model's vocabulary of {} ids",
                ids[i], self.vocab_size
            ))),
            None => Ok(()),
        }
    }

    /// The engine's test for a completion whose text holds one of `stops` (none when there
    /// are none), so generation ends at the token that completes one instead of running on.
    /// It decodes the last few tokens, enough to spell the longest stop string with one token
    /// to spare (a token spells at least a byte, and a decode that starts at the spare token
    /// cannot change the text after it), and only when a stop string shows there, the whole
    /// completion: yes means the completion's text, as [`decode`](Self::decode) gives it,
    /// holds a stop string.
    pub fn stop_watch(&self, stops: &[String]) -> Option<TokenWatch> {
        let longest = stops.iter().map(String::len).max()?;
        let window = longest + 1;
        let tokenizer = Arc::clone(&self.tokenizer);
        let stops = stops.to_vec();
        let holds_stop = move |ids: &[u32]| {
            tokenizer
                .decode_message(ids)
                .is_ok_and(|text| stops.iter().any(|s| text.contains(s.as_str())))
        };
        Some(TokenWatch::new(move |generated: &[u32]| {
            let tail = &generated[generated.len().saturating_sub(window)..];
            holds_stop(tail) && holds_stop(generated)
        }))
    }

    /// Completion text as a client reads it: special tokens (the stop token) left out, the
    /// tool-call tags kept ([`Tokenizer::decode_message`]).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ApiError> {
        self.tokenizer.decode_message(ids).map_err(|e| {
            ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                format!("decoding the completion: {e:#}"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;
    use skein_text::ChatTemplate;

    fn side() -> TextSide {
        let tok = Tokenizer::char_level("abc 0123456789").unwrap();
        let n = tok.vocab_size();
        TextSide::new(tok, n).unwrap()
    }

    #[test]
    fn chat_prompt_is_the_encoding_of_the_rendered_template() {
        let t = side();
        let (text, ids) = t
            .chat_prompt(&[Message::user("ab 12")], None, &Map::new(), 64)
            .unwrap();
        assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
        assert_eq!(ids, t.tokenizer().encode(&text, false).unwrap());
        assert_eq!(t.stop_ids(), &[4]);
    }

    /// A tokenizer whose post-processor puts a BOS before a text and an EOS after it (the
    /// `bpe-bos` fixture's, given the EOS): a text prompt gets the BOS and not the EOS, as a
    /// plain prompt does in training.
    #[test]
    fn a_text_prompt_has_the_start_tokens_and_no_end_of_text() {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../skein-text/tests/fixtures/bpe-bos");
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture.join("tokenizer.json")).unwrap())
                .unwrap();
        let post = &mut json["post_processor"];
        let eos = serde_json::json!({"SpecialToken": {"id": "</s>", "type_id": 0}});
        post["single"].as_array_mut().unwrap().push(eos);
        post["special_tokens"]["</s>"] =
            serde_json::json!({"id": "</s>", "ids": [2], "tokens": ["</s>"]});
        let dir = std::env::temp_dir().join(format!("skein-serve-eos-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
        let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        let n = tok.vocab_size();
        let t = TextSide::new(tok, n).unwrap();
        let ids = t.text_prompt("hello world", 64).unwrap();
        let text = t.tokenizer().encode("hello world", false).unwrap();
        assert_eq!(ids, [&[1][..], &text].concat());
        let whole = t.tokenizer().encode("hello world", true).unwrap();
        assert_eq!(
            whole.last(),
            Some(&2),
            "the post-processor does add the EOS"
        );
    }

    /// Tools offered to a template that never renders them reach no model: the server says
    /// so (once) and serves the request, whose model may have learnt its tools unseen; a
    /// template that renders them, or no tools offered, says nothing.
    #[test]
    fn tools_a_template_does_not_render_are_reported() {
        let user = [Message::user("12")];
        let tools = serde_json::json!([{"type": "function", "function": {"name": "c"}}]);
        let with = |source: &str, tools: &serde_json::Value| {
            let mut t = side();
            t.template = Some(ChatTemplate::new(source, None, None).unwrap());
            let (text, _) = t.chat_prompt(&user, Some(tools), &Map::new(), 64).unwrap();
            (text, t.unrendered_tools_warned.load(Ordering::Relaxed))
        };
        let plain = "{{ messages[0].content }}";
        assert_eq!(with(plain, &tools), ("12".into(), true));
        for none in [serde_json::json!([]), serde_json::Value::Null] {
            assert_eq!(with(plain, &none), ("12".into(), false));
        }
        let rendering = "{{ messages[0].content }}{% if tools %}c{% endif %}";
        assert_eq!(with(rendering, &tools), ("12c".into(), false));
    }

    /// The engine's stop test says yes from the token that completes a stop string on, and
    /// never before, however long the text before it.
    #[test]
    fn the_stop_test_answers_from_the_token_that_completes_a_stop_string() {
        let t = side();
        assert!(t.stop_watch(&[]).is_none());
        let stop = t.stop_watch(&["12".into(), "c c".into()]).unwrap();
        for (text, first_yes) in [("ab12c", 4), ("aaaaaaaaaaaa 1 12", 17), ("bc cc", 4)] {
            let ids = t.tokenizer().encode(text, false).unwrap();
            assert_eq!(ids.len(), text.len());
            let answers: Vec<bool> = (1..=ids.len()).map(|n| stop.ends(&ids[..n])).collect();
            let first = answers.iter().position(|&yes| yes).map(|i| i + 1);
            assert_eq!(first, Some(first_yes), "{text}: {answers:?}");
            assert!(answers[first_yes - 1..].iter().all(|&yes| yes), "{text}");
        }
        let never = t.tokenizer().encode("ab1 2c", false).unwrap();
        assert!((1..=never.len()).all(|n| !stop.ends(&never[..n])));
    }

    /// `chat_template_kwargs` reach the template as its variables (a Qwen3-style
    /// `enable_thinking` switch here).
    #[test]
    fn the_templates_extra_variables_change_the_prompt() {
        let mut t = side();
        let source = "{% for m in messages %}{{ m.content }}{% endfor %}\
                      {% if enable_thinking is defined and not enable_thinking %}ab{% endif %}";
        t.template = Some(ChatTemplate::new(source, None, Some("<|im_end|>")).unwrap());
        let user = [Message::user("12")];
        let (plain, _) = t.chat_prompt(&user, None, &Map::new(), 64).unwrap();
        let mut off = Map::new();
        off.insert("enable_thinking".into(), false.into());
        let (text, ids) = t.chat_prompt(&user, None, &off, 64).unwrap();
        assert_eq!((plain.as_str(), text.as_str()), ("12", "12ab"));
        assert_eq!(ids, t.tokenizer().encode("12ab", false).unwrap());
    }

    /// The byte bound refuses only text that cannot fit: a prompt of `capacity - 1` characters
    /// of the longest spelling passes it.
    #[test]
    fn prompts_too_long_in_bytes_are_refused_before_tokenizing() {
        let t = side();
        // "<|endoftext|>" is the char-level vocabulary's longest entry.
        let longest = "<|endoftext|>";
        assert_eq!(t.bytes_per_token, longest.len());
        let capacity = 16;
        let limit = capacity * t.bytes_per_token;
        let err = t.text_prompt(&"a".repeat(limit), capacity).unwrap_err();
        assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(err.message.contains(&format!("{limit} bytes")), "{err}");
        let fits = longest.repeat(capacity - 2);
        assert_eq!(t.text_prompt(&fits, capacity).unwrap().len(), capacity - 2);
        let err = t
            .chat_prompt(
                &[Message::user("b".repeat(limit))],
                None,
                &Map::new(),
                capacity,
            )
            .unwrap_err();
        assert!(err.message.contains("bytes"), "{err}");
    }

    /// Text of only characters the vocabulary lacks is refused with them named; text with
    /// some of them is served, with the same ids as before.
    #[test]
    fn prompts_of_only_unknown_characters_are_refused() {
        let t = side();
        let err = t.text_prompt("ÿÿ ü", 64).unwrap_err();
        assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(err.message.contains("'ÿ', 'ü'"), "{err}");
        let err = t
            .chat_prompt(
                &[Message::user("€"), Message::assistant("")],
                None,
                &Map::new(),
                64,
            )
            .unwrap_err();
        assert!(
            err.message.contains("'€'") && err.message.contains("messages"),
            "{err}"
        );
        let ids = t.text_prompt("ab ÿ", 64).unwrap();
        assert_eq!(ids, t.tokenizer().encode_plain_prompt("ab ÿ").unwrap());
        let (text, ids) = t
            .chat_prompt(&[Message::user("1 ÿ")], None, &Map::new(), 64)
            .unwrap();
        assert_eq!(ids, t.tokenizer().encode(&text, false).unwrap());
        assert!(t.unknown_warned.load(Ordering::Relaxed));
    }

    #[test]
    fn ids_outside_the_vocabulary_are_refused_with_their_position() {
        let t = side();
        assert!(t.check_ids(&[5, 6]).is_ok());
        let err = t.check_ids(&[5, 10_000]).unwrap_err();
        assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(
            err.message.contains("token 1") && err.message.contains("10000"),
            "{err}"
        );
    }
}
