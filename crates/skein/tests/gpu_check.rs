//! `scripts/gpu-check.sh`, which runs every device path of skein once and prints a pass/fail
//! table, runs here on the CPU with tiny shapes, so its logic stays tested where no GPU is.

use std::process::Command;

#[test]
fn gpu_check_passes_every_row_on_the_cpu() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out_dir = std::env::temp_dir().join(format!("skein-gpu-check-{}", std::process::id()));
    let python = format!("{root}/.venv/bin/python");
    let out = Command::new("bash")
        .arg(format!("{root}/scripts/gpu-check.sh"))
        .args([
            "--device",
            "cpu",
            "--tiny",
            "--skein",
            env!("CARGO_BIN_EXE_skein"),
        ])
        .args(["--python", &python, "--out"])
        .arg(&out_dir)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| ---"))
        .collect();
    // Header, then one row per check: devices, five training paths, the update's memory, and
    // per dtype the layouts, skein's bench and eager's.
    assert_eq!(rows.len(), 1 + 7 + 2 * 3, "{table}");
    for row in &rows[1..] {
        assert!(row.contains("| pass |"), "{row}");
    }
    // The figures are read from each command's own output.
    assert!(table.contains("eval after RL"), "{table}");
    assert!(table.contains("shared-prefix"), "{table}");
    assert!(table.contains("pytorch eager train step"), "{table}");
    assert!(table.contains("decode ops per step"), "{table}");
    assert!(table.contains("peak / full float32 peak"), "{table}");
    std::fs::remove_dir_all(&out_dir).ok();
}
