//! `skein plan-memory`: the trainer's preflight estimate for a training config on a device,
//! part by part, with the total and whether it fits — before anything is built or
//! downloaded: a model's `config.json` is enough to plan a 7B run.

use crate::memory::GIB;
use crate::model::ModelConfig;
use crate::trainer::preflight::{self, Part};
use crate::trainer::TrainConfig;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use tch::Device;

#[derive(clap::Args, Debug)]
pub struct PlanMemoryArgs {
    /// A Hugging Face model directory, or its `config.json` alone (default: `model.path`).
    #[arg(long, value_name = "DIR|CONFIG.json")]
    model: Option<PathBuf>,
    /// A TOML training config; keys not given keep their defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one key, as `skein train` takes it, e.g. --set lora.rank=16
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Where the run trains: `cpu` (against this machine's free memory) or `cuda:<N>GiB`
    /// (one GPU of N GiB, e.g. cuda:80GiB).
    #[arg(long, default_value = "cpu")]
    device: String,
}

/// A device to plan for, and the memory it offers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    Cpu,
    Cuda { bytes: f64 },
}

impl Target {
    /// `cpu` or `cuda:<N>GiB`; anything else is an error naming both forms.
    fn parse(s: &str) -> Result<Self> {
        if s == "cpu" {
            return Ok(Target::Cpu);
        }
        let gib = s
            .strip_prefix("cuda:")
            .and_then(|rest| rest.strip_suffix("GiB"))
            .and_then(|n| n.parse::<f64>().ok())
            .filter(|n| n.is_finite() && *n > 0.0);
        match gib {
            Some(n) => Ok(Target::Cuda { bytes: n * GIB }),
            None => bail!(
                "invalid value `{s}` for `--device` (allowed: cpu, or cuda:<N>GiB with N the \
                 GPU's memory in GiB, e.g. cuda:80GiB)"
            ),
        }
    }

    /// The device the estimate places its parts on (a CUDA device need not exist here).
    fn device(self) -> Device {
        match self {
            Target::Cpu => Device::Cpu,
            Target::Cuda { .. } => Device::Cuda(0),
        }
    }

    /// What the device offers, and a phrase saying so: the free memory of this machine, or
    /// the GPU's size.
    fn available(self) -> Result<(f64, String)> {
        match self {
            Target::Cpu => {
                let free = crate::memory::available()
                    .context("this machine reports no free memory (/proc/meminfo)")?;
                Ok((free, format!("{:.2} GiB free on this machine", free / GIB)))
            }
            Target::Cuda { bytes } => Ok((bytes, format!("{:.2} GiB on the GPU", bytes / GIB))),
        }
    }
}

pub fn run(a: &PlanMemoryArgs) -> Result<()> {
    let target = Target::parse(&a.device)?;
    let mut cfg = super::train::load_config(a.config.as_deref(), &a.overrides)?;
    crate::trainer::config::validate::validate_for_memory_plan(&cfg)?;
    cfg.model_options().check(target.device())?;
    let model = model_config(a.model.as_deref(), &cfg)?;
    if let Some(dir) = a.model.as_deref().filter(|_| cfg.model.path.is_empty()) {
        // The plan is of that model loaded, not of one built from scratch in its shape.
        cfg.model.path = dir.display().to_string();
    }
    // One device, whichever: every rank's replica on it, thread or MPI process (a GPU of
    // this machine, or none, does not change the plan).
    let sharing = cfg.trainer.dp_size.saturating_sub(1);
    let parts = preflight::estimate_sharing(&cfg, &model, target.device(), sharing, None);
    let (available, offered) = target.available()?;
    println!("{}", describe(&cfg, &model));
    if let Some(note) = prompt_bound_note(&cfg) {
        println!("{note}");
    }
    println!();
    print_parts(&parts);
    println!();
    println!("{}", verdict(&parts, available, &offered));
    Ok(())
}

/// The model's `config.json`: `--model` (a directory or the file), else `model.path`.
fn model_config(arg: Option<&Path>, cfg: &TrainConfig) -> Result<ModelConfig> {
    let path = match arg {
        Some(p) => p.to_path_buf(),
        None if !cfg.model.path.is_empty() => PathBuf::from(&cfg.model.path),
        None => bail!(
            "no model to plan for: pass `--model DIR|CONFIG.json` (a Hugging Face model \
             directory or its config.json), or set `model.path`"
        ),
    };
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path
    };
    ModelConfig::from_file(&file)
}

/// One line: the model's shape and the settings that size the estimate.
fn describe(cfg: &TrainConfig, model: &ModelConfig) -> String {
    let options = cfg.model_options();
    let lora = if options.lora.enabled() {
        format!(
            "lora.rank {} on {}",
            options.lora.rank,
            options.lora.targets.join(", ")
        )
    } else {
        "lora.rank 0 (full fine-tuning)".into()
    };
    format!(
        "{}: {:.2}B parameters (hidden {}, {} layers, vocab {}); model.dtype {}, {lora}; \
         micro-batches of {} tokens; activation checkpointing {}",
        model.model_type,
        model.parameter_count() / 1e9,
        model.hidden_size,
        model.num_hidden_layers,
        model.vocab_size,
        options.dtype.name(),
        cfg.trainer.micro_batch_tokens,
        if cfg.trainer.activation_checkpointing {
            "on"
        } else {
            "off"
        }
    )
}

/// For a dataset run: the plan sizes a rollout slot's prompt by `data.max_prompt_tokens`,
/// where `skein train` has the dataset's longest prompt, often far shorter.
fn prompt_bound_note(cfg: &TrainConfig) -> Option<String> {
    if cfg.data.train_files.is_empty() {
        return None;
    }
    let bound = match cfg.data.max_prompt_tokens {
        0 => "the model's context (`data.max_prompt_tokens` = 0)".to_string(),
        n => format!("`data.max_prompt_tokens` = {n} tokens"),
    };
    Some(format!(
        "rollout slots hold a prompt of up to {bound}; `skein train` sizes them by the \
         dataset's longest prompt once it is loaded"
    ))
}

/// The parts as a Markdown table, with the total.
fn print_parts(parts: &[Part]) {
    println!("| part | GiB | lowered by |");
    println!("| --- | ---: | --- |");
    for p in parts {
        println!("| {} | {:.2} | {} |", p.what, p.bytes / GIB, p.lower);
    }
    println!("| **total** | **{:.2}** | |", preflight::total(parts) / GIB);
}

/// Whether the estimate fits `available` bytes (`offered` says where), and if not, what to
/// lower first.
fn verdict(parts: &[Part], available: f64, offered: &str) -> String {
    let total = preflight::total(parts);
    if total <= available {
        return format!(
            "fits: needs {:.2} GiB of the {offered} ({:.0}%)",
            total / GIB,
            100.0 * total / available
        );
    }
    let largest = parts.iter().max_by(|a, b| a.bytes.total_cmp(&b.bytes));
    format!(
        "does not fit: needs {:.2} GiB, {offered}; lower {} first",
        total / GIB,
        largest.map_or("the model size", |p| p.lower)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_bad_ones_name_the_allowed_forms() {
        assert_eq!(Target::parse("cpu").unwrap(), Target::Cpu);
        assert_eq!(
            Target::parse("cuda:80GiB").unwrap(),
            Target::Cuda { bytes: 80.0 * GIB }
        );
        for bad in [
            "cuda",
            "cuda:80",
            "cuda:80GB",
            "cuda:-1GiB",
            "cuda:0GiB",
            "gpu",
        ] {
            let err = Target::parse(bad).unwrap_err().to_string();
            assert!(
                err.contains("`--device`") && err.contains("cuda:80GiB"),
                "{err}"
            );
        }
    }
}
