//! `skein sft`: supervised fine-tuning on chat JSONL with assistant-only loss, writing a
//! Hugging Face model directory that `model.path` can warm-start RL from.
//!
//! A conversation is tokenized through the chat template turn by turn: the text up to an
//! assistant turn (rendered with the generation prompt) has loss mask 0, the turn itself
//! mask 1: its content, its end-of-turn token, and what the template writes after that
//! before the next message (ChatML's newline), which sampling never reaches, since it stops
//! at the end-of-turn token.

use super::sft_memory;
use crate::engine::SamplingParams;
use crate::model::Model;
use crate::trainer::batch::TrainRow;
use crate::trainer::checkpoint::save_model_dir;
use crate::trainer::config::start_device;
use crate::trainer::config::ModelSection;
use crate::trainer::sft::{sft_optim_config, sft_row_masked, sft_step};
use crate::trainer::update::optim::Optimizer;
use anyhow::{bail, Context, Result};
use serde_json::json;
use skein_data::{load_conversations, ChatMessage, Conversation, ReadOptions, Rows, Sampler};
use skein_report::StepProgress;
use skein_text::{ChatTemplate, GenerationConfig, Message, TokenIds, Tokenizer, UnknownChars};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct SftArgs {
    /// Chat JSONL files: one {"messages": [{"role": ..., "content": ...}, ...]} per line.
    #[arg(long = "data", value_name = "FILE", required = true)]
    pub data: Vec<PathBuf>,
    /// The model to fine-tune (Hugging Face directory with a chat template). Without it, a
    /// tiny character-level model is built from scratch (the `[model]` defaults).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Where to write the fine-tuned model: a new directory, or with --overwrite an existing
    /// model directory to replace (never the --model being fine-tuned).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace the model at --out: a directory that holds one (its config.json); the old
    /// model's files are written over (its weights aside first, so a failed save leaves the
    /// old model whole), then its shard index and shards removed.
    #[arg(long)]
    pub overwrite: bool,
    #[arg(long, default_value_t = 100)]
    pub steps: usize,
    /// Conversations per optimizer step.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Token slots of one forward/backward pass: a step's conversations are split into passes
    /// of at most this many (a longer one takes a pass of its own), with the same loss and
    /// step for any split. Default: 8192, or the largest power of two down to 256 whose
    /// estimate fits the free memory.
    #[arg(long, value_name = "N")]
    pub micro_batch_tokens: Option<usize>,
    /// Peak learning rate: reached after a linear warm-up over the first tenth of the steps,
    /// then decayed along a cosine toward 0.1× by the end (AdamW, gradients clipped at norm 1).
    #[arg(long, default_value_t = 1e-4, allow_negative_numbers = true)]
    pub lr: f64,
    /// Longest conversation in tokens; longer ones are cut at the end (counted as
    /// `truncated`, or as `cut_before_any_reply` and left out when the cut leaves no
    /// assistant token).
    #[arg(long, default_value_t = 2048)]
    pub max_tokens: usize,
    /// Skip (and count) malformed lines instead of stopping at the first.
    #[arg(long)]
    pub skip_bad_rows: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Threads libtorch may use (0 = its default).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// Conversations in one optimizer step: each is a row held in memory with its activations.
const MAX_BATCH: usize = 1 << 16;

pub fn run(args: &SftArgs) -> Result<()> {
    check_args(args)?;
    let device = start_device(&args.device, args.threads)?;
    let opts = ReadOptions {
        skip_bad_rows: args.skip_bad_rows,
    };
    let loaded = load_conversations(&args.data, &opts)?;
    if let Some(first) = loaded.skipped.first() {
        eprintln!(
            "skein: skipped {} bad lines; the first: {first}",
            loaded.skipped.len()
        );
    }
    let (tokenizer, policy) = match &args.model {
        Some(dir) => (Tokenizer::from_dir(dir)?, Model::load_dir(dir, device)?),
        None => from_scratch(&loaded.rows, args, device)?,
    };
    let layout = Layout::for_tokenizer(&tokenizer, args.model.as_deref())?;
    let max_tokens = cut_at_positions(args, &policy);
    let tokenized = conversation_rows(&loaded, &layout, &tokenizer, args, max_tokens)?;
    let rows = tokenized.rows;
    if rows.is_empty() {
        bail!(
            "no conversation has an assistant token within --max-tokens {}",
            args.max_tokens
        );
    }

    let longest = rows.iter().map(|r| r.tokens.len()).max().unwrap_or(0);
    let pass_tokens = sft_memory::pass_tokens(args.micro_batch_tokens, &policy, longest)?;
    let ocfg = sft_optim_config(args.lr, args.steps);
    let mut opt = Optimizer::new(&policy.vs, &ocfg, args.steps)?;
    let mut order = Sampler::new(rows.len(), args.seed, true);
    let mut progress = StepProgress::new(args.steps as u64);
    let mut losses = Vec::new();
    for step in 1..=args.steps {
        let batch: Vec<TrainRow> = (0..args.batch_size)
            .map(|_| rows[order.next_index()].clone())
            .collect();
        let outcome = sft_step(&policy, &mut opt, &batch, pass_tokens);
        if let Some(why) = outcome.failure() {
            bail!("step {step}: {why}; lower --lr");
        }
        let loss = outcome.loss;
        losses.push(loss);
        progress.update(step as u64, &[("loss", loss)]);
    }
    progress.finish();

    save_tuned(&policy, &tokenizer, args)?;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    // Up to 5 steps each, and never the same steps in both.
    let k = (losses.len() / 2).clamp(1, 5);
    println!(
        "{}",
        json!({
            "out": args.out.display().to_string(),
            "conversations": rows.len(),
            "skipped_rows": loaded.skipped.len() + tokenized.skipped,
            "truncated": tokenized.truncated,
            "cut_before_any_reply": tokenized.cut_whole,
            "unknown_char_conversations": tokenized.unknown_conversations,
            "steps": args.steps,
            "micro_batch_tokens": pass_tokens,
            "sft/loss_first": mean(&losses[..k]),
            "sft/loss_last": mean(&losses[losses.len() - k..]),
        })
    );
    Ok(())
}

/// Conversations are cut at --max-tokens, or at the model's positions where those are fewer:
/// a row longer than them has no rotary angle for its last tokens (said when so).
fn cut_at_positions(args: &SftArgs, policy: &Model) -> usize {
    let positions = usize::try_from(policy.net.max_positions()).unwrap_or(usize::MAX);
    if positions < args.max_tokens {
        eprintln!(
            "skein: conversations are cut at the model's {positions} positions (below \
             --max-tokens {})",
            args.max_tokens
        );
    }
    args.max_tokens.min(positions)
}

/// Writes the tuned model to --out (over the model there with --overwrite). Fine-tuning
/// samples nothing: a loaded model's own generation settings (its sampling, bos, repetition
/// penalty) stay, with the stop ids this tokenizer ends on; a model without them (or one built
/// from scratch) gets the stop and pad ids alone, so readers keep their own sampling defaults
/// rather than skein's rollout settings.
fn save_tuned(policy: &Model, tokenizer: &Tokenizer, args: &SftArgs) -> Result<()> {
    let sampling = SamplingParams {
        stop_token_ids: tokenizer.stop_token_ids(),
        ..SamplingParams::default()
    };
    save_model_dir(policy, tokenizer, &sampling, &args.out)?;
    // Only once the new model is written: a save that fails leaves the old one whole.
    if args.overwrite {
        remove_replaced_files(&args.out)?;
    }
    let loaded = args.model.as_deref().map(GenerationConfig::from_dir);
    let mut generation = match loaded.transpose()?.flatten() {
        Some(own) => own,
        None => GenerationConfig {
            pad_token_id: tokenizer.pad_token_id(),
            ..GenerationConfig::default()
        },
    };
    generation.added_stop_ids = tokenizer.added_stops(&sampling.stop_token_ids);
    generation.eos_token_id = Some(TokenIds::Many(sampling.stop_token_ids));
    generation.save_dir(&args.out)
}

/// Every flag has a value that can work, checked before anything is read or built.
fn check_args(args: &SftArgs) -> Result<()> {
    if args.steps == 0 || args.batch_size == 0 || args.max_tokens < 2 {
        bail!("--steps and --batch-size must be at least 1, --max-tokens at least 2");
    }
    if args.micro_batch_tokens == Some(0) {
        bail!("--micro-batch-tokens must be at least 1 (the token slots of one pass)");
    }
    if args.batch_size > MAX_BATCH {
        bail!(
            "--batch-size must be at most {MAX_BATCH} (got {})",
            args.batch_size
        );
    }
    if args.threads > crate::trainer::config::max_threads() {
        bail!(
            "--threads must be at most {} (got {})",
            crate::trainer::config::max_threads(),
            args.threads
        );
    }
    if !(args.lr.is_finite() && args.lr > 0.0) {
        bail!("--lr {}: must be a finite number > 0, e.g. 1e-4", args.lr);
    }
    check_out(args)
}

/// `--out` can take the fine-tuned model, checked before any training: not a file, not the
/// input model, and not an existing model directory unless `--overwrite` says to replace it.
fn check_out(args: &SftArgs) -> Result<()> {
    let out = &args.out;
    if out.as_os_str().is_empty() {
        bail!("--out is empty: name the directory the fine-tuned model is written to");
    }
    if out.exists() && !out.is_dir() {
        bail!(
            "--out {} is a file, but the fine-tuned model is a directory: choose another --out",
            out.display()
        );
    }
    if let Some(model) = &args.model {
        let same = match (model.canonicalize(), out.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        if same {
            bail!(
                "--out {} is the --model being fine-tuned: write the result to another directory",
                out.display()
            );
        }
    }
    let occupied = out
        .read_dir()
        .map(|mut entries| entries.next().is_some())
        .unwrap_or(false);
    if occupied && !args.overwrite {
        bail!(
            "--out {} already holds files: choose a new directory, or pass --overwrite to \
             replace its model",
            out.display()
        );
    }
    if occupied && !out.join("config.json").is_file() {
        bail!(
            "--out {} holds files but no model (no config.json): --overwrite replaces a model \
             directory, so choose a new directory",
            out.display()
        );
    }
    Ok(())
}

/// Files of a replaced model that the new one does not write and loaders read before or
/// beside what it does: transformers takes `special_tokens_map.json` and `added_tokens.json`
/// over tokenizer.json's own special tokens, a slow tokenizer reads the vocabulary files, and
/// a loader asked for PyTorch or TensorFlow weights reads those.
const REPLACED_FILES: [&str; 9] = [
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "pytorch_model.bin",
    "tf_model.h5",
    "flax_model.msgpack",
];

/// Once a model is written over the one at `out`: that model's files the new one left in
/// place ([`REPLACED_FILES`], and each weight index with the shards it names, which the new
/// single `model.safetensors` does not replace: loaders that read an index, as vLLM does,
/// would load the old weights).
fn remove_replaced_files(out: &Path) -> Result<()> {
    for name in REPLACED_FILES {
        let path = out.join(name);
        if path.is_file() {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    for index in [
        "model.safetensors.index.json",
        "pytorch_model.bin.index.json",
    ] {
        remove_index_and_shards(&out.join(index))?;
    }
    Ok(())
}

fn remove_index_and_shards(index: &Path) -> Result<()> {
    let Some(out) = index.parent() else {
        return Ok(());
    };
    let Ok(text) = std::fs::read_to_string(index) else {
        return Ok(());
    };
    let parsed: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let shards: BTreeSet<&str> = parsed["weight_map"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    for shard in shards {
        // Only plain file names of this directory: an index cannot point elsewhere.
        if Path::new(shard).file_name() == Some(std::ffi::OsStr::new(shard)) {
            let path = out.join(shard);
            if path.is_file() {
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
            }
        }
    }
    std::fs::remove_file(index).with_context(|| format!("removing {}", index.display()))
}

/// The conversations as training rows, and what was cut, skipped or unknown on the way.
struct ConversationRows {
    rows: Vec<TrainRow>,
    /// Conversations cut at --max-tokens, and trained on as cut.
    truncated: usize,
    /// Conversations cut before their first assistant token: nothing of them is trained.
    cut_whole: usize,
    /// Conversations skipped (--skip-bad-rows): a message of which no character is in the
    /// vocabulary, or a conversation the chat template cannot render.
    skipped: usize,
    /// Conversations with characters outside the vocabulary (read as the unknown token).
    unknown_conversations: usize,
}

/// How a conversation becomes tokens.
enum Layout {
    /// The model's chat template (every model with a real tokenizer).
    Template(Box<ChatTemplate>),
    /// A character-level model's plain form, as the trainer prompts it
    /// ([`plain_conversation_tokens`]).
    Plain { eos: u32 },
}

impl Layout {
    /// The plain form for a character-level tokenizer (the trainer and `skein eval` give
    /// such a model plain prompts, never its template: it is tuned on what it will be asked),
    /// else the chat template of `model` (None: one built from scratch).
    fn for_tokenizer(tokenizer: &Tokenizer, model: Option<&Path>) -> Result<Layout> {
        if tokenizer.is_char_level() {
            let eos = *tokenizer
                .eos_token_ids()
                .first()
                .context("the character-level tokenizer has no end-of-sequence token")?;
            return Ok(Layout::Plain { eos });
        }
        let template = tokenizer.chat_template()?.with_context(|| {
            format!(
                "{} has no chat template: assistant-only loss needs one to find the assistant \
                 turns",
                model.unwrap_or(Path::new("the model")).display()
            )
        })?;
        Ok(Layout::Template(Box::new(template)))
    }
}

/// Tokenizes every conversation, each cut at `max_tokens`; one with a message the tokenizer
/// has no character of is a bad row, and other characters it lacks are counted and reported
/// once.
fn conversation_rows(
    conversations: &Rows<Conversation>,
    layout: &Layout,
    tokenizer: &Tokenizer,
    args: &SftArgs,
    max_tokens: usize,
) -> Result<ConversationRows> {
    let mut out = ConversationRows {
        rows: Vec::with_capacity(conversations.rows.len()),
        truncated: 0,
        cut_whole: 0,
        skipped: 0,
        unknown_conversations: 0,
    };
    let mut first_cut_whole = None;
    let (mut unknown, mut first_unknown) = (UnknownChars::default(), None);
    let mut first_skipped: Option<(&_, anyhow::Error)> = None;
    for (place, c) in conversations.places.iter().zip(&conversations.rows) {
        let at = || place.to_string();
        // A conversation the vocabulary cannot read, or the template cannot render (roles
        // that do not alternate, a turn it does not continue), is a bad row.
        let read = unknown_in(tokenizer, &c.messages).and_then(|chars| {
            let tokenized = match layout {
                Layout::Template(template) => conversation_tokens(template, tokenizer, &c.messages),
                Layout::Plain { eos } => plain_conversation_tokens(tokenizer, &c.messages, *eos),
            };
            Ok((chars, tokenized?))
        });
        let (chars, (mut tokens, mut mask)) = match read.with_context(at) {
            Ok(read) => read,
            Err(e) if args.skip_bad_rows => {
                out.skipped += 1;
                first_skipped.get_or_insert((place, e));
                continue;
            }
            Err(e) => return Err(e.context("pass --skip-bad-rows to skip such conversations")),
        };
        if !chars.is_empty() {
            out.unknown_conversations += 1;
            first_unknown.get_or_insert(place);
            unknown.add(&chars);
        }
        let cut = tokens.len() > max_tokens;
        if cut {
            tokens.truncate(max_tokens);
            mask.truncate(max_tokens);
        }
        match masked_row(tokens, mask) {
            Some(row) => {
                out.truncated += usize::from(cut);
                out.rows.push(row);
            }
            None => {
                out.cut_whole += 1;
                first_cut_whole.get_or_insert(place);
            }
        }
    }
    let conversations = |n: usize| match n {
        1 => "1 conversation".to_string(),
        n => format!("{n} conversations"),
    };
    if let Some(first) = first_unknown {
        eprintln!(
            "skein: warning: {} with {unknown} in all, which the model reads as its unknown \
             token (the first: {first})",
            conversations(out.unknown_conversations)
        );
    }
    if let Some(first) = first_cut_whole {
        eprintln!(
            "skein: warning: left out {} cut at {max_tokens} tokens before any assistant \
             token, with nothing to train (the first: {first}); raise --max-tokens to keep them",
            conversations(out.cut_whole)
        );
    }
    if let Some((_, why)) = first_skipped {
        eprintln!(
            "skein: warning: skipped {} the model cannot be tuned on (the first: {why:#})",
            conversations(out.skipped)
        );
    }
    Ok(out)
}

/// What of a conversation's messages the tokenizer lacks. A message with nothing else is an
/// error: its turn would be only unknown tokens.
fn unknown_in(tokenizer: &Tokenizer, messages: &[ChatMessage]) -> Result<UnknownChars> {
    let mut all = UnknownChars::default();
    for (j, m) in messages.iter().enumerate() {
        let chars = tokenizer.unknown_chars(&m.content)?;
        if chars.is_total() {
            bail!(
                "message {} ({}): none of its characters is in the tokenizer's vocabulary ({}): \
                 the model would read only unknown tokens",
                j + 1,
                m.role,
                chars.examples_text()
            );
        }
        all.add(&chars);
    }
    Ok(all)
}

/// A tiny character-level model over the characters of the conversations.
fn from_scratch(
    convs: &[Conversation],
    args: &SftArgs,
    device: tch::Device,
) -> Result<(Tokenizer, Model)> {
    let chars: BTreeSet<char> = convs
        .iter()
        .flat_map(|c| c.messages.iter())
        .flat_map(|m| m.role.chars().chain(m.content.chars()))
        .collect();
    let tokenizer = Tokenizer::char_level(&chars.into_iter().collect::<String>())?;
    let mc = ModelSection::default().tiny_config(tokenizer.vocab_size(), args.max_tokens);
    let model = Model::random(&mc, device, args.seed as i64)?;
    Ok((tokenizer, model))
}

/// The tokens of a conversation through its last assistant turn and their loss mask (1 on
/// assistant turns). The text is tokenised whole, as transformers' chat tokenisation does: a
/// turn tokenised on its own would start with what a SentencePiece vocabulary puts at the
/// start of a text (`▁`), a token the model never produces after its prompt. A token is
/// trained when it starts inside a turn. Fails when the template does not render each
/// conversation prefix as a prefix of the next, which turn-by-turn masking relies on.
pub fn conversation_tokens(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
) -> Result<(Vec<u32>, Vec<u8>)> {
    let msgs: Vec<Message> = messages
        .iter()
        .map(|m| Message::new(&m.role, &m.content))
        .collect();
    let mut turns = Vec::new();
    let mut done = String::new();
    for (i, m) in messages.iter().enumerate() {
        if m.role != "assistant" {
            continue;
        }
        let before = template.render(&msgs[..i], None, true)?;
        let through = template.render(&msgs[..=i], None, false)?;
        if !before.starts_with(done.as_str()) || !through.starts_with(before.as_str()) {
            bail!(
                "the chat template does not render message {} as a continuation of the ones \
                 before it, so its assistant tokens cannot be told apart",
                i + 1
            );
        }
        turns.push(before.len()..through.len());
        done = through;
    }
    let (tokens, offsets) = tokenizer.encode_with_offsets(&done)?;
    let mask = offsets
        .iter()
        .map(|&(start, _)| u8::from(turns.iter().any(|turn| turn.contains(&start))))
        .collect();
    Ok((tokens, mask))
}

/// The tokens of a conversation in the plain form a character-level model is prompted in:
/// the messages before the reply joined by newlines (as a dataset prompt renders without a
/// template), then the reply and `eos`, the only tokens trained. That form has no turns, so
/// the conversation has one assistant message, its last.
pub fn plain_conversation_tokens(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    eos: u32,
) -> Result<(Vec<u32>, Vec<u8>)> {
    let replies: Vec<usize> = (0..messages.len())
        .filter(|&i| messages[i].role == "assistant")
        .collect();
    let last = messages.len().saturating_sub(1);
    if replies != [last] {
        bail!(
            "a character-level model is prompted in plain text, without turns: its \
             conversations need one assistant message, the last (this one has {} of {} \
             messages{})",
            replies.len(),
            messages.len(),
            if replies.is_empty() || replies.last() == Some(&last) {
                String::new()
            } else {
                ", not last".to_string()
            }
        );
    }
    let prompt: Vec<&str> = messages[..last]
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    let mut tokens = tokenizer.encode_plain_prompt(&prompt.join("\n"))?;
    let mut mask = vec![0u8; tokens.len()];
    let mut reply = tokenizer.encode(&messages[last].content, false)?;
    reply.push(eos);
    mask.extend(std::iter::repeat_n(1u8, reply.len()));
    tokens.extend(reply);
    Ok((tokens, mask))
}

/// A training row whose prompt is everything before the first trained token; None when no
/// token is trained (or the very first one would be, which nothing predicts).
fn masked_row(tokens: Vec<u32>, mask: Vec<u8>) -> Option<TrainRow> {
    let first = mask.iter().position(|&m| m == 1)?.max(1);
    let loss_mask = mask[first..].to_vec();
    loss_mask
        .contains(&1)
        .then(|| sft_row_masked(tokens, first, loss_mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    /// The tokens `mask` trains.
    fn trained(tokens: &[u32], mask: &[u8]) -> Vec<u32> {
        tokens
            .iter()
            .zip(mask)
            .filter(|(_, &m)| m == 1)
            .map(|(&t, _)| t)
            .collect()
    }

    #[test]
    fn only_assistant_turns_are_trained() {
        let tok = Tokenizer::char_level("abcdefghijklmnopqrstuvwxyz ").unwrap();
        let template = tok.chat_template().unwrap().unwrap();
        let conv = [
            msg("system", "be brief"),
            msg("user", "hi"),
            msg("assistant", "hey"),
            msg("user", "bye"),
            msg("assistant", "ok"),
        ];
        let (tokens, mask) = conversation_tokens(&template, &tok, &conv).unwrap();
        assert_eq!(tokens.len(), mask.len());
        let trained = trained(&tokens, &mask);
        let text = tok.decode(&trained, false).unwrap();
        // Both replies with their end-of-turn marker, and nothing the user or system wrote.
        assert!(text.starts_with("hey<|im_end|>"), "{text:?}");
        assert!(text.contains("ok<|im_end|>"), "{text:?}");
        assert!(!text.contains("hi") && !text.contains("bye") && !text.contains("brief"));
        // The whole sequence is what the template renders for the conversation.
        let all: Vec<Message> = conv
            .iter()
            .map(|m| Message::new(&m.role, &m.content))
            .collect();
        let full = template.render(&all, None, false).unwrap();
        assert_eq!(tok.decode(&tokens, false).unwrap(), full);
        let row = masked_row(tokens, mask).unwrap();
        assert!(row.prompt_len > 0 && row.loss_mask[0] == 1);
    }

    /// A SentencePiece-style vocabulary (a `▁` prepended to every text it encodes, spaces
    /// written as `▁`) tokenises the conversation as one text: a turn tokenised on its own
    /// would start with a lone `▁` the model never produces after its prompt.
    #[test]
    fn turns_are_tokenised_within_the_whole_text() {
        let chars = "▁[]/INSThiHey";
        let vocab: serde_json::Map<String, serde_json::Value> = std::iter::once("</s>".into())
            .chain(chars.chars().map(String::from))
            .enumerate()
            .map(|(i, c)| (c, serde_json::json!(i)))
            .collect();
        let tokenizer_json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [{"id": 0, "content": "</s>", "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
            "pre_tokenizer": null,
            "post_processor": null,
            "decoder": null,
            "model": {"type": "BPE", "vocab": vocab, "merges": []}
        });
        let path = std::env::temp_dir().join(format!("skein-sp-{}.json", std::process::id()));
        std::fs::write(&path, tokenizer_json.to_string()).unwrap();
        let tok = Tokenizer::from_file(&path).unwrap();
        std::fs::remove_file(&path).ok();
        let source = "{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} \
                      [/INST]{% else %} {{ m.content }}</s>{% endif %}{% endfor %}";
        let template = ChatTemplate::new(source, None, Some("</s>")).unwrap();
        let conv = [msg("user", "hi"), msg("assistant", "Hey")];
        let (tokens, mask) = conversation_tokens(&template, &tok, &conv).unwrap();
        let whole = tok.encode("[INST] hi [/INST] Hey</s>", false).unwrap();
        assert_eq!(tokens, whole);
        let id = |c: &str| tok.encode(c, false).unwrap()[1];
        let trained = trained(&tokens, &mask);
        // The reply's own space, its letters and the end of turn: one `▁`, not two.
        assert_eq!(trained, [id(" "), id("H"), id("e"), id("y"), 0]);
    }

    /// A character-level model learns the reply to the prompt the trainer gives it: the
    /// messages joined by newlines, no template; a conversation with turns is refused.
    #[test]
    fn a_character_level_model_is_tuned_on_plain_prompts() {
        let tok = Tokenizer::char_level("0123456789+=\n").unwrap();
        let eos = tok.eos_token_ids()[0];
        let conv = [
            msg("system", "1+1=2"),
            msg("user", "3+4="),
            msg("assistant", "7"),
        ];
        let (tokens, mask) = plain_conversation_tokens(&tok, &conv, eos).unwrap();
        let mut expected = tok.encode("1+1=2\n3+4=", false).unwrap();
        let prompt_len = expected.len();
        expected.extend(tok.encode("7", false).unwrap());
        expected.push(eos);
        assert_eq!(tokens, expected);
        assert_eq!(mask, [vec![0; prompt_len], vec![1, 1]].concat());
        let turns = [
            msg("user", "1"),
            msg("assistant", "2"),
            msg("user", "3"),
            msg("assistant", "4"),
        ];
        let err = plain_conversation_tokens(&tok, &turns, eos)
            .unwrap_err()
            .to_string();
        assert!(err.contains("one assistant message, the last"), "{err}");
    }
}
