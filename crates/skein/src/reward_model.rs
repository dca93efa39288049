//! Reward models: a transformer read from a Hugging Face directory that turns
//! (response, reference-or-prompt) pairs into scalar rewards, in batches, without gradients.
//!
//! Two kinds, chosen from the directory's `config.json`:
//! * [`RewardKind::Classifier`]: a `*ForSequenceClassification` checkpoint with one label.
//!   BERT reads the head on the pooled `[CLS]` token of the pair (prompt, response); Qwen2 /
//!   Qwen3 / Llama decoders read `score` at the last real token of `prompt + response`.
//! * [`RewardKind::Similarity`]: a BERT sentence encoder (sentence-transformers layout:
//!   `modules.json`, `1_Pooling/config.json`); the reward is the cosine similarity of the
//!   response's and the reference's embeddings.
//!
//! Threads: tch tensors are `Send` but not `Sync`, so a `RewardModel` is too. Give each
//! executor thread its own handle with [`RewardModel::share`], which shares the parameters
//! (no copy, no reload), or put the model in a [`RewardModelPool`], which is `Sync`.

use crate::model::bert::{BertConfig, BertEncoder, Weights};
use crate::model::transformer::{positions_like, AttnMode, Transformer};
use crate::model::ModelConfig;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tch::{nn, Device, Kind, Tensor};
use tokenizers::{TruncationDirection, TruncationParams, TruncationStrategy};

/// What a reward model's score means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewardKind {
    /// A learned scalar head: higher is better, unbounded.
    Classifier,
    /// Cosine similarity of response and reference embeddings, in [-1, 1].
    Similarity,
}

enum Pooling {
    Mean,
    Cls,
}

enum Body {
    Similarity {
        encoder: BertEncoder,
        pooling: Pooling,
    },
    BertClassifier {
        encoder: BertEncoder,
        weight: Tensor,
        bias: Tensor,
    },
    DecoderClassifier(Box<Decoder>),
}

/// A decoder classifier: the decoder body and the `score` head read at the last real token.
struct Decoder {
    config: ModelConfig,
    vs: nn::VarStore,
    net: Transformer,
    score: Tensor,
}

/// One tokenized input row.
struct Row {
    ids: Vec<i64>,
    types: Vec<i64>,
}

/// A reward model and its tokenizer. See the module docs for the kinds and for threads.
pub struct RewardModel {
    dir: PathBuf,
    tokenizer: tokenizers::Tokenizer,
    max_length: usize,
    body: Body,
    /// Whether an input longer than `max_length` was cut and the run told (once, for every
    /// handle on these weights).
    cut_warned: Arc<AtomicBool>,
}

impl RewardModel {
    /// Loads a reward model directory (`config.json`, `tokenizer.json`, safetensors weights)
    /// onto `device`. Reads every weight (all-MiniLM-L6-v2: about 0.3 s on a CPU); load once and
    /// [`share`](Self::share) rather than loading per thread.
    pub fn load(dir: &Path, device: Device) -> Result<Self> {
        if !dir.join("config.json").is_file() {
            bail!(
                "reward model directory {} has no config.json (for the test model, run \
                 scripts/setup-reward-model.sh)",
                dir.display()
            );
        }
        let config = read_json(&dir.join("config.json"))?;
        let model_type = config["model_type"].as_str().unwrap_or("");
        let arch = config["architectures"][0].as_str().unwrap_or("");
        let classifier = arch.ends_with("ForSequenceClassification");
        let body = match (classifier, model_type) {
            (_, "bert") => {
                let cfg = BertConfig::from_file(&dir.join("config.json"))?;
                let mut w = Weights::read_dir(dir, device)?;
                let encoder = BertEncoder::from_weights(&cfg, &mut w)?;
                if classifier {
                    bert_classifier(dir, encoder, &mut w)?
                } else {
                    Body::Similarity {
                        encoder,
                        pooling: pooling(dir)?,
                    }
                }
            }
            (true, "qwen2" | "qwen3" | "llama") => decoder_classifier(dir, device)?,
            _ => bail!(
                "{}: architectures `{arch}`, model_type `{model_type}` is not a supported reward \
                 model (allowed: a *ForSequenceClassification checkpoint of bert, qwen2, qwen3 or \
                 llama, or a bert sentence encoder)",
                dir.display()
            ),
        };
        let positions = match &body {
            Body::Similarity { encoder, .. } | Body::BertClassifier { encoder, .. } => {
                encoder.config.max_position_embeddings as usize
            }
            Body::DecoderClassifier(d) => d.net.max_positions() as usize,
        };
        let max_length = max_length(dir, positions)?;
        let decoder = matches!(body, Body::DecoderClassifier(_));
        let tokenizer = load_tokenizer(dir, max_length, decoder)?;
        Ok(RewardModel {
            dir: dir.to_path_buf(),
            tokenizer,
            max_length,
            body,
            cut_warned: Arc::new(AtomicBool::new(false)),
        })
    }

    pub fn kind(&self) -> RewardKind {
        match self.body {
            Body::Similarity { .. } => RewardKind::Similarity,
            _ => RewardKind::Classifier,
        }
    }

    /// Longest input in tokens, special tokens included; longer inputs are truncated.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    pub fn device(&self) -> Device {
        match &self.body {
            Body::Similarity { encoder, .. } | Body::BertClassifier { encoder, .. } => {
                encoder.device()
            }
            Body::DecoderClassifier(d) => d.vs.device(),
        }
    }

    /// Another handle on the same parameters, for another thread: encoders share every tensor;
    /// a decoder builds its modules again and points them at the same storage.
    pub fn share(&self) -> Result<Self> {
        let body = match &self.body {
            Body::Similarity { encoder, pooling } => Body::Similarity {
                encoder: encoder.share(),
                pooling: match pooling {
                    Pooling::Mean => Pooling::Mean,
                    Pooling::Cls => Pooling::Cls,
                },
            },
            Body::BertClassifier {
                encoder,
                weight,
                bias,
            } => Body::BertClassifier {
                encoder: encoder.share(),
                weight: weight.shallow_clone(),
                bias: bias.shallow_clone(),
            },
            Body::DecoderClassifier(d) => {
                let (new_vs, net) = decoder_modules(&d.config, d.vs.device())?;
                let src = d.vs.variables();
                tch::no_grad(|| -> Result<()> {
                    for (name, mut var) in new_vs.variables() {
                        let t = src
                            .get(&name)
                            .ok_or_else(|| anyhow!("decoder variable `{name}` has no source"))?;
                        var.set_data(t);
                    }
                    Ok(())
                })?;
                Body::DecoderClassifier(Box::new(Decoder {
                    config: d.config.clone(),
                    vs: new_vs,
                    net,
                    score: d.score.shallow_clone(),
                }))
            }
        };
        Ok(RewardModel {
            dir: self.dir.clone(),
            tokenizer: self.tokenizer.clone(),
            max_length: self.max_length,
            body,
            cut_warned: self.cut_warned.clone(),
        })
    }

    /// One reward per `(response, reference_or_prompt)` item, in order. Similarity models
    /// compare the two texts (each distinct text embedded once); classifiers score the prompt
    /// followed by the response. Inputs run in length buckets, each padded to its longest row
    /// and masked, so a result does not depend on the rest of the batch beyond float rounding.
    pub fn score_batch(&self, items: &[(String, String)]) -> Result<Vec<f64>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let scores = tch::no_grad(|| match &self.body {
            Body::Similarity { .. } => self.similarity(items),
            _ => {
                let rows = items
                    .iter()
                    .map(|(response, prompt)| self.encode_pair(response, prompt))
                    .collect::<Result<Vec<_>>>()?;
                by_length(&rows, |bucket| self.classify(bucket))
            }
        })?;
        Vec::<f64>::try_from(scores.to_kind(Kind::Double).to_device(Device::Cpu))
            .context("reading reward scores")
    }

    /// Sentence embeddings [N, dim] as the model's pooling defines them, L2-normalised
    /// (Similarity models only).
    pub fn embed(&self, texts: &[&str]) -> Result<Tensor> {
        let Body::Similarity { encoder, pooling } = &self.body else {
            bail!(
                "{}: embeddings need a sentence-encoder reward model, this one is a classifier",
                self.dir.display()
            );
        };
        let rows = texts
            .iter()
            .map(|t| self.encode(t, None))
            .collect::<Result<Vec<_>>>()?;
        tch::no_grad(|| {
            let pooled = by_length(&rows, |bucket| {
                let (ids, types, mask) = pad(bucket, encoder.device());
                let hidden = encoder.forward(&ids, &types, &mask);
                Ok(match pooling {
                    Pooling::Cls => hidden.select(1, 0),
                    Pooling::Mean => {
                        let m = mask.to_kind(Kind::Float).unsqueeze(-1);
                        (hidden * &m).sum_dim_intlist(1, false, Kind::Float)
                            / m.sum_dim_intlist(1, false, Kind::Float).clamp_min(1e-9)
                    }
                })
            })?;
            Ok(normalize(&pooled))
        })
    }

    /// The ids the model sees for one text alone (special tokens added, truncated).
    pub fn token_ids(&self, text: &str) -> Result<Vec<i64>> {
        Ok(self.encode(text, None)?.ids)
    }

    /// Tokens an item costs the model (what a token budget should count): both texts for a
    /// similarity model, the joined input for a classifier; after truncation.
    pub fn token_count(&self, response: &str, reference: &str) -> Result<usize> {
        Ok(match self.body {
            Body::Similarity { .. } => {
                self.encode(response, None)?.ids.len() + self.encode(reference, None)?.ids.len()
            }
            _ => self.encode_pair(response, reference)?.ids.len(),
        })
    }

    fn similarity<'a>(&self, items: &'a [(String, String)]) -> Result<Tensor> {
        // Distinct texts once: a GRPO group repeats its reference for every sample.
        let mut index: HashMap<&str, i64> = HashMap::new();
        let mut texts: Vec<&str> = Vec::new();
        let mut pairs: Vec<(i64, i64)> = Vec::with_capacity(items.len());
        for (response, reference) in items {
            let mut slot = |t: &'a str| {
                *index.entry(t).or_insert_with(|| {
                    texts.push(t);
                    texts.len() as i64 - 1
                })
            };
            pairs.push((slot(response), slot(reference)));
        }
        let emb = self.embed(&texts)?;
        let device = emb.device();
        let a = Tensor::from_slice(&pairs.iter().map(|p| p.0).collect::<Vec<_>>()).to(device);
        let b = Tensor::from_slice(&pairs.iter().map(|p| p.1).collect::<Vec<_>>()).to(device);
        Ok(
            (emb.index_select(0, &a) * emb.index_select(0, &b)).sum_dim_intlist(
                -1,
                false,
                Kind::Float,
            ),
        )
    }

    fn classify(&self, rows: &[&Row]) -> Result<Tensor> {
        match &self.body {
            Body::BertClassifier {
                encoder,
                weight,
                bias,
            } => {
                let (ids, types, mask) = pad(rows, encoder.device());
                let hidden = encoder.forward(&ids, &types, &mask);
                let pooled = encoder
                    .pool(&hidden)
                    .ok_or_else(|| anyhow!("{}: no pooler weights", self.dir.display()))?;
                Ok(pooled.linear(weight, Some(bias)).squeeze_dim(-1))
            }
            Body::DecoderClassifier(d) => {
                let (net, score) = (&d.net, &d.score);
                let (ids, _, mask) = pad(rows, d.vs.device());
                // Causal attention keeps real tokens blind to the right padding.
                let hidden = net.hidden(&ids, &positions_like(&ids), AttnMode::Causal);
                let last = mask.sum_dim_intlist(1, false, Kind::Int64) - 1;
                let h = hidden.size()[2];
                let at = last.view([-1, 1, 1]).expand([-1, 1, h], false);
                let picked = hidden.gather(1, &at, false).squeeze_dim(1);
                Ok(picked.linear(score, None::<Tensor>).squeeze_dim(-1))
            }
            Body::Similarity { .. } => unreachable!("similarity models do not classify"),
        }
    }

    fn encode(&self, text: &str, pair: Option<&str>) -> Result<Row> {
        let enc = match pair {
            Some(second) => self.tokenizer.encode((text, second), true),
            None => self.tokenizer.encode(text, true),
        }
        .map_err(|e| anyhow!("{}: tokenizing: {e}", self.dir.display()))?;
        if enc.get_ids().is_empty() {
            bail!("an empty input: the tokenizer produced no tokens");
        }
        if !enc.get_overflowing().is_empty() {
            self.warn_of_a_cut(pair.is_some());
        }
        let mut row = Row {
            ids: enc.get_ids().iter().map(|&i| i as i64).collect(),
            types: enc.get_type_ids().iter().map(|&i| i as i64).collect(),
        };
        if pair.is_none() {
            self.drop_doubled_start(&mut row)?;
        }
        Ok(row)
    }

    /// Whether an input longer than [`max_length`](Self::max_length) was cut, on any handle on
    /// these weights.
    pub fn has_cut_an_input(&self) -> bool {
        self.cut_warned.load(Ordering::Relaxed)
    }

    /// Says once that the model read only part of an input: its score is of what was kept.
    fn warn_of_a_cut(&self, pair: bool) {
        if self.cut_warned.swap(true, Ordering::Relaxed) {
            return;
        }
        let kept = match (&self.body, pair) {
            (Body::DecoderClassifier(_), _) => "its end (the start of the prompt is cut)",
            (_, true) => "the start of each text (the longer of prompt and response is cut first)",
            _ => "its start (the end of the text is cut)",
        };
        eprintln!(
            "skein: warning: reward model {} reads at most {} tokens, and an input was longer: \
             it scored {kept}; a score that hangs on a final answer may not see it",
            self.dir.display(),
            self.max_length
        );
    }

    /// A text that already starts with what the tokenizer puts before a text (a policy's
    /// prompt rendered by a chat template that writes its own `<|begin_of_text|>`) would get
    /// it twice: the model reads it once, as transformers' `apply_chat_template` gives it.
    fn drop_doubled_start(&self, row: &mut Row) -> Result<()> {
        let lead = skein_text::leading_special_ids(&self.tokenizer)
            .with_context(|| format!("{}: reading its post-processor", self.dir.display()))?;
        let lead: Vec<i64> = lead.iter().map(|&i| i as i64).collect();
        let n = lead.len();
        let doubled = n > 0 && row.ids.len() > 2 * n && row.ids[..n] == lead[..];
        if doubled && row.ids[n..2 * n] == lead[..] {
            row.ids.drain(..n);
            row.types.drain(..n);
        }
        Ok(())
    }

    fn encode_pair(&self, response: &str, prompt: &str) -> Result<Row> {
        match self.body {
            // Encoders see (prompt, response) as a sentence pair ([SEP] between, token types).
            Body::BertClassifier { .. } => self.encode(prompt, Some(response)),
            // Decoders see one sequence; the caller formats it (e.g. with a chat template).
            _ => self.encode(&format!("{prompt}{response}"), None),
        }
    }
}

/// A `Sync` front on a reward model for several threads (what a `Send + Sync` scorer trait
/// needs): `handles` handles on the same weights ([`RewardModel::share`]), each behind its own
/// lock. A call takes a free handle, or waits for one when all are busy, so up to `handles`
/// batches run at once. Each calling thread's libtorch intra-op threads still apply
/// (`tch::set_num_threads`, set per thread).
pub struct RewardModelPool {
    handles: Vec<Mutex<RewardModel>>,
    next: AtomicUsize,
    kind: RewardKind,
    max_length: usize,
}

impl RewardModelPool {
    pub fn new(model: RewardModel, handles: usize) -> Result<Self> {
        if handles == 0 {
            bail!("a reward model pool needs at least one handle");
        }
        let (kind, max_length) = (model.kind(), model.max_length());
        let mut all = Vec::with_capacity(handles);
        for _ in 1..handles {
            all.push(Mutex::new(model.share()?));
        }
        all.push(Mutex::new(model));
        Ok(RewardModelPool {
            handles: all,
            next: AtomicUsize::new(0),
            kind,
            max_length,
        })
    }

    pub fn kind(&self) -> RewardKind {
        self.kind
    }

    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// [`RewardModel::score_batch`] on a free handle.
    pub fn score_batch(&self, items: &[(String, String)]) -> Result<Vec<f64>> {
        self.with_handle(|m| m.score_batch(items))
    }

    /// [`RewardModel::token_count`] on a free handle.
    pub fn token_count(&self, response: &str, reference: &str) -> Result<usize> {
        self.with_handle(|m| m.token_count(response, reference))
    }

    fn with_handle<T>(&self, f: impl FnOnce(&RewardModel) -> T) -> T {
        let n = self.handles.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed) % n;
        for k in 0..n {
            if let Ok(guard) = self.handles[(first + k) % n].try_lock() {
                return f(&guard);
            }
        }
        // All busy: wait for this call's own handle. A panic elsewhere leaves the model intact
        // (scoring mutates nothing), so a poisoned lock is still usable.
        let guard = self.handles[first]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&guard)
    }
}

fn bert_classifier(dir: &Path, encoder: BertEncoder, w: &mut Weights) -> Result<Body> {
    let h = encoder.config.hidden_size;
    let one_label = || {
        format!(
            "{}: a reward model has one output (num_labels = 1) and a pooler",
            dir.display()
        )
    };
    let weight = w
        .take("classifier.weight", &[1, h])
        .with_context(one_label)?;
    let bias = w.take("classifier.bias", &[1]).with_context(one_label)?;
    if !encoder.has_pooler() {
        bail!(one_label());
    }
    Ok(Body::BertClassifier {
        encoder,
        weight,
        bias,
    })
}

/// Modules of a decoder classifier: the decoder without an LM head (a classifier never
/// produces vocabulary logits, so none is allocated).
fn decoder_modules(cfg: &ModelConfig, device: Device) -> Result<(nn::VarStore, Transformer)> {
    let mut body_cfg = cfg.clone();
    body_cfg.tie_word_embeddings = true;
    let vs = nn::VarStore::new(device);
    let net = Transformer::new(&vs.root(), &body_cfg)?;
    Ok((vs, net))
}

fn decoder_classifier(dir: &Path, device: Device) -> Result<Body> {
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let (vs, net) = decoder_modules(&config, device)?;
    let mut w = Weights::read_dir(dir, device)?;
    tch::no_grad(|| -> Result<()> {
        for (name, mut var) in vs.variables() {
            let t = w.take(&name, &var.size())?;
            var.copy_(&t.to_kind(var.kind()));
        }
        Ok(())
    })?;
    let score = w
        .take("score.weight", &[1, config.hidden_size as i64])
        .with_context(|| {
            format!(
                "{}: a reward model has one output (num_labels = 1)",
                dir.display()
            )
        })?;
    Ok(Body::DecoderClassifier(Box::new(Decoder {
        config,
        vs,
        net,
        score,
    })))
}

/// The pooling of a sentence-transformers directory (`modules.json` → the Pooling module's
/// config); mean pooling when the directory is a bare BertModel.
fn pooling(dir: &Path) -> Result<Pooling> {
    let modules_path = dir.join("modules.json");
    if !modules_path.exists() {
        return Ok(Pooling::Mean);
    }
    let modules = read_json(&modules_path)?;
    // Anything beyond encoder → pooling → normalisation (a Dense projection, say) would change
    // the embedding, so it is refused rather than skipped.
    for m in modules.as_array().into_iter().flatten() {
        let ty = m["type"].as_str().unwrap_or("");
        if ![".Transformer", ".Pooling", ".Normalize"]
            .iter()
            .any(|ok| ty.ends_with(ok))
        {
            bail!(
                "{}: module type `{ty}` is not supported (allowed: Transformer, Pooling, \
                 Normalize)",
                modules_path.display()
            );
        }
    }
    let Some(module) = modules.as_array().and_then(|m| {
        m.iter()
            .find(|m| m["type"].as_str().is_some_and(|t| t.ends_with(".Pooling")))
    }) else {
        return Ok(Pooling::Mean);
    };
    let sub = module["path"].as_str().unwrap_or("1_Pooling");
    let cfg_path = dir.join(sub).join("config.json");
    let cfg = read_json(&cfg_path)?;
    let on = |k: &str| cfg[k].as_bool().unwrap_or(false);
    // Any other mode switched on (max, mean of square roots, weighted, last token) would add
    // to the embedding a part this pooling leaves out.
    let other = cfg.as_object().and_then(|m| {
        m.iter().find(|(k, v)| {
            k.starts_with("pooling_mode_")
                && !["pooling_mode_mean_tokens", "pooling_mode_cls_token"].contains(&k.as_str())
                && v.as_bool() == Some(true)
        })
    });
    if let Some((key, _)) = other {
        bail!(
            "{}: `{key}` is not supported (allowed: pooling_mode_mean_tokens or \
             pooling_mode_cls_token, one of them)",
            cfg_path.display()
        );
    }
    match (on("pooling_mode_mean_tokens"), on("pooling_mode_cls_token")) {
        (true, false) => Ok(Pooling::Mean),
        (false, true) => Ok(Pooling::Cls),
        _ => bail!(
            "{}: only one of pooling_mode_mean_tokens or pooling_mode_cls_token may be set \
             (other pooling modes are not supported)",
            cfg_path.display()
        ),
    }
}

/// The longest input: the position table, capped by sentence-transformers' `max_seq_length`
/// and the tokenizer's `model_max_length` when present.
fn max_length(dir: &Path, positions: usize) -> Result<usize> {
    let mut max = positions;
    for (file, key) in [
        ("sentence_bert_config.json", "max_seq_length"),
        ("tokenizer_config.json", "model_max_length"),
    ] {
        let path = dir.join(file);
        if path.exists() {
            if let Some(v) = read_json(&path)?[key].as_f64() {
                if v >= 1.0 {
                    max = max.min(v as usize);
                }
            }
        }
    }
    Ok(max)
}

/// tokenizer.json with this model's truncation and no padding of its own (tokenizer.json files
/// often carry fixed-length padding; batches are padded here, to their longest row). Decoders
/// truncate from the left, keeping the end of the response where the score is read.
fn load_tokenizer(dir: &Path, max_length: usize, decoder: bool) -> Result<tokenizers::Tokenizer> {
    let mut tok = skein_text::Tokenizer::from_dir(dir)
        .with_context(|| format!("{}: loading the tokenizer", dir.display()))?
        .inner()
        .clone();
    tok.with_padding(None);
    tok.with_truncation(Some(TruncationParams {
        direction: if decoder {
            TruncationDirection::Left
        } else {
            TruncationDirection::Right
        },
        max_length,
        strategy: TruncationStrategy::LongestFirst,
        stride: 0,
    }))
    .map_err(|e| anyhow!("{}: setting truncation: {e}", dir.display()))?;
    Ok(tok)
}

/// A bucket grows while its rows are at most this much longer than its shortest row…
const BUCKET_STRETCH: f64 = 1.25;
/// …or while it has fewer rows than this (a forward pass has a fixed cost too).
const BUCKET_MIN_ROWS: usize = 4;

/// Runs `forward` ([b, …] out for b rows in) on length buckets of `rows`, so one long row does
/// not pad every short one, and returns the outputs in the order of `rows`.
fn by_length(rows: &[Row], mut forward: impl FnMut(&[&Row]) -> Result<Tensor>) -> Result<Tensor> {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| rows[i].ids.len());
    let mut outputs = Vec::new();
    let mut start = 0;
    while start < order.len() {
        let shortest = rows[order[start]].ids.len() as f64;
        let mut end = start + 1;
        while end < order.len()
            && (end - start < BUCKET_MIN_ROWS
                || rows[order[end]].ids.len() as f64 <= shortest * BUCKET_STRETCH)
        {
            end += 1;
        }
        let bucket: Vec<&Row> = order[start..end].iter().map(|&i| &rows[i]).collect();
        outputs.push(forward(&bucket)?);
        start = end;
    }
    let sorted = Tensor::cat(&outputs, 0);
    let mut position = vec![0i64; rows.len()];
    for (k, &i) in order.iter().enumerate() {
        position[i] = k as i64;
    }
    Ok(sorted.index_select(0, &Tensor::from_slice(&position).to(sorted.device())))
}

/// Right-padded [B, T] ids, token types and attention mask (1 = real).
fn pad(rows: &[&Row], device: Device) -> (Tensor, Tensor, Tensor) {
    let t = rows.iter().map(|r| r.ids.len()).max().unwrap_or(0);
    let (mut ids, mut types, mut mask) = (Vec::new(), Vec::new(), Vec::new());
    for r in rows {
        let fill = t - r.ids.len();
        ids.extend(r.ids.iter().copied().chain(std::iter::repeat_n(0, fill)));
        types.extend(r.types.iter().copied().chain(std::iter::repeat_n(0, fill)));
        mask.extend(std::iter::repeat_n(1i64, r.ids.len()).chain(std::iter::repeat_n(0, fill)));
    }
    let shape = [rows.len() as i64, t as i64];
    let make = |v: Vec<i64>| Tensor::from_slice(&v).view(shape).to(device);
    (make(ids), make(types), make(mask))
}

fn normalize(x: &Tensor) -> Tensor {
    let norm = x
        .norm_scalaropt_dim(2, [-1i64].as_slice(), true)
        .clamp_min(1e-12);
    x / norm
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(len: usize) -> Row {
        Row {
            ids: vec![1; len],
            types: vec![0; len],
        }
    }

    #[test]
    fn sentence_modules_that_change_the_embedding_are_refused() {
        let dir = std::env::temp_dir().join(format!("skein-rm-modules-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
        let pool = r#"{"pooling_mode_mean_tokens": false, "pooling_mode_cls_token": true}"#;
        std::fs::write(dir.join("1_Pooling/config.json"), pool).unwrap();
        let modules = |extra: &str| {
            format!(
                r#"[{{"path": "", "type": "sentence_transformers.models.Transformer"}},
                    {{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}}{extra}]"#
            )
        };
        std::fs::write(dir.join("modules.json"), modules("")).unwrap();
        assert!(matches!(pooling(&dir), Ok(Pooling::Cls)));
        let dense = r#", {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}"#;
        std::fs::write(dir.join("modules.json"), modules(dense)).unwrap();
        let err = pooling(&dir)
            .err()
            .expect("a Dense module is refused")
            .to_string();
        assert!(err.contains("sentence_transformers.models.Dense"), "{err}");
        // Mean and max pooled together: the max half would be left out.
        std::fs::write(dir.join("modules.json"), modules("")).unwrap();
        let both = r#"{"pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": true}"#;
        std::fs::write(dir.join("1_Pooling/config.json"), both).unwrap();
        let err = pooling(&dir)
            .err()
            .expect("max pooling is refused")
            .to_string();
        assert!(err.contains("`pooling_mode_max_tokens`"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn length_buckets_bound_padding_and_keep_the_order() {
        let lens = [10usize, 2, 30, 3, 2, 40, 11, 2, 2, 12, 31];
        let rows: Vec<Row> = lens.iter().map(|&l| row(l)).collect();
        let mut buckets = Vec::new();
        let out = by_length(&rows, |bucket| {
            let bl: Vec<usize> = bucket.iter().map(|r| r.ids.len()).collect();
            buckets.push(bl.clone());
            Ok(Tensor::from_slice(
                &bl.iter().map(|&l| l as i64).collect::<Vec<_>>(),
            ))
        })
        .unwrap();
        assert_eq!(Vec::<i64>::try_from(out).unwrap(), lens.map(|l| l as i64));
        // Short rows are never padded to the long ones: [2,2,2,2], [3,10,11,12], [30,31,40].
        assert_eq!(buckets.len(), 3, "{buckets:?}");
        assert_eq!(buckets[0], vec![2, 2, 2, 2]);
    }
}
