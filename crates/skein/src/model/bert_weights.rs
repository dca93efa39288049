//! Named tensors of a Hugging Face checkpoint, taken one by one with their shape checked.
//!
//! Encoder checkpoints come in two namings: the bare `BertModel` (`embeddings.…`) and the
//! task models that wrap it (`bert.embeddings.…`, beside a `classifier.…` head). `take` accepts
//! both, so one loader serves sentence encoders and sequence classifiers alike.

use anyhow::{bail, Context, Result};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// The tensors of a model directory, on `device`, floating point ones as f32.
pub struct Weights {
    source: String,
    tensors: HashMap<String, Tensor>,
    device: Device,
}

impl Weights {
    /// Reads `model.safetensors`, or every shard that `model.safetensors.index.json` names.
    pub fn read_dir(dir: &Path, device: Device) -> Result<Self> {
        let mut tensors = HashMap::new();
        for file in safetensors_files(dir)? {
            let read = crate::model::io::read_safetensors(&file)?;
            tensors.extend(read);
        }
        Ok(Weights {
            source: dir.display().to_string(),
            tensors,
            device,
        })
    }

    /// Weights already in memory (tests, and handles that share another model's tensors).
    pub fn from_map(source: &str, tensors: HashMap<String, Tensor>, device: Device) -> Self {
        Weights {
            source: source.to_string(),
            tensors,
            device,
        }
    }

    /// Whether `name` (or `bert.name`) is present.
    pub fn contains(&self, name: &str) -> bool {
        self.key(name).is_some()
    }

    fn key(&self, name: &str) -> Option<String> {
        [name.to_string(), format!("bert.{name}")]
            .into_iter()
            .find(|k| self.tensors.contains_key(k))
    }

    /// The tensor `name` (or `bert.name`), which must have `shape`.
    pub fn take(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        let Some(key) = self.key(name) else {
            bail!(
                "{}: the checkpoint has no tensor `{name}` (nor `bert.{name}`)",
                self.source
            );
        };
        let t = self.tensors.remove(&key).expect("key was just found");
        if t.size() != shape {
            bail!(
                "{}: tensor `{key}` has shape {:?}, the config implies {shape:?}",
                self.source,
                t.size()
            );
        }
        let t = if t.is_floating_point() {
            t.to_kind(Kind::Float)
        } else {
            t
        };
        Ok(t.to_device(self.device))
    }
}

fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index_path = dir.join("model.safetensors.index.json");
    if !index_path.exists() {
        let hint = if dir.join("pytorch_model.bin").exists() {
            " (only pytorch_model.bin is there: convert it to safetensors first)"
        } else {
            ""
        };
        bail!(
            "{}: neither model.safetensors nor model.safetensors.index.json{hint}",
            dir.display()
        );
    }
    let text = std::fs::read_to_string(&index_path)
        .with_context(|| format!("reading {}", index_path.display()))?;
    let index: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", index_path.display()))?;
    let map = index["weight_map"]
        .as_object()
        .with_context(|| format!("{}: missing `weight_map`", index_path.display()))?;
    let shards: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
    Ok(shards.into_iter().map(|s| dir.join(s)).collect())
}
