//! Reading real files: JSONL and parquet written here, good rows, every kind of bad row, skip
//! counting, and file-level problems.

use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};
use serde_json::json;
use skein_data::parquet::{write, write_columns, write_columns_compressed, Leaf};
use skein_data::{load, ChatMessage, PromptRow, ReadOptions};
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skein-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn row(i: usize) -> PromptRow {
    PromptRow {
        prompt: vec![
            ChatMessage {
                role: "system".into(),
                content: "add".into(),
            },
            ChatMessage {
                role: "user".into(),
                content: format!("{i}+1="),
            },
        ],
        data_source: "arithmetic".into(),
        ground_truth: (i + 1).to_string(),
        extra_info: json!({"index": i}),
    }
}

const STRICT: ReadOptions = ReadOptions {
    skip_bad_rows: false,
};
const SKIP: ReadOptions = ReadOptions {
    skip_bad_rows: true,
};

#[test]
fn parquet_written_in_verl_layout_reads_back_row_for_row() {
    let path = tmp("good.parquet");
    let rows: Vec<_> = (0..25).map(row).collect();
    write(&path, &rows).unwrap();
    let loaded = load(&[path], &STRICT).unwrap();
    assert!(loaded.skipped.is_empty());
    assert_eq!(loaded.rows.len(), 25);
    for (got, want) in loaded.rows.iter().zip(&rows) {
        assert_eq!(got.prompt, want.prompt);
        assert_eq!(got.data_source, want.data_source);
        assert_eq!(got.ground_truth, want.ground_truth);
        // Written as JSON text.
        assert_eq!(got.extra_info, json!(want.extra_info.to_string()));
    }
}

/// Every codec pandas and polars write reads the same rows: snappy, gzip, brotli, zstd, lz4
/// and none.
#[test]
fn parquet_in_every_codec_pandas_and_polars_write_reads_the_same_rows() {
    let rows: Vec<RawRow> = vec![
        (Some(vec![("user", "2+3=")]), Some("a"), Some("5")),
        (
            Some(vec![("system", "be brief"), ("user", "7*6=")]),
            Some("b"),
            Some("42"),
        ),
    ];
    for compression in [
        Compression::SNAPPY,
        Compression::GZIP(GzipLevel::default()),
        Compression::BROTLI(BrotliLevel::default()),
        Compression::ZSTD(ZstdLevel::default()),
        Compression::LZ4_RAW,
        Compression::UNCOMPRESSED,
    ] {
        let path = tmp(&format!("codec-{compression}.parquet"));
        write_verl_rows_compressed(&path, &rows, compression);
        let loaded = load(&[path], &STRICT).unwrap_or_else(|e| panic!("{compression}: {e}"));
        let truths: Vec<&str> = loaded
            .rows
            .iter()
            .map(|r| r.ground_truth.as_str())
            .collect();
        assert_eq!(truths, ["5", "42"], "{compression}");
        assert_eq!(loaded.rows[1].prompt.len(), 2, "{compression}");
    }
}

/// The schema pandas/pyarrow write for a verl dataset: a three-level list of structs, a
/// `reward_model` struct and an `extra_info` struct with an integer; one row per case below.
const VERL_SCHEMA: &str = "message schema {
    optional group prompt (LIST) {
        repeated group list {
            optional group element {
                optional binary content (STRING);
                optional binary role (STRING);
            }
        }
    }
    optional binary data_source (STRING);
    optional group reward_model { optional binary ground_truth (STRING); }
    optional group extra_info { optional int64 index; }
}";

/// One test row: messages (None: a null prompt), data_source, ground_truth.
type RawRow<'a> = (
    Option<Vec<(&'a str, &'a str)>>,
    Option<&'a str>,
    Option<&'a str>,
);

fn write_verl_rows(path: &Path, rows: &[RawRow]) {
    write_verl_rows_compressed(path, rows, Compression::SNAPPY)
}

fn write_verl_rows_compressed(path: &Path, rows: &[RawRow], compression: Compression) {
    let (mut content, mut role, mut source, mut truth, mut index) = (
        Leaf::default(),
        Leaf::default(),
        Leaf::default(),
        Leaf::default(),
        Leaf::default(),
    );
    for (i, (msgs, ds, gt)) in rows.iter().enumerate() {
        match msgs {
            None => {
                content.push_null(0, 0);
                role.push_null(0, 0);
            }
            Some(m) if m.is_empty() => {
                content.push_null(1, 0);
                role.push_null(1, 0);
            }
            Some(m) => {
                for (k, (r, c)) in m.iter().enumerate() {
                    content.push_bytes(c, 4, i16::from(k > 0));
                    role.push_bytes(r, 4, i16::from(k > 0));
                }
            }
        }
        match ds {
            Some(s) => source.push_bytes(s, 1, 0),
            None => source.push_null(0, 0),
        }
        match gt {
            Some(s) => truth.push_bytes(s, 2, 0),
            None => truth.push_null(1, 0),
        }
        index.push_long(i as i64, 2, 0);
    }
    write_columns_compressed(
        path,
        VERL_SCHEMA,
        vec![content, role, source, truth, index],
        compression,
    )
    .unwrap();
}

#[test]
fn parquet_bad_rows_name_file_and_row_or_are_counted() {
    let path = tmp("bad.parquet");
    let user = Some(vec![("user", "2+2=")]);
    write_verl_rows(
        &path,
        &[
            (user.clone(), Some("a"), Some("4")),
            (None, Some("a"), Some("4")),
            (Some(vec![]), Some("a"), Some("4")),
            (user.clone(), None, Some("4")),
            (user.clone(), Some("a"), None),
            (
                Some(vec![("system", "be brief"), ("user", "3+3=")]),
                Some("b"),
                Some("6"),
            ),
        ],
    );
    let err = load(std::slice::from_ref(&path), &STRICT).unwrap_err();
    assert_eq!(err.row, Some(2));
    assert!(
        err.to_string()
            .contains("bad.parquet, row 2: missing `prompt`"),
        "{err}"
    );

    let loaded = load(&[path], &SKIP).unwrap();
    assert_eq!(loaded.rows.len(), 2);
    let reasons: Vec<_> = loaded
        .skipped
        .iter()
        .map(|e| (e.row, e.message.clone()))
        .collect();
    assert_eq!(
        reasons,
        vec![
            (Some(2), "missing `prompt`".to_string()),
            (Some(3), "`prompt` has no messages".to_string()),
            (Some(4), "missing `data_source`".to_string()),
            (Some(5), "missing `reward_model.ground_truth`".to_string()),
        ]
    );
    let last = &loaded.rows[1];
    assert_eq!(last.prompt.len(), 2);
    assert_eq!(last.prompt[0].content, "be brief");
    assert_eq!(last.extra_info, json!({"index": 5}));
}

#[test]
fn parquet_wrong_types_and_missing_columns_are_named() {
    // `prompt` as a number column: every row has the wrong type.
    let path = tmp("wrongtype.parquet");
    let schema = "message m { optional int64 prompt; optional binary data_source (STRING);
                              optional group reward_model { optional int64 ground_truth; } }";
    let (mut p, mut d, mut g) = (Leaf::default(), Leaf::default(), Leaf::default());
    p.push_long(3, 1, 0);
    d.push_bytes("a", 1, 0);
    g.push_long(7, 2, 0);
    write_columns(&path, schema, vec![p, d, g]).unwrap();
    let err = load(&[path], &STRICT).unwrap_err().to_string();
    assert!(
        err.contains(
            "row 1: `prompt` must be a list of chat messages or a string, got a number (3)"
        ),
        "{err}"
    );

    let path = tmp("nocolumn.parquet");
    let schema =
        "message m { optional binary question (STRING); optional binary data_source (STRING); }";
    let (mut q, mut d) = (Leaf::default(), Leaf::default());
    q.push_bytes("2+2=", 1, 0);
    d.push_bytes("a", 1, 0);
    write_columns(&path, schema, vec![q, d]).unwrap();
    let err = load(&[path], &SKIP).unwrap_err().to_string();
    assert!(
        err.contains("nocolumn.parquet: no column `prompt` (the file has: question, data_source)"),
        "{err}"
    );
}

/// Text stored as bytes without a string annotation, as some writers store it, is read as
/// the text, not as parquet's base64 of it; bytes that are not UTF-8 stay base64.
#[test]
fn parquet_text_stored_as_plain_bytes_is_read_as_text() {
    let path = tmp("binary.parquet");
    let schema = "message m { optional binary prompt; optional binary data_source;
                              optional group reward_model { optional binary ground_truth; }
                              optional binary extra_info; }";
    let (mut p, mut d) = (Leaf::default(), Leaf::default());
    let (mut g, mut x) = (Leaf::default(), Leaf::default());
    p.push_bytes("2+2=", 1, 0);
    d.push_bytes("sums", 1, 0);
    g.push_bytes("4", 2, 0);
    x.bytes.push(vec![0xff, 0xfe].into());
    x.def.push(1);
    x.rep.push(0);
    write_columns(&path, schema, vec![p, d, g, x]).unwrap();
    let loaded = load(&[path], &STRICT).unwrap();
    let row = &loaded.rows[0];
    assert_eq!(row.prompt[0].content, "2+2=");
    assert_eq!(row.data_source, "sums");
    assert_eq!(row.ground_truth, "4");
    assert_eq!(row.extra_info, json!("//4="));
}

/// A ground truth stored as a float32 is its shortest text: 1.1, not the 1.100000023841858
/// its widening to f64 prints, which no written answer equals.
#[test]
fn parquet_float32_ground_truths_read_as_written() {
    let path = tmp("float.parquet");
    let schema =
        "message m { optional binary prompt (STRING); optional binary data_source (STRING);
                              optional group reward_model { optional float ground_truth; } }";
    let (mut p, mut d, mut g) = (Leaf::default(), Leaf::default(), Leaf::default());
    for (q, truth) in [("0.5+0.6=", 1.1f32), ("2/5=", 0.4)] {
        p.push_bytes(q, 1, 0);
        d.push_bytes("sums", 1, 0);
        g.push_float(truth, 2, 0);
    }
    write_columns(&path, schema, vec![p, d, g]).unwrap();
    let loaded = load(&[path], &STRICT).unwrap();
    let truths: Vec<&str> = loaded
        .rows
        .iter()
        .map(|r| r.ground_truth.as_str())
        .collect();
    assert_eq!(truths, ["1.1", "0.4"]);
}

#[test]
fn file_level_problems_name_the_file() {
    let missing = tmp("absent.jsonl");
    let err = load(&[missing], &STRICT).unwrap_err().to_string();
    assert!(err.contains("absent.jsonl: cannot open"), "{err}");
    let csv = tmp("data.csv");
    std::fs::write(&csv, "a,b\n").unwrap();
    let err = load(&[csv], &STRICT).unwrap_err().to_string();
    assert!(err.contains("data.csv: unknown data file format"), "{err}");
    let fake = tmp("fake.parquet");
    std::fs::write(&fake, b"PAR1 not really").unwrap();
    let err = load(&[fake], &STRICT).unwrap_err().to_string();
    assert!(
        err.contains("fake.parquet: not a readable parquet file"),
        "{err}"
    );
    let bad_only = tmp("bad_only.jsonl");
    std::fs::write(&bad_only, "{\n").unwrap();
    let err = load(&[bad_only], &SKIP).unwrap_err().to_string();
    assert!(
        err.contains("no rows in 1 file(s); all 1 were bad"),
        "{err}"
    );
}

#[test]
fn splits_concatenate_files_of_both_formats_in_order() {
    let a = tmp("a.jsonl");
    let lines: Vec<_> = (0..3).map(|i| row(i).to_json().to_string()).collect();
    std::fs::write(&a, lines.join("\n") + "\n").unwrap();
    let b = tmp("b.parquet");
    write(&b, &[row(10), row(11)]).unwrap();
    let loaded = load(&[a, b], &STRICT).unwrap();
    let truths: Vec<_> = loaded
        .rows
        .iter()
        .map(|r| r.ground_truth.as_str())
        .collect();
    assert_eq!(truths, vec!["1", "2", "3", "11", "12"]);
    assert_eq!(loaded.rows[0].extra_info, json!({"index": 0}));
}
