//! Rows as a reader collects them: the good ones, and the bad ones skipped (counted) or, without
//! `skip_bad_rows`, the first bad one as the error. Every file format reads into this.

use crate::error::DataError;
use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Skip (and count) rows that fail validation, instead of stopping at the first.
    pub skip_bad_rows: bool,
}

/// Where a row was read: its file and 1-based row (a JSONL file's line, a parquet file's
/// record), shown as a [`DataError`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowPlace {
    pub file: PathBuf,
    pub row: usize,
}

impl RowPlace {
    /// An error about the row read here.
    pub fn error(&self, message: impl Into<String>) -> DataError {
        DataError::row(&self.file, self.row, message)
    }
}

impl fmt::Display for RowPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, row {}", self.file.display(), self.row)
    }
}

/// Rows read so far, where each was read, and the bad ones skipped (each with its file, row
/// and reason).
#[derive(Debug, Clone)]
pub struct Rows<T> {
    pub rows: Vec<T>,
    /// Parallel to `rows`: so a check made after reading can still name the row.
    pub places: Vec<RowPlace>,
    pub skipped: Vec<DataError>,
}

impl<T> Default for Rows<T> {
    fn default() -> Self {
        Rows {
            rows: Vec::new(),
            places: Vec::new(),
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
            Ok(r) => {
                self.rows.push(r);
                self.places.push(RowPlace {
                    file: file.to_path_buf(),
                    row,
                });
            }
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

    /// The error of files that left no row (`what`: "rows", "conversations"), naming the
    /// first bad row when every one was skipped as bad.
    pub(crate) fn none_left(&self, files: &[PathBuf], what: &str) -> DataError {
        let first = files.first().map(PathBuf::as_path).unwrap_or(Path::new(""));
        let why = match self.skipped.first() {
            Some(e) => format!("; all {} were bad, the first: {e}", self.skipped.len()),
            None => String::new(),
        };
        DataError::file(first, format!("no {what} in {} file(s){why}", files.len()))
    }

    pub(crate) fn extend(&mut self, other: Rows<T>) {
        self.rows.extend(other.rows);
        self.places.extend(other.places);
        self.skipped.extend(other.skipped);
    }
}
