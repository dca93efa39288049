//! Malformed input of every shape gets an error (or a counted skip), never a panic.

use proptest::prelude::*;
use serde_json::{json, Value};
use skein_data::jsonl::read_from;
use skein_data::row::from_json;
use skein_data::{load, ReadOptions};
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skein-data-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Any JSON value, nested a few levels.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-z0-9 ]{0,6}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Rows that are almost right: one field of a good row replaced by an arbitrary value.
fn mangled_row() -> impl Strategy<Value = Value> {
    let good = json!({"prompt": [{"role": "user", "content": "1+1="}], "data_source": "a",
                      "reward_model": {"ground_truth": "2"}});
    let paths: &[&[&str]] = &[
        &["prompt"],
        &["data_source"],
        &["reward_model"],
        &["reward_model", "ground_truth"],
        &["prompt", "0"],
        &["prompt", "0", "role"],
        &["prompt", "0", "content"],
    ];
    (0..paths.len(), any_json()).prop_map(move |(i, v)| {
        let mut row = good.clone();
        let mut at = &mut row;
        let path = paths[i];
        for key in &path[..path.len() - 1] {
            at = match key.parse::<usize>() {
                Ok(n) => &mut at[n],
                Err(_) => &mut at[*key],
            };
        }
        let last = path[path.len() - 1];
        match last.parse::<usize>() {
            Ok(n) => at[n] = v,
            Err(_) => at[last] = v,
        }
        row
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_as_jsonl_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let strict = ReadOptions { skip_bad_rows: false };
        let skip = ReadOptions { skip_bad_rows: true };
        let f = Path::new("fuzz.jsonl");
        let _ = read_from(&bytes[..], f, &strict, from_json);
        // Every non-blank line is either a row or a counted skip, unless one holds a JSON
        // array: then the file is refused, naming it.
        let rows = match read_from(&bytes[..], f, &skip, from_json) {
            Ok(rows) => rows,
            Err(e) => {
                prop_assert!(e.row.is_none() && e.message.contains("is a JSON array"), "{}", e);
                return Ok(());
            }
        };
        let lines = bytes.split(|&b| b == b'\n')
            .filter(|l| !std::str::from_utf8(l).is_ok_and(|t| t.trim().is_empty()))
            .count();
        prop_assert_eq!(rows.rows.len() + rows.skipped.len(), lines);
    }

    #[test]
    fn arbitrary_json_lines_are_rows_or_named_errors(values in prop::collection::vec(any_json(), 1..8)) {
        let text: String = values.iter().map(|v| v.to_string() + "\n").collect();
        let skip = ReadOptions { skip_bad_rows: true };
        let read = read_from(text.as_bytes(), Path::new("f.jsonl"), &skip, from_json);
        if let Some(first) = values.iter().position(|v| v.is_array()) {
            let e = read.unwrap_err();
            prop_assert!(e.to_string().starts_with(&format!("f.jsonl: line {} is a JSON array", first + 1)), "{}", e);
            return Ok(());
        }
        let rows = read.unwrap();
        prop_assert_eq!(rows.rows.len() + rows.skipped.len(), values.len());
        for e in &rows.skipped {
            prop_assert!(e.row.is_some_and(|r| (1..=values.len()).contains(&r)));
            prop_assert!(e.to_string().starts_with("f.jsonl, row "));
        }
    }

    #[test]
    fn mangled_rows_are_rejected_with_a_field_name_or_accepted(row in mangled_row()) {
        match from_json(&row) {
            Ok(r) => prop_assert!(!r.prompt.is_empty() && !r.data_source.is_empty()),
            Err(e) => prop_assert!(e.contains('`') || e.contains("expected"), "{}", e),
        }
    }

    #[test]
    fn corrupted_parquet_files_are_errors(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6), cut in any::<prop::sample::Index>()) {
        let rows: Vec<_> = (0..8).map(|i| {
            from_json(&json!({"prompt": format!("{i}+1="), "data_source": "a",
                              "reward_model": {"ground_truth": i + 1}})).unwrap()
        }).collect();
        let path = tmp(&format!("c-{}.parquet", std::thread::current().name().unwrap_or("t").replace("::", "-")));
        skein_data::parquet::write(&path, &rows).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        for (at, b) in &flips {
            let i = at.index(bytes.len());
            bytes[i] ^= b | 1;
        }
        if cut.index(4) == 0 {
            bytes.truncate(cut.index(bytes.len()));
        }
        std::fs::write(&path, &bytes).unwrap();
        for opts in [ReadOptions { skip_bad_rows: false }, ReadOptions { skip_bad_rows: true }] {
            // A flip may land in a value and leave a valid file; what matters is no panic
            // escapes and every error names the file.
            if let Err(e) = load(std::slice::from_ref(&path), &opts) {
                prop_assert!(e.file == path, "{}", e);
            }
        }
    }
}
