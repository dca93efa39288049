//! The decoder reproduces Hugging Face transformers' float32 logits on tiny random Qwen2,
//! Qwen3 and Llama checkpoints (made by scripts/make_tiny_hf_fixture.py), loaded from single
//! and sharded safetensors, and a saved copy loads back to the same logits.

use serde_json::Value;
use skein::model::Model;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn check(dir: &Path, model: &Model) {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let ids: Vec<Vec<i64>> = serde_json::from_value(expected["input_ids"].clone()).unwrap();
    let positions: Vec<i64> = serde_json::from_value(expected["last_positions"].clone()).unwrap();
    let want: Vec<Vec<Vec<f32>>> = serde_json::from_value(expected["logits_last"].clone()).unwrap();
    let argmax: Vec<Vec<i64>> = serde_json::from_value(expected["argmax"].clone()).unwrap();
    let input = Tensor::from_slice(&ids.concat()).view([ids.len() as i64, -1]);
    let logits = tch::no_grad(|| model.net.forward(&input)).to_kind(Kind::Float);
    let got_argmax: Vec<i64> = Vec::try_from(logits.argmax(-1, false).view([-1])).unwrap();
    assert_eq!(
        got_argmax,
        argmax.concat(),
        "{}: argmax differs",
        dir.display()
    );
    let mut worst = 0f32;
    for (b, rows) in want.iter().enumerate() {
        for (k, row) in rows.iter().enumerate() {
            let got: Vec<f32> = Vec::try_from(logits.get(b as i64).get(positions[k])).unwrap();
            for (g, w) in got.iter().zip(row) {
                worst = worst.max((g - w).abs());
            }
        }
    }
    // float32 with a different summation order than transformers: ~1e-6 in practice.
    assert!(
        worst < 1e-4,
        "{}: max |logit difference| {worst}",
        dir.display()
    );
}

#[test]
fn logits_match_transformers_for_every_layout() {
    for name in [
        "tiny-qwen2",
        "tiny-qwen3",
        "tiny-llama",
        "tiny-llama-rope3",
        "tiny-qwen2-sharded",
    ] {
        let dir = fixture(name);
        let model = Model::load_dir(&dir, Device::Cpu).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        check(&dir, &model);
    }
}

/// A saved copy computes the same logits, and keeps the keys that decide them: the rotary
/// base and scaling, the norm's epsilon and the head size (tiny-llama-rope3 sets each away
/// from its default), and keys skein does not read.
#[test]
fn a_saved_checkpoint_loads_back_identically() {
    for (name, architecture) in [
        ("tiny-qwen3", "Qwen3ForCausalLM"),
        ("tiny-llama-rope3", "LlamaForCausalLM"),
    ] {
        let src = fixture(name);
        let model = Model::load_dir(&src, Device::Cpu).unwrap();
        let out = std::env::temp_dir().join(format!("skein-save-{}-{name}", std::process::id()));
        model.save_dir(&out).unwrap();
        std::fs::copy(src.join("expected.json"), out.join("expected.json")).unwrap();
        let back = Model::load_dir(&out, Device::Cpu).unwrap();
        check(&out, &back);
        let read = |dir: &Path| -> Value {
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap()
        };
        let (saved, source) = (read(&out), read(&src));
        assert_eq!(saved["architectures"][0], architecture, "{name}");
        for key in ["rope_theta", "rope_scaling", "rms_norm_eps", "head_dim"] {
            assert_eq!(saved[key], source[key], "{name}: {key}");
        }
        std::fs::remove_dir_all(&out).ok();
    }
}

#[test]
fn a_missing_tensor_is_an_error_naming_it() {
    let src = fixture("tiny-llama");
    let out = std::env::temp_dir().join(format!("skein-broken-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(src.join("config.json"), out.join("config.json")).unwrap();
    let tensors: Vec<(String, Tensor)> = Tensor::read_safetensors(src.join("model.safetensors"))
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n != "model.norm.weight")
        .collect();
    Tensor::write_safetensors(&tensors, out.join("model.safetensors")).unwrap();
    let err = Model::load_dir(&out, Device::Cpu)
        .err()
        .expect("loading must fail")
        .to_string();
    assert!(err.contains("model.norm.weight"), "{err}");
    std::fs::remove_dir_all(&out).ok();
}
