//! JSON Lines: one JSON value per line; blank lines are allowed and skipped silently (they
//! hold no row), everything else must parse. A `.json` file may instead hold one JSON array of
//! rows (pandas' `to_json(orient="records")`, a Hugging Face export): its elements are the
//! rows, numbered from 1.

use crate::error::DataError;
use crate::rows::{ReadOptions, Rows};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;

/// Reads every row of `file` through `convert`; bad rows are errors or counted skips.
pub fn read<T>(
    file: &Path,
    opts: &ReadOptions,
    convert: impl Fn(&Value) -> Result<T, String>,
) -> Result<Rows<T>, DataError> {
    let f = std::fs::File::open(file)
        .map_err(|e| DataError::file(file, format!("cannot open: {e}")))?;
    let mut reader = BufReader::new(f);
    if file.extension().is_some_and(|e| e == "json") && starts_an_array(&mut reader, file)? {
        return read_array(reader, file, opts, convert);
    }
    read_from(reader, file, opts, convert)
}

/// Whether the text ahead (past a byte-order mark and white space) opens a JSON array. Only
/// the buffered start is looked at, and nothing is consumed: a file of JSON lines is then read
/// from its first line, numbered as it is.
fn starts_an_array(reader: &mut impl BufRead, file: &Path) -> Result<bool, DataError> {
    let ahead = reader
        .fill_buf()
        .map_err(|e| DataError::file(file, format!("read error: {e}")))?;
    let ahead = ahead.strip_prefix("\u{feff}".as_bytes()).unwrap_or(ahead);
    Ok(ahead.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'['))
}

/// One JSON array of rows; the file must parse as a whole, its elements are rows 1, 2, ….
fn read_array<T>(
    mut reader: impl BufRead,
    file: &Path,
    opts: &ReadOptions,
    convert: impl Fn(&Value) -> Result<T, String>,
) -> Result<Rows<T>, DataError> {
    let mut text = String::new();
    reader
        .read_to_string(&mut text)
        .map_err(|e| DataError::file(file, format!("read error (not UTF-8 text?): {e}")))?;
    let rows: Vec<Value> = serde_json::from_str(text.trim_start_matches('\u{feff}'))
        .map_err(|e| DataError::file(file, format!("unparsable JSON array of rows: {e}")))?;
    let mut out = Rows::default();
    for (i, value) in rows.iter().enumerate() {
        out.push(convert(value), file, i + 1, opts)?;
    }
    Ok(out)
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
            Ok(text) => match serde_json::from_str::<Value>(text.trim_start_matches('\u{feff}')) {
                // A whole dataset on one line, or a file of arrays: no line is a row, and
                // skipping it as one bad row would lose every row in silence.
                Ok(Value::Array(_)) => return Err(array_line(file, line)),
                parsed => parsed
                    .map_err(|e| format!("unparsable JSON: {e}"))
                    .and_then(|v| convert(&v)),
            },
        };
        out.push(parsed, file, line, opts)?;
    }
    Ok(out)
}

fn array_line(file: &Path, line: usize) -> DataError {
    DataError::file(
        file,
        format!(
            "line {line} is a JSON array, where JSON lines hold one object per line (a prompt \
             row, or a `{{\"messages\": [...]}}` conversation); pandas writes them with \
             `to_json(path, orient=\"records\", lines=True)`, and a `.json` file may hold one \
             array of such objects instead"
        ),
    )
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
        text.extend_from_slice(b"\xff\xfe\n7\n");
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

    /// A line holding an array is no row: the file is refused, skipping or not, instead of
    /// losing a whole dataset written on one line as one skipped row.
    #[test]
    fn a_line_holding_an_array_refuses_the_file() {
        let text = format!("{GOOD}\n[{GOOD}, {GOOD}]\n");
        for skip in [false, true] {
            let err = read_text(text.as_bytes(), skip).unwrap_err();
            assert_eq!(err.row, None, "{err}");
            assert!(err.to_string().contains("line 2 is a JSON array"), "{err}");
            assert!(err.to_string().contains("one object per line"), "{err}");
        }
    }

    /// A `.json` file of one array (after a byte-order mark and white space) reads its elements
    /// as rows, a bad one named by its place in the array; one of JSON lines reads as lines.
    #[test]
    fn a_json_file_of_one_array_reads_its_elements_as_rows() {
        let dir = std::env::temp_dir().join(format!("skein-data-array-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("rows.json");
        let bad = r#"{"prompt": "1+1="}"#;
        let text = format!("\u{feff}\n  [{GOOD},\n {bad},\n {GOOD}]\n");
        std::fs::write(&file, text).unwrap();
        let opts = |skip_bad_rows| ReadOptions { skip_bad_rows };
        let rows = read(&file, &opts(true), from_json).unwrap();
        assert_eq!(rows.rows.len(), 2);
        let places: Vec<usize> = rows.places.iter().map(|p| p.row).collect();
        assert_eq!(places, [1, 3]);
        let err = read(&file, &opts(false), from_json).unwrap_err();
        assert_eq!(err.row, Some(2), "{err}");
        std::fs::write(&file, format!("[{GOOD}, {{oops]")).unwrap();
        let err = read(&file, &opts(true), from_json).unwrap_err();
        assert!(err.to_string().contains("unparsable JSON array"), "{err}");
        std::fs::write(&file, format!("{GOOD}\n{GOOD}\n")).unwrap();
        assert_eq!(read(&file, &opts(false), from_json).unwrap().rows.len(), 2);
        // JSON lines after blank lines: a bad line is named by its own number.
        std::fs::write(&file, format!("\n\n{GOOD}\n{bad}\n")).unwrap();
        let err = read(&file, &opts(false), from_json).unwrap_err();
        assert_eq!(err.row, Some(4), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
