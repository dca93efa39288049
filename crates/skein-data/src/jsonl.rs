//! JSON Lines: one JSON value per line; blank lines are allowed and skipped silently (they
//! hold no row), everything else must parse.

use crate::error::DataError;
use crate::rows::{ReadOptions, Rows};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;

/// Reads every line of `file` through `convert`; bad lines are errors or counted skips.
pub fn read<T>(
    file: &Path,
    opts: &ReadOptions,
    convert: impl Fn(&Value) -> Result<T, String>,
) -> Result<Rows<T>, DataError> {
    let f = std::fs::File::open(file)
        .map_err(|e| DataError::file(file, format!("cannot open: {e}")))?;
    read_from(BufReader::new(f), file, opts, convert)
}

/// [`read`] over any reader; `file` names it in errors.
pub fn read_from<T>(
    mut reader: impl BufRead,
    file: &Path,
    opts: &ReadOptions,
    convert: impl Fn(&Value) -> Result<T, String>,
) -> Result<Rows<T>, DataError> {
    let mut out = Rows::default();
    let mut buf = Vec::new();
    let mut line = 0;
    loop {
        buf.clear();
        // Bytes, not `lines()`: a line of invalid UTF-8 is one bad row, not a failed file.
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| DataError::file(file, format!("read error after line {line}: {e}")))?;
        if n == 0 {
            break;
        }
        line += 1;
        let parsed = match std::str::from_utf8(&buf) {
            Err(e) => Err(format!("not UTF-8 text ({e})")),
            Ok(text) if text.trim().is_empty() => continue,
            Ok(text) => serde_json::from_str::<Value>(text.trim_start_matches('\u{feff}'))
                .map_err(|e| format!("unparsable JSON: {e}"))
                .and_then(|v| convert(&v)),
        };
        out.push(parsed, file, line, opts)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::from_json;
    use std::path::PathBuf;

    fn read_text(text: &[u8], skip: bool) -> Result<Rows<crate::PromptRow>, DataError> {
        let opts = ReadOptions {
            skip_bad_rows: skip,
        };
        read_from(text, &PathBuf::from("t.jsonl"), &opts, from_json)
    }

    const GOOD: &str =
        r#"{"prompt": "1+1=", "data_source": "a", "reward_model": {"ground_truth": "2"}}"#;

    #[test]
    fn bad_lines_name_their_line_or_are_counted() {
        let mut text = format!("{GOOD}\n\n{{not json\n{GOOD}\n").into_bytes();
        text.extend_from_slice(b"\xff\xfe\n[1,2]\n");
        text.extend_from_slice(GOOD.as_bytes());
        let err = read_text(&text, false).unwrap_err();
        assert_eq!(err.row, Some(3), "{err}");
        assert!(
            err.to_string()
                .starts_with("t.jsonl, row 3: unparsable JSON"),
            "{err}"
        );
        let rows = read_text(&text, true).unwrap();
        assert_eq!(rows.rows.len(), 3);
        let lines: Vec<_> = rows.skipped.iter().map(|e| e.row).collect();
        assert_eq!(lines, vec![Some(3), Some(5), Some(6)]);
        assert!(rows.skipped[1].message.contains("not UTF-8"));
        assert!(rows.skipped[2].message.contains("expected a JSON object"));
    }
}
