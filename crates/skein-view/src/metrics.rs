//! A run's `metrics.jsonl` as the page draws it: every record that has a numeric `step`, and
//! the names of the numeric metrics among them. Streamed line by line straight into the reply's
//! JSON, so memory follows the bytes kept rather than a parsed tree of the whole file; lines
//! past the limits are skipped, and the reply says which.

use crate::limits::{size, Limits};
use crate::lines::{open_regular, BoundedLines, Line};
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

/// The reply when there is no `metrics.jsonl` (yet).
pub fn missing_reply(run: usize) -> Vec<u8> {
    format!(r#"{{"run":{run},"metrics":{{"records":[],"keys":[],"missing":true,"skipped":null}}}}"#)
        .into_bytes()
}

/// The API's reply for run `run`'s metrics at `path` (`shown` in messages):
/// `{"run", "metrics": {"records", "keys", "missing", "skipped"}}`, where `skipped` says what
/// the limits left out (null: nothing). A line that is not a JSON object is an error naming it,
/// except a last line without its newline: a record still being written, left out.
pub fn reply(path: &Path, shown: &str, run: usize, limits: &Limits) -> Result<Vec<u8>> {
    let file = open_regular(path, shown)?;
    let mut lines = BoundedLines::new(file, limits.metrics_bytes, limits.metrics_line_bytes);
    let mut body = format!(r#"{{"run":{run},"metrics":{{"records":["#).into_bytes();
    let mut keys = BTreeSet::new();
    let mut skipped = Skipped::default();
    let mut line = Vec::new();
    let mut first = true;
    loop {
        if lines.number() == limits.metrics_lines {
            skipped.after_line = Some(lines.number());
            break;
        }
        let read = lines
            .next(&mut line, |_| true)
            .with_context(|| format!("{shown}:{}: unreadable line", lines.number() + 1))?;
        match read {
            Line::End => break,
            Line::TooLong => skipped.long.push(lines.number()),
            // The last line of a run still writing it may be a record's first bytes.
            Line::Read if lines.unfinished() && parse(&line, shown, 0).is_err() => break,
            Line::Read | Line::Stopped => {
                let n = lines.number();
                let Some(record) = parse(&line, shown, n)? else {
                    continue;
                };
                if !first {
                    body.push(b',');
                }
                first = false;
                serde_json::to_writer(&mut body, &record)?;
                keys.extend(numeric_keys(&record));
            }
        }
    }
    if lines.cut_short() {
        skipped.after_bytes = Some(limits.metrics_bytes);
    }
    if skipped.after_line.is_some() && !more_follows(&mut lines, &mut line) {
        skipped.after_line = None;
    }
    body.extend_from_slice(br#"],"keys":"#);
    serde_json::to_writer(&mut body, &keys)?;
    body.extend_from_slice(br#","missing":false,"skipped":"#);
    serde_json::to_writer(&mut body, &skipped.describe(shown, limits))?;
    body.extend_from_slice(b"}}");
    Ok(body)
}

/// One line as a record to draw: None for a blank line or a record without a numeric `step`.
fn parse(line: &[u8], shown: &str, n: usize) -> Result<Option<serde_json::Map<String, Value>>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: Value =
        serde_json::from_slice(line).with_context(|| format!("{shown}:{n}: not a JSON object"))?;
    let Value::Object(record) = value else {
        anyhow::bail!("{shown}:{n}: not a JSON object");
    };
    Ok(record
        .get("step")
        .is_some_and(Value::is_number)
        .then_some(record))
}

fn numeric_keys(record: &serde_json::Map<String, Value>) -> impl Iterator<Item = String> + '_ {
    record
        .iter()
        .filter(|(k, v)| k.as_str() != "step" && v.is_number())
        .map(|(k, _)| k.clone())
}

/// Whether anything but blank lines follows where reading stopped.
fn more_follows(lines: &mut BoundedLines<std::fs::File>, line: &mut Vec<u8>) -> bool {
    loop {
        match lines.next(line, |_| true) {
            Ok(Line::End) => return lines.cut_short(),
            Ok(Line::Read) if line.iter().all(u8::is_ascii_whitespace) => continue,
            _ => return true,
        }
    }
}

/// What the limits left out of a file.
#[derive(Default)]
struct Skipped {
    /// Numbers of the lines that were too long.
    long: Vec<usize>,
    /// Reading stopped after this line, at the limit on lines.
    after_line: Option<usize>,
    /// Reading stopped at this many bytes.
    after_bytes: Option<u64>,
}

impl Skipped {
    fn describe(&self, shown: &str, limits: &Limits) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(&first) = self.long.first() {
            parts.push(format!(
                "{} line(s) longer than {} (the first is line {first})",
                self.long.len(),
                size(limits.metrics_line_bytes as u64)
            ));
        }
        if let Some(n) = self.after_line {
            parts.push(format!("every line after line {n}"));
        }
        if let Some(bytes) = self.after_bytes {
            parts.push(format!("everything after its first {}", size(bytes)));
        }
        (!parts.is_empty()).then(|| format!("{shown}: skipped {}", parts.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str, limits: &Limits) -> Value {
        let dir = std::env::temp_dir().join(format!("skein-view-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.jsonl", text.len()));
        std::fs::write(&path, text).unwrap();
        let body = reply(&path, "run/metrics.jsonl", 3, limits).unwrap();
        std::fs::remove_file(&path).ok();
        serde_json::from_slice(&body).unwrap()
    }

    #[test]
    fn keeps_stepped_records_and_their_numeric_keys() {
        let text = "{\"step\":1,\"a\":0.5,\"note\":\"x\"}\n\n{\"b\":1}\n{\"step\":2,\"b\":2}\n";
        let v = read(text, &Limits::DEFAULT);
        assert_eq!(v["run"], 3);
        let m = &v["metrics"];
        assert_eq!(m["keys"], serde_json::json!(["a", "b"]));
        assert_eq!(m["records"].as_array().unwrap().len(), 2);
        assert_eq!(m["records"][1]["b"], 2);
        assert_eq!(
            (&m["missing"], &m["skipped"]),
            (&false.into(), &Value::Null)
        );
        let none = serde_json::from_slice::<Value>(&missing_reply(0)).unwrap();
        assert_eq!(none["metrics"]["missing"], true);
    }

    /// A run appending a record may be read between its first bytes and its newline.
    #[test]
    fn a_record_still_being_written_is_left_out() {
        let v = read(
            "{\"step\":1}\n{\"step\":2}\n{\"step\":3,\"a\":0.",
            &Limits::DEFAULT,
        );
        assert_eq!(v["metrics"]["records"].as_array().unwrap().len(), 2);
        assert_eq!(v["metrics"]["skipped"], Value::Null);
        // A whole record that only lacks its newline is kept.
        let v = read("{\"step\":1}\n{\"step\":2}", &Limits::DEFAULT);
        assert_eq!(v["metrics"]["records"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn lines_past_the_limits_are_skipped_and_named() {
        let limits = Limits {
            metrics_line_bytes: 20,
            metrics_lines: 3,
            ..Limits::DEFAULT
        };
        let long = format!("{{\"step\":9,\"a\":\"{}\"}}", "x".repeat(30));
        let text = format!("{{\"step\":1}}\n{long}\n{{\"step\":3}}\n{{\"step\":4}}\n");
        let m = read(&text, &limits)["metrics"].clone();
        let steps: Vec<&Value> = m["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| &r["step"])
            .collect();
        assert_eq!(steps, [1, 3]);
        assert_eq!(
            m["skipped"],
            "run/metrics.jsonl: skipped 1 line(s) longer than 20 bytes (the first is line 2); \
             every line after line 3"
        );
        // At the limit on lines but nothing after: nothing skipped.
        let m = read("{\"step\":1}\n\n{\"step\":3}\n\n", &limits)["metrics"].clone();
        assert_eq!(m["skipped"], Value::Null);
        // And at the limit on bytes.
        let limits = Limits {
            metrics_bytes: 24,
            ..Limits::DEFAULT
        };
        let m = read("{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n", &limits)["metrics"].clone();
        assert_eq!(m["records"].as_array().unwrap().len(), 2);
        assert_eq!(
            m["skipped"],
            "run/metrics.jsonl: skipped everything after its first 24 bytes"
        );
    }
}
