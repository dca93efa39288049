//! TensorBoard event files, written directly: a TFRecord stream of protobuf `Event`s, encoded
//! here by hand (three message types with a handful of fields need no protobuf crate).
//!
//! A run's event file holds exactly the records of its `metrics.jsonl`: [`EventWriter::rebuild`]
//! starts it from the records already there (a resumed run's, cut back to its checkpoint), so
//! TensorBoard never shows a step the log no longer has, and [`EventWriter::append`] adds each
//! new record, flushed as written.

use crate::record::Record;
use anyhow::{Context, Result};
use serde_json::Value;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The run directory's folder of event files (`tensorboard --logdir` takes it or any parent).
pub const DIR: &str = "tensorboard";

/// What every event file names itself as in its first event: the version TensorBoard reads.
const FILE_VERSION: &str = "brain.Event:2";

/// What TensorBoard looks for in a file name: it reads every file of a directory whose name
/// contains it.
const EVENTS_MARK: &str = "tfevents";

/// The file a rebuild writes before renaming it into place: without [`EVENTS_MARK`] in its
/// name, so TensorBoard never reads a half-written file. A crash's leftover is overwritten.
const PARTIAL: &str = "events.partial";

/// Appends records to one event file, one `Event` per record.
pub struct EventWriter {
    file: File,
    path: PathBuf,
}

impl EventWriter {
    /// The event file of `dir`, holding `records` and nothing else. It is written under a
    /// temporary name that TensorBoard ignores and renamed into place once complete; every
    /// other event file of `dir` is removed first, so no earlier run's steps remain beside it
    /// (a crash in between leaves no event file, which the next rebuild writes again).
    /// Rebuilt records carry the time of the rebuild (metrics.jsonl keeps no clock time).
    pub fn rebuild(dir: &Path, records: &[Record]) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let secs = now().floor() as u64;
        let name = format!("events.out.tfevents.{secs}.{}", host_name());
        let path = dir.join(&name);
        let tmp = dir.join(PARTIAL);
        let mut bytes = frame(&version_event(now()));
        for r in records {
            if let Some(event) = scalars_event(now(), r) {
                bytes.extend(frame(&event));
            }
        }
        let mut file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        file.write_all(&bytes)
            .and_then(|_| file.sync_all())
            .with_context(|| format!("writing {}", tmp.display()))?;
        for old in event_files(dir)? {
            if old != path {
                std::fs::remove_file(&old)
                    .with_context(|| format!("removing {}", old.display()))?;
            }
        }
        std::fs::rename(&tmp, &path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(EventWriter { file, path })
    }

    /// Writes `record`'s numbers as one event and flushes it. A record without a numeric
    /// `step`, or without another number, writes nothing.
    pub fn append(&mut self, record: &Record) -> Result<()> {
        let Some(event) = scalars_event(now(), record) else {
            return Ok(());
        };
        self.file
            .write_all(&frame(&event))
            .and_then(|_| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The event files in `dir`, by TensorBoard's own test of a name.
fn event_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry
            .with_context(|| format!("listing {}", dir.display()))?
            .path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.contains(EVENTS_MARK) && path.is_file() {
            found.push(path);
        }
    }
    Ok(found)
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's name for the file name (TensorBoard's convention), or `skein` when it
/// cannot be read; only characters safe in a file name are kept.
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    if name.is_empty() {
        "skein".into()
    } else {
        name
    }
}

// ---- Protobuf: `Event`, `Summary` and `Summary.Value`, only the fields written here. ----

/// Wire types: a varint, 8 fixed bytes, a length-prefixed field, 4 fixed bytes.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

fn key(out: &mut Vec<u8>, field: u8, wire: u8) {
    out.push((field << 3) | wire);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    key(out, field, LEN);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// `Event { wall_time = 1 (double), step = 2 (int64) }`, the start of every event.
fn event_head(wall_time: f64, step: i64) -> Vec<u8> {
    let mut e = Vec::new();
    key(&mut e, 1, FIXED64);
    e.extend_from_slice(&wall_time.to_le_bytes());
    key(&mut e, 2, VARINT);
    varint(&mut e, step as u64);
    e
}

/// The first event of a file: `file_version = 3`.
fn version_event(wall_time: f64) -> Vec<u8> {
    let mut e = event_head(wall_time, 0);
    bytes_field(&mut e, 3, FILE_VERSION.as_bytes());
    e
}

/// `record` as an event: `summary = 5` with one `Value { tag = 1, simple_value = 2 (float) }`
/// per number besides `step`. None when there is no step or nothing to show.
fn scalars_event(wall_time: f64, record: &Record) -> Option<Vec<u8>> {
    let step = record.get("step").and_then(Value::as_i64)?;
    let mut summary = Vec::new();
    for (tag, v) in record {
        let Some(v) = v.as_f64().filter(|_| tag != "step") else {
            continue;
        };
        let mut value = Vec::new();
        bytes_field(&mut value, 1, tag.as_bytes());
        key(&mut value, 2, FIXED32);
        value.extend_from_slice(&(v as f32).to_le_bytes());
        bytes_field(&mut summary, 1, &value);
    }
    if summary.is_empty() {
        return None;
    }
    let mut e = event_head(wall_time, step);
    bytes_field(&mut e, 5, &summary);
    Some(e)
}

// ---- TFRecord framing: length, its checksum, the data, its checksum. ----

/// One TFRecord: the length (u64, little-endian), the masked CRC32C of those 8 bytes, the
/// data, the masked CRC32C of the data.
fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// TFRecord's checksum: CRC32C rotated right by 15 bits plus a constant.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), a byte at a time from a table
/// built at compile time: event files are small, so speed does not matter.
fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tmp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("skein-tb-{}-{name}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn rec(v: Value) -> Record {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn crc32c_matches_known_vectors() {
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, of ones, and ascending.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&ascending), 0x46DD_794E);
        // TFRecord's mask, ((crc >> 15) | (crc << 17)) + 0xa282ead8, of the vector above.
        assert_eq!(masked_crc(b"123456789"), 0xC78A_B0E5);
    }

    /// What a reader sees of a file: each record's data, its framing checked.
    fn read_frames(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len_bytes: [u8; 8] = bytes[at..at + 8].try_into().unwrap();
            let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc(&len_bytes), "length checksum at {at}");
            let len = u64::from_le_bytes(len_bytes) as usize;
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc(data), "data checksum at {at}");
            out.push(data.to_vec());
            at += 16 + len;
        }
        out
    }

    /// A decoded protobuf field: its number and its value (a varint, fixed bytes or a
    /// length-prefixed payload).
    #[derive(Debug, PartialEq)]
    enum Field {
        Varint(u64),
        Fixed64([u8; 8]),
        Bytes(Vec<u8>),
        Fixed32([u8; 4]),
    }

    fn read_varint(b: &[u8], at: &mut usize) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let byte = b[*at];
            *at += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte < 0x80 {
                return v;
            }
            shift += 7;
        }
    }

    fn fields(b: &[u8]) -> Vec<(u64, Field)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < b.len() {
            let k = read_varint(b, &mut at);
            let f = match (k & 7) as u8 {
                VARINT => Field::Varint(read_varint(b, &mut at)),
                FIXED64 => {
                    at += 8;
                    Field::Fixed64(b[at - 8..at].try_into().unwrap())
                }
                LEN => {
                    let n = read_varint(b, &mut at) as usize;
                    at += n;
                    Field::Bytes(b[at - n..at].to_vec())
                }
                FIXED32 => {
                    at += 4;
                    Field::Fixed32(b[at - 4..at].try_into().unwrap())
                }
                w => panic!("wire type {w}"),
            };
            out.push((k >> 3, f));
        }
        out
    }

    /// An event's step, its (tag, value) pairs and its file version, if any.
    type Decoded = (i64, Vec<(String, f32)>, Option<String>);

    /// Decodes an event, failing on any field the writer does not write.
    fn decode(event: &[u8]) -> Decoded {
        let (mut step, mut scalars, mut version) = (0, Vec::new(), None);
        for (n, f) in fields(event) {
            match (n, f) {
                (1, Field::Fixed64(t)) => assert!(f64::from_le_bytes(t) > 1.6e9),
                (2, Field::Varint(s)) => step = s as i64,
                (3, Field::Bytes(v)) => version = Some(String::from_utf8(v).unwrap()),
                (5, Field::Bytes(summary)) => {
                    for (n, f) in fields(&summary) {
                        let (1, Field::Bytes(value)) = (n, f) else {
                            panic!("summary field {n}")
                        };
                        let vf = fields(&value);
                        let (Field::Bytes(tag), Field::Fixed32(v)) = (&vf[0].1, &vf[1].1) else {
                            panic!("value {vf:?}")
                        };
                        assert_eq!((vf[0].0, vf[1].0), (1, 2));
                        scalars.push((
                            String::from_utf8(tag.clone()).unwrap(),
                            f32::from_le_bytes(*v),
                        ));
                    }
                }
                (n, f) => panic!("unexpected field {n}: {f:?}"),
            }
        }
        (step, scalars, version)
    }

    fn events_in(dir: &Path) -> Vec<Decoded> {
        let files = event_files(dir).unwrap();
        assert_eq!(files.len(), 1, "{files:?}");
        let bytes = std::fs::read(&files[0]).unwrap();
        read_frames(&bytes).iter().map(|e| decode(e)).collect()
    }

    #[test]
    fn records_round_trip_through_the_framing_and_encoding() {
        let dir = tmp_dir("round-trip");
        let mut w = EventWriter::rebuild(&dir, &[]).unwrap();
        let name = w.path().file_name().unwrap().to_str().unwrap().to_string();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        w.append(&rec(json!({"step": 0, "eval/accuracy": 0.25})))
            .unwrap();
        // Non-numbers are left out; a record with no number, or no step, writes nothing.
        w.append(&rec(
            json!({"step": 300, "loss": -1.5e-3, "task": "x", "ok": true, "n": null}),
        ))
        .unwrap();
        w.append(&rec(json!({"step": 301, "task": "x"}))).unwrap();
        w.append(&rec(json!({"loss": 2.0}))).unwrap();
        // Flushed per record: readable while the writer is open.
        let events = events_in(&dir);
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].2.as_deref(), Some("brain.Event:2"));
        assert_eq!(events[1], (0, vec![("eval/accuracy".into(), 0.25)], None));
        assert_eq!(events[2], (300, vec![("loss".into(), -1.5e-3f32)], None));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_rebuild_holds_exactly_the_given_records() {
        let dir = tmp_dir("rebuild");
        let mut w = EventWriter::rebuild(&dir, &[]).unwrap();
        for step in 1..=5 {
            w.append(&rec(json!({"step": step, "r": step as f64})))
                .unwrap();
        }
        // Another run's file and a crash's partial file are replaced, other files kept.
        std::fs::write(dir.join("events.out.tfevents.1.other"), b"junk").unwrap();
        std::fs::write(dir.join(PARTIAL), b"half").unwrap();
        std::fs::write(dir.join("notes.txt"), b"mine").unwrap();
        let kept: Vec<Record> = (1..=2)
            .map(|s| rec(json!({"step": s, "r": s as f64})))
            .collect();
        let mut w = EventWriter::rebuild(&dir, &kept).unwrap();
        w.append(&rec(json!({"step": 3, "r": 30.0}))).unwrap();
        let steps: Vec<(i64, f32)> = events_in(&dir)[1..]
            .iter()
            .map(|(s, v, _)| (*s, v[0].1))
            .collect();
        assert_eq!(steps, [(1, 1.0), (2, 2.0), (3, 30.0)]);
        assert!(dir.join("notes.txt").exists());
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_metrics_log_mirrors_the_records_it_holds_and_appends() {
        let dir = tmp_dir("log");
        let path = dir.join("metrics.jsonl");
        let mut log = crate::MetricsLog::create(&path).unwrap();
        log.append(&rec(json!({"step": 0, "eval/accuracy": 0.5})))
            .unwrap();
        drop(log);
        let events = dir.join(DIR);
        let mut log = crate::MetricsLog::create(&path)
            .unwrap()
            .with_tensorboard(&events)
            .unwrap();
        log.append(&rec(json!({"step": 1, "reward/mean": 0.125})))
            .unwrap();
        let got: Vec<(i64, Vec<(String, f32)>)> = events_in(&events)[1..]
            .iter()
            .map(|(s, v, _)| (*s, v.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (0, vec![("eval/accuracy".into(), 0.5)]),
                (1, vec![("reward/mean".into(), 0.125)])
            ]
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
