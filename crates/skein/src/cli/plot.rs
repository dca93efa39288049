//! `skein plot`: a run's curves as a PNG, or several runs overlaid.

use anyhow::Result;
use std::path::{Path, PathBuf};

/// Where several runs' overlay goes when `--out` is not given.
const DEFAULT_OVERLAY: &str = "compare.png";

/// `skein plot`: a run's own plot.png (or, with `--out`, that figure elsewhere), or several
/// runs overlaid in one PNG.
pub fn run(run_dirs: &[PathBuf], keys: &[String], out: Option<&Path>) -> Result<()> {
    if let Some(out) = out {
        check_png(out)?;
    }
    for dir in run_dirs {
        skein_report::check_run_dir(dir)?;
    }
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    warn_of_missing_keys(run_dirs, &keys)?;
    if let [dir] = run_dirs {
        let custom = (!keys.is_empty()).then_some(keys.as_slice());
        let png = match out {
            Some(out) => {
                skein_report::plot_run_to(dir, custom, out)?;
                out.to_path_buf()
            }
            None => skein_report::plot_run_dir(dir, custom)?,
        };
        println!("{}", png.display());
        return Ok(());
    }
    let out = out.unwrap_or(Path::new(DEFAULT_OVERLAY));
    let keys = if keys.is_empty() {
        skein_report::COMPARE_PANELS.to_vec()
    } else {
        keys
    };
    skein_report::compare_runs(run_dirs, &keys, out)?;
    println!("{}", out.display());
    Ok(())
}

/// A `--keys` metric no run has is drawn as nothing: said, with the keys the runs do have,
/// so a misspelt name is not a silently missing panel. (A default panel a run lacks is simply
/// left out.)
fn warn_of_missing_keys(run_dirs: &[PathBuf], keys: &[&str]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let (missing, present) = skein_report::missing_keys(run_dirs, keys)?;
    if missing.is_empty() {
        return Ok(());
    }
    let missing: Vec<String> = missing.iter().map(|k| format!("`{k}`")).collect();
    let have: Vec<&str> = present
        .iter()
        .map(String::as_str)
        .filter(|k| *k != "step")
        .collect();
    eprintln!(
        "skein plot: warning: no record has a value of {}, so it is not drawn; the runs have: {}",
        missing.join(", "),
        have.join(", ")
    );
    Ok(())
}

/// The figure goes where the user says, over whatever is there: only a PNG's name is taken,
/// so a slip of the path cannot turn a run's config or metrics into an image.
fn check_png(out: &Path) -> Result<()> {
    let is_png = out
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !is_png {
        anyhow::bail!(
            "--out {}: the figure is a PNG image; name a file ending in .png",
            out.display()
        );
    }
    Ok(())
}
