//! The text side of the served model: chat messages become prompt ids once (template, then
//! tokenizer), and sampled ids become text only for the response body. Clients get the ids
//! themselves too, so nothing downstream ever retokenizes.

use super::error::ApiError;
use skein_text::{ChatTemplate, Message, Tokenizer};

/// Tokenizer, chat template and stop ids of the served model.
pub struct TextSide {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    eos: Vec<u32>,
    /// Rows of the model's embedding table: token-id prompts must stay below it.
    vocab_size: usize,
}

impl TextSide {
    /// `vocab_size` is the model's (its embedding rows), which may exceed the tokenizer's.
    pub fn new(tokenizer: Tokenizer, vocab_size: usize) -> anyhow::Result<Self> {
        let template = tokenizer.chat_template()?;
        let eos = tokenizer.eos_token_ids().to_vec();
        Ok(TextSide {
            tokenizer,
            template,
            eos,
            vocab_size,
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Ids that end a completion.
    pub fn stop_ids(&self) -> &[u32] {
        &self.eos
    }

    /// The rendered chat prompt (generation prompt appended) and its ids.
    pub fn chat_prompt(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
    ) -> Result<(String, Vec<u32>), ApiError> {
        let template = self.template.as_ref().ok_or_else(|| {
            ApiError::bad_request(
                "the served model has no chat template: use /v1/completions with a prompt",
            )
        })?;
        let text = template
            .render(messages, tools, true)
            .map_err(|e| ApiError::bad_request(format!("rendering the chat template: {e:#}")))?;
        let ids = self.encode(&text, false)?;
        Ok((text, ids))
    }

    /// Ids of a plain-text prompt, with the tokenizer's own special tokens (e.g. a BOS).
    pub fn text_prompt(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.encode(text, true)
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ApiError> {
        self.tokenizer
            .encode(text, add_special_tokens)
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

    /// Completion text as a client reads it: special tokens (the stop token) left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, ApiError> {
        self.tokenizer.decode(ids, true).map_err(|e| {
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

    fn side() -> TextSide {
        let tok = Tokenizer::char_level("abc 0123456789").unwrap();
        let n = tok.vocab_size();
        TextSide::new(tok, n).unwrap()
    }

    #[test]
    fn chat_prompt_is_the_encoding_of_the_rendered_template() {
        let t = side();
        let (text, ids) = t.chat_prompt(&[Message::user("ab 12")], None).unwrap();
        assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
        assert_eq!(ids, t.tokenizer().encode(&text, false).unwrap());
        assert_eq!(t.stop_ids(), &[4]);
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
