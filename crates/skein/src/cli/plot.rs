//! `skein plot`: a run's curves as a PNG, or several runs overlaid.

use anyhow::Result;
use std::path::PathBuf;

/// `skein plot`: a run's own plot.png, or several runs overlaid in one PNG.
pub fn run(run_dirs: &[PathBuf], keys: &[String], out: &std::path::Path) -> Result<()> {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    if let [dir] = run_dirs {
        let custom = (!keys.is_empty()).then_some(keys.as_slice());
        let png = skein_report::plot_run_dir(dir, custom)?;
        println!("{}", png.display());
        return Ok(());
    }
    // The overlay goes where the user says, over whatever is there: only a PNG's name is
    // taken, so a slip of the path cannot turn a run's config or metrics into an image.
    let is_png = out
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !is_png {
        anyhow::bail!(
            "--out {}: the overlay is a PNG image; name a file ending in .png",
            out.display()
        );
    }
    let keys = if keys.is_empty() {
        skein_report::COMPARE_PANELS.to_vec()
    } else {
        keys
    };
    skein_report::compare_runs(run_dirs, &keys, out)?;
    println!("{}", out.display());
    Ok(())
}
