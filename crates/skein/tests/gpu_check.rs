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

/// What the check prints: its table of rows, then the targets read from them.
fn sections(stdout: &str) -> (&str, &str) {
    const TARGETS: &str = "\nTargets, from the rows above";
    let at = stdout
        .find(TARGETS)
        .unwrap_or_else(|| panic!("no targets in {stdout}"));
    let targets = &stdout[at + TARGETS.len()..];
    let table_end = targets.find('\n').map_or(targets.len(), |i| i + 1);
    (&stdout[..at], &targets[table_end..])
}

/// The line of the markdown `table` whose first cell is `name`.
fn named_line<'a>(table: &'a str, name: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(&format!("| {name} |")))
        .unwrap_or_else(|| panic!("no row {name} in {table}"))
}

/// The number before " tokens/s" in the one row of `table` named `row`, after `label`.
fn rate(table: &str, row: &str, label: &str) -> f64 {
    let line = named_line(table, row);
    let after = &line[line
        .find(label)
        .unwrap_or_else(|| panic!("{label} in {line}"))..];
    let figure = &after[..after.find(" tokens/s").unwrap()];
    figure.rsplit([' ', ',']).next().unwrap().parse().unwrap()
}

/// The ratio the targets table gives `target`.
fn target_ratio(targets: &str, target: &str) -> f64 {
    let measured = named_line(targets, target)
        .split('|')
        .nth(2)
        .unwrap()
        .trim();
    measured.trim_end_matches('x').parse().unwrap()
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (table, targets) = sections(&stdout);
    let rows = table_rows(table);
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
    assert_targets_read_the_rows(table, targets);
    let on_disk = std::fs::read_to_string(out_dir.join("targets.md")).unwrap();
    assert_eq!(on_disk, targets, "targets.md");
    std::fs::remove_dir_all(&out_dir).ok();
}

/// Every target is measured on the CPU, and each ratio is the one of its rows' figures.
fn assert_targets_read_the_rows(table: &str, targets: &str) {
    // Per configuration, the training step and three layouts against eager and shared
    // prefixes against packing; per dtype, decode, decode in graphs and the products alone
    // against `generate`; bfloat16 against float32 in the step and in decode.
    assert_eq!(
        table_rows(targets).len(),
        1 + 3 * 5 + 2 * 3 + 2,
        "{targets}"
    );
    for row in &table_rows(targets)[1..] {
        let verdict = row.rsplit('|').nth(1).unwrap().trim();
        assert!(
            ["met", "not met", "1x met", "2x met"].contains(&verdict),
            "{row}"
        );
    }
    let close = |target: &str, want: f64| {
        let got = target_ratio(targets, target);
        assert!(
            (got - want).abs() <= 0.006 + 0.003 * want,
            "{target}: {got} against {want}"
        );
    };
    let step = |row| rate(table, row, "train step");
    let decode = |row| rate(table, row, "decode (batch");
    close(
        "training step, float32, against eager",
        step("bench-skein-float32") / step("bench-eager-float32"),
    );
    close(
        "skein's decode, bfloat16, against `generate`",
        decode("bench-skein-bfloat16") / rate(table, "bench-generate-bfloat16", "generate (batch"),
    );
    close(
        "decode, bfloat16 against float32",
        decode("bench-skein-bfloat16") / decode("bench-skein-float32"),
    );
}

/// `--only` runs the rows it names and no other, and a spent `--seconds` budget lists every
/// row as not run and fails the check: a check cut short never reads as a pass.
#[test]
fn gpu_check_runs_the_rows_asked_for_within_its_budget() {
    let out_dir = scratch("gpu-check-only");
    let out = gpu_check(&out_dir, &["--only", "^(devices|default-job)$"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let (table, targets) = sections(&stdout);
    assert_eq!(targets, "(no target's rows were in the check)\n");
    let rows = table_rows(table);
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let (table, targets) = sections(&stdout);
    let rows = table_rows(table);
    assert_eq!(rows.len(), ROWS_ON_THE_CPU, "{table}");
    for row in &rows[1..] {
        assert!(row.contains("| not run (time budget spent) |"), "{row}");
    }
    // A row that did not run measures nothing.
    for row in &table_rows(targets)[1..] {
        assert!(row.contains("| not measured ("), "{row}");
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
