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
        let de = &mut serde_json::Deserializer::from_str(&text);
        let cfg: ModelConfig = serde_path_to_error::deserialize(de)
            .map_err(|e| match e.path().to_string().as_str() {
                "." => anyhow::anyhow!("{}", e.into_inner()),
                key => anyhow::anyhow!("key `{key}`: {}", e.into_inner()),
            })
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
        if let (Some(top), Some(nested)) = (self.rope_theta, self.nested_rope_theta()) {
            if top != nested {
                bail!(
                    "rope_theta is {top} and rope_parameters.rope_theta {nested}: transformers 5 \
                     reads the second and transformers 4 the first, so the model computes \
                     differently in each; make them equal"
                );
            }
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
        self.refuse_unbuilt_parts()
    }

    /// Settings of a checkpoint's config that change its math in a way this transformer does
    /// not build: loading such a model would silently compute other numbers than it was
    /// trained to, so each is refused, naming the key.
    fn refuse_unbuilt_parts(&self) -> Result<()> {
        let get = |key: &str| self.extra.get(key).filter(|v| !v.is_null());
        if let Some(q) = get("quantization_config") {
            let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("?");
            bail!(
                "`quantization_config` (quant_method `{method}`): skein loads unquantised \
                 weights only; save the model dequantised (in float32, float16 or bfloat16) \
                 and load that"
            );
        }
        match get("hidden_act").map(|v| v.as_str()) {
            None | Some(Some("silu")) => {}
            Some(other) => bail!(
                "hidden_act {} is not supported (allowed: silu)",
                other.map_or_else(|| "(not a string)".into(), |a| format!("`{a}`"))
            ),
        }
        if get("mlp_bias").and_then(Value::as_bool) == Some(true) {
            bail!("`mlp_bias` = true is not supported: skein's MLP projections have no bias");
        }
        if get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
            bail!(
                "`use_sliding_window` = true is not supported: skein attends over the whole \
                 context"
            );
        }
        if self.model_type != "qwen2" && self.attention_bias == Some(true) {
            bail!(
                "`attention_bias` = true is not supported for model_type `{}`: it puts a bias on \
                 o_proj too, which skein does not build",
                self.model_type
            );
        }
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

    /// `rope_parameters.rope_theta` first, as transformers 5 reads it, then the top-level key
    /// that transformers 4 wrote (a config with both, differing, is refused by `validate`).
    pub fn rope_theta(&self) -> f64 {
        self.nested_rope_theta()
            .or(self.rope_theta)
            .unwrap_or(10_000.0)
    }

    fn nested_rope_theta(&self) -> Option<f64> {
        self.rope_parameters()
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
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
            "llama3" => {
                let needs =
                    |k: &str| get(k).with_context(|| format!("rope scaling `llama3` needs `{k}`"));
                // As transformers reads it: the scaling's own, else the config's top-level
                // key, else the model's context.
                let original = get("original_max_position_embeddings")
                    .or_else(|| {
                        self.extra
                            .get("original_max_position_embeddings")
                            .and_then(Value::as_f64)
                    })
                    .unwrap_or(self.max_position_embeddings as f64);
                RopeScaling::Llama3 {
                    factor: needs("factor")?,
                    low_freq_factor: needs("low_freq_factor")?,
                    high_freq_factor: needs("high_freq_factor")?,
                    original_max_position_embeddings: original,
                }
            }
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

    /// Qwen2.5-0.5B's configuration (its `config.json`), for benchmarks of a model of real
    /// shape built with random weights: the 0.5B model is the smallest whose memory has the
    /// proportions of the larger ones (a vocabulary-sized head, GQA, a wide MLP).
    pub fn qwen2_5_0_5b() -> Self {
        let mut cfg = ModelConfig::tiny_qwen2(151_936, 896, 24, 14, 2, 4864, 32_768);
        cfg.rope_theta = Some(1_000_000.0);
        cfg.rms_norm_eps = 1e-6;
        cfg.tie_word_embeddings = true;
        for (key, value) in [
            ("torch_dtype", Value::from("bfloat16")),
            ("bos_token_id", Value::from(151_643)),
            ("eos_token_id", Value::from(151_643)),
            ("use_sliding_window", Value::from(false)),
            ("sliding_window", Value::from(32_768)),
            ("max_window_layers", Value::from(21)),
            ("attention_dropout", Value::from(0.0)),
            ("initializer_range", Value::from(0.02)),
        ] {
            cfg.extra.insert(key.into(), value);
        }
        cfg
    }

    /// Every projection of a layer LoRA can adapt: its name, input and output width.
    pub fn projection_shapes(&self) -> [(&'static str, usize, usize); 7] {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let q = self.num_attention_heads * self.head_dim();
        let kv = self.kv_heads() * self.head_dim();
        [
            ("q_proj", h, q),
            ("k_proj", h, kv),
            ("v_proj", h, kv),
            ("o_proj", q, h),
            ("gate_proj", h, i),
            ("up_proj", h, i),
            ("down_proj", i, h),
        ]
    }

    /// Parameters LoRA adds (`rank · (in + out)` per adapted projection and layer); 0 when
    /// `lora.rank` is 0.
    pub fn adapter_count(&self, lora: &super::LoraConfig) -> f64 {
        let per_layer: f64 = self
            .projection_shapes()
            .iter()
            .filter(|(name, _, _)| lora.targets.iter().any(|t| t == name))
            .map(|&(_, input, output)| (input + output) as f64)
            .sum();
        lora.rank as f64 * per_layer * self.num_hidden_layers as f64
    }

    /// Elements of the largest trainable tensor: an adapter's `A` or `B` with LoRA, else the
    /// embedding (or the LM head, which has its shape).
    pub fn largest_trainable(&self, lora: &super::LoraConfig) -> f64 {
        if !lora.enabled() {
            let matrices = self.projection_shapes().map(|(_, i, o)| (i * o) as f64);
            let embed = (self.vocab_size * self.hidden_size) as f64;
            return matrices.into_iter().fold(embed, f64::max);
        }
        self.projection_shapes()
            .iter()
            .filter(|(name, _, _)| lora.targets.iter().any(|t| t == name))
            .map(|&(_, input, output)| (lora.rank * input.max(output)) as f64)
            .fold(0.0, f64::max)
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

    /// Bytes of a KV cache of `slots` sequences of `context` tokens, `element_bytes` per
    /// number (the cache is in the model's dtype).
    pub fn kv_cache_bytes(&self, slots: usize, context: usize, element_bytes: f64) -> f64 {
        let per_token =
            2.0 * self.num_hidden_layers as f64 * (self.kv_heads() * self.head_dim()) as f64;
        per_token * slots as f64 * context as f64 * element_bytes
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
    use serde_json::json;

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

    /// With both keys, transformers 5 reads `rope_parameters`; equal values load, differing
    /// ones are refused naming both.
    #[test]
    fn both_rope_thetas_must_agree() {
        let with = |top: f64, nested: f64| -> ModelConfig {
            serde_json::from_value(json!({"model_type":"llama","vocab_size":10,"hidden_size":8,
                "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
                "rope_theta": top, "rope_parameters": {"rope_theta": nested, "rope_type": "default"}}))
            .unwrap()
        };
        let same = with(1e6, 1e6);
        same.validate().unwrap();
        assert_eq!(same.rope_theta(), 1e6);
        let e = with(1e4, 1e6).validate().unwrap_err().to_string();
        assert!(
            e.contains("rope_parameters.rope_theta") && e.contains("10000"),
            "{e}"
        );
        assert_eq!(with(1e4, 1e6).rope_theta(), 1e6, "transformers 5's reading");
    }

    /// The published figure: 494,032,768 parameters (0.49B), 0.36B of them outside the
    /// embedding; LoRA rank 16 on every projection adds 8.8M.
    #[test]
    fn qwen2_5_0_5b_has_the_published_parameter_count() {
        let cfg = ModelConfig::qwen2_5_0_5b();
        cfg.validate().unwrap();
        assert_eq!(cfg.num_parameters(), 494_032_768);
        assert!(cfg.qkv_bias() && cfg.tie_word_embeddings);
        assert_eq!((cfg.head_dim(), cfg.rope_theta()), (64, 1e6));
        let lora = crate::model::LoraConfig {
            rank: 16,
            ..Default::default()
        };
        assert_eq!(cfg.adapter_count(&lora), 8_798_208.0);
        assert_eq!(cfg.largest_trainable(&lora), 16.0 * 4864.0);
        assert_eq!(
            cfg.largest_trainable(&Default::default()),
            151_936.0 * 896.0
        );
    }

    /// A config key that changes the math in a way skein does not build is refused by name,
    /// rather than loaded to compute other numbers.
    #[test]
    fn settings_skein_does_not_build_are_refused_by_name() {
        let refused = |key: &str, value: Value| {
            let mut cfg = ModelConfig::tiny_qwen2(10, 8, 1, 2, 1, 16, 64);
            cfg.extra.insert(key.into(), value);
            cfg.validate().unwrap_err().to_string()
        };
        let q = serde_json::json!({"quant_method": "bitsandbytes", "load_in_8bit": true});
        let err = refused("quantization_config", q);
        assert!(
            err.contains("`quantization_config`") && err.contains("bitsandbytes"),
            "{err}"
        );
        assert!(refused("hidden_act", "gelu".into()).contains("hidden_act `gelu`"));
        assert!(refused("mlp_bias", true.into()).contains("`mlp_bias`"));
        assert!(refused("use_sliding_window", true.into()).contains("`use_sliding_window`"));
        let mut llama = ModelConfig::tiny_qwen2(10, 8, 1, 2, 1, 16, 64);
        llama.model_type = "llama".into();
        llama.attention_bias = Some(true);
        let err = llama.validate().unwrap_err().to_string();
        assert!(
            err.contains("`attention_bias`") && err.contains("o_proj"),
            "{err}"
        );
        // What Qwen2.5's and SmolLM2's configs say loads.
        let mut cfg = ModelConfig::tiny_qwen2(10, 8, 1, 2, 1, 16, 64);
        for (k, v) in [
            ("use_sliding_window", Value::from(false)),
            ("mlp_bias", false.into()),
            ("quantization_config", Value::Null),
        ] {
            cfg.extra.insert(k.into(), v);
        }
        cfg.validate().unwrap();
        llama.attention_bias = Some(false);
        llama.validate().unwrap();
    }

    /// llama3 scaling without `original_max_position_embeddings` takes the top-level key,
    /// else the model's context, as transformers does; a missing frequency factor is named.
    #[test]
    fn llama3_rope_scaling_reads_its_original_context_as_transformers_does() {
        let mut cfg = ModelConfig::tiny_qwen2(10, 8, 1, 2, 1, 16, 131_072);
        let scaling = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0});
        cfg.rope_scaling = Some(scaling.clone());
        let original = |cfg: &ModelConfig| match cfg.rope().unwrap() {
            RopeScaling::Llama3 {
                original_max_position_embeddings,
                ..
            } => original_max_position_embeddings,
            other => panic!("{other:?}"),
        };
        assert_eq!(original(&cfg), 131_072.0);
        cfg.extra
            .insert("original_max_position_embeddings".into(), json!(8192));
        assert_eq!(original(&cfg), 8192.0);
        let mut own = scaling.clone();
        own["original_max_position_embeddings"] = json!(4096);
        cfg.rope_scaling = Some(own);
        assert_eq!(original(&cfg), 4096.0);
        let mut partial = scaling;
        partial.as_object_mut().unwrap().remove("high_freq_factor");
        cfg.rope_scaling = Some(partial);
        let err = format!("{:#}", cfg.rope().unwrap_err());
        assert!(err.contains("`high_freq_factor`"), "{err}");
    }

    /// A value of the wrong type is named by its key, not only its column.
    #[test]
    fn a_mistyped_value_names_its_key() {
        let path = std::env::temp_dir().join(format!("skein-config-{}.json", std::process::id()));
        let mut cfg =
            serde_json::to_value(ModelConfig::tiny_qwen2(10, 8, 1, 2, 1, 16, 64)).unwrap();
        cfg["hidden_size"] = json!("8");
        std::fs::write(&path, cfg.to_string()).unwrap();
        let err = format!("{:#}", ModelConfig::from_file(&path).unwrap_err());
        std::fs::remove_file(&path).ok();
        assert!(err.contains("key `hidden_size`: invalid type"), "{err}");
    }

    #[test]
    fn unsupported_model_type_names_the_allowed_ones() {
        let mut cfg = ModelConfig::tiny_qwen2(10, 8, 1, 2, 1, 16, 64);
        cfg.model_type = "gpt2".into();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("qwen2, qwen3, llama"), "{err}");
    }
}
