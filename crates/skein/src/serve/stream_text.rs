//! A streamed choice's text as its tokens arrive. A piece of text is sent once no later token
//! can change it and it cannot be the start of a `stop` string, so what a client puts
//! together from the pieces is the beginning of the answer's text, and the last piece, sent
//! when the completion ends, makes it the whole text.
//!
//! Each new token is decoded with the one before it for context (a SentencePiece decoder
//! drops the leading space of the first token it decodes), so a long completion costs a few
//! tokens' decoding per token, not its whole length. Held back until more text comes: a
//! character whose bytes are split across tokens (decoded as U+FFFD so far), whitespace at
//! the end (a decoder may clean a space away before the punctuation that follows it), and an
//! ending that could begin a stop string. Nothing is sent past a stop string (nor, for a
//! chat with tools, past the tag that opens a tool call).

/// One choice's tokens so far, their text, and how much of it was sent.
#[derive(Debug, Default)]
pub struct StreamedText {
    /// The final text may lose its leading whitespace (tool calls parsed out of it trim it),
    /// so a text that starts with whitespace waits for the end.
    trimmed_at_start: bool,
    tokens: Vec<u32>,
    /// Decoding starts at this token: the last one already in `text`, for context.
    prefix: usize,
    /// The tokens before this one are spelled in `text`.
    read: usize,
    /// The text of the tokens before `read`, put together piece by piece.
    text: String,
    /// How many bytes of `text` were sent.
    sent: usize,
    /// The text stopped reading as what was decoded before plus more; the rest waits for
    /// the end of the completion.
    held: bool,
}

impl StreamedText {
    /// `trimmed_at_start`: whether the final text may lose its leading whitespace.
    pub fn new(trimmed_at_start: bool) -> Self {
        StreamedText {
            trimmed_at_start,
            ..StreamedText::default()
        }
    }

    pub fn push(&mut self, token: u32) {
        self.tokens.push(token);
    }

    /// The text to send now that was not sent before, if any. `decode` gives the text of
    /// ids (`None` when they cannot be decoded, which holds the text back).
    pub fn next_piece(
        &mut self,
        decode: impl Fn(&[u32]) -> Option<String>,
        stops: &[String],
    ) -> Option<String> {
        if self.held {
            return None;
        }
        self.read_new_tokens(decode)?;
        if self.trimmed_at_start && self.text.starts_with(char::is_whitespace) {
            self.held = true;
            return None;
        }
        let end = settled(&self.text, self.sent, stops);
        if end <= self.sent {
            return None;
        }
        let piece = self.text[self.sent..end].to_string();
        self.sent = end;
        Some(piece)
    }

    /// Adds the text of the tokens after `read` to `text`, unless it ends in a character not
    /// finished yet.
    fn read_new_tokens(&mut self, decode: impl Fn(&[u32]) -> Option<String>) -> Option<()> {
        let before = decode(&self.tokens[self.prefix..self.read])?;
        let now = decode(&self.tokens[self.prefix..])?;
        if now.ends_with(char::REPLACEMENT_CHARACTER) {
            return Some(());
        }
        match now.strip_prefix(before.as_str()) {
            Some(new) => {
                self.text.push_str(new);
                self.prefix = self.read;
                self.read = self.tokens.len();
            }
            None => self.held = true,
        }
        Some(())
    }

    /// What is left to send of the completion's final text. `None` when the text sent is not
    /// its beginning, which a decoder that rewrites earlier text on later tokens could cause;
    /// the choice's token-exact record is then the answer to trust.
    pub fn rest<'a>(&self, final_text: &'a str) -> Option<&'a str> {
        final_text.strip_prefix(&self.text[..self.sent])
    }
}

/// Where the sendable part of `text` ends: before its first stop string, before an ending
/// that could begin one, and before whitespace at the end. `sent` bytes hold none of the
/// stop strings, so a stop string can only begin in their last few.
fn settled(text: &str, sent: usize, stops: &[String]) -> usize {
    let longest = stops.iter().map(String::len).max().unwrap_or(0);
    let mut from = sent.saturating_sub(longest);
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let first_stop = stops
        .iter()
        .filter_map(|s| text[from..].find(s.as_str()))
        .min();
    let end = match first_stop {
        Some(at) => from + at,
        None => {
            let started = stops.iter().map(|s| longest_started(text, s)).max();
            text.len() - started.unwrap_or(0)
        }
    };
    text[..end].trim_end().len()
}

/// The length of the longest end of `text` that `stop` starts with (shorter than `stop`).
fn longest_started(text: &str, stop: &str) -> usize {
    (1..stop.len())
        .rev()
        .filter(|&k| stop.is_char_boundary(k))
        .find(|&k| text.ends_with(&stop[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte-level tokens, as GPT-2-style vocabularies have: "€" is E2 82 AC, split over two.
    const VOCAB: [&[u8]; 8] = [b"a", b"b", b" ", b"\xE2", b"\x82\xAC", b".", b"c", b"d"];

    fn decode(ids: &[u32]) -> Option<String> {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| VOCAB[id as usize].to_vec())
            .collect();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn stream(ids: &[u32], stops: &[String]) -> (Vec<String>, StreamedText) {
        let mut text = StreamedText::default();
        let mut pieces = Vec::new();
        for &id in ids {
            text.push(id);
            pieces.extend(text.next_piece(decode, stops));
        }
        (pieces, text)
    }

    #[test]
    fn each_token_is_sent_as_it_comes_and_trailing_space_waits() {
        let (pieces, text) = stream(&[0, 1, 2, 6], &[]);
        assert_eq!(pieces, ["a", "b", " c"]);
        assert_eq!(text.rest("ab c"), Some(""));
        assert_eq!(text.rest("ab cd"), Some("d"));
        assert_eq!(
            text.rest("abc"),
            None,
            "a rewritten beginning is not continued"
        );
    }

    #[test]
    fn a_split_character_waits_for_its_last_byte() {
        let (pieces, _) = stream(&[0, 3], &[]);
        assert_eq!(pieces, ["a"]);
        let (pieces, _) = stream(&[0, 3, 4, 1], &[]);
        assert_eq!(pieces, ["a", "€", "b"]);
    }

    #[test]
    fn nothing_that_could_start_a_stop_string_is_sent() {
        let stops = vec!["cd".to_string()];
        // a; c could start "cd" (held); b shows it did not ("cb"); c (held); d: the stop.
        let (pieces, text) = stream(&[0, 6, 1, 6, 7, 0], &stops);
        assert_eq!(pieces, ["a", "cb"]);
        // The final text ends before the stop string: nothing more to send.
        assert_eq!(text.rest("acb"), Some(""));
    }

    #[test]
    fn the_pieces_and_the_rest_make_the_whole_text() {
        let ids = [0, 2, 3, 4, 1, 2, 2, 5, 6, 0];
        let whole = decode(&ids).unwrap();
        assert_eq!(whole, "a €b  .ca");
        for stops in [
            vec![],
            vec!["b  .".to_string()],
            vec![" .".into(), "€b".into()],
        ] {
            let (pieces, text) = stream(&ids, &stops);
            let end = stops.iter().filter_map(|s| whole.find(s.as_str())).min();
            let final_text = &whole[..end.unwrap_or(whole.len())];
            let rest = text
                .rest(final_text)
                .expect("the pieces begin the final text");
            assert_eq!(pieces.concat() + rest, final_text, "stops {stops:?}");
            assert!(stops.iter().all(|s| !pieces.concat().contains(s.as_str())));
        }
    }

    #[test]
    fn a_stop_string_ending_in_a_split_character_is_held_whole() {
        let stops = vec!["c€".to_string()];
        // a, c (could start "c€"), the first byte of "€": "c" is still held.
        let (pieces, _) = stream(&[0, 6, 3], &stops);
        assert_eq!(pieces, ["a"]);
        // The last byte completes the stop string: nothing of it was sent.
        let (pieces, text) = stream(&[0, 6, 3, 4, 1], &stops);
        assert_eq!(pieces, ["a"]);
        assert_eq!(text.rest("a"), Some(""));
    }

    /// Where the final text may be trimmed at the start, one that starts with whitespace
    /// waits whole for the end; one that does not streams as any other.
    #[test]
    fn a_text_trimmed_at_its_start_waits_when_it_starts_with_space() {
        let mut led = StreamedText::new(true);
        for id in [2, 0, 1] {
            led.push(id);
            assert_eq!(led.next_piece(decode, &[]), None);
        }
        assert_eq!(led.rest("ab"), Some("ab"));
        let mut plain = StreamedText::new(true);
        plain.push(0);
        assert_eq!(plain.next_piece(decode, &[]).as_deref(), Some("a"));
    }

    /// With `<tool_call>` among the strings nothing is streamed past, the text before a call
    /// is streamed and the message's content (the text with its calls parsed out) ends it.
    #[test]
    fn text_before_a_tool_call_streams_and_the_content_ends_it() {
        let text = r#"Let me add. <tool_call>{"name": "add", "arguments": {}}</tool_call> ok"#;
        let chars: Vec<char> = text.chars().collect();
        let by_char = |ids: &[u32]| Some(ids.iter().map(|&i| chars[i as usize]).collect());
        let until = vec![skein_text::TOOL_CALL_OPEN.to_string()];
        let mut streamed = StreamedText::new(true);
        let mut pieces = Vec::new();
        for id in 0..chars.len() as u32 {
            streamed.push(id);
            pieces.extend(streamed.next_piece(by_char, &until));
        }
        assert_eq!(pieces.concat(), "Let me add.");
        let content = skein_text::strip_tool_calls(text);
        assert_eq!(content, "Let me add.  ok");
        assert_eq!(streamed.rest(&content), Some("  ok"));
    }

    /// Each token is decoded with the one before it, not with the whole completion.
    #[test]
    fn a_long_completion_decodes_a_few_tokens_per_token() {
        let longest = std::cell::Cell::new(0);
        let counting = |ids: &[u32]| {
            longest.set(longest.get().max(ids.len()));
            decode(ids)
        };
        let ids: Vec<u32> = (0..400).map(|i| [0, 1, 2, 3, 4, 5, 6, 7][i % 8]).collect();
        let mut text = StreamedText::default();
        let mut pieces = Vec::new();
        for &id in &ids {
            text.push(id);
            pieces.extend(text.next_piece(counting, &[]));
        }
        assert!(
            longest.get() <= 3,
            "decoded {} tokens at once",
            longest.get()
        );
        let whole = decode(&ids).unwrap();
        assert_eq!(pieces.concat() + text.rest(&whole).unwrap(), whole);
    }
}
