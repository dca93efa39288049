//! Named tensors of a Hugging Face checkpoint, taken one by one with their shape checked.
//!
//! Encoder checkpoints come in two namings: the bare `BertModel` (`embeddings.…`) and the
//! task models that wrap it (`bert.embeddings.…`, beside a `classifier.…` head). `take` accepts
//! both, so one loader serves sentence encoders and sequence classifiers alike.

use anyhow::{bail, Result};
use std::collections::HashMap;
use std::path::Path;
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
        for file in crate::model::io::weight_files(dir)? {
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
