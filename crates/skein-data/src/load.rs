//! Loading a split: a list of files, each read by the format its extension names.

use crate::error::DataError;
use crate::row::{from_json, PromptRow};
use crate::rows::{ReadOptions, Rows};
use std::path::{Path, PathBuf};

/// A loaded split.
pub type Loaded = Rows<PromptRow>;

/// The formats by file extension.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Format {
    Jsonl,
    Parquet,
}

impl Format {
    pub fn of(file: &Path) -> Result<Format, DataError> {
        match file.extension().and_then(|e| e.to_str()) {
            Some("jsonl") | Some("json") => Ok(Format::Jsonl),
            Some("parquet") => Ok(Format::Parquet),
            _ => Err(DataError::file(
                file,
                "unknown data file format (allowed extensions: .jsonl for JSON lines, .json for \
                 JSON lines or one JSON array of rows, .parquet)",
            )),
        }
    }
}

/// Reads every file of a split, in order. A split with no row left is an error.
pub fn load(files: &[PathBuf], opts: &ReadOptions) -> Result<Loaded, DataError> {
    let mut all = Loaded::default();
    for file in files {
        let rows = match Format::of(file)? {
            Format::Jsonl => crate::jsonl::read(file, opts, from_json)?,
            Format::Parquet => crate::parquet::read(file, opts)?,
        };
        all.extend(rows);
    }
    if all.rows.is_empty() {
        return Err(all.none_left(files, "rows"));
    }
    Ok(all)
}
