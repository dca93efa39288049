//! Reading a run's files line by line within bounds: only regular files are opened, a line is
//! read up to a length and the file up to a number of bytes, so neither one endless line nor
//! a link to `/dev/zero` makes the viewer allocate without end.

use crate::limits::Refused;
use anyhow::{Context, Result};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Take};
use std::path::Path;

/// Opens `path` for reading if it is a regular file (a link to one included); `shown` names
/// it in messages. A device, a FIFO or a directory is refused: reading one may never end.
pub fn open_regular(path: &Path, shown: &str) -> Result<File> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {shown}"))?;
    if !meta.is_file() {
        return Err(not_regular(shown));
    }
    let file = File::open(path).with_context(|| format!("opening {shown}"))?;
    // What was opened is what counts: the path may have been replaced in between.
    let opened = file
        .metadata()
        .with_context(|| format!("reading {shown}"))?;
    if !opened.is_file() {
        return Err(not_regular(shown));
    }
    Ok(file)
}

fn not_regular(shown: &str) -> anyhow::Error {
    Refused(format!(
        "{shown} is not a regular file (a device, a pipe or a directory): the viewer does not \
         read it"
    ))
    .into()
}

/// What [`BoundedLines::next`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A line, whole, without its newline.
    Read,
    /// A line longer than the limit: skipped to its end, nothing of it kept.
    TooLong,
    /// The inspector refused a piece of the line; reading stopped there.
    Stopped,
    /// The end of the file, or of the bytes allowed ([`BoundedLines::cut_short`] tells which).
    End,
}

/// The lines of a reader, each up to `line_limit` bytes, `byte_limit` bytes in all.
pub struct BoundedLines<R: Read> {
    reader: BufReader<Take<R>>,
    byte_limit: u64,
    line_limit: usize,
    consumed: u64,
    number: usize,
    /// The line last read ended at the end of the file, without a newline.
    unfinished: bool,
}

impl<R: Read> BoundedLines<R> {
    pub fn new(inner: R, byte_limit: u64, line_limit: usize) -> BoundedLines<R> {
        BoundedLines {
            // One byte past the limit tells a file that ends there from one that goes on.
            reader: BufReader::new(inner.take(byte_limit.saturating_add(1))),
            byte_limit,
            line_limit,
            consumed: 0,
            number: 0,
            unfinished: false,
        }
    }

    /// The number of the line last read (1 for the first).
    pub fn number(&self) -> usize {
        self.number
    }

    /// The line last read had no newline: the file ended in it, perhaps while it was being
    /// written.
    pub fn unfinished(&self) -> bool {
        self.unfinished
    }

    /// The file goes on past the bytes allowed.
    pub fn cut_short(&self) -> bool {
        self.consumed > self.byte_limit
    }

    /// Reads the next line into `line`. Each piece is shown to `inspect` as it arrives, before
    /// it is kept; `false` stops reading there (e.g. at a count it keeps).
    pub fn next(
        &mut self,
        line: &mut Vec<u8>,
        mut inspect: impl FnMut(&[u8]) -> bool,
    ) -> std::io::Result<Line> {
        line.clear();
        let mut too_long = false;
        let mut any = false;
        self.unfinished = true;
        loop {
            let chunk = self.reader.fill_buf()?;
            if chunk.is_empty() {
                break;
            }
            any = true;
            let (piece_len, used, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i, i + 1, true),
                None => (chunk.len(), chunk.len(), false),
            };
            let piece = &chunk[..piece_len];
            if !too_long {
                if line.len() + piece.len() > self.line_limit {
                    too_long = true;
                    line.clear();
                } else if inspect(piece) {
                    line.extend_from_slice(piece);
                } else {
                    self.number += 1;
                    return Ok(Line::Stopped);
                }
            }
            self.reader.consume(used);
            self.consumed += used as u64;
            if done {
                self.unfinished = false;
                break;
            }
        }
        if !any || self.cut_short() {
            // The last piece of a file cut at the limit is not a line.
            line.clear();
            return Ok(Line::End);
        }
        self.number += 1;
        Ok(if too_long { Line::TooLong } else { Line::Read })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(text: &[u8], byte_limit: u64, line_limit: usize) -> (Vec<String>, bool) {
        let mut lines = BoundedLines::new(text, byte_limit, line_limit);
        let mut out = Vec::new();
        let mut line = Vec::new();
        loop {
            match lines.next(&mut line, |_| true).unwrap() {
                Line::Read => out.push(String::from_utf8(line.clone()).unwrap()),
                Line::TooLong => out.push(format!("<{} too long>", lines.number())),
                Line::Stopped => unreachable!(),
                Line::End => return (out, lines.cut_short()),
            }
        }
    }

    #[test]
    fn long_lines_are_skipped_whole_and_the_rest_read() {
        let text = b"ab\nabcdefgh\n\nxyz";
        assert_eq!(
            all(text, 100, 3),
            (
                vec!["ab".into(), "<2 too long>".into(), "".into(), "xyz".into()],
                false
            )
        );
        // A reader's buffer is smaller than a long line: it is skipped across many fills.
        let long = [vec![b'x'; 100_000], b"\nok".to_vec()].concat();
        assert_eq!(
            all(&long, 1 << 20, 10),
            (vec!["<1 too long>".into(), "ok".into()], false)
        );
    }

    #[test]
    fn reading_stops_at_the_byte_limit_without_a_partial_line() {
        let text = b"ab\ncd\nef\n";
        assert_eq!(
            all(text, 9, 10),
            (vec!["ab".into(), "cd".into(), "ef".into()], false)
        );
        assert_eq!(all(text, 7, 10), (vec!["ab".into(), "cd".into()], true));
        // An endless source (as /dev/zero is) ends at the limit.
        let (lines, cut) = all_of(std::io::repeat(0), 1 << 16, 1 << 10);
        assert_eq!((lines, cut), (0, true));
    }

    fn all_of(source: impl Read, byte_limit: u64, line_limit: usize) -> (usize, bool) {
        let mut lines = BoundedLines::new(source, byte_limit, line_limit);
        let mut line = Vec::new();
        let mut n = 0;
        while lines.next(&mut line, |_| true).unwrap() != Line::End {
            n += 1;
        }
        (n, lines.cut_short())
    }

    #[test]
    fn an_inspector_stops_a_line_before_it_is_kept() {
        let mut lines = BoundedLines::new(&b"aaaa\nbb\n"[..], 100, 100);
        let mut line = Vec::new();
        let mut seen = 0;
        let stop_after_three = |piece: &[u8]| {
            seen += piece.len();
            seen <= 3
        };
        assert_eq!(
            lines.next(&mut line, stop_after_three).unwrap(),
            Line::Stopped
        );
        assert_eq!(lines.number(), 1);
    }

    #[test]
    fn only_regular_files_are_opened() {
        let err = open_regular(Path::new("/dev/zero"), "zero").unwrap_err();
        assert!(err.downcast_ref::<Refused>().is_some());
        assert!(
            format!("{err}").contains("zero is not a regular file"),
            "{err}"
        );
        let dir = std::env::temp_dir();
        assert!(open_regular(&dir, "tmp").is_err());
    }
}
