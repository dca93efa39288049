//! How much of a run's files the viewer reads and keeps. A run directory is data: a damaged or
//! hostile file (a 14 KB step file that decodes to gigabytes of tokens, one endless line, a
//! link to a device) must cost the viewer a bounded amount of memory and get a clear answer.

use std::fmt;

/// The bounds the viewer works within.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Decoded bytes read from one step file, which is also the most one request reads.
    pub step_file_bytes: u64,
    /// JSON values (array entries and fields) kept from one step file: each token of a
    /// record is several, and each costs memory beyond its bytes (a one-letter token text is
    /// 4 bytes of JSON and 56 in memory).
    pub step_file_values: usize,
    /// Memory the decoded step files kept for the next request may hold in all.
    pub step_cache_bytes: usize,
    /// Bytes of `metrics.jsonl` read; the rest is skipped, and the reply says so.
    pub metrics_bytes: u64,
    /// Longest `metrics.jsonl` line read; longer ones are skipped, and the reply says so.
    pub metrics_line_bytes: usize,
    /// Lines of `metrics.jsonl` read; the rest is skipped, and the reply says so.
    pub metrics_lines: usize,
    /// Memory the replies for `metrics.jsonl` kept for the next request may hold in all.
    pub metrics_cache_bytes: usize,
    /// Requests that read files at once; the others wait their turn.
    pub concurrent_reads: usize,
}

const MIB: usize = 1 << 20;

impl Limits {
    /// Room for a step of a few hundred thousand tokens and a `metrics.jsonl` of a million
    /// steps of a few dozen metrics, a few times over, in about 2 GiB at most.
    pub const DEFAULT: Limits = Limits {
        step_file_bytes: 128 * MIB as u64,
        step_file_values: 1 << 22,
        step_cache_bytes: 512 * MIB,
        metrics_bytes: 128 * MIB as u64,
        metrics_line_bytes: 64 << 10,
        metrics_lines: 1 << 20,
        metrics_cache_bytes: 256 * MIB,
        concurrent_reads: 2,
    };
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::DEFAULT
    }
}

/// A file the viewer will not read: what it is and which limit it passes. The API answers it
/// with 422 rather than 500: the file may be fine, but showing it is beyond the viewer.
#[derive(Debug)]
pub struct Refused(pub String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// `bytes` in the largest binary unit it is a whole number of, for messages.
pub fn size(bytes: u64) -> String {
    for (unit, name) in [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} bytes")
}
