//! Rows as a reader collects them: the good ones, and the bad ones skipped (counted) or, without
//! `skip_bad_rows`, the first bad one as the error. Every file format reads into this.

use crate::error::DataError;
use std::path::Path;

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

    pub(crate) fn extend(&mut self, other: Rows<T>) {
        self.rows.extend(other.rows);
        self.skipped.extend(other.skipped);
    }
}
