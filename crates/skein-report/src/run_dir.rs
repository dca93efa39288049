//! Whether a path given to a command that reads a run (`skein plot`, `skein doctor`, `skein
//! view`) is one, said the same way by each: a missing path, a file, and a directory that is
//! not a run (or a run that has logged nothing yet) each get their own message and what to give
//! instead.

use anyhow::{bail, Result};
use std::path::Path;

/// The file every run writes from its first record.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// Refuses `dir` unless it holds a run's `metrics.jsonl`.
pub fn check_run_dir(dir: &Path) -> Result<()> {
    let shown = dir.display();
    let what = "give the `run.dir` of a `skein train` (for example runs/default)";
    if !dir.exists() {
        bail!("{shown} does not exist: {what}");
    }
    if !dir.is_dir() {
        bail!("{shown} is a file, not a run directory: {what}");
    }
    if dir.join(METRICS_FILE).is_file() {
        return Ok(());
    }
    if dir.join("config.toml").is_file() {
        bail!(
            "{shown} holds a run that has logged nothing yet (no {METRICS_FILE}): it writes its \
             first record after its first warm-up or evaluation step"
        );
    }
    if dir.join("model.safetensors").is_file() || dir.join("config.json").is_file() {
        bail!(
            "{shown} is a model directory, not a run: {what}; a model is evaluated with `skein \
             eval {shown}`"
        );
    }
    bail!("{shown} is not a run directory (no {METRICS_FILE}): {what}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_non_run_is_named() {
        let root = std::env::temp_dir().join(format!("skein-run-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let said = |p: &Path| format!("{:#}", check_run_dir(p).unwrap_err());
        assert!(said(&root.join("missing")).contains("does not exist"));
        std::fs::create_dir_all(root.join("empty")).unwrap();
        assert!(said(&root.join("empty")).contains("is not a run directory"));
        std::fs::write(root.join("a-file"), "x").unwrap();
        assert!(said(&root.join("a-file")).contains("is a file"));
        let model = root.join("model");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("config.json"), "{}").unwrap();
        assert!(said(&model).contains("skein eval"));
        let run = root.join("run");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("config.toml"), "").unwrap();
        assert!(said(&run).contains("logged nothing yet"));
        std::fs::write(run.join(METRICS_FILE), "").unwrap();
        check_run_dir(&run).unwrap();
        let _ = std::fs::remove_dir_all(&root);
    }
}
