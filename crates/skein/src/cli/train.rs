//! `skein train`: a training run (or a resumed one) from a TOML config and `--set` overrides,
//! and the config loading `skein eval` shares.

use anyhow::{Context, Result};
use std::path::PathBuf;

pub fn run(
    config: Option<PathBuf>,
    mut overrides: Vec<String>,
    print_config: bool,
    resume: Option<PathBuf>,
    overwrite: bool,
) -> Result<()> {
    let config = config.or_else(|| resume.as_ref().map(|dir| dir.join("config.toml")));
    if let Some(dir) = &resume {
        // The resumed run stays in its own directory, whatever the config says.
        overrides.push(format!(
            "run.dir={}",
            toml_string(&dir.display().to_string())
        ));
    }
    let cfg = load_config(config.as_deref(), &overrides)?;
    if print_config {
        print!("{}", skein_config::to_toml_string(&cfg));
        return Ok(());
    }
    let summary = match (resume, overwrite) {
        (Some(_), _) => crate::trainer::run::resume(&cfg)?,
        (None, true) => crate::trainer::run::train_overwriting(&cfg)?,
        (None, false) => crate::trainer::run::train(&cfg)?,
    };
    if summary.rank > 0 {
        // Another rank of an MPI job: rank 0 reports the run.
        return Ok(());
    }
    if summary.interrupted {
        println!(
            "interrupted after step {}: continue with `skein train --resume {}`",
            summary.rewards.len(),
            summary.dir.display()
        );
        return Ok(());
    }
    let kind = crate::trainer::run::eval_kind(summary.held_out);
    let accuracy = format!(
        "{kind} greedy accuracy {:.3} → {:.3}",
        summary.eval_before.accuracy, summary.eval_after.accuracy
    );
    let rewards = &summary.rewards;
    let training = if rewards.is_empty() {
        "no RL steps".to_string()
    } else {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let k = rewards.len().min(5);
        format!(
            "training reward {:.3} → {:.3} (mean of the first and last {k} steps)",
            mean(&rewards[..k]),
            mean(&rewards[rewards.len() - k..]),
        )
    };
    println!(
        "{training}; {accuracy}; run directory {}",
        summary.dir.display()
    );
    Ok(())
}

/// A training config: the file at `path` (or the defaults) with `--set` overrides.
pub fn load_config(
    path: Option<&std::path::Path>,
    overrides: &[String],
) -> Result<crate::trainer::TrainConfig> {
    let text = match path {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading config {}", p.display()))?,
        ),
        None => None,
    };
    let source = path.map_or_else(|| "defaults".into(), |p| p.display().to_string());
    Ok(skein_config::load_with_defaults(
        text.as_deref(),
        &source,
        overrides,
    )?)
}

/// `s` as a TOML string literal, for an override value.
pub fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}
