//! Text a vocabulary has no token for. Such a piece encodes to the tokenizer's unknown token
//! (`<|unk|>` in the character-level vocabulary) and the model cannot tell what was there, so
//! whoever hands skein text (a dataset, an environment, a chat file, a client) is told.

use std::fmt;

/// Distinct unknown pieces an [`UnknownChars`] keeps as examples.
pub const UNKNOWN_EXAMPLES: usize = 5;

/// Characters of a text shown in an example piece at most (a word-level unknown token can
/// stand for a whole word).
const EXAMPLE_CHARS: usize = 16;

/// What of a text (or of several, added up) encodes to the unknown token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnknownChars {
    /// Characters that became the unknown token.
    pub count: usize,
    /// Characters other than whitespace that the vocabulary has.
    pub known: usize,
    /// The first distinct pieces that became the unknown token, in order of appearance (at
    /// most [`UNKNOWN_EXAMPLES`]; one character each in a character-level vocabulary).
    pub examples: Vec<String>,
}

impl UnknownChars {
    /// Every character is in the vocabulary.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Text with something in it besides whitespace, none of which the vocabulary has: the
    /// model would read only unknown tokens.
    pub fn is_total(&self) -> bool {
        self.count > 0 && self.known == 0
    }

    /// Counts a piece that became the unknown token.
    pub(crate) fn add_piece(&mut self, piece: &str) {
        self.count += piece.chars().count();
        // Its characters other than whitespace were counted as known by the caller.
        let solid = piece.chars().filter(|c| !c.is_whitespace()).count();
        self.known = self.known.saturating_sub(solid);
        self.note_example(piece);
    }

    fn note_example(&mut self, piece: &str) {
        if self.examples.len() < UNKNOWN_EXAMPLES && !self.examples.iter().any(|e| e == piece) {
            self.examples.push(piece.to_string());
        }
    }

    /// Adds another text's count and examples (the examples of the first texts stay first).
    pub fn add(&mut self, other: &UnknownChars) {
        self.count += other.count;
        self.known += other.known;
        for e in &other.examples {
            self.note_example(e);
        }
    }

    /// The examples as a reader sees them, quoted and escaped: `'é', '€', '\t'`.
    pub fn examples_text(&self) -> String {
        let quoted: Vec<String> = self.examples.iter().map(|e| quote(e)).collect();
        let more = if self.examples.len() == UNKNOWN_EXAMPLES {
            ", …"
        } else {
            ""
        };
        format!("{}{more}", quoted.join(", "))
    }
}

/// `'é'` for one character, `"word"` for a longer piece (cut to [`EXAMPLE_CHARS`]).
fn quote(piece: &str) -> String {
    let mut chars = piece.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => format!("{c:?}"),
        _ => {
            let cut: String = piece.chars().take(EXAMPLE_CHARS).collect();
            let dots = if cut.len() < piece.len() { "…" } else { "" };
            format!("{cut:?}{dots}")
        }
    }
}

impl fmt::Display for UnknownChars {
    /// `3 characters outside the tokenizer's vocabulary ('é', '€')`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.count == 1 { "" } else { "s" };
        write!(
            f,
            "{} character{s} outside the tokenizer's vocabulary ({})",
            self.count,
            self.examples_text()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_are_distinct_capped_and_quoted() {
        let mut u = UnknownChars {
            known: 10,
            ..Default::default()
        };
        for p in ["é", "€", "é", "\t", "ü", "ß", "ø", "ñ"] {
            u.add_piece(p);
        }
        assert_eq!(u.count, 8);
        assert_eq!(u.known, 3, "the tab was never counted as known");
        assert_eq!(u.examples, ["é", "€", "\t", "ü", "ß"]);
        assert_eq!(u.examples_text(), r"'é', '€', '\t', 'ü', 'ß', …");
        assert_eq!(
            u.to_string(),
            r"8 characters outside the tokenizer's vocabulary ('é', '€', '\t', 'ü', 'ß', …)"
        );
        assert!(!u.is_total());
    }

    #[test]
    fn long_pieces_are_cut_and_sums_keep_the_first_examples() {
        let mut a = UnknownChars {
            known: 30,
            ..Default::default()
        };
        a.add_piece("abcdefghijklmnopqrstuvwxyz");
        assert_eq!(a.examples_text(), "\"abcdefghijklmnop\"…");
        let mut b = UnknownChars {
            known: 1,
            ..Default::default()
        };
        b.add_piece("é");
        a.add(&b);
        assert_eq!(a.count, 27);
        assert_eq!(a.known, 4);
        assert_eq!(a.examples.len(), 2);
        assert_eq!(a.examples[1], "é");
        assert_eq!(
            b.to_string(),
            "1 character outside the tokenizer's vocabulary ('é')"
        );
        assert!(b.is_total());
    }
}
