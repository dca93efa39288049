//! LoRA adapters in PEFT's layout: `adapter_config.json` and `adapter_model.safetensors`
//! with PEFT's key names (`base_model.model.` + the variable's name), so
//! `PeftModel.from_pretrained(base, dir)` loads what skein trained, and skein loads PEFT's.

use super::io::{copy_named, read_safetensors, write_atomic, Model};
use super::lora::{is_adapter, LoraConfig};
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::Tensor;

pub const CONFIG_FILE: &str = "adapter_config.json";
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
const PREFIX: &str = "base_model.model.";

/// PEFT's `adapter_config.json` for `cfg`, on the base model at `base`.
fn config_json(cfg: &LoraConfig, base: &str) -> serde_json::Value {
    json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": cfg.targets,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": null
    })
}

/// An adapter directory's `adapter_config.json`: its path and its contents.
fn config_of(dir: &Path) -> Result<(PathBuf, serde_json::Value)> {
    let path = dir.join(CONFIG_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let json =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok((path, json))
}

/// The LoRA settings an adapter directory was saved with (its `adapter_config.json`).
pub fn read_config(dir: &Path) -> Result<LoraConfig> {
    let (path, saved) = config_of(dir)?;
    let field = |key: &str| {
        saved
            .get(key)
            .filter(|v| !v.is_null())
            .with_context(|| format!("{}: no `{key}`", path.display()))
    };
    let targets = match field("target_modules")? {
        serde_json::Value::String(one) => vec![one.clone()],
        list => serde_json::from_value(list.clone())
            .with_context(|| format!("{}: `target_modules` is not a list", path.display()))?,
    };
    let targets = projections(targets).with_context(|| {
        format!(
            "{}: `target_modules` names modules skein cannot apply LoRA to (allowed: the \
             projections {}, by name or by full module name, or \"all-linear\"; a regular \
             expression is not read)",
            path.display(),
            super::lora::TARGETS.join(", ")
        )
    })?;
    let number = |key: &str, read: &dyn Fn(&serde_json::Value) -> Option<f64>| {
        let v = field(key)?;
        read(v).with_context(|| format!("{}: `{key}` = {v} is not a number", path.display()))
    };
    let cfg = LoraConfig {
        rank: number("r", &|v| v.as_u64().map(|r| r as f64))? as usize,
        alpha: number("lora_alpha", &serde_json::Value::as_f64)?,
        dropout: saved["lora_dropout"].as_f64().unwrap_or(0.0),
        targets,
    };
    if !cfg.enabled() || saved["use_dora"] == true || saved["use_rslora"] == true {
        bail!(
            "{}: not a plain LoRA adapter skein can apply (r > 0, no DoRA, no rsLoRA)",
            path.display()
        );
    }
    let beyond = beyond_plain_lora(&saved);
    if !beyond.is_empty() {
        bail!(
            "{}: {}: skein applies plain LoRA only (one rank and alpha for every target module \
             in every layer, no trained biases, no saved modules, `nn.Linear` layout), so these \
             settings would be ignored",
            path.display(),
            beyond.join(", ")
        );
    }
    cfg.check()
        .with_context(|| format!("{}: unsupported settings", path.display()))?;
    Ok(cfg)
}

/// The projections `target_modules` names, in PEFT's forms: a projection's name, a full module
/// name ending in one (PEFT saves `"all-linear"` as those when they are few), or
/// `"all-linear"`. Which layers have adapters is checked where the weights are read: a
/// layer without its tensors fails the load. The first name of another form is the error.
fn projections(targets: Vec<String>) -> Result<Vec<String>> {
    use super::lora::TARGETS;
    if targets == ["all-linear"] {
        return Ok(TARGETS.iter().map(|t| t.to_string()).collect());
    }
    let mut out: Vec<String> = Vec::new();
    for t in &targets {
        let last = t.rsplit('.').next().unwrap_or(t);
        if !TARGETS.contains(&last) {
            bail!("`{t}`");
        }
        if !out.iter().any(|o| o == last) {
            out.push(last.to_string());
        }
    }
    Ok(out)
}

/// PEFT settings that change what the adapter computes beyond plain LoRA, each as
/// "`key` = value", for those a saved config sets to anything but their plain default.
fn beyond_plain_lora(saved: &serde_json::Value) -> Vec<String> {
    use serde_json::Value;
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    type IsPlain<'a> = &'a dyn Fn(&Value) -> bool;
    let off = |v: &Value| v.is_null() || v == false;
    let plain: [(&str, IsPlain); 16] = [
        ("peft_type", &|v| v.is_null() || v == "LORA"),
        // PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA and MiCA rewrite the base weight when PEFT
        // loads the adapter, so A and B alone are not the change; the others only draw A, B.
        ("init_lora_weights", &|v| {
            v.is_null()
                || v.is_boolean()
                || ["gaussian", "eva", "orthogonal"].iter().any(|p| v == p)
        }),
        // aLoRA: active only after its invocation tokens, which a merge cannot express.
        ("alora_invocation_tokens", &empty),
        ("exclude_modules", &empty),
        ("target_parameters", &empty),
        ("use_qalora", &off),
        ("alpha_pattern", &empty),
        ("rank_pattern", &empty),
        ("layers_to_transform", &empty),
        ("layers_pattern", &empty),
        ("fan_in_fan_out", &off),
        ("bias", &|v| v.is_null() || v == "none"),
        ("lora_bias", &off),
        ("modules_to_save", &empty),
        ("layer_replication", &empty),
        ("trainable_token_indices", &empty),
    ];
    plain
        .iter()
        .filter_map(|(key, is_plain)| {
            let v = saved.get(*key)?;
            if is_plain(v) {
                return None;
            }
            let shown: String = v.to_string().chars().take(60).collect();
            Some(format!("`{key}` = {shown}"))
        })
        .collect()
}

/// An error naming a tensor of an adapter file that is none of the model's LoRA adapters:
/// PEFT's trainable token rows, a saved embedding or head. Loading the adapters without it
/// would compute other numbers than PEFT does with the file.
fn refuse_beyond_adapters(
    variables: &HashMap<String, Tensor>,
    tensors: &HashMap<String, Tensor>,
    source: &str,
) -> Result<()> {
    let mut beyond: Vec<&String> = tensors
        .keys()
        .filter(|name| !(is_adapter(name) && variables.contains_key(*name)))
        .collect();
    beyond.sort();
    if let Some(first) = beyond.first() {
        bail!(
            "{source}: {} tensor(s) are no LoRA adapter of the model, e.g. `{first}`: skein \
             loads plain LoRA adapters (A and B matrices) only, and without them the model \
             would compute other numbers than PEFT does with this adapter",
            beyond.len()
        );
    }
    Ok(())
}

/// The base model directory an adapter names (`base_model_name_or_path`: absolute, or
/// relative to the adapter's parent, as in a checkpoint's `adapter/` and `base/`).
pub fn base_of(adapter: &Path) -> Result<PathBuf> {
    let (path, cfg) = config_of(adapter)?;
    let named = cfg["base_model_name_or_path"].as_str().unwrap_or_default();
    let dir = adapter.parent().unwrap_or(Path::new(".")).join(named);
    if named.is_empty() || !dir.join("config.json").is_file() {
        bail!(
            "{}: its base model `{named}` is not a model directory on this machine",
            path.display()
        );
    }
    Ok(dir)
}

impl Model {
    /// Writes the adapters into `dir` in PEFT's layout; `base` names the base model directory
    /// for `adapter_config.json`.
    pub fn save_adapter(&self, dir: &Path, base: &str) -> Result<()> {
        let lora = &self.options.lora;
        if !lora.enabled() {
            bail!("the model has no LoRA adapters to save (`lora.rank` is 0)");
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let config = serde_json::to_string_pretty(&config_json(lora, base))?;
        write_atomic(&dir.join(CONFIG_FILE), config.as_bytes())?;
        let named: Vec<(String, Tensor)> = super::sorted_variables(&self.vs)
            .into_iter()
            .filter(|(name, _)| is_adapter(name))
            .map(|(name, t)| (format!("{PREFIX}{name}"), t))
            .collect();
        let tmp = dir.join(format!("{WEIGHTS_FILE}.tmp"));
        Tensor::write_safetensors(&named, &tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, dir.join(WEIGHTS_FILE))?;
        Ok(())
    }

    /// Reads adapters saved by [`Model::save_adapter`] (or by PEFT) into this model, whose
    /// LoRA settings must match the adapter's rank and targets.
    pub fn load_adapter(&self, dir: &Path) -> Result<()> {
        let (saved, lora) = (read_config(dir)?, &self.options.lora);
        let sorted = |t: &[String]| -> Vec<String> {
            let mut t = t.to_vec();
            t.sort();
            t
        };
        if saved.rank != lora.rank || sorted(&saved.targets) != sorted(&lora.targets) {
            bail!(
                "{}: the adapter has rank {} on {:?}, the model rank {} on {:?}: use the \
                 `lora.rank` and `lora.targets` it was trained with",
                dir.display(),
                saved.rank,
                saved.targets,
                lora.rank,
                lora.targets
            );
        }
        let tensors: HashMap<String, Tensor> = read_safetensors(&dir.join(WEIGHTS_FILE))?
            .into_iter()
            .map(|(name, t)| (name.trim_start_matches(PREFIX).to_string(), t))
            .collect();
        let source = dir.join(WEIGHTS_FILE).display().to_string();
        let variables = self.vs.variables();
        refuse_beyond_adapters(&variables, &tensors, &source)?;
        copy_named(&variables, &tensors, &source, true)
    }

    /// Folds the adapters into the base weights and restarts them from zero: the model
    /// computes what it did, to the rounding of the base's dtype, with the update in its base
    /// (`skein export --merge`).
    pub fn merge_adapters(&mut self) {
        self.net.merge_adapters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter_dir(name: &str, config: &serde_json::Value) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("skein-peft-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(CONFIG_FILE), config.to_string()).unwrap();
        dir
    }

    /// `target_modules` in PEFT's other forms reads as the projections it names: full module
    /// names (PEFT saves "all-linear" as those when they are few) and "all-linear" itself; a
    /// regular expression or another module is refused naming the key.
    #[test]
    fn target_modules_read_in_peft_forms() {
        let mut config = config_json(
            &LoraConfig {
                rank: 4,
                ..Default::default()
            },
            "base",
        );
        let read = |config: &serde_json::Value| {
            let dir = adapter_dir("targets", config);
            let read = read_config(&dir).map_err(|e| format!("{e:#}"));
            std::fs::remove_dir_all(&dir).ok();
            read
        };
        config["target_modules"] = json!([
            "model.layers.0.mlp.down_proj",
            "model.layers.1.mlp.down_proj",
            "model.layers.0.self_attn.q_proj",
            "model.layers.1.self_attn.q_proj"
        ]);
        assert_eq!(read(&config).unwrap().targets, ["down_proj", "q_proj"]);
        config["target_modules"] = json!("all-linear");
        assert_eq!(read(&config).unwrap().targets.len(), 7);
        for other in [json!(".*\\.(q_proj|v_proj)"), json!(["lm_head"])] {
            config["target_modules"] = other.clone();
            let err = read(&config).unwrap_err();
            assert!(
                err.contains("`target_modules`") && err.contains("all-linear"),
                "{err}"
            );
        }
    }

    /// Each PEFT setting that changes what an adapter computes is refused by name, not
    /// ignored; a config that sets each to its plain default reads as before.
    #[test]
    fn peft_settings_beyond_plain_lora_are_refused_by_name() {
        let cfg = LoraConfig {
            rank: 4,
            ..Default::default()
        };
        let plain = config_json(&cfg, "base");
        let dir = adapter_dir("plain", &plain);
        assert_eq!(read_config(&dir).unwrap().rank, 4);
        std::fs::remove_dir_all(&dir).ok();
        let cases = [
            (
                "alpha_pattern",
                json!({"model.layers.0.self_attn.q_proj": 64}),
            ),
            ("rank_pattern", json!({"q_proj": 8})),
            ("layers_to_transform", json!([0, 1])),
            ("layers_to_transform", json!(3)),
            ("layers_pattern", json!("layers")),
            ("fan_in_fan_out", json!(true)),
            ("bias", json!("all")),
            ("bias", json!("lora_only")),
            ("lora_bias", json!(true)),
            ("modules_to_save", json!(["lm_head"])),
            ("layer_replication", json!([[0, 2]])),
            ("trainable_token_indices", json!([5, 7])),
            ("peft_type", json!("LOHA")),
            ("init_lora_weights", json!("pissa")),
            ("init_lora_weights", json!("olora")),
            ("init_lora_weights", json!("loftq")),
            ("alora_invocation_tokens", json!([13, 7])),
            ("exclude_modules", json!(["layers.0.self_attn.q_proj"])),
            ("target_parameters", json!(["experts.gate_up_proj"])),
            ("use_qalora", json!(true)),
        ];
        for (i, (key, value)) in cases.into_iter().enumerate() {
            let mut config = plain.clone();
            config[key] = value.clone();
            let dir = adapter_dir(&format!("case-{i}"), &config);
            let err = format!("{:#}", read_config(&dir).unwrap_err());
            assert!(err.contains(&format!("`{key}` = {value}")), "{key}: {err}");
            assert!(err.contains(CONFIG_FILE), "{key}: {err}");
            std::fs::remove_dir_all(&dir).ok();
        }
        // Inits that only draw A and B read as plain.
        for init in [
            json!(false),
            json!("gaussian"),
            json!("eva"),
            json!("orthogonal"),
        ] {
            let mut config = plain.clone();
            config["init_lora_weights"] = init.clone();
            let dir = adapter_dir("init", &config);
            assert_eq!(read_config(&dir).unwrap().rank, 4, "{init}");
            std::fs::remove_dir_all(&dir).ok();
        }
        // A rank or alpha that is not a number is named with what the file says.
        for (key, value) in [("r", json!("16")), ("lora_alpha", json!("32"))] {
            let mut config = plain.clone();
            config[key] = value.clone();
            let dir = adapter_dir("typed", &config);
            let err = format!("{:#}", read_config(&dir).unwrap_err());
            assert!(
                err.contains(&format!("`{key}` = {value} is not a number")),
                "{err}"
            );
            std::fs::remove_dir_all(&dir).ok();
        }
    }
}
