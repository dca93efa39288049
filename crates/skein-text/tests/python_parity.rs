//! The Rust side against what Python transformers produced for the same files.
//!
//! `tests/fixtures/*/expected.json` is written by `scripts/check_tokenizer_roundtrip.py`, which
//! loads each fixture directory with transformers (`AutoTokenizer` and
//! `PreTrainedTokenizerFast`), encodes a few strings and renders a few chats. Here the same
//! directories load through `Tokenizer::from_dir` and must give the same text and ids, so CI
//! checks parity without Python.
//!
//! The `char-level` directory is itself made by `Tokenizer::char_level`; this test fails when
//! that output changes. Regenerate with `SKEIN_WRITE_FIXTURES=1 cargo test -p skein-text
//! --test python_parity`, then rerun the Python script.

use serde::Deserialize;
use skein_text::{Message, Tokenizer};
use std::path::{Path, PathBuf};

/// The alphabet of the committed char-level fixture: arithmetic and short English answers.
const CHAR_ALPHABET: &str = "0123456789abcdefghijklmnopqrstuvwxyz +-*/=().,?!:'";

#[derive(Deserialize)]
struct Expected {
    cases: Vec<Case>,
    chats: Vec<Chat>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    /// transformers' `tokenizer(text)`: with what the post-processor adds (a BOS).
    prompt_ids: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
}

#[derive(Deserialize)]
struct Chat {
    messages: Vec<Message>,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    add_generation_prompt: bool,
    text: String,
    ids: Vec<u32>,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn check_against_python(dir: &Path) {
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    assert!(!expected.cases.is_empty());
    let tok = Tokenizer::from_dir(dir).unwrap();
    for case in &expected.cases {
        let ids = tok.encode(&case.text, false).unwrap();
        assert_eq!(ids, case.ids, "encoding {:?}", case.text);
        let prompt = tok.encode_plain_prompt(&case.text).unwrap();
        assert_eq!(prompt, case.prompt_ids, "a plain prompt {:?}", case.text);
        assert_eq!(tok.decode(&ids, false).unwrap(), case.decoded);
        assert_eq!(tok.decode(&ids, true).unwrap(), case.decoded_skip_special);
    }
    let Some(template) = tok.chat_template().unwrap() else {
        assert!(
            expected.chats.is_empty(),
            "chats recorded without a template"
        );
        return;
    };
    assert!(
        !expected.chats.is_empty(),
        "a template with no chat recorded"
    );
    for chat in &expected.chats {
        let text = template
            .render(
                &chat.messages,
                chat.tools.as_ref(),
                chat.add_generation_prompt,
            )
            .unwrap();
        assert_eq!(text, chat.text);
        assert_eq!(tok.encode(&text, false).unwrap(), chat.ids);
    }
}

#[test]
fn char_level_fixture_is_what_char_level_builds() {
    let dir = fixture("char-level");
    let built = Tokenizer::char_level(CHAR_ALPHABET).unwrap();
    if std::env::var_os("SKEIN_WRITE_FIXTURES").is_some() {
        built.save_dir(&dir).unwrap();
    }
    let fresh = tempfile::tempdir().unwrap();
    built.save_dir(fresh.path()).unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        let committed = std::fs::read_to_string(dir.join(file)).unwrap();
        let now = std::fs::read_to_string(fresh.path().join(file)).unwrap();
        assert_eq!(committed, now, "{file} differs from char_level's output");
    }
}

#[test]
fn char_level_matches_transformers() {
    check_against_python(&fixture("char-level"));
}

#[test]
fn byte_level_bpe_matches_transformers() {
    // A small BPE trained by the script with a Qwen2-style split regex (lookahead, \p{L}),
    // byte-level pieces and a ChatML template with tools: the shape of real checkpoints.
    check_against_python(&fixture("bpe-bytelevel"));
}

/// A base Llama's shape: the post-processor puts a BOS before every text, and there is no
/// chat template, so a plain prompt starts with the BOS as transformers gives it.
#[test]
fn a_bos_first_bpe_matches_transformers() {
    let dir = fixture("bpe-bos");
    check_against_python(&dir);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let bos = tok.token_to_id("<s>").unwrap();
    assert_eq!(tok.start_ids(), [bos]);
    assert_eq!(tok.bos_token_id(), Some(bos));
}

/// `"add_bos_token": false` in tokenizer_config.json beside a post-processor that puts a BOS
/// first: transformers keeps the BOS (the post-processor decides), and so does a plain prompt.
#[test]
fn a_bos_first_post_processor_decides_over_add_bos_token() {
    let dir = fixture("bpe-bos-off");
    check_against_python(&dir);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.start_ids(), [tok.token_to_id("<s>").unwrap()]);
}

#[test]
fn byte_level_bpe_specials() {
    let tok = Tokenizer::from_dir(fixture("bpe-bytelevel")).unwrap();
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let eot = tok.token_to_id("<|endoftext|>").unwrap();
    // eos from tokenizer_config.json first, then generation_config.json's list.
    assert_eq!(tok.eos_token_ids(), &[im_end, eot]);
    assert_eq!(tok.pad_token_id(), Some(eot));
    assert_eq!(tok.bos_token_id(), None);
}
