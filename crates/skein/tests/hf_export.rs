//! A checkpoint skein writes is a model Hugging Face transformers loads and agrees with: the
//! saved directory is loaded by `AutoModelForCausalLM` in the project's Python environment
//! (scripts/hf_forward.py) and its logits compared with skein's own.

use skein::engine::SamplingParams;
use skein::model::{Model, ModelConfig};
use skein::trainer::checkpoint::save_model_dir;
use skein_text::Tokenizer;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use tch::{Device, Kind, Tensor};

fn venv_python() -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let py = root.join(".venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run scripts/setup-libtorch.sh and scripts/setup-reward-model.sh \
         (make test does)",
        py.display()
    );
    py
}

#[test]
fn transformers_loads_a_saved_checkpoint_with_the_same_logits() {
    let tokenizer = Tokenizer::char_level("0123456789+=").unwrap();
    let cfg = ModelConfig::tiny_qwen2(tokenizer.vocab_size(), 64, 2, 4, 2, 96, 32);
    let model = Model::random(&cfg, Device::Cpu, 5).unwrap();
    // Sharper than the default init, so the comparison is not between near-uniform logits.
    tch::no_grad(|| {
        for (name, mut v) in model.vs.variables() {
            if name.contains("embed_tokens") {
                let _ = v.g_mul_scalar_(10.0);
            }
        }
    });
    let dir = std::env::temp_dir().join(format!("skein-hf-export-{}", std::process::id()));
    let sampling = SamplingParams {
        stop_token_ids: tokenizer.eos_token_ids().to_vec(),
        ..Default::default()
    };
    save_model_dir(&model, &tokenizer, &sampling, &dir).unwrap();

    let ids: Vec<Vec<i64>> = vec![
        tokenizer
            .encode("12+34=46", false)
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect(),
        tokenizer
            .encode("7+8=15==", false)
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect(),
    ];
    let mut child = Command::new(venv_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/hf_forward.py"))
        .arg(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let request = serde_json::json!({ "input_ids": ids }).to_string();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "transformers could not load {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let theirs: Vec<Vec<Vec<f32>>> = serde_json::from_value(theirs["logits"].clone()).unwrap();

    let input = Tensor::from_slice(&ids.concat()).view([2, -1]);
    let ours = tch::no_grad(|| model.net.forward(&input)).to_kind(Kind::Float);
    let mut worst = 0f32;
    for (b, rows) in theirs.iter().enumerate() {
        for (t, row) in rows.iter().enumerate() {
            let mine = Vec::<f32>::try_from(ours.get(b as i64).get(t as i64)).unwrap();
            for (x, y) in mine.iter().zip(row) {
                worst = worst.max((x - y).abs());
            }
        }
    }
    eprintln!("saved checkpoint: transformers vs skein logits, max |Δ| {worst:.2e}");
    // float32 with different summation orders: ~1e-6 in practice.
    assert!(worst < 1e-4, "max |Δ| {worst}");
    let _ = std::fs::remove_dir_all(&dir);
}
