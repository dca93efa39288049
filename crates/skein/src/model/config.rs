//! `config.json` of a Hugging Face decoder: the Qwen2, Qwen3 and Llama layouts.
//!
//! Unknown keys are kept (`extra`) so that a config read from a model directory is written back
//! unchanged, which is what lets HF transformers and vLLM load the checkpoints this project saves.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::Path;

/// Most positions a model may have: 16M, beyond the longest context of any released model;
/// the rotary tables of every position are built up front.
pub const MAX_POSITIONS: usize = 1 << 24;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelConfig {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<Value>,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_max_pos() -> usize {
    4096
}

/// How rotary frequencies are scaled (`rope_scaling` / `rope_parameters.rope_type`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading model config {}", path.display()))?;
        let cfg: ModelConfig = serde_json::from_str(&text)
            .with_context(|| format!("parsing model config {}", path.display()))?;
        cfg.validate()
            .with_context(|| format!("model config {}", path.display()))?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<()> {
        match self.model_type.as_str() {
            "qwen2" | "qwen3" | "llama" => {}
            other => bail!("model_type `{other}` is not supported (allowed: qwen2, qwen3, llama)"),
        }
        if self.hidden_size == 0 || self.num_attention_heads == 0 || self.num_hidden_layers == 0 {
            bail!("hidden_size, num_attention_heads and num_hidden_layers must be positive");
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            bail!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                self.hidden_size,
                self.num_attention_heads
            );
        }
        if !self.num_attention_heads.is_multiple_of(self.kv_heads()) {
            bail!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.kv_heads()
            );
        }
        if self.max_position_embeddings > MAX_POSITIONS {
            bail!(
                "max_position_embeddings {} exceeds the {MAX_POSITIONS} positions skein supports",
                self.max_position_embeddings
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            bail!(
                "head_dim {} must be even for rotary embeddings",
                self.head_dim()
            );
        }
        self.rope()?;
        Ok(())
    }

    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// Qwen2 always has q/k/v biases (its config has no key for it); the others say so.
    pub fn qkv_bias(&self) -> bool {
        self.attention_bias.unwrap_or(self.model_type == "qwen2")
    }

    /// Qwen3 normalises queries and keys per head before the rotary embedding.
    pub fn qk_norm(&self) -> bool {
        self.model_type == "qwen3"
    }

    /// Newer transformers versions move `rope_theta` and the scaling into `rope_parameters`.
    fn rope_parameters(&self) -> Option<&Map<String, Value>> {
        self.extra.get("rope_parameters").and_then(Value::as_object)
    }

    pub fn rope_theta(&self) -> f64 {
        self.rope_theta
            .or_else(|| {
                self.rope_parameters()
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10_000.0)
    }

    pub fn rope(&self) -> Result<RopeScaling> {
        let params = match (&self.rope_scaling, self.rope_parameters()) {
            (Some(Value::Object(m)), _) => Some(m),
            (_, Some(m)) => Some(m),
            _ => None,
        };
        let Some(p) = params else {
            return Ok(RopeScaling::None);
        };
        let get = |k: &str| p.get(k).and_then(Value::as_f64);
        let kind = p
            .get("rope_type")
            .or_else(|| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        Ok(match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: get("factor").context("rope scaling `linear` needs `factor`")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: get("factor").context("rope scaling `llama3` needs `factor`")?,
                low_freq_factor: get("low_freq_factor").unwrap_or(1.0),
                high_freq_factor: get("high_freq_factor").unwrap_or(4.0),
                original_max_position_embeddings: get("original_max_position_embeddings")
                    .unwrap_or(8192.0),
            },
            other => {
                bail!("rope type `{other}` is not supported (allowed: default, linear, llama3)")
            }
        })
    }

    /// A Qwen2-layout config for tiny models built from scratch.
    pub fn tiny_qwen2(
        vocab_size: usize,
        hidden: usize,
        layers: usize,
        heads: usize,
        kv_heads: usize,
        intermediate: usize,
        max_positions: usize,
    ) -> Self {
        let mut extra = Map::new();
        extra.insert(
            "architectures".into(),
            Value::from(vec!["Qwen2ForCausalLM"]),
        );
        extra.insert("hidden_act".into(), Value::from("silu"));
        extra.insert("torch_dtype".into(), Value::from("float32"));
        ModelConfig {
            model_type: "qwen2".into(),
            vocab_size,
            hidden_size: hidden,
            intermediate_size: intermediate,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: Some(kv_heads),
            head_dim: None,
            rms_norm_eps: 1e-6,
            rope_theta: Some(10_000.0),
            rope_scaling: None,
            max_position_embeddings: max_positions,
            tie_word_embeddings: true,
            attention_bias: None,
            extra,
        }
    }

    pub fn num_parameters(&self) -> usize {
        // In f64, so sizes from a config file cannot overflow; `as` saturates.
        self.parameter_count() as usize
    }

    /// The parameter count as a float: exact below 2^53, and never overflowing.
    pub fn parameter_count(&self) -> f64 {
        let f = |x: usize| x as f64;
        let (h, i, hd) = (
            f(self.hidden_size),
            f(self.intermediate_size),
            f(self.head_dim()),
        );
        let (q, kv) = (f(self.num_attention_heads) * hd, f(self.kv_heads()) * hd);
        let bias = if self.qkv_bias() { q + 2.0 * kv } else { 0.0 };
        let norm = if self.qk_norm() { 2.0 * hd } else { 0.0 };
        let layer = h * q + 2.0 * h * kv + q * h + bias + norm + 3.0 * h * i + 2.0 * h;
        let embed = f(self.vocab_size) * h;
        let head = if self.tie_word_embeddings { 0.0 } else { embed };
        embed + f(self.num_hidden_layers) * layer + h + head
    }

    /// Bytes of a float32 KV cache of `slots` sequences of `context` tokens.
    pub fn kv_cache_bytes(&self, slots: usize, context: usize) -> f64 {
        let per_token =
            2.0 * self.num_hidden_layers as f64 * (self.kv_heads() * self.head_dim()) as f64;
        per_token * slots as f64 * context as f64 * 4.0
    }

    /// Bytes that building this model allocates: its weights (`weight_bytes` each) and the
    /// float32 rotary tables (angles, cosines and sines for every position).
    pub fn build_bytes(&self, weight_bytes: f64) -> f64 {
        let rope = self.max_position_embeddings as f64 * self.head_dim() as f64 * 3.0;
        self.parameter_count() * weight_bytes + rope * 4.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen2_defaults_to_qkv_bias_and_reads_rope_parameters() {
        let cfg: ModelConfig = serde_json::from_str(
            r#"{"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":16,
                "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,
                "rope_parameters":{"rope_theta":500.0,"rope_type":"default"},"foo":1}"#,
        )
        .unwrap();
        assert!(cfg.qkv_bias());
        assert_eq!(cfg.rope_theta(), 500.0);
        assert_eq!(cfg.head_dim(), 4);
        let back = serde_json::to_value(&cfg).unwrap();
        assert_eq!(back["foo"], 1, "unknown keys survive a round trip");
    }

    #[test]
    fn unsupported_model_type_names_the_allowed_ones() {
        let mut cfg = ModelConfig::tiny_qwen2(10, 8, 1, 2, 1, 16, 64);
        cfg.model_type = "gpt2".into();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("qwen2, qwen3, llama"), "{err}");
    }
}
