//! Hugging Face model directories in and out: `config.json` and `model.safetensors` (or shards
//! with `model.safetensors.index.json`). Written so HF transformers and vLLM load the result.

use super::config::ModelConfig;
use super::transformer::Transformer;
use anyhow::{bail, Context, Result};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use tch::{nn, Device, Kind, Tensor};

/// A policy (or reference) model: its parameters and the module that uses them.
pub struct Model {
    pub vs: nn::VarStore,
    pub net: Transformer,
}

impl Model {
    /// A randomly initialised model (tiny models built from scratch).
    pub fn random(cfg: &ModelConfig, device: Device, seed: i64) -> Result<Self> {
        ensure_fits(cfg, device)?;
        tch::manual_seed(seed);
        let vs = nn::VarStore::new(device);
        let net = Transformer::new(&vs.root(), cfg)?;
        Ok(Model { vs, net })
    }

    /// Loads `config.json` and the safetensors weights of an HF model directory.
    pub fn load_dir(dir: &Path, device: Device) -> Result<Self> {
        let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        ensure_fits(&cfg, device).with_context(|| format!("loading {}", dir.display()))?;
        let vs = nn::VarStore::new(device);
        let net = Transformer::new(&vs.root(), &cfg)?;
        let tensors = read_weights(dir)?;
        let mut variables = vs.variables();
        tch::no_grad(|| -> Result<()> {
            for (name, var) in variables.iter_mut() {
                let Some(t) = tensors.get(name) else {
                    bail!("{}: the checkpoint has no tensor `{name}`", dir.display());
                };
                if t.size() != var.size() {
                    bail!(
                        "{}: tensor `{name}` has shape {:?}, the config implies {:?}",
                        dir.display(),
                        t.size(),
                        var.size()
                    );
                }
                var.copy_(&t.to_kind(var.kind()));
            }
            Ok(())
        })?;
        Ok(Model { vs, net })
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (created if missing).
    pub fn save_dir(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let config = serde_json::to_string_pretty(&self.net.config)?;
        write_atomic(&dir.join("config.json"), config.as_bytes())?;
        let mut named: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let tmp = dir.join("model.safetensors.tmp");
        Tensor::write_safetensors(&named, &tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, dir.join("model.safetensors"))?;
        Ok(())
    }

    /// Copies every parameter of `other` (same architecture) into this model.
    pub fn copy_from(&mut self, other: &Model) -> Result<()> {
        self.vs.copy(&other.vs).context("copying model parameters")
    }

    /// Sum of all parameter values: a cheap fingerprint for "did the weights change".
    pub fn checksum(&self) -> f64 {
        tch::no_grad(|| {
            self.vs
                .trainable_variables()
                .iter()
                .map(|t| {
                    t.to_kind(Kind::Double)
                        .abs()
                        .sum(Kind::Double)
                        .double_value(&[])
                })
                .sum()
        })
    }
}

/// An error, before any allocation, when building `cfg` on the CPU needs more memory than is
/// free (libtorch would abort the process instead).
fn ensure_fits(cfg: &ModelConfig, device: Device) -> Result<()> {
    cfg.validate()?;
    if let Some(free) = crate::memory::available_on(device).filter(|&f| cfg.build_bytes() > f) {
        bail!(
            "a model of {:.3e} parameters and {} positions needs {:.1} GiB to build, but {:.1} \
             GiB of memory is free",
            cfg.parameter_count(),
            cfg.max_position_embeddings,
            cfg.build_bytes() / crate::memory::GIB,
            free / crate::memory::GIB
        );
    }
    Ok(())
}

fn read_weights(dir: &Path) -> Result<HashMap<String, Tensor>> {
    let single = dir.join("model.safetensors");
    let files: Vec<PathBuf> = if single.exists() {
        vec![single]
    } else {
        let index_path = dir.join("model.safetensors.index.json");
        let text = std::fs::read_to_string(&index_path).with_context(|| {
            format!(
                "{}: neither model.safetensors nor model.safetensors.index.json",
                dir.display()
            )
        })?;
        let index: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", index_path.display()))?;
        let map = index["weight_map"]
            .as_object()
            .with_context(|| format!("{}: missing `weight_map`", index_path.display()))?;
        let shards: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
        shards.into_iter().map(|s| dir.join(s)).collect()
    };
    let mut tensors = HashMap::new();
    for file in files {
        for (name, t) in read_safetensors(&file)? {
            tensors.insert(name, t);
        }
    }
    Ok(tensors)
}

/// The tensors of one safetensors file; a damaged one is named, with what to do about it.
pub fn read_safetensors(file: &Path) -> Result<Vec<(String, Tensor)>> {
    if !file.is_file() {
        bail!("{}: no such file", file.display());
    }
    Tensor::read_safetensors(file).with_context(|| {
        format!(
            "reading {}: not a complete safetensors file (damaged or cut short?): copy or \
             export the model again",
            file.display()
        )
    })
}

/// Writes through a temporary file and a rename, so a crash never leaves a half-written file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}
