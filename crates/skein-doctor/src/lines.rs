//! Reading a run's JSON-lines files with bounded memory: a line longer than the limit is
//! skipped without being held (a hostile or corrupted file can be one line of gigabytes).

use std::io::{self, BufRead, Read};

/// One line of a bounded read.
pub enum Line<'a> {
    /// A line within the limit, without its newline's bytes removed.
    Kept(&'a [u8]),
    /// A line over the limit, skipped.
    TooLong,
}

/// Calls `f` for each of the first `max_lines` lines of `reader`; lines over `max_line` bytes
/// are reported as [`Line::TooLong`] and read past in chunks.
pub fn for_each_line(
    mut reader: impl BufRead,
    max_line: usize,
    max_lines: usize,
    mut f: impl FnMut(Line),
) -> io::Result<()> {
    let mut line = Vec::new();
    for _ in 0..max_lines {
        line.clear();
        let n = (&mut reader)
            .take(max_line as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        if line.len() > max_line {
            skip_line(&mut reader)?;
            f(Line::TooLong);
        } else {
            f(Line::Kept(&line));
        }
    }
    Ok(())
}

/// Reads up to and past the next newline without keeping what it reads.
fn skip_line(reader: &mut impl BufRead) -> io::Result<()> {
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                reader.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                reader.consume(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_skipped_and_the_rest_read_up_to_the_line_limit() {
        let text = format!("a\n{}\nbb\nccc\nd", "x".repeat(100));
        let mut seen = Vec::new();
        for_each_line(text.as_bytes(), 10, 4, |l| {
            seen.push(match l {
                Line::Kept(b) => String::from_utf8_lossy(b).trim().to_string(),
                Line::TooLong => "<long>".into(),
            })
        })
        .unwrap();
        assert_eq!(seen, vec!["a", "<long>", "bb", "ccc"]);
    }
}
