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

/// Everything of the base directory but its weights and config (the tokenizer, generation
/// config, chat template), so the merged directory is a complete model.
fn copy_other_files(base: &Path, out: &Path) -> Result<()> {
    for entry in std::fs::read_dir(base).with_context(|| format!("reading {}", base.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        let weights = name.starts_with("model") && name.contains(".safetensors");
        if entry.file_type()?.is_file() && !weights && name != "config.json" {
            std::fs::copy(entry.path(), out.join(&name))
                .with_context(|| format!("copying {name} to {}", out.display()))?;
        }
    }
    Ok(())
}
