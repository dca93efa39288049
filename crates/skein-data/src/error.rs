use std::fmt;
use std::path::{Path, PathBuf};

/// A problem with a data file, or with one row of it (`row` is 1-based: the line of a JSONL
/// file, the record of a parquet file).
#[derive(Debug, Clone, PartialEq)]
pub struct DataError {
    pub file: PathBuf,
    pub row: Option<usize>,
    pub message: String,
}

impl DataError {
    pub fn file(file: &Path, message: impl Into<String>) -> Self {
        DataError {
            file: file.to_path_buf(),
            row: None,
            message: message.into(),
        }
    }

    pub fn row(file: &Path, row: usize, message: impl Into<String>) -> Self {
        DataError {
            file: file.to_path_buf(),
            row: Some(row),
            message: message.into(),
        }
    }
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.row {
            Some(row) => write!(f, "{}, row {row}: {}", self.file.display(), self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for DataError {}
