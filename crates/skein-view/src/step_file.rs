//! Reading one step's trajectories (`trajectories/step-N.jsonl.zst`) within the viewer's
//! limits. zstd shrinks repetitive text a thousandfold, so a tiny file can decode to gigabytes:
//! the decoded bytes are counted, and so are the JSON values each line holds, before the line is
//! parsed, since a value costs memory beyond its bytes once parsed.

use crate::limits::{size, Limits, Refused};
use crate::lines::{open_regular, BoundedLines, Line};
use anyhow::{Context, Result};
use skein_report::trajectories::{RowRecord, TrajectoryRecord};
use std::mem::size_of;
use std::path::Path;

/// The records of one step file and the memory they hold.
pub struct Step {
    pub records: Vec<TrajectoryRecord>,
    pub held_bytes: usize,
}

/// Reads the step file at `path` (`shown` in messages). A bad line is an error naming the file
/// and line; a file past the limits is [`Refused`], naming the limit.
pub fn read(path: &Path, shown: &str, limits: &Limits) -> Result<Step> {
    let unreadable = |n: usize| format!("{shown}:{n}: unreadable (not a zstd JSONL file?)");
    let file = open_regular(path, shown)?;
    let z = zstd::Decoder::new(file).with_context(|| unreadable(1))?;
    let bytes = limits.step_file_bytes;
    let mut lines = BoundedLines::new(z, bytes, usize::MAX);
    let mut values = ValueCount::default();
    let mut records = Vec::new();
    let mut held_bytes = size_of::<Vec<TrajectoryRecord>>();
    let mut line = Vec::new();
    loop {
        let within = |piece: &[u8]| values.add(piece) <= limits.step_file_values;
        match lines
            .next(&mut line, within)
            .with_context(|| unreadable(lines.number() + 1))?
        {
            Line::End if lines.cut_short() => {
                return Err(Refused(format!(
                    "{shown} decodes to more than {}, the most the viewer reads of a step file",
                    size(bytes)
                ))
                .into())
            }
            Line::End => break,
            Line::Stopped => {
                return Err(Refused(format!(
                    "{shown}:{}: more than {} JSON values (tokens and their fields) in the file, \
                     the most the viewer keeps of a step",
                    lines.number(),
                    limits.step_file_values
                ))
                .into())
            }
            // No line limit is set below the file's: the file's bound ends a line first.
            Line::TooLong => unreachable!("a line longer than usize::MAX bytes"),
            Line::Read => {}
        }
        values.end_line();
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let n = lines.number();
        let record: TrajectoryRecord = serde_json::from_slice(&line)
            .with_context(|| format!("{shown}:{n}: not a trajectory record"))?;
        held_bytes += held_by(&record);
        records.push(record);
    }
    held_bytes += (records.capacity() - records.len()) * size_of::<TrajectoryRecord>();
    Ok(Step {
        records,
        held_bytes,
    })
}

/// An upper bound on the JSON values in text seen so far: every value but a line's first
/// follows a comma or opens an array or object. Commas and brackets inside strings are text.
#[derive(Default)]
struct ValueCount {
    count: usize,
    in_string: bool,
    escaped: bool,
}

impl ValueCount {
    /// Counts `piece`; returns the count so far.
    fn add(&mut self, piece: &[u8]) -> usize {
        for &b in piece {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
            } else {
                match b {
                    b'"' => self.in_string = true,
                    b',' | b'[' | b'{' => self.count += 1,
                    _ => {}
                }
            }
        }
        self.count
    }

    /// A line is one JSON value: a string left open ends with it.
    fn end_line(&mut self) {
        self.in_string = false;
        self.escaped = false;
    }
}

/// Heap memory a record holds: its vectors' capacities and its strings, each block rounded
/// as a general-purpose allocator rounds it (16-byte steps, 32 bytes at least).
pub fn held_by(t: &TrajectoryRecord) -> usize {
    size_of::<TrajectoryRecord>()
        + [&t.id, &t.group, &t.source]
            .into_iter()
            .chain(t.reason.as_ref())
            .map(|s| block(s.capacity()))
            .sum::<usize>()
        + vec(&t.turn_rewards)
        + vec(&t.rows)
        + t.rows.iter().map(row_held).sum::<usize>()
}

fn row_held(r: &RowRecord) -> usize {
    vec(&r.prompt_ids)
        + texts(&r.prompt_text)
        + vec(&r.response_ids)
        + texts(&r.response_text)
        + vec(&r.loss_mask)
        + vec(&r.behavior_logp)
        + vec(&r.versions)
        + vec(&r.advantages)
        + vec(&r.is_weight)
}

fn vec<T>(v: &Vec<T>) -> usize {
    block(v.capacity() * size_of::<T>())
}

fn texts(v: &Vec<String>) -> usize {
    vec(v) + v.iter().map(|s| block(s.capacity())).sum::<usize>()
}

fn block(bytes: usize) -> usize {
    if bytes == 0 {
        0
    } else {
        (bytes + 8).next_multiple_of(16).max(32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_values_but_not_text_inside_strings() {
        let mut c = ValueCount::default();
        assert_eq!(c.add(br#"{"a": [1, 2, 3], "b": "x,[{"#), 5);
        // A piece may end inside a string or after an escape: the state carries over.
        assert_eq!(c.add(br#"\",y", "c": {}}"#), 7);
        c.end_line();
        assert_eq!(c.add(br#""unclosed, [ string"#), 7);
        c.end_line();
        assert_eq!(c.add(b"[,]"), 9);
    }

    #[test]
    fn counts_allocator_blocks() {
        assert_eq!((block(0), block(1), block(24), block(25)), (0, 32, 32, 48));
    }
}
