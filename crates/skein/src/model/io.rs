//! Hugging Face model directories in and out: `config.json` and `model.safetensors` (or shards
//! with `model.safetensors.index.json`). Written so HF transformers and vLLM load the result.

use super::config::ModelConfig;
use super::options::ModelOptions;
use super::safetensors_stream::{write_streamed, Entry};
use super::transformer::Transformer;
use anyhow::{bail, Context, Result};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use tch::{nn, Device, Kind, Tensor};

/// A policy (or reference) model: its parameters and the module that uses them.
pub struct Model {
    pub vs: nn::VarStore,
    pub net: Transformer,
    /// The dtype and adapters it was built with (replicas are built the same way).
    pub options: ModelOptions,
}

impl Model {
    /// A randomly initialised model (tiny models built from scratch).
    pub fn random(cfg: &ModelConfig, device: Device, seed: i64) -> Result<Self> {
        Model::random_with(cfg, &ModelOptions::default(), device, seed)
    }

    /// [`Model::random`] with `options`: the weights drawn in their dtype (no float32 copy
    /// first), then adapters on the frozen base.
    pub fn random_with(
        cfg: &ModelConfig,
        options: &ModelOptions,
        device: Device,
        seed: i64,
    ) -> Result<Self> {
        ensure_fits(cfg, options, device)?;
        tch::manual_seed(seed);
        let (vs, net) = build(cfg, options, device)?;
        Ok(Model::with_adapters(vs, net, options))
    }

    /// Loads `config.json` and the safetensors weights of an HF model directory.
    pub fn load_dir(dir: &Path, device: Device) -> Result<Self> {
        Model::load_dir_with(dir, &ModelOptions::default(), device)
    }

    /// [`Model::load_dir`] with `options`: the weights in their dtype, then adapters (fresh:
    /// [`Model::load_adapter`] reads trained ones).
    pub fn load_dir_with(dir: &Path, options: &ModelOptions, device: Device) -> Result<Self> {
        let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        let files = weight_files(dir)?;
        ensure_fits_reading(&cfg, options, device, reading_bytes(&files))
            .with_context(|| format!("loading {}", dir.display()))?;
        let (vs, net) = build(&cfg, options, device)?;
        let tensors = read_weights(&files)?;
        let source = dir.display().to_string();
        let variables = vs.variables();
        refuse_unused(&variables, &tensors, &source)?;
        copy_named(&variables, &tensors, &source, false)?;
        Ok(Model::with_adapters(vs, net, options))
    }

    /// Freezes the base and attaches adapters when `options` asks for LoRA.
    fn with_adapters(vs: nn::VarStore, net: Transformer, options: &ModelOptions) -> Self {
        let mut model = Model {
            vs,
            net,
            options: ModelOptions::default(),
        };
        model.options.dtype = options.dtype;
        model.attach_adapters(&options.lora);
        model
    }

    /// A model whose every weight trained (float32, no adapters) becomes a frozen base in
    /// `options.dtype` with fresh adapters: how a model built from scratch, warmed up in
    /// full, goes on with LoRA. Without LoRA its weights go on training, in `options.dtype`.
    pub fn adapt(&mut self, options: &ModelOptions) -> Result<()> {
        if self.options.lora.enabled() {
            bail!("the model already has LoRA adapters");
        }
        options.check(self.vs.device())?;
        tch::no_grad(|| self.vs.set_kind(options.dtype.kind()));
        // The cast gave every weight storage of its own.
        self.net.share_storage();
        self.options.dtype = options.dtype;
        self.attach_adapters(&options.lora);
        Ok(())
    }

    fn attach_adapters(&mut self, lora: &super::LoraConfig) {
        if lora.enabled() {
            self.vs.freeze();
            self.net.attach_adapters(&self.vs.root(), lora);
            self.options.lora = lora.clone();
        }
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (created if missing): the
    /// weights the model computes with, adapters merged in, so any loader of Hugging Face
    /// directories gets this policy. A weight with an adapter is written in float32: merged
    /// into a bfloat16 base and rounded back, an update smaller than half the weight's last
    /// digit (2⁻⁹ of its size) would be lost, and most of an RL run's are that small.
    pub fn save_dir(&self, dir: &Path) -> Result<()> {
        self.write_dir(dir, true)
    }

    /// [`Model::save_dir`] of the frozen base alone (what adapters are trained on).
    pub fn save_base_dir(&self, dir: &Path) -> Result<()> {
        self.write_dir(dir, false)
    }

    fn write_dir(&self, dir: &Path, merged: bool) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let all: HashMap<String, Tensor> = self.vs.variables();
        let scale = self.options.lora.scale();
        // Each weight with the adapter (A, B) it merges with, if any.
        type Merge<'a> = Option<(&'a Tensor, &'a Tensor)>;
        let weights: Vec<(String, Tensor, Merge)> = super::sorted_variables(&self.vs)
            .into_iter()
            .filter(|(name, _)| !super::lora::is_adapter(name))
            .map(|(name, w)| {
                let pair = super::lora::adapter_names(&name)
                    .and_then(|(a, b)| Some((all.get(&a)?, all.get(&b)?)))
                    .filter(|_| merged);
                (name, w, pair)
            })
            .collect();
        let entries: Vec<Entry> = weights
            .iter()
            .map(|(name, w, pair)| Entry {
                name: name.clone(),
                kind: if pair.is_some() {
                    Kind::Float
                } else {
                    w.kind()
                },
                shape: w.size(),
            })
            .collect();
        // The weights first, aside then renamed, and the config after: a write that fails or
        // is cut short (a full disk, Ctrl-C) over an existing model leaves that model whole,
        // never its weights beside the new model's config. Merged weights are made one at a
        // time as they are written.
        let tmp = dir.join("model.safetensors.tmp");
        write_streamed(&tmp, &entries, |i| {
            let (_, w, pair) = &weights[i];
            Ok(match pair {
                Some((a, b)) => tch::no_grad(|| w.to_kind(Kind::Float) + b.matmul(a) * scale),
                None => w.shallow_clone(),
            })
        })?;
        let kinds: Vec<Kind> = entries.iter().map(|e| e.kind).collect();
        let config = serde_json::to_string_pretty(&config_as_written(&self.net.config, &kinds))?;
        std::fs::rename(&tmp, dir.join("model.safetensors"))
            .with_context(|| format!("replacing {}", dir.join("model.safetensors").display()))?;
        write_atomic(&dir.join("config.json"), config.as_bytes())
    }

    /// The model with LoRA's frozen base alone: the same tensors, shared, not copied (an
    /// empty var store, so nothing of it trains or is saved twice).
    pub fn base_only(&self) -> Model {
        Model {
            vs: nn::VarStore::new(self.vs.device()),
            net: self.net.base_only(),
            options: ModelOptions {
                lora: Default::default(),
                ..self.options.clone()
            },
        }
    }

    /// The model as it computes now, frozen: LoRA's base shared, not copied, and a frozen copy
    /// of its adapters (dropout off) in a var store of its own, named as the model's, so
    /// [`Model::save_adapter`] and [`Model::load_adapter`] work on it. A KL reference that
    /// starts where a warm-up of the adapters left the policy, without folding them into a
    /// low-precision base.
    pub fn frozen_copy(&self) -> Model {
        let mut copy = self.base_only();
        copy.net
            .attach_frozen_adapter_copies(&copy.vs.root(), &self.net);
        copy.options.lora = super::LoraConfig {
            dropout: 0.0,
            ..self.options.lora.clone()
        };
        copy
    }

    /// The options a copy of this model (a data-parallel rank's) is built with: its own, with
    /// adapter dropout as this model runs it now. Once RL has stopped the policy's dropout
    /// (`Transformer::stop_adapter_dropout`), a rank that drew masks would compute another
    /// function than the π_old rank 0 recorded.
    pub fn replica_options(&self) -> ModelOptions {
        let mut options = self.options.clone();
        options.lora.dropout = self.net.adapter_dropout();
        options
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
fn ensure_fits(cfg: &ModelConfig, options: &ModelOptions, device: Device) -> Result<()> {
    ensure_fits_reading(cfg, options, device, 0.0)
}

/// [`ensure_fits`] for a model whose weights are read from files while it is built: `reading`
/// bytes held at once beside it ([`reading_bytes`]).
fn ensure_fits_reading(
    cfg: &ModelConfig,
    options: &ModelOptions,
    device: Device,
    reading: f64,
) -> Result<()> {
    cfg.validate()?;
    // Loading alone: whether the model may train is the trainer's check.
    options.check_loadable(device)?;
    let bytes = cfg.build_bytes(options.dtype.bytes()) + reading;
    if let Some(free) = crate::memory::available_on(device).filter(|&f| bytes > f) {
        bail!(
            "a model of {:.3e} parameters and {} positions needs {:.1} GiB to load (its weights \
             and, while they are read, {:.1} GiB of its files), but {:.1} GiB of memory is free",
            cfg.parameter_count(),
            cfg.max_position_embeddings,
            bytes / crate::memory::GIB,
            reading / crate::memory::GIB,
            free / crate::memory::GIB
        );
    }
    Ok(())
}

/// Memory that reading `files` holds at its peak beside the model being built: every file's
/// tensors until they are copied in, and the largest file's bytes as it is read whole.
fn reading_bytes(files: &[PathBuf]) -> f64 {
    let sizes: Vec<f64> = files
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0.0, |m| m.len() as f64))
        .collect();
    sizes.iter().sum::<f64>() + sizes.iter().copied().fold(0.0, f64::max)
}

/// A var store and its module, every variable created in `options.dtype`.
fn build(
    cfg: &ModelConfig,
    options: &ModelOptions,
    device: Device,
) -> Result<(nn::VarStore, Transformer)> {
    let mut vs = nn::VarStore::new(device);
    // On an empty store this only sets the kind new variables are created in.
    vs.set_kind(options.dtype.kind());
    let net = Transformer::new(&vs.root(), cfg)?;
    Ok((vs, net))
}

/// Copies `tensors` into the same-named `variables` that `adapters` selects (adapter
/// variables, or base ones), cast to each variable's dtype; a missing or misshapen tensor is
/// an error naming `source`. Every tensor is checked before any is copied, so an error
/// leaves the variables as they were (a server's failed reload keeps serving the old weights).
pub fn copy_named(
    variables: &HashMap<String, Tensor>,
    tensors: &HashMap<String, Tensor>,
    source: &str,
    adapters: bool,
) -> Result<()> {
    let mut pairs = Vec::new();
    for (name, var) in variables {
        if super::lora::is_adapter(name) != adapters {
            continue;
        }
        let Some(t) = tensors.get(name) else {
            bail!("{source}: no tensor `{name}` (was it saved from a model of this shape?)");
        };
        if var.is_floating_point() && !t.is_floating_point() {
            bail!(
                "{source}: tensor `{name}` holds {:?} values, not floating point: a quantised \
                 checkpoint? Load its dequantised weights",
                t.kind()
            );
        }
        if t.size() != var.size() {
            bail!(
                "{source}: tensor `{name}` has shape {:?}, the config implies {:?}",
                t.size(),
                var.size()
            );
        }
        pairs.push((var, t));
    }
    tch::no_grad(|| {
        for (var, t) in pairs {
            var.shallow_clone().copy_(&t.to_kind(var.kind()));
        }
    });
    Ok(())
}

/// An error naming a tensor of `source` that no variable takes: a part of the model skein
/// does not build (a bias, a quantisation scale), which loading without it would silently
/// drop. A tied `lm_head.weight` (the embedding's copy) and rotary frequency tables (which
/// skein computes) are the exceptions.
fn refuse_unused(
    variables: &HashMap<String, Tensor>,
    tensors: &HashMap<String, Tensor>,
    source: &str,
) -> Result<()> {
    let mut unused: Vec<&String> = tensors
        .keys()
        .filter(|name| !variables.contains_key(*name))
        .filter(|name| !name.ends_with("rotary_emb.inv_freq"))
        .filter(|name| {
            let tied_head =
                *name == "lm_head.weight" && variables.contains_key("model.embed_tokens.weight");
            !tied_head
        })
        .collect();
    unused.sort();
    if let Some(first) = unused.first() {
        bail!(
            "{source}: {} tensor(s) no part of the model takes, e.g. `{first}`: the checkpoint \
             has parts skein does not build (a bias, quantisation scales), so it would compute \
             other numbers than the model",
            unused.len()
        );
    }
    Ok(())
}

fn read_weights(files: &[PathBuf]) -> Result<HashMap<String, Tensor>> {
    let mut tensors = HashMap::new();
    for file in files {
        for (name, t) in read_safetensors(file)? {
            tensors.insert(name, t);
        }
    }
    Ok(tensors)
}

/// Elements of every tensor in a model directory's safetensors files, from their headers
/// alone: what the model holds, before any weight is read.
pub fn stored_elements(dir: &Path) -> Result<f64> {
    let mut elements = 0.0;
    for file in weight_files(dir)? {
        let header = safetensors_header(&file)
            .with_context(|| format!("reading the header of {}", file.display()))?;
        for (name, entry) in header.iter().filter(|(n, _)| *n != "__metadata__") {
            let shape = entry["shape"]
                .as_array()
                .with_context(|| format!("{}: tensor {name} has no shape", file.display()))?;
            elements += shape
                .iter()
                .map(|d| d.as_f64().unwrap_or(0.0))
                .product::<f64>();
        }
    }
    Ok(elements)
}

/// A safetensors file's header: 8 bytes of its length (little-endian), then that much JSON.
fn safetensors_header(file: &Path) -> Result<serde_json::Map<String, serde_json::Value>> {
    use std::io::Read;
    /// Far more than any header of a real checkpoint (a few MB for thousands of tensors).
    const MAX_HEADER: u64 = 100 << 20;
    let mut f = std::fs::File::open(file)?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER {
        bail!("a header of {len} bytes: not a safetensors file");
    }
    let mut text = vec![0u8; len as usize];
    f.read_exact(&mut text)?;
    Ok(serde_json::from_slice(&text)?)
}

/// The safetensors files of a model directory: `model.safetensors`, or the shards its index
/// names. A directory with only PyTorch's pickle is told to convert it.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
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

/// The tensors of one safetensors file; a damaged one is named, with what to do about it.
pub fn read_safetensors(file: &Path) -> Result<Vec<(String, Tensor)>> {
    if !file.is_file() {
        bail!("{}: no such file", file.display());
    }
    Tensor::read_safetensors(file).with_context(|| {
        format!(
            "reading {}: not a safetensors file skein can read: damaged or cut short (copy or \
             export the model again), or holding a dtype libtorch does not read (float8)",
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

/// `config` with the dtype loaders take for the weights (`torch_dtype`, and `dtype` where it
/// is set): the widest of `written`. A source model's own (`bfloat16`) would have transformers
/// round the float32 weights of a trained model back to bfloat16 as it loads them, and lose
/// the updates that were written in float32 to be kept.
fn config_as_written(config: &ModelConfig, written: &[Kind]) -> ModelConfig {
    let width = |kind: Kind| match kind {
        Kind::Double => 3,
        Kind::Float => 2,
        Kind::Half => 1,
        _ => 0,
    };
    let mut config = config.clone();
    let widest = written.iter().copied().max_by_key(|&k| width(k));
    if let Some(kind) = widest {
        let name = serde_json::Value::from(crate::devices::dtype_name(kind));
        config.extra.insert("torch_dtype".into(), name.clone());
        if config.extra.contains_key("dtype") {
            config.extra.insert("dtype".into(), name);
        }
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model's files: the shards its index names, once each; a directory with only
    /// PyTorch's pickle is told to convert it (the policy and a reward model alike).
    #[test]
    fn weight_files_are_the_indexed_shards_or_a_conversion_hint() {
        let dir = std::env::temp_dir().join(format!("skein-weight-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pytorch_model.bin"), b"").unwrap();
        let err = format!("{:#}", weight_files(&dir).unwrap_err());
        assert!(err.contains("convert it to safetensors"), "{err}");
        let index = r#"{"weight_map": {"a": "m-2.safetensors", "b": "m-1.safetensors",
            "c": "m-2.safetensors"}}"#;
        std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
        let shards = weight_files(&dir).unwrap();
        assert_eq!(
            shards,
            [dir.join("m-1.safetensors"), dir.join("m-2.safetensors")]
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    /// One misshapen tensor among many fails the copy before any variable changes.
    #[test]
    fn a_failed_copy_changes_no_variable() {
        let mut variables = HashMap::new();
        let mut tensors = HashMap::new();
        for i in 0..16 {
            let name = format!("layers.{i}.weight");
            variables.insert(name.clone(), Tensor::zeros([3], (Kind::Float, Device::Cpu)));
            tensors.insert(name, Tensor::ones([3], (Kind::Float, Device::Cpu)));
        }
        tensors.insert(
            "layers.7.weight".into(),
            Tensor::ones([4], (Kind::Float, Device::Cpu)),
        );
        let e = copy_named(&variables, &tensors, "dir", false).unwrap_err();
        assert!(e.to_string().contains("`layers.7.weight` has shape"), "{e}");
        for (name, v) in &variables {
            assert_eq!(
                v.abs().sum(Kind::Float).double_value(&[]),
                0.0,
                "{name} changed"
            );
        }
        tensors.insert(
            "layers.7.weight".into(),
            Tensor::ones([3], (Kind::Float, Device::Cpu)),
        );
        copy_named(&variables, &tensors, "dir", false).unwrap();
        assert!(variables
            .values()
            .all(|v| v.sum(Kind::Float).double_value(&[]) == 3.0));
    }

    /// Loading holds every file's tensors until they are copied in, and the file being read
    /// whole: the check before it counts both, not the built weights alone.
    #[test]
    fn reading_counts_every_file_and_the_largest_again() {
        let dir = std::env::temp_dir().join(format!("skein-reading-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files: Vec<PathBuf> = [10usize, 30]
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let f = dir.join(format!("model-{i}.safetensors"));
                std::fs::write(&f, vec![0u8; n]).unwrap();
                f
            })
            .collect();
        assert_eq!(reading_bytes(&files), 70.0);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A tensor no variable takes (here an o_proj bias and an int8 scale) is refused by name;
    /// a tied head's copy and rotary tables are not. Integer weights are refused too.
    #[test]
    fn parts_skein_does_not_build_are_refused() {
        let zeros = |n: i64| Tensor::zeros([n], (Kind::Float, Device::Cpu));
        let variables: HashMap<String, Tensor> = [
            ("model.embed_tokens.weight".to_string(), zeros(4)),
            ("model.layers.0.self_attn.o_proj.weight".into(), zeros(4)),
        ]
        .into();
        let mut tensors: HashMap<String, Tensor> = variables
            .iter()
            .map(|(k, v)| (k.clone(), v.ones_like()))
            .collect();
        tensors.insert("lm_head.weight".into(), zeros(4));
        tensors.insert(
            "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            zeros(2),
        );
        refuse_unused(&variables, &tensors, "dir").unwrap();
        tensors.insert("model.layers.0.self_attn.o_proj.bias".into(), zeros(4));
        tensors.insert("model.layers.0.self_attn.o_proj.SCB".into(), zeros(4));
        let e = refuse_unused(&variables, &tensors, "dir")
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 tensor(s)") && e.contains("o_proj.SCB"), "{e}");

        let name = "model.layers.0.self_attn.o_proj.weight";
        let int8: HashMap<String, Tensor> = [(
            name.to_string(),
            Tensor::ones([4], (Kind::Int8, Device::Cpu)),
        )]
        .into();
        let only: HashMap<String, Tensor> =
            [(name.to_string(), variables[name].shallow_clone())].into();
        let e = copy_named(&only, &int8, "dir", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not floating point"), "{e}");
    }
}
