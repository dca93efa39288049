//! The tokenizer of a Hugging Face model directory (tokenizer.json + tokenizer_config.json +
//! generation_config.json), and a character-level one for tiny models trained from scratch.

use crate::chat_template::ChatTemplate;
use crate::generation_config::GenerationConfig;
use crate::json_file;
use crate::unknown_chars::UnknownChars;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use tokenizers::decoders::fuse::Fuse;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::models::ModelWrapper;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

const TOKENIZER_FILE: &str = "tokenizer.json";
const CONFIG_FILE: &str = "tokenizer_config.json";
/// Newer transformers versions save the chat template beside tokenizer_config.json.
const TEMPLATE_FILE: &str = "chat_template.jinja";
/// Named templates beside the default one, as transformers saves them (`tool_use.jinja`).
const MORE_TEMPLATES_DIR: &str = "additional_chat_templates";

/// Special tokens of [`Tokenizer::char_level`], in id order (ids 0..=4).
pub const CHAR_PAD: &str = "<|pad|>";
pub const CHAR_UNK: &str = "<|unk|>";
pub const CHAR_ENDOFTEXT: &str = "<|endoftext|>";
pub const CHAR_IM_START: &str = "<|im_start|>";
pub const CHAR_IM_END: &str = "<|im_end|>";

/// ChatML without a default system prompt; every character it writes itself is in the
/// char-level vocabulary (see [`TEMPLATE_CHARS`]).
const CHAR_CHAT_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Characters the char-level chat template emits (role names, newline), added to every
/// char-level vocabulary so a rendered prompt never contains `<|unk|>` outside message text.
const TEMPLATE_CHARS: &str = "\nsystemuserassistanttool";

/// A tokenizer plus the special-token facts skein needs (stop ids, padding) and the chat
/// template, loaded once from a model directory.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// tokenizer_config.json as read (or built), written back unchanged by `save_dir`.
    config: Map<String, Value>,
    /// The model directory it was read from, which error messages name.
    dir: Option<PathBuf>,
    /// chat_template.jinja, when the directory keeps the template there.
    template_file: Option<String>,
    /// additional_chat_templates/NAME.jinja, by name: `tool_use` renders requests with tools.
    more_templates: Vec<(String, String)>,
    eos_ids: Vec<u32>,
    /// Stops a run added, recorded in generation_config ([`Tokenizer::stop_token_ids`]).
    added_stop_ids: Vec<u32>,
    pad_id: Option<u32>,
    bos_id: Option<u32>,
    /// What the post-processor puts before a text (a BOS): see [`Tokenizer::start_ids`].
    start_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("eos_ids", &self.eos_ids)
            .field("added_stop_ids", &self.added_stop_ids)
            .field("pad_id", &self.pad_id)
            .field("bos_id", &self.bos_id)
            .finish()
    }
}

/// Where a token lies in the text it was read from: its first byte and one past its last.
pub type ByteRange = (usize, usize);

fn tk_err(e: tokenizers::Error) -> anyhow::Error {
    anyhow!("{e}")
}

impl Tokenizer {
    /// Loads a tokenizer.json alone: no special-token config, so no eos/pad/bos ids.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(tk_err)
            .with_context(|| format!("loading {}", path.display()))?;
        let start_ids = leading_special_ids(&inner)
            .with_context(|| format!("reading the post-processor of {}", path.display()))?;
        Ok(Self {
            inner,
            config: Map::new(),
            dir: None,
            template_file: None,
            more_templates: Vec::new(),
            eos_ids: Vec::new(),
            added_stop_ids: Vec::new(),
            pad_id: None,
            bos_id: None,
            start_ids,
        })
    }

    /// Loads `tokenizer.json`, and `tokenizer_config.json`, `generation_config.json` and
    /// `chat_template.jinja` when present. End-of-sequence ids are the union of the config's
    /// `eos_token` and generation_config's `eos_token_id` (int or list), config first, less the
    /// stops a run added there (`skein_added_stop_token_ids`).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        check_fast_tokenizer(dir)?;
        let mut tok = Self::from_file(dir.join(TOKENIZER_FILE))?;
        tok.dir = Some(dir.to_path_buf());
        let config_path = dir.join(CONFIG_FILE);
        tok.config = json_file::read_optional(&config_path)?.unwrap_or_default();
        let template_path = dir.join(TEMPLATE_FILE);
        if template_path.exists() {
            tok.template_file = Some(
                std::fs::read_to_string(&template_path)
                    .with_context(|| format!("reading {}", template_path.display()))?,
            );
        }
        tok.more_templates = read_more_templates(&dir.join(MORE_TEMPLATES_DIR))?;
        let generation = GenerationConfig::from_dir(dir)?.unwrap_or_default();
        let named = |key: &str| -> Result<Option<u32>> {
            tok.special_from_config(key)
                .with_context(|| format!("{}: key `{key}`", config_path.display()))
        };
        let mut eos_ids: Vec<u32> = named("eos_token")?.into_iter().collect();
        for id in generation.end_of_sequence_ids() {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let mut added_stop_ids = generation.added_stop_ids.clone();
        added_stop_ids.retain(|id| !eos_ids.contains(id));
        let pad_id = named("pad_token")?.or(generation.pad_token_id);
        let bos_id = named("bos_token")?.or(generation.bos_token_id);
        tok.eos_ids = eos_ids;
        tok.added_stop_ids = added_stop_ids;
        tok.pad_id = pad_id;
        tok.bos_id = bos_id;
        Ok(tok)
    }

    /// The token a config key names, as a string or as an AddedToken object
    /// (`{"content": ...}`); `None` when absent or null.
    fn special_from_config(&self, key: &str) -> Result<Option<u32>> {
        let Some(content) = self.config_token(key)? else {
            return Ok(None);
        };
        self.token_to_id(&content)
            .map(Some)
            .with_context(|| format!("token {content:?} is not in the vocabulary"))
    }

    fn config_token(&self, key: &str) -> Result<Option<String>> {
        match self.config.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Object(o)) => match o.get("content") {
                Some(Value::String(s)) => Ok(Some(s.clone())),
                _ => bail!("expected a string or an object with a string `content`"),
            },
            Some(other) => bail!("expected a token string, found {other}"),
        }
    }

    /// Builds a character-level tokenizer: one token per character of `alphabet` (duplicates
    /// ignored), plus the characters its chat template writes, after the special tokens
    /// `<|pad|>`=0, `<|unk|>`=1, `<|endoftext|>`=2, `<|im_start|>`=3, `<|im_end|>`=4.
    /// Characters outside the vocabulary encode to `<|unk|>` ([`Tokenizer::encode_checked`]
    /// says which). The chat template is ChatML and the eos token `<|im_end|>` (end of an
    /// assistant turn). The saved directory loads in transformers with
    /// `AutoTokenizer.from_pretrained` and gives the same ids.
    pub fn char_level(alphabet: &str) -> Result<Self> {
        let specials = [
            CHAR_PAD,
            CHAR_UNK,
            CHAR_ENDOFTEXT,
            CHAR_IM_START,
            CHAR_IM_END,
        ];
        let mut vocab = Map::new();
        let pieces = specials.iter().map(|s| s.to_string());
        for piece in pieces.chain(
            alphabet
                .chars()
                .chain(TEMPLATE_CHARS.chars())
                .map(String::from),
        ) {
            let next = vocab.len();
            vocab.entry(piece).or_insert(json!(next));
        }
        // Through serde: the builder wants the crate's private hash map type.
        let spec = json!({"type": "WordLevel", "vocab": vocab, "unk_token": CHAR_UNK});
        let model: WordLevel = serde_json::from_str(&spec.to_string())
            .context("building the char-level vocabulary")?;
        let mut inner = tokenizers::Tokenizer::new(model);
        // One piece per character. `[\s\S]` rather than `.`: it also matches newlines, and reads
        // the same in fancy-regex (here) and Oniguruma (the Python tokenizers build).
        let split = Split::new(
            SplitPattern::Regex(r"[\s\S]".into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(tk_err)?;
        inner.with_pre_tokenizer(Some(split));
        // Concatenate on decode (the default joins tokens with spaces).
        inner.with_decoder(Some(Fuse::new()));
        let added: Vec<AddedToken> = specials
            .iter()
            .map(|s| AddedToken::from(*s, true))
            .collect();
        inner.add_special_tokens(&added);

        let config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": null,
            "eos_token": CHAR_IM_END,
            "pad_token": CHAR_PAD,
            "unk_token": CHAR_UNK,
            "additional_special_tokens": [CHAR_ENDOFTEXT, CHAR_IM_START],
            "clean_up_tokenization_spaces": false,
            "model_max_length": 1_000_000,
            "chat_template": CHAR_CHAT_TEMPLATE,
        });
        let Value::Object(config) = config else {
            unreachable!("a json object literal")
        };
        let mut tok = Self {
            inner,
            config,
            dir: None,
            template_file: None,
            more_templates: Vec::new(),
            eos_ids: Vec::new(),
            added_stop_ids: Vec::new(),
            pad_id: None,
            bos_id: None,
            start_ids: Vec::new(),
        };
        tok.eos_ids = tok.special_from_config("eos_token")?.into_iter().collect();
        tok.pad_id = tok.special_from_config("pad_token")?;
        Ok(tok)
    }

    /// Writes `tokenizer.json` and `tokenizer_config.json` (and `chat_template.jinja` if the
    /// template was loaded from one) into `dir`, creating it.
    pub fn save_dir(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(TOKENIZER_FILE);
        let mut text = self.inner.to_string(true).map_err(tk_err)?;
        text.push('\n');
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        json_file::write(&dir.join(CONFIG_FILE), &self.config)?;
        let path = dir.join(TEMPLATE_FILE);
        match &self.template_file {
            Some(template) => std::fs::write(&path, template)
                .with_context(|| format!("writing {}", path.display()))?,
            // Another model's template file left there would override this one's
            // tokenizer_config template when the directory is read back.
            None if path.exists() => std::fs::remove_file(&path)
                .with_context(|| format!("removing the replaced {}", path.display()))?,
            None => {}
        }
        write_more_templates(&dir.join(MORE_TEMPLATES_DIR), &self.more_templates)
    }

    /// Text to ids. `add_special_tokens` applies the tokenizer's post-processor (e.g. a BOS);
    /// special-token strings in `text` (`<|im_start|>`) always map to their ids.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(tk_err)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// [`Tokenizer::encode`] without special tokens, with each token's byte range in `text`.
    pub fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<ByteRange>)> {
        let encoding = self.inner.encode(text, false).map_err(tk_err)?;
        Ok((encoding.get_ids().to_vec(), encoding.get_offsets().to_vec()))
    }

    /// The special tokens this tokenizer's post-processor puts before a text, as transformers'
    /// `tokenizer(text)` gives them: a BOS for Llama, Mistral or Gemma vocabularies, none for
    /// Qwen's, SmolLM2's or the char-level one. A prompt given as plain text starts with them;
    /// a chat template writes its own (`{{ bos_token }}`), so a rendered prompt does not.
    /// What the post-processor puts after a text (an EOS) is never wanted before a response.
    /// tokenizer_config.json's `add_bos_token` does not change them, as it does not change
    /// transformers' (5.x) own post-processor of a tokenizer.json (`tests/python_parity.rs`).
    pub fn start_ids(&self) -> &[u32] {
        &self.start_ids
    }

    /// Ids of a prompt given as plain text, not rendered through a chat template: the
    /// [`Tokenizer::start_ids`], then the text's.
    pub fn encode_plain_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.start_ids.clone();
        ids.extend(self.encode(text, false)?);
        Ok(ids)
    }

    /// [`Tokenizer::encode_plain_prompt`], with what in the text the vocabulary lacks
    /// ([`Tokenizer::encode_checked`]).
    pub fn encode_plain_prompt_checked(&self, text: &str) -> Result<(Vec<u32>, UnknownChars)> {
        let (ids, unknown) = self.encode_checked(text, false)?;
        Ok(([self.start_ids.as_slice(), &ids].concat(), unknown))
    }

    /// Ids of `text`, exactly as [`Tokenizer::encode`] gives them, and what in it the
    /// vocabulary lacks (each such piece became the unknown token). A literal unknown-token
    /// string in `text` is a special token like any other, not counted.
    pub fn encode_checked(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<(Vec<u32>, UnknownChars)> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(tk_err)?;
        let mut unknown = UnknownChars {
            known: text.chars().filter(|c| !c.is_whitespace()).count(),
            ..Default::default()
        };
        if let Some(unk) = self.unk_token_id() {
            let literal = self.id_to_token(unk);
            let pieces = encoding.get_ids().iter().zip(encoding.get_offsets());
            for (_, &(start, end)) in pieces.filter(|(id, _)| **id == unk) {
                let piece = text.get(start..end).unwrap_or_default();
                if !piece.is_empty() && Some(piece) != literal.as_deref() {
                    unknown.add_piece(piece);
                }
            }
        }
        Ok((encoding.get_ids().to_vec(), unknown))
    }

    /// What of `text` the vocabulary lacks (see [`Tokenizer::encode_checked`]).
    pub fn unknown_chars(&self, text: &str) -> Result<UnknownChars> {
        Ok(self.encode_checked(text, false)?.1)
    }

    /// The id text outside the vocabulary encodes to: tokenizer_config.json's `unk_token`, else
    /// the model's own. None when there is none (a byte-level vocabulary needs none).
    pub fn unk_token_id(&self) -> Option<u32> {
        if let Some(id) = self
            .config_token("unk_token")
            .ok()
            .flatten()
            .and_then(|t| self.token_to_id(&t))
        {
            return Some(id);
        }
        let token = match self.inner.get_model() {
            ModelWrapper::WordLevel(m) => Some(&m.unk_token),
            ModelWrapper::WordPiece(m) => Some(&m.unk_token),
            ModelWrapper::BPE(m) => m.unk_token.as_ref(),
            ModelWrapper::Unigram(_) => None,
        };
        token.and_then(|t| self.token_to_id(t))
    }

    /// Ids to text, for reward programs and display only.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(tk_err)
    }

    /// A model's message as text: special tokens left out (the stop token, template markers)
    /// except the tool-call tags, which some vocabularies mark special and which the
    /// message's calls are read from (`decode(ids, true)` would drop them, and the calls with
    /// them).
    pub fn decode_message(&self, ids: &[u32]) -> Result<String> {
        let added = self.inner.get_added_tokens_decoder();
        let kept: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|id| {
                added.get(id).is_none_or(|t| {
                    !t.special || crate::tool_calls::TAGS.contains(&t.content.as_str())
                })
            })
            .collect();
        self.decode(&kept, false)
    }

    /// Each of `ids`' text as it reads in place, for showing tokens one by one: a token is
    /// decoded after the one before it (`before` for the first) and that one's text taken
    /// off. Decoded alone, a SentencePiece token loses its leading space (the decoder strips
    /// the first `▁`), and every word would run into the last. Where the pair does not read as
    /// the first token's text and more (one character's bytes split across tokens), the
    /// token's own text, U+FFFD included.
    pub fn token_texts(&self, before: Option<u32>, ids: &[u32]) -> Vec<String> {
        let alone = |id: u32| self.decode(&[id], false).unwrap_or_default();
        let mut prev = before.map(|p| (p, alone(p)));
        ids.iter()
            .map(|&id| {
                let own = alone(id);
                let text = match &prev {
                    Some((p, p_text)) => self
                        .decode(&[*p, id], false)
                        .ok()
                        .and_then(|pair| pair.strip_prefix(p_text.as_str()).map(str::to_string))
                        .unwrap_or_else(|| own.clone()),
                    None => own.clone(),
                };
                prev = Some((id, own));
                text
            })
            .collect()
    }

    /// Number of ids, added tokens included. (A model's embedding table may be larger.)
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The ids that end a sequence (text readers drop a final one); empty when the directory
    /// names none.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The ids where generation ends: the end-of-sequence ids, then the stops a run added
    /// and its checkpoint's generation_config records (`skein_added_stop_token_ids`), whose
    /// text is part of a response.
    pub fn stop_token_ids(&self) -> Vec<u32> {
        let mut ids = self.eos_ids.clone();
        ids.extend(&self.added_stop_ids);
        ids
    }

    /// Takes `stops` (a run's `stop_token_ids`) as stops the run added, not ends of sequence,
    /// where the tokenizer read them as end-of-sequence ids: a checkpoint written before its
    /// generation_config named its added stops lists them in `eos_token_id` alone. The
    /// tokenizer_config's `eos_token` stays an end of sequence, and so does the last one left.
    pub fn treat_as_added_stops(&mut self, stops: &[u32]) {
        let config_eos = self.special_from_config("eos_token").ok().flatten();
        for &id in stops {
            let Some(at) = self.eos_ids.iter().position(|&e| e == id) else {
                continue;
            };
            if Some(id) == config_eos || self.eos_ids.len() == 1 {
                continue;
            }
            self.eos_ids.remove(at);
            if !self.added_stop_ids.contains(&id) {
                self.added_stop_ids.push(id);
            }
        }
    }

    /// Of `stops`, those that are not end-of-sequence ids: what a checkpoint's
    /// generation_config records as added ([`crate::GenerationConfig::added_stop_ids`]).
    pub fn added_stops(&self, stops: &[u32]) -> Vec<u32> {
        stops
            .iter()
            .copied()
            .filter(|id| !self.eos_ids.contains(id))
            .collect()
    }

    pub fn pad_token_id(&self) -> Option<u32> {
        self.pad_id
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Whether this is the built-in character-level tokenizer ([`Tokenizer::char_level`]), also
    /// when loaded back from a checkpoint: it is the one whose template is skein's char-level
    /// ChatML.
    pub fn is_char_level(&self) -> bool {
        self.template_file.is_none()
            && self.config.get("chat_template").and_then(Value::as_str) == Some(CHAR_CHAT_TEMPLATE)
    }

    /// The chat template (chat_template.jinja over tokenizer_config.json's `chat_template`),
    /// with this tokenizer's bos/eos strings; `None` when there is none. A template that fails
    /// on an ordinary conversation, or whose prompts would not end with the assistant's opener,
    /// is an error naming its file ([`ChatTemplate::check_prompts`]).
    pub fn chat_template(&self) -> Result<Option<ChatTemplate>> {
        let Some(template) = self.unchecked_chat_template()? else {
            return Ok(None);
        };
        template.check_prompts(&self.template_origin())?;
        Ok(Some(template))
    }

    /// Where the chat template is read from, for messages: the file, and the key in it.
    fn template_origin(&self) -> String {
        let file = |name: &str| match &self.dir {
            Some(dir) => dir.join(name).display().to_string(),
            None => name.to_string(),
        };
        match self.template_file {
            Some(_) => file(TEMPLATE_FILE),
            None => format!("{} (key `chat_template`)", file(CONFIG_FILE)),
        }
    }

    fn unchecked_chat_template(&self) -> Result<Option<ChatTemplate>> {
        let bos = self
            .config_token("bos_token")
            .context("tokenizer_config.json: key `bos_token`")?;
        let eos = self
            .config_token("eos_token")
            .context("tokenizer_config.json: key `eos_token`")?;
        let default = match (&self.template_file, self.config.get("chat_template")) {
            (Some(source), _) => source.clone(),
            (None, Some(Value::String(source))) if !self.more_templates.is_empty() => {
                source.clone()
            }
            (None, None) => return Ok(None),
            (None, Some(value)) => {
                let template =
                    ChatTemplate::from_config_value(value, bos.as_deref(), eos.as_deref())
                        .context("tokenizer_config.json: key `chat_template`")?;
                let tokens = self.other_special_tokens()?;
                return Ok(template.map(|t| t.with_special_tokens(tokens)));
            }
        };
        let mut named = vec![("default".to_string(), default)];
        named.extend(self.more_templates.iter().cloned());
        let template = ChatTemplate::named(named, bos.as_deref(), eos.as_deref())
            .with_context(|| format!("{TEMPLATE_FILE} or {MORE_TEMPLATES_DIR}/"))?;
        Ok(Some(
            template.with_special_tokens(self.other_special_tokens()?),
        ))
    }

    /// The special tokens tokenizer_config.json names besides BOS and EOS, which
    /// transformers passes to chat templates.
    fn other_special_tokens(&self) -> Result<Vec<(String, String)>> {
        let mut tokens = Vec::new();
        for key in [
            "unk_token",
            "sep_token",
            "pad_token",
            "cls_token",
            "mask_token",
        ] {
            let token = self
                .config_token(key)
                .with_context(|| format!("tokenizer_config.json: key `{key}`"))?;
            if let Some(token) = token {
                tokens.push((key.to_string(), token));
            }
        }
        Ok(tokens)
    }

    /// The underlying `tokenizers` tokenizer, for what this type does not wrap.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Files of a "slow" tokenizer (SentencePiece, BPE or WordPiece vocabularies), which
/// transformers converts to tokenizer.json.
const SLOW_TOKENIZER_FILES: &[&str] = &[
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
];

/// Refuses a model directory without tokenizer.json, the fast tokenizer's file skein reads,
/// saying how to write one (a missing directory is left to the load to report).
fn check_fast_tokenizer(dir: &Path) -> Result<()> {
    if !dir.is_dir() || dir.join(TOKENIZER_FILE).exists() {
        return Ok(());
    }
    let slow: Vec<&str> = SLOW_TOKENIZER_FILES
        .iter()
        .copied()
        .filter(|f| dir.join(f).is_file())
        .collect();
    let has = match slow.as_slice() {
        [] => String::new(),
        files => format!(" (it has a slow tokenizer's {})", files.join(", ")),
    };
    let quoted = dir.display().to_string().replace('\'', "\\'");
    bail!(
        "{}: no {TOKENIZER_FILE}{has}. skein reads a model's tokenizer from the fast tokenizer \
         file {TOKENIZER_FILE}; transformers writes one (with the `tokenizers` package \
         installed): python -c \"from transformers import AutoTokenizer as T; \
         T.from_pretrained('{quoted}').save_pretrained('{quoted}')\"",
        dir.display()
    )
}

/// The named templates of `dir` (`additional_chat_templates/`), by file stem; none when the
/// folder is missing.
fn read_more_templates(dir: &Path) -> Result<Vec<(String, String)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    let mut named = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("listing {}", dir.display()))?
            .path();
        let name = path.file_stem().and_then(|n| n.to_str());
        if let (Some(name), true) = (name, path.extension().is_some_and(|e| e == "jinja")) {
            let source = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            named.push((name.to_string(), source));
        }
    }
    named.sort();
    Ok(named)
}

/// Writes `named` as `dir/NAME.jinja`, removing the templates of another model a save over
/// its directory would leave (read back, they would render this model's tool requests).
fn write_more_templates(dir: &Path, named: &[(String, String)]) -> Result<()> {
    for (stale, _) in read_more_templates(dir)? {
        if !named.iter().any(|(name, _)| *name == stale) {
            let path = dir.join(format!("{stale}.jinja"));
            std::fs::remove_file(&path)
                .with_context(|| format!("removing the replaced {}", path.display()))?;
        }
    }
    if named.is_empty() {
        // Gone when nothing else is in it; a folder the user keeps more in stays.
        let _ = std::fs::remove_dir(dir);
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, source) in named {
        let path = dir.join(format!("{name}.jinja"));
        std::fs::write(&path, source).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The ids the post-processor adds before a text: those it marks special at the front of a
/// one-character text.
pub fn leading_special_ids(inner: &tokenizers::Tokenizer) -> Result<Vec<u32>> {
    let encoding = inner.encode("a", true).map_err(tk_err)?;
    Ok(encoding
        .get_ids()
        .iter()
        .zip(encoding.get_special_tokens_mask())
        .take_while(|(_, &special)| special == 1)
        .map(|(&id, _)| id)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat_template::Message;

    #[test]
    fn char_level_encodes_one_id_per_char_and_round_trips() {
        let tok = Tokenizer::char_level("0123456789+-= ").unwrap();
        let ids = tok.encode("12+3 = 15", false).unwrap();
        assert_eq!(ids.len(), 9);
        assert_eq!(ids[0], 5 + 1, "first alphabet char follows the 5 specials");
        assert_eq!(tok.decode(&ids, false).unwrap(), "12+3 = 15");
        assert_eq!(tok.id_to_token(ids[2]).as_deref(), Some("+"));
        assert_eq!(tok.token_to_id("<|im_end|>"), Some(4));
        assert_eq!(tok.eos_token_ids(), &[4]);
        assert_eq!(tok.pad_token_id(), Some(0));
        assert_eq!(tok.bos_token_id(), None);
    }

    /// An `added_tokens` entry of tokenizer.json: a special token.
    fn special(id: u32, content: &str) -> String {
        format!(
            r#"{{"id": {id}, "content": "{content}", "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true}}"#
        )
    }

    /// Where the tool-call tags are special tokens, a message keeps them (and so its calls);
    /// other special tokens, such as the stop token, are left out.
    #[test]
    fn a_message_keeps_tool_call_tags_marked_special() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tool-tags-special");
        let tok = Tokenizer::from_file(dir.join(TOKENIZER_FILE)).unwrap();
        assert_eq!(tok.decode(&[2, 1, 3, 4], true).unwrap(), "x");
        // (A vocabulary without a decoder joins its tokens with spaces.)
        assert_eq!(
            tok.decode_message(&[2, 1, 3, 4]).unwrap(),
            "<tool_call> x </tool_call>"
        );
    }

    /// A Llama-style post-processor: a plain prompt starts with its BOS, as transformers'
    /// `tokenizer(text)` gives it, and not with the EOS a post-processor may put after a text.
    #[test]
    fn a_plain_prompt_starts_with_what_the_post_processor_puts_first() {
        let token = |name: &str| format!(r#"{{"SpecialToken": {{"id": "{name}", "type_id": 0}}}}"#);
        let seq = r#"{"Sequence": {"id": "A", "type_id": 0}}"#;
        let entry = |name: &str, id: u32| {
            format!(r#""{name}": {{"id": "{name}", "ids": [{id}], "tokens": ["{name}"]}}"#)
        };
        let json = format!(
            r#"{{"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{}, {}],
            "normalizer": null, "pre_tokenizer": null, "decoder": null,
            "post_processor": {{"type": "TemplateProcessing", "single": [{}, {seq}, {}],
                "pair": [{seq}], "special_tokens": {{{}, {}}}}},
            "model": {{"type": "WordLevel", "vocab": {{"<unk>": 0, "<s>": 1, "</s>": 2, "x": 3}},
                      "unk_token": "<unk>"}}}}"#,
            special(1, "<s>"),
            special(2, "</s>"),
            token("<s>"),
            token("</s>"),
            entry("<s>", 1),
            entry("</s>", 2),
        );
        let path = std::env::temp_dir().join(format!("skein-bos-{}.json", std::process::id()));
        std::fs::write(&path, json).unwrap();
        let tok = Tokenizer::from_file(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(tok.encode("x", true).unwrap(), [1, 3, 2]);
        assert_eq!(tok.start_ids(), [1]);
        assert_eq!(tok.encode_plain_prompt("x").unwrap(), [1, 3]);
        assert_eq!(tok.encode_plain_prompt("<s>x").unwrap(), [1, 1, 3]);
        let (ids, unknown) = tok.encode_plain_prompt_checked("x").unwrap();
        assert_eq!((ids, unknown.is_empty()), (vec![1, 3], true));
        let (ids, unknown) = tok.encode_plain_prompt_checked("y").unwrap();
        assert_eq!((ids, unknown.is_total()), (vec![1, 0], true));
        let plain = Tokenizer::char_level("x").unwrap();
        assert!(plain.start_ids().is_empty());
        assert_eq!(
            plain.encode_plain_prompt("x").unwrap(),
            plain.encode("x", false).unwrap()
        );
    }

    /// A SentencePiece vocabulary (Llama 2's, Mistral's): each token shows its word's space,
    /// which decoding it alone drops.
    #[test]
    fn tokens_one_by_one_keep_their_spaces() {
        let json = r#"{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
            "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "▁The": 1, "▁quick": 2, "fox": 3},
                      "unk_token": "<unk>"}}"#;
        let path = std::env::temp_dir().join(format!("skein-sp-{}.json", std::process::id()));
        std::fs::write(&path, json).unwrap();
        let tok = Tokenizer::from_file(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(tok.decode(&[1, 2, 3], false).unwrap(), "The quickfox");
        assert_eq!(
            tok.decode(&[2], false).unwrap(),
            "quick",
            "alone, the space is gone"
        );
        assert_eq!(tok.token_texts(None, &[1, 2, 3]), ["The", " quick", "fox"]);
        assert_eq!(tok.token_texts(Some(1), &[2]), [" quick"]);
        // A byte-level or character vocabulary reads the same either way.
        let chars = Tokenizer::char_level("ab ").unwrap();
        let ids = chars.encode("a b", false).unwrap();
        assert_eq!(chars.token_texts(None, &ids), ["a", " ", "b"]);
    }

    #[test]
    fn char_level_maps_unknown_chars_to_unk() {
        let tok = Tokenizer::char_level("ab").unwrap();
        assert_eq!(tok.encode("aZb€", false).unwrap(), {
            let a = tok.token_to_id("a").unwrap();
            let b = tok.token_to_id("b").unwrap();
            vec![a, 1, b, 1]
        });
    }

    #[test]
    fn unknown_characters_are_reported_with_the_same_ids() {
        let tok = Tokenizer::char_level("ab ").unwrap();
        let text = "aé b€\t<|unk|>é<|im_end|>";
        let (ids, unknown) = tok.encode_checked(text, false).unwrap();
        assert_eq!(ids, tok.encode(text, false).unwrap(), "token in, token out");
        assert_eq!(tok.unk_token_id(), Some(1));
        assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 5);
        // The typed `<|unk|>` is a special token, not an unknown character.
        assert_eq!(unknown.count, 4);
        assert_eq!(unknown.examples, ["é", "€", "\t"]);
        assert_eq!(
            unknown.known,
            2 + 7 + 10,
            "a, b and the special tokens' characters"
        );
        assert!(!unknown.is_total());

        assert!(tok.unknown_chars("ab ab\n").unwrap().is_empty());
        let all = tok.unknown_chars(" é€ ").unwrap();
        assert!(all.is_total(), "{all:?}");
        assert_eq!(all.count, 2);
        let blank = tok.unknown_chars("  ").unwrap();
        assert!(blank.is_empty() && !blank.is_total());
    }

    #[test]
    fn unknown_characters_are_found_after_a_save_and_in_a_bare_tokenizer_json() {
        let dir = tempfile::tempdir().unwrap();
        Tokenizer::char_level("xy")
            .unwrap()
            .save_dir(dir.path())
            .unwrap();
        for tok in [
            Tokenizer::from_dir(dir.path()).unwrap(),
            Tokenizer::from_file(dir.path().join(TOKENIZER_FILE)).unwrap(),
        ] {
            assert_eq!(tok.unk_token_id(), Some(1));
            let unknown = tok.unknown_chars("xzy").unwrap();
            assert_eq!((unknown.count, unknown.known), (1, 2));
            assert_eq!(unknown.examples, ["z"]);
        }
    }

    #[test]
    fn char_level_keeps_special_tokens_and_newlines() {
        let tok = Tokenizer::char_level("xy").unwrap();
        let ids = tok
            .encode("<|im_start|>user\nxy<|im_end|>\n", false)
            .unwrap();
        assert_eq!(ids[0], 3);
        assert_eq!(ids.len(), 1 + 4 + 1 + 2 + 1 + 1);
        assert!(
            !ids.contains(&1),
            "template characters are in the vocabulary: {ids:?}"
        );
        assert_eq!(tok.decode(&ids, true).unwrap(), "user\nxy\n");
    }

    #[test]
    fn char_level_vocab_has_no_duplicates() {
        let tok = Tokenizer::char_level("aab\n").unwrap();
        let unique: std::collections::HashSet<char> =
            "ab".chars().chain(TEMPLATE_CHARS.chars()).collect();
        assert_eq!(tok.vocab_size(), 5 + unique.len());
    }

    #[test]
    fn char_level_chat_template_renders_chatml() {
        let tok = Tokenizer::char_level("0123456789").unwrap();
        let text = tok
            .chat_template()
            .unwrap()
            .unwrap()
            .render(&[Message::user("12")], None, true)
            .unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\n12<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn save_and_load_dir_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let tok = Tokenizer::char_level("abc ").unwrap();
        tok.save_dir(dir.path()).unwrap();
        let back = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(back.vocab_size(), tok.vocab_size());
        assert_eq!(
            back.encode("ab c", false).unwrap(),
            tok.encode("ab c", false).unwrap()
        );
        assert_eq!(back.eos_token_ids(), &[4]);
        assert_eq!(back.pad_token_id(), Some(0));
        assert!(back.chat_template().unwrap().is_some());
        assert!(tok.is_char_level() && back.is_char_level());
        let file_only = Tokenizer::from_file(dir.path().join(TOKENIZER_FILE)).unwrap();
        assert_eq!(
            file_only.encode("cab", false).unwrap(),
            tok.encode("cab", false).unwrap()
        );
        assert!(file_only.eos_token_ids().is_empty());
    }

    #[test]
    fn eos_ids_merge_config_and_generation_config() {
        let dir = tempfile::tempdir().unwrap();
        Tokenizer::char_level("a")
            .unwrap()
            .save_dir(dir.path())
            .unwrap();
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"eos_token_id": [2, 4], "bos_token_id": 3}"#,
        )
        .unwrap();
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.eos_token_ids(), &[4, 2]);
        assert_eq!(tok.bos_token_id(), Some(3));
    }

    /// Saved over a directory holding another tokenizer's `chat_template.jinja` (an
    /// overwritten model), a tokenizer without one reads back as itself, not with that
    /// template.
    #[test]
    fn a_save_over_another_model_leaves_no_template_of_its() {
        let dir = tempfile::tempdir().unwrap();
        let char_level = Tokenizer::char_level("ab").unwrap();
        char_level.save_dir(dir.path()).unwrap();
        std::fs::write(dir.path().join(TEMPLATE_FILE), "{{ messages }}").unwrap();
        let other = Tokenizer::from_dir(dir.path()).unwrap();
        assert!(!other.is_char_level(), "the template file is read");
        char_level.save_dir(dir.path()).unwrap();
        let back = Tokenizer::from_dir(dir.path()).unwrap();
        assert!(back.is_char_level());
        assert!(!dir.path().join(TEMPLATE_FILE).exists());
    }

    #[test]
    fn added_token_objects_and_template_file_are_read() {
        let dir = tempfile::tempdir().unwrap();
        Tokenizer::char_level("a")
            .unwrap()
            .save_dir(dir.path())
            .unwrap();
        let config = json!({"eos_token": {"content": "<|endoftext|>", "special": true}});
        json_file::write(&dir.path().join(CONFIG_FILE), &config).unwrap();
        std::fs::write(
            dir.path().join(TEMPLATE_FILE),
            "[{{ eos_token }}]{% if add_generation_prompt %}>{% endif %}",
        )
        .unwrap();
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tok.eos_token_ids(), &[2]);
        assert!(
            !tok.is_char_level(),
            "a template of its own: not the built-in tokenizer"
        );
        let t = tok.chat_template().unwrap().unwrap();
        assert_eq!(t.render(&[], None, false).unwrap(), "[<|endoftext|>]");
    }

    /// transformers saves named templates beside chat_template.jinja; `tool_use` renders a
    /// request with tools, and a save keeps them, or removes another model's.
    #[test]
    fn additional_chat_templates_are_read_used_with_tools_and_saved() {
        let dir = tempfile::tempdir().unwrap();
        Tokenizer::char_level("a")
            .unwrap()
            .save_dir(dir.path())
            .unwrap();
        std::fs::write(
            dir.path().join(TEMPLATE_FILE),
            "plain{% if add_generation_prompt %}>{% endif %}",
        )
        .unwrap();
        let more = dir.path().join(MORE_TEMPLATES_DIR);
        std::fs::create_dir_all(&more).unwrap();
        std::fs::write(more.join("tool_use.jinja"), "tools: {{ tools | length }}").unwrap();
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        let render = |tok: &Tokenizer, tools: Option<&Value>| {
            let t = tok.chat_template().unwrap().unwrap();
            t.render(&[], tools, false).unwrap()
        };
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        assert_eq!(render(&tok, None), "plain");
        assert_eq!(render(&tok, Some(&tools)), "tools: 1");
        let saved = tempfile::tempdir().unwrap();
        tok.save_dir(saved.path()).unwrap();
        let back = Tokenizer::from_dir(saved.path()).unwrap();
        assert_eq!(render(&back, Some(&tools)), "tools: 1");
        // Another model saved over it takes its tool template away.
        Tokenizer::char_level("a")
            .unwrap()
            .save_dir(saved.path())
            .unwrap();
        assert!(!saved.path().join(MORE_TEMPLATES_DIR).exists());
    }

    /// A model directory with `template` as its chat_template.jinja, or as tokenizer_config.json's
    /// `chat_template`.
    fn templated(template: &str, in_config: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        Tokenizer::char_level("abc0123456789 +?.")
            .unwrap()
            .save_dir(dir.path())
            .unwrap();
        if in_config {
            let path = dir.path().join(CONFIG_FILE);
            let mut config: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            config["chat_template"] = template.into();
            json_file::write(&path, &config).unwrap();
        } else {
            std::fs::write(dir.path().join(TEMPLATE_FILE), template).unwrap();
        }
        dir
    }

    const CHATML_TURNS: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n\
                                {{ m.content }}<|im_end|>\n{% endfor %}";

    /// ChatML without its generation prompt renders a prompt that ends with the user's turn:
    /// loading it is refused, naming its file, the opener its prompts lack, and the block to
    /// add. With the block it loads; so does a template that opens the reply itself (Llama
    /// 2's `[/INST]`) or writes nothing around it.
    #[test]
    fn a_template_that_ignores_the_generation_prompt_is_refused_by_its_file() {
        for in_config in [false, true] {
            let dir = templated(CHATML_TURNS, in_config);
            let tok = Tokenizer::from_dir(dir.path()).unwrap();
            let err = format!("{:#}", tok.chat_template().unwrap_err());
            let file = if in_config {
                format!(
                    "{} (key `chat_template`)",
                    dir.path().join(CONFIG_FILE).display()
                )
            } else {
                dir.path().join(TEMPLATE_FILE).display().to_string()
            };
            assert!(err.starts_with(&format!("{file}: ")), "{err}");
            assert!(err.contains("ignores `add_generation_prompt`"), "{err}");
            assert!(
                err.contains(r#"{%- if add_generation_prompt %}{{- "<|im_start|>assistant\n" }}"#),
                "{err}"
            );
        }
        let llama2 = "{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} \
                      [/INST]{% else %} {{ m.content }}</s>{% endif %}{% endfor %}";
        let contents = "{% for m in messages %}{{ m.content }}\n{% endfor %}";
        let opened = format!(
            "{CHATML_TURNS}{{% if add_generation_prompt %}}<|im_start|>assistant\n{{% endif %}}"
        );
        for template in [llama2, contents, &opened] {
            let dir = templated(template, false);
            let tok = Tokenizer::from_dir(dir.path()).unwrap();
            let t = tok.chat_template().unwrap().unwrap();
            let prompt = t.render(&[Message::user("1+2?")], None, true).unwrap();
            assert!(!prompt.is_empty(), "{template}");
        }
    }

    /// A template that fails on any conversation (an unknown filter) is the template's error,
    /// named by its file as it loads, not a data row's.
    #[test]
    fn a_template_that_fails_on_an_ordinary_conversation_is_refused_by_its_file() {
        let broken = "{% for m in messages %}{{ m.content | shout }}{% endfor %}";
        let dir = templated(broken, false);
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        let err = format!("{:#}", tok.chat_template().unwrap_err());
        let file = dir.path().join(TEMPLATE_FILE).display().to_string();
        assert!(err.starts_with(&format!("{file}: ")), "{err}");
        assert!(err.contains("fails on an ordinary conversation"), "{err}");
        assert!(err.contains("unknown filter"), "{err}");
        // One that refuses a particular role still loads: that is a row's fault.
        let picky = format!(
            "{{% for m in messages %}}{{% if m.role == 'robot' %}}\
             {{{{ raise_exception('no robots') }}}}{{% endif %}}{{% endfor %}}{CHATML_TURNS}\
             {{% if add_generation_prompt %}}<|im_start|>assistant\n{{% endif %}}"
        );
        let dir = templated(&picky, false);
        let t = Tokenizer::from_dir(dir.path())
            .unwrap()
            .chat_template()
            .unwrap()
            .unwrap();
        let err = t
            .render(&[Message::new("robot", "beep")], None, true)
            .unwrap_err();
        assert!(format!("{err:#}").contains("no robots"), "{err:#}");
    }

    /// A directory with a slow tokenizer only is refused saying skein needs tokenizer.json and
    /// how transformers writes it.
    #[test]
    fn a_directory_without_tokenizer_json_says_how_to_make_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.model"), "").unwrap();
        std::fs::write(dir.path().join(CONFIG_FILE), "{}").unwrap();
        let err = format!("{:#}", Tokenizer::from_dir(dir.path()).unwrap_err());
        let path = dir.path().display().to_string();
        assert!(
            err.starts_with(&format!(
                "{path}: no tokenizer.json (it has a slow tokenizer's tokenizer.model)"
            )),
            "{err}"
        );
        assert!(
            err.contains("the fast tokenizer file tokenizer.json"),
            "{err}"
        );
        assert!(
            err.contains(&format!(
                "T.from_pretrained('{path}').save_pretrained('{path}')"
            )),
            "{err}"
        );
        assert!(!err.contains("No such file"), "{err}");
    }

    #[test]
    fn bad_user_files_name_the_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let err = format!("{:#}", Tokenizer::from_dir(dir.path()).unwrap_err());
        assert!(err.contains(TOKENIZER_FILE), "{err}");

        Tokenizer::char_level("a")
            .unwrap()
            .save_dir(dir.path())
            .unwrap();
        let config = json!({"pad_token": "<missing>"});
        json_file::write(&dir.path().join(CONFIG_FILE), &config).unwrap();
        let err = format!("{:#}", Tokenizer::from_dir(dir.path()).unwrap_err());
        assert!(
            err.contains(CONFIG_FILE) && err.contains("pad_token"),
            "{err}"
        );
        assert!(err.contains("<missing>"), "{err}");

        std::fs::write(dir.path().join(TOKENIZER_FILE), "{not json").unwrap();
        let err = format!("{:#}", Tokenizer::from_dir(dir.path()).unwrap_err());
        assert!(err.contains(TOKENIZER_FILE), "{err}");
    }
}
