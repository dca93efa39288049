//! `scripts/gpu-check.sh`, which runs every device path of skein once and prints a pass/fail
//! table, runs here on the CPU with tiny shapes, so its logic stays tested where no GPU is.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Runs `scripts/gpu-check.sh --device cpu --tiny` with `extra` options, its logs in `out_dir`.
fn gpu_check(out_dir: &Path, extra: &[&str]) -> Output {
    let python = format!("{ROOT}/.venv/bin/python");
    Command::new("bash")
        .arg(format!("{ROOT}/scripts/gpu-check.sh"))
        .args([
            "--device",
            "cpu",
            "--tiny",
            "--skein",
            env!("CARGO_BIN_EXE_skein"),
        ])
        .args(["--python", &python, "--out"])
        .arg(out_dir)
        .args(extra)
        .output()
        .unwrap()
}

/// The table's rows, its header first.
fn table_rows(table: &str) -> Vec<&str> {
    table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| ---"))
        .collect()
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("skein-{name}-{}", std::process::id()))
}

// Header, then one row per check: devices, six training paths each with its log-prob gap, the
// update's memory, in float32 and in bfloat16 with every weight trained the layouts, skein's
// bench, eager's, transformers' `generate`, the decode step's products alone, decode in the
// other form of the decoding copy, the training step in the other form of AdamW and decode in
// CUDA graphs' fixed shapes, and for bfloat16 LoRA all but eager's, `generate` and the products
// alone (the run through CUDA graphs is for CUDA only).
const ROWS_ON_THE_CPU: usize = 1 + 1 + 6 * 2 + 1 + 2 * 8 + 5;

#[test]
fn gpu_check_passes_every_row_on_the_cpu() {
    let out_dir = scratch("gpu-check");
    let out = gpu_check(&out_dir, &[]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = table_rows(&table);
    assert_eq!(rows.len(), ROWS_ON_THE_CPU, "{table}");
    for row in &rows[1..] {
        assert!(row.contains("| pass |"), "{row}");
    }
    // The figures are read from each command's own output.
    assert!(table.contains("eval after RL"), "{table}");
    assert!(table.contains("shared-prefix"), "{table}");
    assert!(table.contains("pytorch eager train step"), "{table}");
    assert!(table.contains("| full-bf16 | pass |"), "{table}");
    assert!(table.contains("of them the optimizer's"), "{table}");
    assert!(table.contains("transformers generate (batch"), "{table}");
    assert!(table.contains("products alone (batch"), "{table}");
    assert!(table.contains("decode ops per step"), "{table}");
    assert!(table.contains("peak / full float32 peak"), "{table}");
    assert!(table.contains("bound on the mean"), "{table}");
    assert!(table.contains("separate form"), "{table}");
    assert!(table.contains("fused form"), "{table}");
    assert!(table.contains("(AdamW fused)"), "{table}");
    assert!(table.contains("(AdamW op by op)"), "{table}");
    assert!(table.contains("steps replayed; a step"), "{table}");
    // The table on disk, rewritten after each row, ends as the one printed.
    let on_disk = std::fs::read_to_string(out_dir.join("table.md")).unwrap();
    assert_eq!(on_disk, table, "table.md");
    std::fs::remove_dir_all(&out_dir).ok();
}

/// `--only` runs the rows it names and no other, and a spent `--seconds` budget lists every
/// row as not run and fails the check: a check cut short never reads as a pass.
#[test]
fn gpu_check_runs_the_rows_asked_for_within_its_budget() {
    let out_dir = scratch("gpu-check-only");
    let out = gpu_check(&out_dir, &["--only", "^(devices|default-job)$"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    let rows = table_rows(&table);
    // The training row brings its log-prob gap.
    let names: Vec<&str> = rows[1..]
        .iter()
        .map(|r| r.split('|').nth(1).unwrap().trim())
        .collect();
    assert_eq!(
        names,
        ["devices", "default-job", "default-job-logp-gap"],
        "{table}"
    );
    assert!(
        table.contains("rows matching /^(devices|default-job)$/"),
        "{table}"
    );
    std::fs::remove_dir_all(&out_dir).ok();

    let out = gpu_check(&out_dir, &["--seconds", "0"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    let rows = table_rows(&table);
    assert_eq!(rows.len(), ROWS_ON_THE_CPU, "{table}");
    for row in &rows[1..] {
        assert!(row.contains("| not run (time budget spent) |"), "{row}");
    }
    std::fs::remove_dir_all(&out_dir).ok();

    let out = gpu_check(&out_dir, &["--only", "no-such-row"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no row's name matches"));
    std::fs::remove_dir_all(&out_dir).ok();
}

/// `scripts/logp-gap.sh` reads a run's largest gap and fails where a step's mean passed its
/// bound, or where the run logged none.
#[test]
fn logp_gap_fails_a_run_whose_engine_computes_another_policy() {
    let dir = scratch("logp-gap");
    std::fs::create_dir_all(&dir).unwrap();
    let gap = |metrics: &str| {
        std::fs::write(dir.join("metrics.jsonl"), metrics).unwrap();
        let out = Command::new("bash")
            .arg(format!("{ROOT}/scripts/logp-gap.sh"))
            .arg(&dir)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let step = |mean: f64, max: f64| {
        format!(
            "{{\"step\":1,\"logp_mismatch/mean\":{mean:e},\"logp_mismatch/max\":{max},\"logp_mismatch/tolerance\":0.001,\"loss\":0.5}}\n"
        )
    };
    let healthy = step(2.5e-7, 3e-5) + &step(1e-8, 2e-6);
    let (code, line) = gap(&healthy);
    assert_eq!(code, Some(0), "{line}");
    assert!(
        line.contains("steps 2, largest mean 2.5e-07, largest max 3e-05"),
        "{line}"
    );
    let (code, line) = gap(&(healthy + &step(0.02, 0.4)));
    assert_eq!(code, Some(1), "{line}");
    assert!(line.contains("largest mean 0.02"), "{line}");
    let (code, line) = gap("{\"step\":1,\"eval/accuracy\":0.5}\n");
    assert_eq!(code, Some(1), "{line}");
    std::fs::remove_dir_all(&dir).ok();
}
