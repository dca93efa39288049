//! The paths of a run's `config.toml`, read by `skein eval RUN_DIR` from wherever it is run. A
//! relative `model.path` or `data.*_files` was relative to the directory the run started in,
//! not to the run directory: the model's tokenizer and chat template are taken from the run's
//! checkpoint, which holds both, and a data file is looked for where the run started (known when
//! `run.dir` was relative: the run directory is that path below it), else refused naming the
//! key it came from and what to do.

use crate::trainer::TrainConfig;
use anyhow::{bail, Result};
use std::path::{Component, Path, PathBuf};

/// Makes the paths `cfg` (the config.toml of the run at `run`, with `overrides`) reads usable
/// from here; `checkpoint`: the run's weights evaluated; `data_files`: whether its
/// `data.*_files` are read (not with `--data`).
pub fn resolve_paths(
    cfg: &mut TrainConfig,
    run: &Path,
    checkpoint: &Path,
    overrides: &[String],
    data_files: bool,
) -> Result<()> {
    let start = start_dir(run, &cfg.run.dir);
    if !cfg.model.path.is_empty() && !super::train::sets_key(None, overrides, "model.path") {
        // The tokenizer and template the run saved with its weights are the ones it used.
        if checkpoint.join("tokenizer.json").is_file() {
            cfg.model.path = checkpoint.display().to_string();
        } else {
            let path = &mut cfg.model.path;
            *path = found(path, start.as_deref(), run, "model.path", "model.path=DIR")?;
        }
    }
    if !data_files {
        return Ok(());
    }
    for (key, files) in [
        ("data.train_files", &mut cfg.data.train_files),
        ("data.val_files", &mut cfg.data.val_files),
    ] {
        if super::train::sets_key(None, overrides, key) {
            continue;
        }
        for f in files.iter_mut() {
            *f = found(
                f,
                start.as_deref(),
                run,
                key,
                &format!("{key}='[\"FILE\"]'"),
            )?;
        }
    }
    Ok(())
}

/// `path` as it can be read from here: as written when absolute; else below the directory the
/// run started in, where the run read it, before a file of the same name here; else here; an
/// error naming `key` when neither holds it.
fn found(path: &str, start: Option<&Path>, run: &Path, key: &str, set: &str) -> Result<String> {
    let p = Path::new(path);
    if p.is_absolute() {
        return Ok(path.to_string());
    }
    if let Some(there) = start.map(|s| s.join(p)).filter(|t| t.exists()) {
        return Ok(there.display().to_string());
    }
    if p.exists() {
        return Ok(path.to_string());
    }
    let here = std::env::current_dir().map_or_else(|_| "here".into(), |d| d.display().to_string());
    let config = run.join("config.toml");
    let config = config.display();
    match start {
        Some(start) => bail!(
            "`{key}` of {config} is {path}, relative to the directory the run started in ({}), \
             and it is no longer there: put it back, or --set {set}",
            start.display()
        ),
        None => bail!(
            "`{key}` of {config} is {path}, relative to the directory the run started in, and \
             it is not found from {here}: run skein eval from that directory, or --set {set}"
        ),
    }
}

/// The directory the run started in, when its `run.dir` was a relative path the run directory
/// ends with (`runs/r` of `/work/runs/r`: `/work`).
fn start_dir(run: &Path, run_dir: &str) -> Option<PathBuf> {
    let rel = Path::new(run_dir);
    let parts: Vec<Component> = rel
        .components()
        .filter(|c| *c != Component::CurDir)
        .collect();
    if parts.is_empty() || !parts.iter().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    // Lexically, not through symlinks: `runs` may link elsewhere, and the run started above
    // the link, not above its target.
    let run = std::path::absolute(run).ok()?;
    let rel: PathBuf = parts.iter().collect();
    run.ends_with(&rel)
        .then(|| run.ancestors().nth(parts.len()).map(Path::to_path_buf))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_directory_is_above_a_relative_run_dir() {
        let root = std::env::temp_dir().join(format!("skein-eval-run-{}", std::process::id()));
        let run = root.join("runs/r");
        std::fs::create_dir_all(&run).unwrap();
        let root = std::path::absolute(&root).unwrap();
        assert_eq!(start_dir(&run, "runs/r"), Some(root.clone()));
        assert_eq!(start_dir(&run, "./runs/r"), Some(root.clone()));
        assert_eq!(start_dir(&run, "other/r"), None);
        assert_eq!(start_dir(&run, "../r"), None);
        assert_eq!(start_dir(&run, &run.display().to_string()), None);
        // `runs` a link to other storage: the run started above the link, not its target.
        let project = root.join("project");
        std::fs::create_dir_all(&project).unwrap();
        std::os::unix::fs::symlink(root.join("runs"), project.join("runs")).unwrap();
        let linked = project.join("runs/r");
        assert_eq!(start_dir(&linked, "runs/r"), Some(project.clone()));
        // Found below it; else an error that names the key, the file and what to do.
        std::fs::write(root.join("val.jsonl"), "").unwrap();
        let there = found("val.jsonl", Some(&root), &run, "data.val_files", "x").unwrap();
        assert_eq!(there, root.join("val.jsonl").display().to_string());
        let err = found(
            "no.jsonl",
            None,
            &run,
            "data.val_files",
            "data.val_files=[]",
        )
        .unwrap_err()
        .to_string();
        for says in [
            "`data.val_files` of ",
            "config.toml is no.jsonl",
            "relative to the directory the run started in",
            "run skein eval from that directory, or --set data.val_files=[]",
        ] {
            assert!(err.contains(says), "expected {says:?} in {err}");
        }
        let err = found("no.jsonl", Some(&root), &run, "data.val_files", "x").unwrap_err();
        assert!(err.to_string().contains("no longer there"), "{err}");
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A run started in `root` with `run.dir = "runs/r"`, evaluated from elsewhere: its model
    /// is read from its checkpoint and its data below `root`; a file gone names its key.
    #[test]
    fn a_runs_relative_paths_are_read_from_where_it_started() {
        let root = std::env::temp_dir().join(format!("skein-eval-paths-{}", std::process::id()));
        let run = root.join("runs/r");
        std::fs::create_dir_all(run.join("checkpoint")).unwrap();
        std::fs::write(run.join("checkpoint/tokenizer.json"), "{}").unwrap();
        std::fs::write(root.join("val.jsonl"), "").unwrap();
        let mut cfg = TrainConfig::default();
        cfg.run.dir = "runs/r".into();
        cfg.model.path = "models/base".into();
        cfg.data.val_files = vec!["val.jsonl".into()];
        cfg.data.train_files = vec!["train.jsonl".into()];
        // With --data, the data keys are not read.
        let mut with_data = cfg.clone();
        resolve_paths(&mut with_data, &run, &run.join("checkpoint"), &[], false).unwrap();
        let checkpoint = run.join("checkpoint").display().to_string();
        assert_eq!(with_data.model.path, checkpoint);
        assert_eq!(with_data.data.train_files, ["train.jsonl"]);
        let err = resolve_paths(&mut cfg.clone(), &run, &run.join("checkpoint"), &[], true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`data.train_files` of ") && err.contains("no longer there"),
            "{err}"
        );
        // Set on the command line, a key is the user's, taken as given.
        let sets = ["data.train_files=[\"t.jsonl\"]".to_string()];
        resolve_paths(&mut cfg, &run, &run.join("checkpoint"), &sets, true).unwrap();
        let root = std::path::absolute(&root).unwrap();
        assert_eq!(
            cfg.data.val_files,
            [root.join("val.jsonl").display().to_string()]
        );
        assert_eq!(cfg.data.train_files, ["train.jsonl"]);
        let _ = std::fs::remove_dir_all(&root);
    }
}
