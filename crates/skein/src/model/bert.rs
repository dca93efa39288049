//! A BERT-style encoder (the Hugging Face `BertModel` layout): word + position + token-type
//! embeddings and a LayerNorm, then N post-LN layers of bidirectional self-attention and a GELU
//! feed-forward. It is the body of the reward models in `crate::reward_model`: sentence
//! encoders (all-MiniLM-L6-v2) and `BertForSequenceClassification` scorers.

#[path = "bert_weights.rs"]
pub mod weights;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::Path;
use tch::{Device, Kind, Tensor};
pub use weights::Weights;

/// The keys of a BERT `config.json` the encoder needs; the rest are ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct BertConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    pub intermediate_size: i64,
    pub max_position_embeddings: i64,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: i64,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_position_type")]
    pub position_embedding_type: String,
}

fn default_type_vocab() -> i64 {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}
fn default_position_type() -> String {
    "absolute".into()
}

impl BertConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading model config {}", path.display()))?;
        let cfg: BertConfig = serde_json::from_str(&text)
            .with_context(|| format!("parsing BERT model config {}", path.display()))?;
        cfg.validate()
            .with_context(|| format!("model config {}", path.display()))?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<()> {
        if self.hidden_size <= 0 || self.num_attention_heads <= 0 || self.num_hidden_layers == 0 {
            bail!("hidden_size, num_attention_heads and num_hidden_layers must be positive");
        }
        if self.hidden_size % self.num_attention_heads != 0 {
            bail!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size,
                self.num_attention_heads
            );
        }
        if self.position_embedding_type != "absolute" {
            bail!(
                "position_embedding_type `{}` is not supported (allowed: absolute)",
                self.position_embedding_type
            );
        }
        self.gelu_approximation()?;
        Ok(())
    }

    /// The `approximate` argument of torch's GELU for `hidden_act`.
    fn gelu_approximation(&self) -> Result<&'static str> {
        match self.hidden_act.as_str() {
            "gelu" => Ok("none"),
            "gelu_new" | "gelu_pytorch_tanh" => Ok("tanh"),
            other => bail!(
                "hidden_act `{other}` is not supported (allowed: gelu, gelu_new, gelu_pytorch_tanh)"
            ),
        }
    }
}

struct Linear {
    weight: Tensor,
    bias: Tensor,
}

impl Linear {
    fn take(w: &mut Weights, name: &str, inp: i64, out: i64) -> Result<Self> {
        Ok(Linear {
            weight: w.take(&format!("{name}.weight"), &[out, inp])?,
            bias: w.take(&format!("{name}.bias"), &[out])?,
        })
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.linear(&self.weight, Some(&self.bias))
    }

    fn share(&self) -> Self {
        Linear {
            weight: self.weight.shallow_clone(),
            bias: self.bias.shallow_clone(),
        }
    }
}

struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    fn take(w: &mut Weights, name: &str, dim: i64, eps: f64) -> Result<Self> {
        Ok(LayerNorm {
            weight: w.take(&format!("{name}.weight"), &[dim])?,
            bias: w.take(&format!("{name}.bias"), &[dim])?,
            eps,
        })
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let dim = *x
            .size()
            .last()
            .expect("hidden states have a last dimension");
        x.layer_norm([dim], Some(&self.weight), Some(&self.bias), self.eps, true)
    }

    fn share(&self) -> Self {
        LayerNorm {
            weight: self.weight.shallow_clone(),
            bias: self.bias.shallow_clone(),
            eps: self.eps,
        }
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    intermediate: Linear,
    out: Linear,
    out_norm: LayerNorm,
}

impl Layer {
    fn take(w: &mut Weights, i: usize, cfg: &BertConfig) -> Result<Self> {
        let p = format!("encoder.layer.{i}");
        let (h, m, eps) = (cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps);
        Ok(Layer {
            query: Linear::take(w, &format!("{p}.attention.self.query"), h, h)?,
            key: Linear::take(w, &format!("{p}.attention.self.key"), h, h)?,
            value: Linear::take(w, &format!("{p}.attention.self.value"), h, h)?,
            attn_out: Linear::take(w, &format!("{p}.attention.output.dense"), h, h)?,
            attn_norm: LayerNorm::take(w, &format!("{p}.attention.output.LayerNorm"), h, eps)?,
            intermediate: Linear::take(w, &format!("{p}.intermediate.dense"), h, m)?,
            out: Linear::take(w, &format!("{p}.output.dense"), m, h)?,
            out_norm: LayerNorm::take(w, &format!("{p}.output.LayerNorm"), h, eps)?,
        })
    }

    fn share(&self) -> Self {
        Layer {
            query: self.query.share(),
            key: self.key.share(),
            value: self.value.share(),
            attn_out: self.attn_out.share(),
            attn_norm: self.attn_norm.share(),
            intermediate: self.intermediate.share(),
            out: self.out.share(),
            out_norm: self.out_norm.share(),
        }
    }
}

/// The encoder and its parameters. Not `Sync` (tch tensors are not); [`BertEncoder::share`]
/// gives another thread its own handle on the same parameters without copying them.
pub struct BertEncoder {
    pub config: BertConfig,
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
    /// dense + tanh on the first token: part of `BertForSequenceClassification`, absent from
    /// some sentence-encoder checkpoints.
    pooler: Option<Linear>,
    gelu: &'static str,
}

impl BertEncoder {
    /// Loads `config.json` and the safetensors weights of an HF directory.
    pub fn load(dir: &Path, device: Device) -> Result<Self> {
        let cfg = BertConfig::from_file(&dir.join("config.json"))?;
        let mut weights = Weights::read_dir(dir, device)?;
        Self::from_weights(&cfg, &mut weights)
    }

    /// Takes the encoder's tensors out of `weights` (a task head, if any, stays there).
    pub fn from_weights(cfg: &BertConfig, w: &mut Weights) -> Result<Self> {
        cfg.validate()?;
        let (h, eps) = (cfg.hidden_size, cfg.layer_norm_eps);
        let emb = |n: &str| format!("embeddings.{n}.weight");
        let word = w.take(&emb("word_embeddings"), &[cfg.vocab_size, h])?;
        let position = w.take(
            &emb("position_embeddings"),
            &[cfg.max_position_embeddings, h],
        )?;
        let token_type = w.take(&emb("token_type_embeddings"), &[cfg.type_vocab_size, h])?;
        let embed_norm = LayerNorm::take(w, "embeddings.LayerNorm", h, eps)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| Layer::take(w, i, cfg))
            .collect::<Result<Vec<_>>>()?;
        let pooler = if w.contains("pooler.dense.weight") {
            Some(Linear::take(w, "pooler.dense", h, h)?)
        } else {
            None
        };
        Ok(BertEncoder {
            config: cfg.clone(),
            word,
            position,
            token_type,
            embed_norm,
            layers,
            pooler,
            gelu: cfg.gelu_approximation()?,
        })
    }

    /// Another handle on the same parameters (no copy), for use on another thread.
    pub fn share(&self) -> Self {
        BertEncoder {
            config: self.config.clone(),
            word: self.word.shallow_clone(),
            position: self.position.shallow_clone(),
            token_type: self.token_type.shallow_clone(),
            embed_norm: self.embed_norm.share(),
            layers: self.layers.iter().map(Layer::share).collect(),
            pooler: self.pooler.as_ref().map(Linear::share),
            gelu: self.gelu,
        }
    }

    pub fn device(&self) -> Device {
        self.word.device()
    }

    /// Hidden states [B, T, hidden] of a right-padded batch. `input_ids`, `token_type_ids` and
    /// `attention_mask` (1 = real token, 0 = padding) are [B, T] int64; T must not exceed
    /// `max_position_embeddings`. Padding keys are masked out of every attention, so a row's
    /// real positions do not depend on the rest of the batch.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        token_type_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> Tensor {
        let (b, t) = input_ids.size2().expect("input ids are [batch, time]");
        let positions = Tensor::arange(t, (Kind::Int64, input_ids.device())).unsqueeze(0);
        let x = Tensor::embedding(&self.word, input_ids, -1, false, false)
            + Tensor::embedding(&self.token_type, token_type_ids, -1, false, false)
            + Tensor::embedding(&self.position, &positions, -1, false, false);
        let mut x = self.embed_norm.forward(&x);
        // [B, 1, 1, T]: every query may read every real key, never a padding one.
        let mask = attention_mask.to_kind(Kind::Bool).view([b, 1, 1, t]);
        let heads = self.config.num_attention_heads;
        let hd = self.config.hidden_size / heads;
        for layer in &self.layers {
            let split = |lin: &Linear| lin.forward(&x).view([b, t, heads, hd]).transpose(1, 2);
            let a = Tensor::scaled_dot_product_attention(
                &split(&layer.query),
                &split(&layer.key),
                &split(&layer.value),
                Some(&mask),
                0.0,
                false,
                None,
                false,
            )
            .transpose(1, 2)
            .reshape([b, t, heads * hd]);
            x = layer.attn_norm.forward(&(layer.attn_out.forward(&a) + &x));
            let m = layer.intermediate.forward(&x).gelu(self.gelu);
            x = layer.out_norm.forward(&(layer.out.forward(&m) + &x));
        }
        x
    }

    pub fn has_pooler(&self) -> bool {
        self.pooler.is_some()
    }

    /// The pooled output (dense + tanh on the first, `[CLS]`, position) of hidden states
    /// [B, T, hidden] → [B, hidden]; `None` when the checkpoint has no pooler.
    pub fn pool(&self, hidden: &Tensor) -> Option<Tensor> {
        let pooler = self.pooler.as_ref()?;
        Some(pooler.forward(&hidden.select(1, 0)).tanh())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn tiny_config() -> BertConfig {
        serde_json::from_value(serde_json::json!({
            "vocab_size": 20, "hidden_size": 8, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 12,
        }))
        .expect("a valid config literal")
    }

    /// Pseudo-random values in [-1.5, 1.5), drawn from a generator of the test's own (splitmix64)
    /// rather than libtorch's global one, which tests running beside this one also draw from.
    fn fixed_noise(shape: &[i64], seed: u64) -> Tensor {
        let len: i64 = shape.iter().product();
        let mut state = seed;
        let values: Vec<f32> = (0..len)
            .map(|_| {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                ((z >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
            })
            .collect();
        Tensor::from_slice(&values).view(shape)
    }

    /// Fixed pseudo-random weights under the names a BertModel checkpoint uses, optionally
    /// `bert.`-prefixed.
    fn tiny_weights(cfg: &BertConfig, prefix: &str) -> Weights {
        let (h, m) = (cfg.hidden_size, cfg.intermediate_size);
        let mut shapes: Vec<(String, Vec<i64>)> = vec![
            (
                "embeddings.word_embeddings.weight".into(),
                vec![cfg.vocab_size, h],
            ),
            ("embeddings.position_embeddings.weight".into(), vec![12, h]),
            ("embeddings.token_type_embeddings.weight".into(), vec![2, h]),
            ("embeddings.LayerNorm.weight".into(), vec![h]),
            ("embeddings.LayerNorm.bias".into(), vec![h]),
        ];
        for i in 0..cfg.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            for (name, out, inp) in [
                ("attention.self.query", h, h),
                ("attention.self.key", h, h),
                ("attention.self.value", h, h),
                ("attention.output.dense", h, h),
                ("intermediate.dense", m, h),
                ("output.dense", h, m),
            ] {
                shapes.push((format!("{p}.{name}.weight"), vec![out, inp]));
                shapes.push((format!("{p}.{name}.bias"), vec![out]));
            }
            for name in ["attention.output.LayerNorm", "output.LayerNorm"] {
                shapes.push((format!("{p}.{name}.weight"), vec![h]));
                shapes.push((format!("{p}.{name}.bias"), vec![h]));
            }
        }
        let map: HashMap<String, Tensor> = shapes
            .into_iter()
            .zip(1u64..)
            .map(|((n, s), seed)| (format!("{prefix}{n}"), fixed_noise(&s, seed)))
            .collect();
        Weights::from_map("tiny", map, Device::Cpu)
    }

    #[test]
    fn padding_does_not_change_real_positions() {
        let cfg = tiny_config();
        let enc = BertEncoder::from_weights(&cfg, &mut tiny_weights(&cfg, "")).expect("loads");
        let ids = Tensor::from_slice(&[1i64, 5, 6, 2]).view([1, 4]);
        let alone = enc.forward(&ids, &ids.zeros_like(), &ids.ones_like());
        // The same row padded to 7 with garbage ids, beside a longer row.
        let batch = Tensor::from_slice(&[1i64, 5, 6, 2, 9, 9, 9, 1, 3, 4, 7, 8, 3, 2]).view([2, 7]);
        let mask = Tensor::from_slice(&[1i64, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]).view([2, 7]);
        let padded = enc.forward(&batch, &batch.zeros_like(), &mask);
        let diff = (padded.narrow(0, 0, 1).narrow(1, 0, 4) - &alone)
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 1e-5, "padding changed a real position by {diff}");
        // And the mask matters: without it the padding would leak in.
        let leaky = enc.forward(&batch, &batch.zeros_like(), &batch.ones_like());
        let leak = (leaky.narrow(0, 0, 1).narrow(1, 0, 4) - &alone)
            .abs()
            .max()
            .double_value(&[]);
        assert!(leak > 1e-3, "unmasked padding should change the result");
    }

    #[test]
    fn bert_prefixed_names_load_and_wrong_shapes_are_named() {
        let cfg = tiny_config();
        assert!(BertEncoder::from_weights(&cfg, &mut tiny_weights(&cfg, "bert.")).is_ok());
        let mut wrong = cfg.clone();
        wrong.intermediate_size = 12;
        let err = BertEncoder::from_weights(&wrong, &mut tiny_weights(&cfg, ""))
            .err()
            .expect("a shape mismatch is an error")
            .to_string();
        assert!(
            err.contains("encoder.layer.0.intermediate.dense.weight"),
            "{err}"
        );
    }

    #[test]
    fn unsupported_activation_is_rejected_by_name() {
        let mut cfg = tiny_config();
        cfg.hidden_act = "swish".into();
        let err = cfg.validate().expect_err("rejected").to_string();
        assert!(err.contains("hidden_act `swish`"), "{err}");
    }
}
