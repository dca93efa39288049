//! A checkpoint skein writes is a model Hugging Face transformers loads and agrees with: the
//! saved directory is loaded by `AutoModelForCausalLM` in the project's Python environment
//! (scripts/hf_forward.py) and its logits compared with skein's own.

use skein::engine::SamplingParams;
use skein::model::{LoraConfig, Model, ModelConfig, ModelOptions};
use skein::trainer::checkpoint::{save_model_dir, save_policy_dir, ADAPTER_DIR, BASE_DIR};
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

/// Logits of transformers (scripts/hf_forward.py) for `ids`: `args` are the model directory,
/// then optionally a PEFT adapter and a directory PEFT saves it to again.
fn hf_logits(args: &[&Path], ids: &[Vec<i64>]) -> Vec<Vec<Vec<f32>>> {
    let mut child = Command::new(venv_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/hf_forward.py"))
        .args(args)
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
        "transformers could not load {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    serde_json::from_value(theirs["logits"].clone()).unwrap()
}

/// Largest |Δ| between `model`'s logits for `ids` and `theirs`.
fn max_diff(model: &Model, ids: &[Vec<i64>], theirs: &[Vec<Vec<f32>>]) -> f32 {
    let input = Tensor::from_slice(&ids.concat()).view([ids.len() as i64, -1]);
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
    worst
}

fn sampling(tokenizer: &Tokenizer) -> SamplingParams {
    SamplingParams {
        stop_token_ids: tokenizer.eos_token_ids().to_vec(),
        ..Default::default()
    }
}

fn sample_ids(tokenizer: &Tokenizer) -> Vec<Vec<i64>> {
    ["12+34=46", "7+8=15=="]
        .iter()
        .map(|s| {
            let ids = tokenizer.encode(s, false).unwrap();
            ids.into_iter().map(i64::from).collect()
        })
        .collect()
}

/// Sharper than the default init, so comparisons are not between near-uniform logits.
fn sharpen(model: &Model) {
    tch::no_grad(|| {
        for (name, mut v) in model.vs.variables() {
            if name.contains("embed_tokens") {
                let _ = v.g_mul_scalar_(10.0);
            }
        }
    });
}

#[test]
fn transformers_loads_a_saved_checkpoint_with_the_same_logits() {
    let tokenizer = Tokenizer::char_level("0123456789+=").unwrap();
    let cfg = ModelConfig::tiny_qwen2(tokenizer.vocab_size(), 64, 2, 4, 2, 96, 32);
    let model = Model::random(&cfg, Device::Cpu, 5).unwrap();
    sharpen(&model);
    let dir = std::env::temp_dir().join(format!("skein-hf-export-{}", std::process::id()));
    save_model_dir(&model, &tokenizer, &sampling(&tokenizer), &dir).unwrap();
    let ids = sample_ids(&tokenizer);
    let theirs = hf_logits(&[dir.as_path()], &ids);
    let worst = max_diff(&model, &ids, &theirs);
    eprintln!("saved checkpoint: transformers vs skein logits, max |Δ| {worst:.2e}");
    // float32 with different summation orders: ~1e-6 in practice.
    assert!(worst < 1e-4, "max |Δ| {worst}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A LoRA policy's checkpoint: PEFT applies `adapter/` to `base/` and gets skein's logits;
/// the adapter PEFT saves again loads back into skein with the same logits; and the merged
/// model files alone give them too.
#[test]
fn peft_loads_a_lora_adapter_with_the_same_logits() {
    let tokenizer = Tokenizer::char_level("0123456789+=").unwrap();
    let cfg = ModelConfig::tiny_qwen2(tokenizer.vocab_size(), 64, 2, 4, 2, 96, 32);
    let options = ModelOptions {
        lora: LoraConfig {
            rank: 4,
            alpha: 8.0,
            ..Default::default()
        },
        ..Default::default()
    };
    let model = Model::random_with(&cfg, &options, Device::Cpu, 6).unwrap();
    sharpen(&model);
    // Trained adapters: B away from its zero start, so the adapter changes the logits.
    tch::no_grad(|| {
        for (name, mut v) in model.vs.variables() {
            if name.contains(".lora_B.") {
                v.copy_(&(v.randn_like() * 0.2));
            }
        }
    });
    let dir = std::env::temp_dir().join(format!("skein-peft-{}", std::process::id()));
    save_policy_dir(&model, &tokenizer, &sampling(&tokenizer), &dir, None).unwrap();
    let ids = sample_ids(&tokenizer);
    let merged_logits = hf_logits(&[&dir], &ids);
    let base_only = max_diff(&model.base_only(), &ids, &merged_logits);
    assert!(base_only > 1e-2, "the adapter changes nothing: {base_only}");

    let resaved = dir.join("resaved");
    let (base, adapter) = (dir.join(BASE_DIR), dir.join(ADAPTER_DIR));
    let theirs = hf_logits(&[&base, &adapter, &resaved], &ids);
    let worst = max_diff(&model, &ids, &theirs);
    eprintln!("LoRA adapter: peft vs skein logits, max |Δ| {worst:.2e}");
    assert!(worst < 1e-4, "max |Δ| {worst}");
    let merged = max_diff(&model, &ids, &merged_logits);
    assert!(merged < 1e-4, "merged model files: max |Δ| {merged}");

    let again = Model::load_dir_with(&base, &options, Device::Cpu).unwrap();
    again.load_adapter(&resaved).unwrap();
    let back = max_diff(&again, &ids, &theirs);
    assert!(
        back < 1e-4,
        "the adapter PEFT saved, in skein: max |Δ| {back}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
