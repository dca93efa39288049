//! `skein export --merge`: a LoRA adapter (PEFT's layout, skein's or PEFT's own) folded into
//! its base model, written as a plain Hugging Face model directory that any loader (vLLM,
//! transformers, `skein serve`) reads without knowing about adapters.

use crate::model::{peft, Model, ModelOptions};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ExportArgs {
    /// Fold the adapter into the base weights (the only export there is, for now).
    #[arg(long, required = true)]
    merge: bool,
    /// The adapter directory (`adapter_config.json`, `adapter_model.safetensors`), e.g. a LoRA
    /// run's `checkpoint/adapter`.
    #[arg(long)]
    adapter: PathBuf,
    /// The base model directory; default: the adapter's `base_model_name_or_path`, read
    /// relative to the adapter's parent (a checkpoint's `base/`).
    #[arg(long)]
    base: Option<PathBuf>,
    /// Where the merged model goes (must not exist yet).
    out: PathBuf,
}

pub fn run(args: &ExportArgs) -> Result<()> {
    debug_assert!(args.merge);
    if args.out.exists() {
        bail!(
            "{} exists: export writes a new directory; pick another path or remove it",
            args.out.display()
        );
    }
    refuse_non_adapter(&args.adapter)?;
    let lora = peft::read_config(&args.adapter)?;
    let base = match &args.base {
        Some(b) => b.clone(),
        None => {
            peft::base_of(&args.adapter).context("give the base model directory with --base DIR")?
        }
    };
    let options = ModelOptions {
        lora,
        ..Default::default()
    };
    let mut model = Model::load_dir_with(&base, &options, tch::Device::Cpu)
        .with_context(|| format!("loading the base model {}", base.display()))?;
    model.load_adapter(&args.adapter)?;
    model.merge_adapters();
    model.save_dir(&args.out)?;
    copy_other_files(&base, &args.out)?;
    eprintln!(
        "skein export: {} merged into {} → {}",
        args.adapter.display(),
        base.display(),
        args.out.display()
    );
    Ok(())
}

/// `--adapter` names a directory without `adapter_config.json`: where the adapter is, when it
/// is a run or checkpoint directory (whose own model files already hold it merged).
fn refuse_non_adapter(dir: &Path) -> Result<()> {
    if dir.join(peft::CONFIG_FILE).is_file() {
        return Ok(());
    }
    let below = [
        dir.join(crate::trainer::checkpoint::ADAPTER_DIR),
        dir.join("checkpoint")
            .join(crate::trainer::checkpoint::ADAPTER_DIR),
    ];
    let what_to_do = match below.iter().find(|d| d.join(peft::CONFIG_FILE).is_file()) {
        Some(adapter) => {
            let merged = adapter.parent().unwrap_or(dir);
            format!(
                "the adapter is {}; {} already holds it merged into its base, ready to load \
                 as it is",
                adapter.display(),
                merged.display()
            )
        }
        None => "give the directory that holds adapter_config.json and \
                 adapter_model.safetensors (a LoRA run's checkpoint/adapter)"
            .to_string(),
    };
    bail!(
        "--adapter {}: no {} there, so it is no LoRA adapter: {what_to_do}",
        dir.display(),
        peft::CONFIG_FILE
    )
}

/// Everything of the base directory but its weights in any format and its config (the
/// tokenizer, generation config, chat template), so the merged directory is a complete model
/// whose only weights are the merged ones. Links are followed: a Hugging Face cache snapshot is
/// all links.
fn copy_other_files(base: &Path, out: &Path) -> Result<()> {
    for entry in std::fs::read_dir(base).with_context(|| format!("reading {}", base.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        if entry.path().is_file() && !is_weights(&name) && name != "config.json" {
            std::fs::copy(entry.path(), out.join(&name))
                .with_context(|| format!("copying {name} to {}", out.display()))?;
        }
    }
    // Named chat templates (`tool_use`), kept in a folder of their own.
    let templates = base.join(MORE_TEMPLATES_DIR);
    if templates.is_dir() {
        std::fs::create_dir_all(out.join(MORE_TEMPLATES_DIR))?;
        for entry in std::fs::read_dir(&templates)
            .with_context(|| format!("reading {}", templates.display()))?
        {
            let entry = entry?;
            if entry.path().is_file() {
                let to = out.join(MORE_TEMPLATES_DIR).join(entry.file_name());
                std::fs::copy(entry.path(), &to)
                    .with_context(|| format!("copying {}", to.display()))?;
            }
        }
    }
    Ok(())
}

/// Whether a file of a model directory holds weights, or indexes them: safetensors, PyTorch,
/// GGUF, TensorFlow, Flax, ONNX. A base's unmerged `pytorch_model.bin` beside the merged
/// safetensors would be what a loader asked for that format reads.
fn is_weights(name: &str) -> bool {
    const FORMATS: [&str; 9] = [
        "safetensors",
        "bin",
        "pt",
        "pth",
        "ckpt",
        "gguf",
        "h5",
        "msgpack",
        "onnx",
    ];
    let indexed = name.strip_suffix(".index.json").unwrap_or(name);
    let extension = indexed.rsplit_once('.').map(|(_, e)| e);
    extension.is_some_and(|e| FORMATS.contains(&e))
}

/// Where transformers keeps a model's named chat templates beside chat_template.jinja.
const MORE_TEMPLATES_DIR: &str = "additional_chat_templates";

#[cfg(test)]
mod tests {
    use super::*;

    /// The merged directory takes the base's other files, linked or not, its named chat
    /// templates included (without `tool_use`, requests with tools would render with the
    /// default template), and none of its weights in any format.
    #[test]
    fn the_base_files_beside_the_weights_are_copied_templates_folder_included() {
        let root = std::env::temp_dir().join(format!("skein-export-{}", std::process::id()));
        let (base, out) = (root.join("base"), root.join("out"));
        std::fs::create_dir_all(base.join(MORE_TEMPLATES_DIR)).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        let weights = [
            "config.json",
            "model.safetensors",
            "pytorch_model.bin",
            "pytorch_model.bin.index.json",
            "model.safetensors.index.json",
            "consolidated.safetensors",
            "model-q8_0.gguf",
            "tf_model.h5",
        ];
        for name in ["tokenizer.json", "generation_config.json"]
            .iter()
            .chain(&weights)
        {
            std::fs::write(base.join(name), name).unwrap();
        }
        // A cache snapshot's files are links to blobs.
        std::fs::write(root.join("blob"), "{}").unwrap();
        std::os::unix::fs::symlink(root.join("blob"), base.join("tokenizer_config.json")).unwrap();
        std::fs::write(base.join(MORE_TEMPLATES_DIR).join("tool_use.jinja"), "t").unwrap();
        copy_other_files(&base, &out).unwrap();
        for name in [
            "tokenizer.json",
            "generation_config.json",
            "tokenizer_config.json",
        ] {
            assert!(out.join(name).is_file(), "{name}");
        }
        for name in weights {
            assert!(!out.join(name).exists(), "{name}");
        }
        let copied = out.join(MORE_TEMPLATES_DIR).join("tool_use.jinja");
        assert_eq!(std::fs::read_to_string(copied).unwrap(), "t");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
