//! The plot font, compiled in: plotters draws no text unless a font is registered, and a fresh
//! machine may have no font files at all.

use anyhow::{anyhow, Result};
use plotters::style::{register_font, FontStyle};
use std::sync::OnceLock;

/// Registers DejaVu Sans as plotters' "sans-serif" (regular and bold), once per process.
pub fn register() -> Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        for (style, bytes) in [
            (FontStyle::Normal, dejavu::sans::regular()),
            (FontStyle::Bold, dejavu::sans::bold()),
        ] {
            register_font("sans-serif", style, bytes)
                .map_err(|_| "the embedded DejaVu Sans font could not be read".to_string())?;
        }
        Ok(())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}
