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
    // Header, then one row per check: devices, six training paths each with its log-prob
    // gap, the update's memory, in float32 and in bfloat16 with every weight trained the
    // layouts, skein's bench, eager's, transformers' `generate`, decode in the other form of
    // the decoding copy, the training step in the other form of AdamW and decode in CUDA
    // graphs' fixed shapes, and for bfloat16 LoRA all but eager's and `generate` (the run
    // through CUDA graphs is for CUDA only).
    assert_eq!(rows.len(), 1 + 1 + 6 * 2 + 1 + 2 * 7 + 5, "{table}");
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
    assert!(table.contains("decode ops per step"), "{table}");
    assert!(table.contains("peak / full float32 peak"), "{table}");
    assert!(table.contains("bound on the mean"), "{table}");
    assert!(table.contains("separate form"), "{table}");
    assert!(table.contains("fused form"), "{table}");
    assert!(table.contains("(AdamW fused)"), "{table}");
    assert!(table.contains("(AdamW op by op)"), "{table}");
    std::fs::remove_dir_all(&out_dir).ok();
}

/// `scripts/logp-gap.sh` reads a run's largest gap and fails where a step's mean passed its
/// bound, or where the run logged none.
#[test]
fn logp_gap_fails_a_run_whose_engine_computes_another_policy() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let dir = std::env::temp_dir().join(format!("skein-logp-gap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gap = |metrics: &str| {
        std::fs::write(dir.join("metrics.jsonl"), metrics).unwrap();
        let out = Command::new("bash")
            .arg(format!("{root}/scripts/logp-gap.sh"))
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
