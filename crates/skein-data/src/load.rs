//! Loading a split: a list of files, each read by the format its extension names.

use crate::error::DataError;
use crate::row::{from_json, PromptRow};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Skip (and count) rows that fail validation, instead of stopping at the first.
    pub skip_bad_rows: bool,
}

/// Rows read so far, and the bad ones skipped (each with its file, row and reason).
#[derive(Debug, Clone)]
pub struct Rows<T> {
    pub rows: Vec<T>,
    pub skipped: Vec<DataError>,
}

impl<T> Default for Rows<T> {
    fn default() -> Self {
        Rows {
            rows: Vec::new(),
            skipped: Vec::new(),
        }
    }
}

impl<T> Rows<T> {
    /// Takes one row's outcome: a row, a counted skip, or (without `skip_bad_rows`) the error.
    pub fn push(
        &mut self,
        parsed: Result<T, String>,
        file: &Path,
        row: usize,
        opts: &ReadOptions,
    ) -> Result<(), DataError> {
        match parsed {
            Ok(r) => self.rows.push(r),
            Err(message) => {
                let err = DataError::row(file, row, message);
                if !opts.skip_bad_rows {
                    return Err(err);
                }
                self.skipped.push(err);
            }
        }
        Ok(())
    }

    fn extend(&mut self, other: Rows<T>) {
        self.rows.extend(other.rows);
        self.skipped.extend(other.skipped);
    }
}

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
                "unknown data file format (allowed extensions: .jsonl, .json for JSON lines, \
                 .parquet)",
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
        let first = files.first().map(PathBuf::as_path).unwrap_or(Path::new(""));
        let why = match all.skipped.first() {
            Some(e) => format!("; all {} were bad, the first: {e}", all.skipped.len()),
            None => String::new(),
        };
        return Err(DataError::file(
            first,
            format!("no rows in {} file(s){why}", files.len()),
        ));
    }
    Ok(all)
}
