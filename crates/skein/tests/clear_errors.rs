//! Inputs that used to be accepted silently, crash, or get an error naming nothing: each now
//! ends in exit status 2 with an error that says what is wrong and what to do, and loses
//! nothing. Every case runs the real `skein` binary.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn skein(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("skein runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn refused(args: &[&str], says: &[&str]) {
    let (code, err) = skein(args);
    assert_eq!(code, 2, "{args:?}: {err}");
    for s in says {
        assert!(err.contains(s), "{args:?}: expected {s:?} in {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

/// A tiny model directory, written by a real run with no RL steps.
fn tiny_model(root: &Path) -> PathBuf {
    let run = root.join("run");
    let mut args = vec!["train".to_string()];
    for s in common::TINY_RUN
        .iter()
        .chain(&["sft.steps=1", "trainer.steps=0", "eval.problems=2"])
    {
        args.extend(["--set".into(), s.to_string()]);
    }
    args.extend(["--set".into(), format!("run.dir=\"{}\"", run.display())]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, err) = skein(&args);
    assert_eq!(code, 0, "{err}");
    run.join("checkpoint")
}

#[test]
fn eval_and_sft_refuse_values_that_cannot_work() {
    let root = common::workdir("clear-errors", "eval-sft");
    let model = tiny_model(&root);
    let m = model.to_str().unwrap();
    refused(
        &["eval", m, "--temperature", "nan"],
        &["--temperature", "finite"],
    );
    refused(&["eval", m, "--temperature", "-1"], &["--temperature"]);
    refused(&["eval", m, "--problems", "0"], &["--problems"]);
    // Where the results go is checked before the evaluation, and a failed evaluation leaves
    // no --samples file behind to refuse its rerun.
    let root_dir = root.to_str().unwrap();
    refused(
        &["eval", m, "--out", root_dir],
        &["--out", "is a directory"],
    );
    let nowhere = root.join("no/such/dir/out.jsonl");
    refused(
        &["eval", m, "--out", nowhere.to_str().unwrap()],
        &["--out", "does not exist"],
    );
    // --samples: a missing directory is named as such; only a file that exists is "not
    // overwritten".
    let nowhere = root.join("no/such/dir/samples.jsonl");
    let (code, err) = skein(&["eval", m, "--samples", nowhere.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("its directory does not exist"), "{err}");
    assert!(!err.contains("overwritten"), "{err}");
    let existing = root.join("existing.jsonl");
    std::fs::write(&existing, "kept\n").unwrap();
    refused(
        &["eval", m, "--samples", existing.to_str().unwrap()],
        &["the file exists", "not overwritten"],
    );
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "kept\n");
    let samples = root.join("samples.jsonl");
    let s = samples.to_str().unwrap();
    refused(
        &["eval", "/no/such/model", "--samples", s],
        &["/no/such/model"],
    );
    assert!(!samples.exists(), "a failed eval left {s}");
    // A prompt file with nothing to evaluate, or rows no reward route scores, is refused
    // rather than reported as accuracy 0.
    let prompts = root.join("prompts.jsonl");
    std::fs::write(
        &prompts,
        r#"{"prompt": "1+1=", "data_source": "other", "reward_model": {"ground_truth": "2"}}"#,
    )
    .unwrap();
    let p = prompts.to_str().unwrap();
    refused(
        &["eval", m, "--data", p, "--set", "data.max_prompt_tokens=1"],
        &[
            "no problem to evaluate",
            "1 prompts over `data.max_prompt_tokens` = 1",
        ],
    );
    // Rows skipped when read (malformed) and when tokenized (no character the model knows)
    // are both counted.
    let bad = root.join("bad-prompts.jsonl");
    std::fs::write(
        &bad,
        "{\"prompt\": 5}\n\
         {\"prompt\": \"\u{e9}\u{e9}\", \"data_source\": \"a\", \"reward_model\": {\"ground_truth\": \"2\"}}\n",
    )
    .unwrap();
    refused(
        &[
            "eval",
            m,
            "--data",
            bad.to_str().unwrap(),
            "--set",
            "data.skip_bad_rows=true",
        ],
        &["no problem to evaluate", "2 bad rows skipped"],
    );
    refused(
        &[
            "eval",
            m,
            "--data",
            p,
            "--set",
            "reward.sources.answer.kind=\"math\"",
            "--set",
            "reward.routes.arith.sources=[\"answer\"]",
        ],
        &["no route scores rows with data source `other` (1 row)"],
    );
    // An answer whose reward failed is written with no reward and the reason, not a 0.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let failed = root.join("failed-samples.jsonl");
    let url = format!("reward.sources.far.url=\"http://127.0.0.1:{port}/score\"");
    let mut args = vec![
        "eval",
        m,
        "--data",
        p,
        "--samples",
        failed.to_str().unwrap(),
    ];
    for set in [
        "reward.sources.far.kind=\"remote\"",
        &url,
        "reward.sources.far.timeout_ms=500",
        "reward.sources.far.retries=1",
        "reward.sources.far.backoff_ms=10",
        "reward.default_route.sources=[\"far\"]",
    ] {
        args.extend(["--set", set]);
    }
    let (code, err) = skein(&args);
    assert_eq!(code, 0, "{err}");
    let line: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&failed).unwrap().trim()).unwrap();
    assert!(
        line["reward"].is_null() && line["failed"].as_str().is_some_and(|f| !f.is_empty()),
        "{line}"
    );

    // Samples cut at the new-token budget are counted in the line, marked in --samples, and
    // (most of them) warned of, naming the key to raise.
    let cut = root.join("cut-samples.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(["eval", m, "--data", p, "--samples", cut.to_str().unwrap()])
        .args(["--set", "rollout.sampling.max_new_tokens=1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["max_new_tokens"], 1, "{line}");
    assert_eq!(line["eval/truncated_fraction"], 1.0, "{line}");
    assert!(
        err.contains("--set rollout.sampling.max_new_tokens="),
        "{err}"
    );
    let sample: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&cut).unwrap().trim()).unwrap();
    assert_eq!(sample["truncated"], true, "{sample}");

    let chat = root.join("chat.jsonl");
    std::fs::write(
        &chat,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"1+1=\"}, \
         {\"role\": \"assistant\", \"content\": \"2\"}]}\n\
         {\"messages\": [{\"role\": \"wizard\", \"content\": \"2+2=\"}, \
         {\"role\": \"assistant\", \"content\": \"4\"}]}\n",
    )
    .unwrap();
    let data = chat.to_str().unwrap();
    let before = std::fs::read(model.join("model.safetensors")).unwrap();
    let sft = |out: &str, extra: &[&str]| {
        let mut a = vec![
            "sft", "--model", m, "--data", data, "--out", out, "--steps", "1",
        ];
        a.extend(extra);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |a: Vec<String>, says: &[&str]| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        refused(&a, says)
    };
    // An unknown role names the file, its row and the allowed roles.
    let out = root.join("out");
    let o = out.to_str().unwrap();
    run(
        sft(o, &[]),
        &["chat.jsonl, row 2", "`wizard`", "allowed: system"],
    );
    std::fs::write(
        &chat,
        std::fs::read_to_string(&chat)
            .unwrap()
            .replace("wizard", "user"),
    )
    .unwrap();
    run(sft(o, &["--lr=-1"]), &["--lr"]);
    run(
        sft(o, &["--micro-batch-tokens", "0"]),
        &["--micro-batch-tokens"],
    );
    // A pass beyond the machine's memory is refused before the first step, naming the flag.
    run(
        sft(o, &["--micro-batch-tokens", "100000000000"]),
        &["this fine-tuning needs about", "lower --micro-batch-tokens"],
    );
    assert!(!out.exists(), "a refused fine-tuning wrote {o}");
    run(sft(m, &[]), &["is the --model being fine-tuned"]);
    assert_eq!(
        std::fs::read(model.join("model.safetensors")).unwrap(),
        before
    );
    // An existing directory is replaced only when asked, and only when it holds a model.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    run(sft(o, &[]), &["already holds files", "--overwrite"]);
    run(sft(o, &["--overwrite"]), &["no model", "config.json"]);
    // A sharded model there loses its index and shards, which would still be read as its
    // weights beside the new model.safetensors, and the files of it loaders read beside the
    // new model's (its special tokens, its PyTorch weights); other files stay.
    std::fs::write(out.join("config.json"), "{}").unwrap();
    let shards = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    let index = serde_json::json!({"weight_map": {"a": shards[0], "b": shards[1]}});
    std::fs::write(out.join("model.safetensors.index.json"), index.to_string()).unwrap();
    for shard in shards {
        std::fs::write(out.join(shard), "old weights").unwrap();
    }
    let stale = [
        "special_tokens_map.json",
        "added_tokens.json",
        "pytorch_model.bin",
    ];
    for name in stale {
        std::fs::write(out.join(name), "the old model's").unwrap();
    }
    let a = sft(o, &["--overwrite"]);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    // A save that fails (its weights cannot be written) leaves the old model as it was.
    let blocked = out.join("model.safetensors.tmp");
    std::fs::create_dir_all(&blocked).unwrap();
    let (code, err) = skein(&a);
    assert_ne!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_to_string(out.join("config.json")).unwrap(),
        "{}"
    );
    assert!(shards.iter().all(|s| out.join(s).is_file()));
    std::fs::remove_dir(&blocked).unwrap();
    let (code, err) = skein(&a);
    assert_eq!(code, 0, "{err}");
    assert!(out.join("model.safetensors").is_file());
    assert!(!out.join("model.safetensors.index.json").exists());
    assert!(shards.iter().all(|s| !out.join(s).exists()));
    assert!(stale.iter().all(|s| !out.join(s).exists()));
    assert!(out.join("notes.txt").is_file());
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn paths_and_files_that_cannot_work_are_named() {
    let root = common::workdir("clear-errors", "paths");
    std::fs::create_dir_all(root.join("data.jsonl")).unwrap();
    let dir = root.join("data.jsonl");
    refused(
        &["train", "--set", "model.path=\"/no/such/model\""],
        &["`model.path`", "no such directory"],
    );
    refused(
        &[
            "train",
            "--set",
            &format!("data.train_files=[\"{}\"]", dir.display()),
        ],
        &["`data.train_files[0]`", "is a directory"],
    );
    // A damaged weights file names itself and says what to do.
    let model = tiny_model(&root);
    let weights = model.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..100]).unwrap();
    refused(
        &["eval", model.to_str().unwrap()],
        &["model.safetensors", "damaged", "export the model again"],
    );
    // A host that is not an address of this machine is not blamed on the port.
    let (code, err) = skein(&["serve", "--host", "999.1.1.1", "--port", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("address of this machine") && !err.contains("port is in use"));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn sizes_beyond_the_machine_are_refused_before_anything_is_allocated() {
    refused(
        &["train", "--set", "model.hidden_size=1000000000000"],
        &["`model.hidden_size`", "GiB of memory is free"],
    );
    refused(
        &["train", "--set", "model.max_positions=1000000000000"],
        &["`model.max_positions`", "at most"],
    );
    refused(
        &["train", "--set", "eval.problems=1000000000000"],
        &["`eval.problems`"],
    );
    // Difficulty 2's longest prompt is "31+31=", 6 tokens, and 8 new tokens need 14 positions.
    refused(
        &["train", "--set", "model.max_positions=13"],
        &["`model.max_positions`", "14 positions"],
    );
    // An episode's token limit beyond the model's context could never be reached.
    refused(
        &[
            "train",
            "--set",
            "task.name=\"guess\"",
            "--set",
            "agent.max_tokens=100000",
        ],
        &["`agent.max_tokens`", "100000", "positions"],
    );
    refused(&["serve", "--max-slots", "1000000000"], &["--max-slots"]);
    refused(&["eval", "/nonexistent", "--n", "1000000000000"], &["--n"]);
}

/// `skein eval` and `skein plan-memory` refuse the sizes and sampling `skein train` refuses,
/// by key: they used to evaluate greedily at `top_p = 0`, score 0 at `max_new_tokens = 0`,
/// and plan a step of no tokens as fitting. No evaluation is `eval.every = 0`, not 0 problems.
#[test]
fn eval_and_plan_memory_refuse_what_train_refuses() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen2");
    let m = model.to_str().unwrap();
    for (set, key) in [
        ("rollout.sampling.top_p=0", "`rollout.sampling.top_p`"),
        ("rollout.sampling.top_p=nan", "`rollout.sampling.top_p`"),
        (
            "rollout.sampling.max_new_tokens=0",
            "`rollout.sampling.max_new_tokens`",
        ),
        ("eval.problems=0", "`eval.problems`"),
    ] {
        refused(&["eval", m, "--set", set], &[key]);
        refused(&["train", "--set", set], &[key]);
    }
    for (set, key) in [
        (
            "trainer.micro_batch_tokens=0",
            "`trainer.micro_batch_tokens`",
        ),
        (
            "rollout.samples_per_prompt=0",
            "`rollout.samples_per_prompt`",
        ),
        ("rollout.max_slots=0", "`rollout.max_slots`"),
    ] {
        refused(&["plan-memory", "--set", set], &[key]);
    }
}

/// CUDA graphs replay GPU kernels: asked for on the CPU (the default device), the training
/// key and the server's flag are refused with the device they need.
#[test]
fn cuda_graphs_off_a_gpu_are_refused_with_the_device_they_need() {
    refused(
        &["train", "--set", "rollout.cuda_graphs=true"],
        &["`rollout.cuda_graphs`", "`run.device = \"cuda\"`"],
    );
    refused(
        &["serve", "--cuda-graphs"],
        &["--cuda-graphs", "--device cuda"],
    );
}

/// A stop id the tokenizer does not have would never end a sample: refused with its key,
/// before the run directory is written.
#[test]
fn a_stop_id_outside_the_vocabulary_is_refused() {
    let dir = common::workdir("clear-errors", "stop-id");
    let run_dir = format!("run.dir=\"{}\"", dir.display());
    refused(
        &[
            "train",
            "--set",
            "rollout.sampling.stop_token_ids=[100000]",
            "--set",
            &run_dir,
        ],
        &["`rollout.sampling.stop_token_ids`", "100000"],
    );
    assert!(!dir.join("config.toml").exists());
}

/// LoRA, low-precision weights and checkpointing: settings that cannot train name their key
/// and the way out, before anything runs.
#[test]
fn lora_and_precision_settings_that_cannot_train_are_refused() {
    let train = |sets: &[&str], says: &[&str]| {
        let mut args = vec!["train"];
        for s in sets {
            args.extend(["--set", s]);
        }
        refused(&args, says);
    };
    train(
        &["model.dtype=\"float16\""],
        &["model.dtype", "loss scaling", "bfloat16", "`lora.rank`"],
    );
    train(&["model.dtype=\"int8\""], &["model.dtype", "bfloat16"]);
    train(
        &["lora.rank=8", "lora.targets=[\"q_proj\", \"lm_head\"]"],
        &["`lora.targets` has `lm_head`", "q_proj"],
    );
    train(&["lora.rank=8", "lora.alpha=0"], &["`lora.alpha`"]);
    // Dropout acts only in a loaded model's warm-up: a model built from scratch gets its
    // adapters after its warm-up, and RL's passes run without it.
    train(
        &["lora.rank=8", "lora.dropout=0.1"],
        &["`lora.dropout`", "`model.path` set", "remove the key"],
    );
    train(
        &["lora.rank=8", "model.dtype=\"float16\""],
        &["float16", "CUDA", "bfloat16"],
    );
}

/// `skein export --merge` names what it cannot use.
#[test]
fn export_names_a_missing_adapter_or_base() {
    let root = common::workdir("clear-errors", "export");
    std::fs::create_dir_all(&root).unwrap();
    let out = root.join("out");
    let (o, r) = (out.to_str().unwrap(), root.to_str().unwrap());
    refused(
        &["export", "--merge", "--adapter", r, o],
        &["adapter_config.json", "a LoRA run's checkpoint/adapter"],
    );
    // A run directory: its adapter is named, and its checkpoint as the merged model.
    let run = root.join("run");
    let adapter = run.join("checkpoint/adapter");
    std::fs::create_dir_all(&adapter).unwrap();
    std::fs::write(adapter.join("adapter_config.json"), "{}").unwrap();
    let run_str = run.to_str().unwrap();
    refused(
        &["export", "--merge", "--adapter", run_str, o],
        &[
            &format!("the adapter is {}", adapter.display()),
            &format!(
                "{} already holds it merged",
                run.join("checkpoint").display()
            ),
        ],
    );
    std::fs::write(
        root.join("adapter_config.json"),
        r#"{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "base_model_name_or_path": "nowhere"}"#,
    )
    .unwrap();
    refused(
        &["export", "--merge", "--adapter", r, o],
        &["nowhere", "--base"],
    );
    assert!(!out.exists(), "nothing is written");
}

#[test]
fn the_reward_bench_refuses_zero_rounds_rather_than_report_zeros() {
    refused(&["bench", "rewards", "--rounds", "0"], &["--rounds", "≥ 1"]);
    for flag in ["--prompts", "--samples", "--throughput-requests"] {
        refused(&["bench", "rewards", flag, "0"], &[flag, "≥ 1"]);
    }
    // The step bench's flags before another bench's name are refused, not ignored.
    refused(&["bench", "--device", "nonsense", "memory"], &["--device"]);
}

/// A reward service has no task, so its checker (`task`) cannot be one of its sources: said at
/// start-up, not as a scorer the program failed to supply.
#[test]
fn a_reward_service_refuses_the_task_checker() {
    refused(
        &[
            "serve-reward",
            "--set",
            "reward.sources.task.kind=\"scorer\"",
            "--set",
            "reward.default_route.sources=[\"task\"]",
        ],
        &[
            "`reward.sources.task`",
            "only `skein train` and `skein eval`",
        ],
    );
}

/// `skein ARGS...`: exit code, stdout and stderr.
fn skein_out(args: &[String]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("skein runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Characters a loaded model's tokenizer lacks used to become `<|unk|>` without a word. A
/// dataset's prompts and a chat file's conversations with some are used, counted and reported
/// once with the first row; a prompt or message with nothing else is a bad row, refused with
/// its row and characters (or skipped when bad rows are).
#[test]
fn text_outside_the_vocabulary_is_reported_and_text_of_nothing_else_refused() {
    let root = common::workdir("clear-errors", "unknown-chars");
    let model = tiny_model(&root);
    let m = model.to_str().unwrap().to_string();
    let row = |p: &str| {
        format!(
            "{{\"prompt\": [{{\"role\": \"user\", \"content\": \"{p}\"}}], \
             \"data_source\": \"d\", \"reward_model\": {{\"ground_truth\": \"2\"}}}}\n"
        )
    };
    let data = root.join("train.jsonl");
    let train = |dir: &str| {
        let mut a = vec!["train".to_string()];
        for s in common::TINY_RUN.iter().copied().chain([
            "sft.steps=0",
            "trainer.steps=0",
            "eval.problems=2",
            &format!("model.path=\"{m}\""),
            &format!("data.train_files=[\"{}\"]", data.display()),
            &format!("run.dir=\"{}\"", root.join(dir).display()),
        ]) {
            a.extend(["--set".to_string(), s.to_string()]);
        }
        a
    };

    std::fs::write(&data, [row("1+1="), row("1+é="), row("ü1+é=")].concat()).unwrap();
    let (code, _, err) = skein_out(&train("some"));
    assert_eq!(code, 0, "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("train split")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains("2 prompts with 3 characters outside the tokenizer's vocabulary")
            && warnings[0].contains("'é', 'ü'")
            && warnings[0].contains("train.jsonl, row 2"),
        "{err}"
    );
    let metrics = std::fs::read_to_string(root.join("some/metrics.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert_eq!(first["data/unknown_char_prompts"], 2.0, "{first}");

    std::fs::write(&data, [row("1+1="), row(" éü ")].concat()).unwrap();
    let a = train("none");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    refused(
        &a,
        &[
            "train.jsonl, row 2",
            "none of the prompt's characters",
            "'é', 'ü'",
            "data.skip_bad_rows",
        ],
    );

    // A chat file for `skein sft`: the same rules, per conversation and message.
    let chat = root.join("chat.jsonl");
    let conversation = |user: &str, assistant: &str| {
        format!(
            "{{\"messages\": [{{\"role\": \"user\", \"content\": \"{user}\"}}, \
             {{\"role\": \"assistant\", \"content\": \"{assistant}\"}}]}}\n"
        )
    };
    std::fs::write(
        &chat,
        [conversation("1+1=", "2"), conversation("1+1=é", "2")].concat(),
    )
    .unwrap();
    let sft = |out: &str, extra: &[&str]| {
        let (data, out) = (
            chat.display().to_string(),
            root.join(out).display().to_string(),
        );
        let mut a: Vec<String> = ["sft", "--model", m.as_str(), "--data", &data, "--out", &out]
            .map(String::from)
            .to_vec();
        a.extend(["--steps", "1", "--batch-size", "2"].map(String::from));
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let (code, out, err) = skein_out(&sft("sft-some", &[]));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("1 conversation with 1 character outside the tokenizer's vocabulary ('é')")
            && err.contains("the first: ")
            && err.contains("chat.jsonl, row 2"),
        "{err}"
    );
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["unknown_char_conversations"], 1, "{summary}");

    std::fs::write(
        &chat,
        [conversation("1+1=", "2"), conversation("1+1=", "éé")].concat(),
    )
    .unwrap();
    let a = sft("sft-none", &[]);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    refused(
        &a,
        &[
            "chat.jsonl, row 2",
            "message 2 (assistant)",
            "'é'",
            "--skip-bad-rows",
        ],
    );
    let (code, out, err) = skein_out(&sft("sft-skip", &["--skip-bad-rows"]));
    assert_eq!(code, 0, "{err}");
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["skipped_rows"], 1, "{summary}");
    assert!(
        err.contains("skipped 1 conversation") && err.contains("chat.jsonl, row 2"),
        "{err}"
    );

    // A conversation longer than the model's positions is cut there, not past them (where
    // its last tokens had no rotary angle, and the run panicked).
    let positions = 64;
    std::fs::write(
        &chat,
        [
            conversation("1+1=", "2"),
            conversation(&"1+".repeat(60), "2"),
        ]
        .concat(),
    )
    .unwrap();
    let (code, out, err) = skein_out(&sft("sft-long", &["--max-tokens", "2048"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!("cut at the model's {positions} positions")),
        "{err}"
    );
    // Cut there before its reply, it has nothing to train: left out and said so, not
    // counted as a conversation trained on as cut.
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["truncated"], 0, "{summary}");
    assert_eq!(summary["cut_before_any_reply"], 1, "{summary}");
    assert!(err.contains("left out 1 conversation cut at"), "{err}");
    // The tuned model keeps the loaded one's generation settings (the run sampled 8 new
    // tokens, not the engine default of 64), with top_k written out.
    let generation = |dir: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("generation_config.json")).unwrap())
            .unwrap()
    };
    let (base, tuned) = (generation(&model), generation(&root.join("sft-long")));
    assert_eq!(base["max_new_tokens"], 8, "{base}");
    assert_eq!(base["top_k"], 0, "{base}");
    assert_eq!(tuned, base);
    // A model without generation settings gets none of skein's: its stop ids alone, so
    // transformers keeps its own defaults (greedy) rather than sampling 64 tokens.
    std::fs::remove_file(model.join("generation_config.json")).unwrap();
    let (code, _, err) = skein_out(&sft("sft-bare", &[]));
    assert_eq!(code, 0, "{err}");
    let bare = generation(&root.join("sft-bare"));
    for key in [
        "max_new_tokens",
        "do_sample",
        "temperature",
        "top_p",
        "top_k",
    ] {
        assert!(bare.get(key).is_none(), "{key} in {bare}");
    }
    assert_eq!(bare["eos_token_id"], base["eos_token_id"], "{bare}");
    let _ = std::fs::remove_dir_all(&root);
}
