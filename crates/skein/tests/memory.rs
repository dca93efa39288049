//! `skein bench memory` and `skein plan-memory`, run for real as subprocesses.

use std::path::PathBuf;
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

/// All five setups run in their own processes on the tiny shape; each reports a positive
/// peak, and the LoRA setups' peaks are below full float32's.
#[test]
fn bench_memory_measures_five_setups_and_lora_stays_below_full() {
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
            "full bfloat16, float32 masters",
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
    // Training every weight in bfloat16 holds float32's 16 bytes per parameter; LoRA does not.
    assert!(peaks[2..].iter().all(|&p| p < peaks[0]), "{out}");
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

/// A Qwen2.5-7B `config.json` (no weights) in a fresh directory of the test `name`.
fn qwen7b_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skein-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = r#"{
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
        "tie_word_embeddings": false, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
        "max_position_embeddings": 32768, "torch_dtype": "bfloat16"
    }"#;
    std::fs::write(dir.join("config.json"), config).unwrap();
    dir
}

/// Qwen2.5-7B planned from its config alone, micro-batches of 2048 tokens: full float32
/// fine-tuning does not fit an 80 GiB GPU (its weights, gradients and moments alone take
/// 114 GiB), LoRA on a bfloat16 base does; a directory and its config.json plan alike.
#[test]
fn plan_memory_fits_qwen_7b_on_80_gib_with_lora_and_bfloat16_only() {
    let dir = qwen7b_dir("plan-7b");
    let file = dir.join("config.json");
    let (code, full, err) = skein(&[
        "plan-memory",
        "--model",
        file.to_str().unwrap(),
        "--device",
        "cuda:80GiB",
        "--set",
        "trainer.micro_batch_tokens=2048",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(full.contains("7.62B parameters"), "{full}");
    assert!(
        full.contains("policy weights, gradients and AdamW moments"),
        "{full}"
    );
    assert!(
        full.lines().any(|l| l.starts_with("does not fit")),
        "{full}"
    );

    // LoRA on a bfloat16 base, planned for the device `--device` names, whatever the
    // config's `run.device` (the CPU by default), adapters' activations included.
    let plan_lora = |run_device: &[&str]| {
        let (code, out, err) = skein(
            &[
                &[
                    "plan-memory",
                    "--model",
                    dir.to_str().unwrap(),
                    "--device",
                    "cuda:80GiB",
                    "--set",
                    "lora.rank=16",
                    "--set",
                    "model.dtype=bfloat16",
                    "--set",
                    "trainer.micro_batch_tokens=2048",
                ],
                run_device,
            ]
            .concat(),
        );
        assert_eq!(code, 0, "{err}");
        out
    };
    let lora = plan_lora(&[]);
    assert!(lora.contains("frozen base weights"), "{lora}");
    assert!(lora.lines().any(|l| l.starts_with("fits")), "{lora}");
    assert_eq!(plan_lora(&["--set", "run.device=cuda"]), lora);
    // The plan is for one GPU: two thread ranks put a second replica on it.
    assert!(!lora.contains("other data-parallel ranks"), "{lora}");
    let two = plan_lora(&["--set", "trainer.dp_size=2"]);
    assert!(two.contains("other data-parallel ranks"), "{two}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plan_memory_errors_name_the_flag_and_the_allowed_values() {
    let (code, _, err) = skein(&["plan-memory", "--device", "gpu"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("`--device`") && err.contains("cuda:80GiB"),
        "{err}"
    );

    let (code, _, err) = skein(&["plan-memory"]);
    assert_eq!(code, 2);
    assert!(err.contains("--model"), "{err}");

    let dir = qwen7b_dir("plan-errors");
    let (code, _, err) = skein(&[
        "plan-memory",
        "--model",
        dir.to_str().unwrap(),
        "--set",
        "model.dtype=float16",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("`lora.rank`"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--sequences` and `--tokens` beyond what a measurement needs are refused, naming the flag,
/// before any setup starts (a billion sequences made the child abort on a 288 GB allocation),
/// and the `--tokens` range the error states is the one accepted.
#[test]
fn bench_memory_refuses_sizes_it_cannot_run_and_states_the_range_it_takes() {
    let tiny = ["bench", "memory", "--shape", "tiny"];
    let run = |extra: &[&str]| skein(&[&tiny[..], extra].concat());
    let (code, _, err) = run(&["--sequences", "1000000000"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`--sequences`"), "{err}");
    assert!(
        !err.contains("setup"),
        "refused before any setup runs: {err}"
    );

    let (code, _, err) = run(&["--tokens", "3"]);
    assert_eq!(code, 2, "{err}");
    let stated: usize = err
        .split("model's ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no stated upper bound: {err}"));
    let (code, _, err) = run(&["--tokens", &(stated + 1).to_string()]);
    assert_eq!(code, 2, "one past the stated bound is refused: {err}");
    assert!(err.contains("`--tokens`"), "{err}");
    // The bound itself runs (one setup, one step).
    let (code, out, err) = run(&[
        "--tokens",
        &stated.to_string(),
        "--sequences",
        "1",
        "--warmup-steps",
        "0",
        "--only",
        "lora",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("peak_mib"), "{out}");
}

/// `--device` names where the setups run; a device this machine lacks is refused before any
/// setup starts, naming the flag and why (on a machine with a GPU, `cuda:99` still is).
#[test]
fn bench_memory_refuses_a_device_this_machine_lacks() {
    let (code, _, err) = skein(&["bench", "memory", "--shape", "tiny", "--device", "cuda:99"]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("--device"), "{err}");
    assert!(
        !err.contains("setup"),
        "refused before any setup runs: {err}"
    );
    let (code, _, err) = skein(&["bench", "memory", "--shape", "tiny", "--device", "tpu"]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("--device") && err.contains("cuda"), "{err}");
}
