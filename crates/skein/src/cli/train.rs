//! `skein train`: a training run (or a resumed one) from a TOML config and `--set` overrides,
//! and the config loading `skein eval` shares.

use anyhow::{bail, Context, Result};
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
    if let Some(dir) = &resume {
        check_fixed_on_resume(dir, &cfg)?;
    }
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
    let kind = crate::trainer::rollout::eval_kind(summary.held_out);
    let rewards = &summary.rewards;
    if !rewards.is_empty() {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let k = rewards.len().min(5);
        println!(
            "training reward          {:.3} → {:.3} (mean of the first and last {k} RL steps)",
            mean(&rewards[..k]),
            mean(&rewards[rewards.len() - k..]),
        );
    }
    println!(
        "{kind} greedy accuracy {:.3} → {:.3} (after the warm-up → after RL)",
        summary.eval_before.accuracy, summary.eval_after.accuracy
    );
    // What to look at next: the curves, then what the policy actually said.
    let dir = summary.dir.display();
    println!("curves                   {dir}/plot.png");
    println!("trajectories             skein view {dir}");
    Ok(())
}

/// Sections a resume cannot change: the checkpoint's weights fix the model, and its task
/// state (problems drawn, data position) the task.
const FIXED_ON_RESUME: [&str; 3] = ["model", "task", "lora"];

/// A resume keeps the run's [`FIXED_ON_RESUME`] sections as its `config.toml` has them; a
/// changed key would be ignored by the checkpoint while the config claims it.
fn check_fixed_on_resume(dir: &std::path::Path, cfg: &crate::trainer::TrainConfig) -> Result<()> {
    let Ok(mut saved) = load_config(Some(&dir.join("config.toml")), &[]) else {
        // No readable config of the run: the resume itself says what is missing.
        return Ok(());
    };
    let mut now = cfg.clone();
    positions_as_built(&mut saved, &mut now);
    let (saved, now) = (serde_json::to_value(&saved)?, serde_json::to_value(&now)?);
    for section in FIXED_ON_RESUME {
        let (Some(a), Some(b)) = (saved[section].as_object(), now[section].as_object()) else {
            continue;
        };
        if let Some((key, was)) = a.iter().find(|(k, v)| b.get(*k) != Some(*v)) {
            bail!(
                "`{section}.{key}` cannot change on --resume (the run's checkpoint was made with \
                 {was}, now {}): start a new run to change it",
                b.get(key).unwrap_or(&serde_json::Value::Null)
            );
        }
    }
    Ok(())
}

/// `model.max_positions` of both configs as the model has it. config.toml records the context
/// the model was built with: a from-scratch model's is raised to what its task needs, and a
/// loaded model's is its directory's (the key does not apply to it), so a config that asks for
/// less, or for a loaded model's, asks for the same model.
fn positions_as_built(
    saved: &mut crate::trainer::TrainConfig,
    now: &mut crate::trainer::TrainConfig,
) {
    for c in [&mut *saved, &mut *now] {
        if c.model.path.is_empty() {
            let least = crate::trainer::rollout::tasks::min_positions(c);
            c.model.max_positions = c.model.max_positions.max(least);
        }
    }
    if !now.model.path.is_empty() {
        now.model.max_positions = saved.model.max_positions;
    }
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
