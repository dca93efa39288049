//! `skein bench memory`, run for real as a subprocess.

use std::process::Command;

fn skein(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(args)
        .output()
        .expect("skein runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The body rows of the Markdown table in `out`, split into trimmed cells.
fn table_rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| setup") && !l.starts_with("| ---"))
        .map(|l| {
            let cells: Vec<String> = l.split('|').map(|c| c.trim().to_string()).collect();
            cells[1..cells.len() - 1].to_vec()
        })
        .collect()
}

/// All four setups run in their own processes on the tiny shape; each reports a positive
/// peak, and the LoRA setups' peaks are below full float32's.
#[test]
fn bench_memory_measures_four_setups_and_lora_stays_below_full() {
    let (code, out, err) = skein(&[
        "bench",
        "memory",
        "--shape",
        "tiny",
        "--sequences",
        "2",
        "--tokens",
        "64",
        "--warmup-steps",
        "0",
    ]);
    assert_eq!(code, 0, "{err}");
    let rows = table_rows(&out);
    let setups: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        setups,
        [
            "full float32",
            "LoRA r16",
            "LoRA r16 + bfloat16",
            "LoRA r16 + bfloat16 + checkpointing"
        ],
        "{out}"
    );
    // setup, trainable, RSS at start, measured peak, estimate, ratio, step.
    let number = |row: &[String], col: usize| -> f64 {
        row[col]
            .trim_end_matches('M')
            .parse()
            .unwrap_or_else(|_| panic!("column {col} of {row:?}"))
    };
    let peaks: Vec<f64> = rows.iter().map(|r| number(r, 3)).collect();
    assert!(peaks.iter().all(|&p| p > 0.0), "{out}");
    assert!(peaks[1..].iter().all(|&p| p < peaks[0]), "{out}");
    assert!(rows.iter().all(|r| number(r, 4) > 0.0), "{out}");
    assert!(
        out.contains("goal ≤ 0.25"),
        "the goals follow the table: {out}"
    );
    assert!(
        err.contains("bench memory: full float32"),
        "progress on stderr: {err}"
    );
}
