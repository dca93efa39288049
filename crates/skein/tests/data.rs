//! Your own data, end to end: a verl-layout parquet dataset of arithmetic problems trains the
//! tiny model for a few steps, with a JSONL validation split that has a bad row; `skein eval`
//! scores the run's checkpoint; `skein sft` fine-tunes on chat JSONL and writes a model that
//! loads back.

use serde_json::{json, Value};
use skein::trainer::rollout::dataset::Data;
use skein::trainer::TrainConfig;
use skein_data::{ChatMessage, PromptRow, Truncation};
use skein_tasks::arithmetic::Arithmetic;
use skein_tasks::{Task, TaskRng};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skein-data-e2e-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `n` distinct additions that [`rows`] never draws (its operands stop at 9), as a held-out
/// split disjoint from its training rows.
fn held_out_rows(n: usize) -> Vec<PromptRow> {
    (0..n)
        .map(|i| {
            let (a, b) = (10 + i, 20 + i);
            PromptRow {
                prompt: vec![ChatMessage {
                    role: "user".into(),
                    content: format!("{a}+{b}="),
                }],
                data_source: "arith".into(),
                ground_truth: (a + b).to_string(),
                extra_info: json!({"index": i}),
            }
        })
        .collect()
}

/// Arithmetic problems as verl rows; `long` of them padded past a 12-token limit.
fn rows(n: usize, seed: u64, long: usize) -> Vec<PromptRow> {
    let task = Arithmetic::new(1);
    let mut rng = TaskRng::new(seed);
    (0..n)
        .map(|i| {
            let p = task.sample(&mut rng);
            let content = if i < long {
                format!("{}{}", "0+".repeat(8), p.prompt)
            } else {
                p.prompt
            };
            PromptRow {
                prompt: vec![ChatMessage {
                    role: "user".into(),
                    content,
                }],
                data_source: "arith".into(),
                ground_truth: p.ground_truth,
                extra_info: json!({"index": i}),
            }
        })
        .collect()
}

fn write_jsonl(path: &Path, rows: &[PromptRow], extra_line: &str) {
    let mut text: String = rows
        .iter()
        .map(|r| r.to_json().to_string() + "\n")
        .collect();
    text.push_str(extra_line);
    std::fs::write(path, text).unwrap();
}

fn config(dir: &Path) -> TrainConfig {
    config_with(dir, "")
}

/// [`config`] with `extra` TOML at its end.
fn config_with(dir: &Path, extra: &str) -> TrainConfig {
    let toml = format!(
        r#"
[run]
dir = "{run}"
threads = 1
[data]
train_files = ["{train}"]
val_files = ["{val}"]
skip_bad_rows = true
max_prompt_tokens = 12
truncation = "filter"
[sft]
steps = 10
batch_size = 32
[rollout]
prompts_per_step = 8
samples_per_prompt = 4
[trainer]
steps = 3
checkpoint_every = 2
[eval]
problems = 16
every = 2
{extra}
"#,
        run = dir.join("run").display(),
        train = dir.join("train.parquet").display(),
        val = dir.join("val.jsonl").display(),
    );
    skein_config::load(Some(&toml), "test", &[]).unwrap()
}

fn metrics(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn trains_on_a_parquet_dataset_and_evaluates_its_validation_split() {
    let dir = workdir("train");
    skein_data::parquet::write(&dir.join("train.parquet"), &rows(200, 1, 3)).unwrap();
    write_jsonl(
        &dir.join("val.jsonl"),
        &held_out_rows(20),
        "{\"prompt\": 5}\n",
    );
    let cfg = config(&dir);

    // The held-out batch is the validation split, in file order.
    let data = Data::load(&cfg).unwrap();
    assert_eq!(data.val.len(), 20);
    assert_eq!(data.counts.skipped_rows, 1);
    assert_eq!(data.counts.filtered_prompts, 3);
    let tokenizer =
        skein_text::Tokenizer::char_level(skein_tasks::Task::alphabet(&data.train)).unwrap();
    let batch = data.eval_batch(&tokenizer, 16, 0).unwrap();
    let want: Vec<_> = held_out_rows(20)
        .into_iter()
        .take(16)
        .map(|r| r.prompt[0].content.clone())
        .collect();
    let got: Vec<_> = batch.problems.iter().map(|p| p.prompt.clone()).collect();
    assert_eq!(got, want);

    let summary = skein::trainer::run::train(&cfg).unwrap();
    assert_eq!(summary.rewards.len(), 3);
    let run = dir.join("run");
    let lines = metrics(&run);
    let first = lines
        .iter()
        .find(|m| m["step"] == 0 && m.get("eval/accuracy").is_some())
        .unwrap();
    assert_eq!(first["data/skipped_rows"], 1.0);
    assert_eq!(first["data/filtered_prompts"], 3.0);
    let steps: Vec<_> = lines
        .iter()
        .filter(|m| m.get("rollout/trajectories").is_some())
        .collect();
    assert_eq!(steps.len(), 3);
    assert!(
        steps[1].get("eval/accuracy").is_some(),
        "eval.every = 2 evaluates at step 2"
    );
    // 197 rows: SFT drew 10 × 32 and RL 8 per step, so the step-2 checkpoint is in epoch 1.
    assert_eq!(steps[1]["data/epoch"], 1);
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("checkpoint-2/trainer_state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["data_position"], 10 * 32 + 2 * 8);

    // Resuming from checkpoint-2 redraws step 3's prompts from the saved position: the step
    // comes out exactly as in the uninterrupted run.
    let step3 = |lines: &[Value]| {
        let m = lines
            .iter()
            .find(|m| m["step"] == 3 && m.get("rollout/trajectories").is_some())
            .cloned();
        let m = m.unwrap();
        (
            m["reward/mean"].clone(),
            m["loss/policy"].clone(),
            m["grad_norm"].clone(),
        )
    };
    let before = step3(&lines);
    skein::trainer::run::resume(&cfg).unwrap();
    assert_eq!(step3(&metrics(&run)), before);

    // `skein eval` on the run: its validation split, sampled 4 times per problem.
    let out = dir.join("eval.jsonl");
    let status = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args([
            "eval",
            run.to_str().unwrap(),
            "--n",
            "4",
            "--k",
            "1,4",
            "--temperature",
            "1",
        ])
        .args(["--set", "run.threads=1", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let line: Value = serde_json::from_str(std::fs::read_to_string(&out).unwrap().trim()).unwrap();
    // The run's held-out problems: `eval.problems` of the 20 good rows.
    assert_eq!(line["problems"], 16);
    assert_eq!(line["n"], 4);
    let (p1, p4) = (
        line["eval/pass@1"].as_f64().unwrap(),
        line["eval/pass@4"].as_f64().unwrap(),
    );
    assert!(
        (p1 - line["eval/accuracy"].as_f64().unwrap()).abs() < 1e-9,
        "{line}"
    );
    assert!(p4 >= p1, "{line}");
}

#[test]
fn data_problems_name_the_key_file_and_row() {
    let dir = workdir("errors");
    let mut cfg = config(&dir);
    let bad = ["data.truncation=\"middle\"".to_string()];
    let err = skein_config::load::<TrainConfig>(None, "defaults", &bad)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`data.truncation`") && err.contains("left"),
        "{err}"
    );
    let err = skein::trainer::config::validate::validate(&cfg)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`data.train_files[0]`: no such file"), "{err}");

    cfg.data.truncation = Truncation::Error;
    cfg.data.skip_bad_rows = false;
    skein_data::parquet::write(&dir.join("train.parquet"), &rows(10, 1, 0)).unwrap();
    write_jsonl(
        &dir.join("val.jsonl"),
        &held_out_rows(3),
        "{\"prompt\": 5}\n",
    );
    let err = format!("{:#}", Data::load(&cfg).err().unwrap());
    assert!(
        err.contains("val.jsonl, row 4: `prompt` must be a list"),
        "{err}"
    );
    assert!(err.contains("data.skip_bad_rows"), "{err}");

    skein_data::parquet::write(&dir.join("train.parquet"), &rows(10, 1, 2)).unwrap();
    cfg.data.skip_bad_rows = true;
    let err = format!("{:#}", Data::load(&cfg).err().unwrap());
    assert!(
        err.contains(
            "train.parquet, row 1: the prompt has 20 tokens, over `data.max_prompt_tokens` = 12"
        ),
        "{err}"
    );
    cfg.data.truncation = Truncation::Left;
    let data = Data::load(&cfg).unwrap();
    assert_eq!(data.counts.truncated_prompts, 2);
    let mut rng = TaskRng::new(0);
    let lens: Vec<_> = (0..10)
        .map(|_| data.train.sample(&mut rng).prompt.len())
        .collect();
    assert!(lens.iter().all(|&l| l <= 12), "{lens:?}");

    // An empty prompt (no chat template to add tokens) has nothing to predict a response
    // from: an error naming its file and line, or a counted skip.
    cfg.data.truncation = Truncation::Filter;
    cfg.data.skip_bad_rows = false;
    skein_data::parquet::write(&dir.join("train.parquet"), &rows(10, 1, 0)).unwrap();
    let empty = r#"{"prompt": "", "data_source": "a", "reward_model": {"ground_truth": "1"}}"#;
    write_jsonl(
        &dir.join("val.jsonl"),
        &held_out_rows(3),
        &format!("{empty}\n"),
    );
    let err = format!("{:#}", Data::load(&cfg).err().unwrap());
    assert!(
        err.contains("val.jsonl, row 4: the prompt is empty") && err.contains("data.skip_bad_rows"),
        "{err}"
    );
    cfg.data.skip_bad_rows = true;
    let data = Data::load(&cfg).unwrap();
    assert_eq!((data.val.len(), data.counts.skipped_rows), (3, 1));
    // Every training row skipped as bad: the error says so, not that prompts were too long.
    write_jsonl(&dir.join("bad.jsonl"), &[], &format!("{empty}\n{empty}\n"));
    let mut bad = cfg.clone();
    bad.data.train_files = vec![dir.join("bad.jsonl").display().to_string()];
    let err = format!("{:#}", Data::load(&bad).err().unwrap());
    assert!(
        err.contains("every row of `data.train_files` was skipped as bad")
            && !err.contains("max_prompt_tokens"),
        "{err}"
    );
}

/// A dataset's rows name their data sources, so its `[reward]` routes are checked once the
/// rows are loaded: a route no row uses, or rows no route scores, is refused with the sources
/// the rows have, before any trajectory fails for it.
#[test]
fn reward_routes_are_checked_against_the_rows_data_sources() {
    let dir = workdir("routes");
    skein_data::parquet::write(&dir.join("train.parquet"), &rows(10, 1, 0)).unwrap();
    write_jsonl(&dir.join("val.jsonl"), &held_out_rows(3), "");
    let reward = |route: &str, default_route: &str| {
        format!(
            "[reward.sources.answer]\nkind = \"math\"\n[reward.routes.\"{route}\"]\n\
             sources = [\"answer\"]\n[reward.default_route]\nsources = [{default_route}]\n"
        )
    };

    let cfg = config_with(&dir, &reward("openai/arith", "\"answer\""));
    let err = format!("{:#}", Data::load(&cfg).err().unwrap());
    assert!(
        err.contains(
            "`reward.routes.openai/arith`: no loaded row has data source `openai/arith` (the \
             rows have: `arith` (13 rows))"
        ),
        "{err}"
    );
    let cfg = config_with(&dir, &reward("arith", ""));
    Data::load(&cfg).expect("every row's source has its route");

    // With no default route, a source without a route of its own would fail every one of
    // its trajectories at run time.
    write_jsonl(
        &dir.join("val.jsonl"),
        &held_out_rows(3),
        r#"{"prompt": "9+9=", "data_source": "other", "reward_model": {"ground_truth": "18"}}"#,
    );
    let err = format!("{:#}", Data::load(&cfg).err().unwrap());
    assert!(
        err.contains("no route scores rows with data source `other` (1 row)"),
        "{err}"
    );
}

#[test]
fn sft_on_chat_jsonl_lowers_the_loss_and_writes_a_loadable_model() {
    let dir = workdir("sft");
    let task = Arithmetic::new(1);
    let mut rng = TaskRng::new(3);
    let lines: String = (0..64)
        .map(|_| {
            let p = task.sample(&mut rng);
            json!({"messages": [{"role": "system", "content": "add"},
                                {"role": "user", "content": p.prompt},
                                {"role": "assistant", "content": p.ground_truth}]})
            .to_string()
                + "\n"
        })
        .collect();
    let data = dir.join("chat.jsonl");
    std::fs::write(
        &data,
        lines
            + "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n"
            // Turns a character-level model's plain prompt cannot hold: skipped too.
            + "{\"messages\": [{\"role\": \"user\", \"content\": \"1+1\"}, \
               {\"role\": \"assistant\", \"content\": \"2\"}, \
               {\"role\": \"user\", \"content\": \"2+2\"}, \
               {\"role\": \"assistant\", \"content\": \"4\"}]}\n",
    )
    .unwrap();
    let out_dir = dir.join("model");
    let out = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args([
            "sft",
            "--data",
            data.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ])
        .args([
            "--steps",
            "40",
            "--batch-size",
            "16",
            "--lr",
            "3e-3",
            "--max-tokens",
            "64",
        ])
        .args(["--threads", "1", "--skip-bad-rows"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["skipped_rows"], 2);
    let (first, last) = (
        summary["sft/loss_first"].as_f64().unwrap(),
        summary["sft/loss_last"].as_f64().unwrap(),
    );
    assert!(last < 0.6 * first, "loss {first} → {last}");
    let model = skein::model::Model::load_dir(&out_dir, tch::Device::Cpu).unwrap();
    assert!(model.net.config.num_parameters() > 0);
    let tok = skein_text::Tokenizer::from_dir(&out_dir).unwrap();
    assert!(tok.chat_template().unwrap().is_some());
}

/// `skein eval RUN_DIR` with the run's own config `--set`.
fn eval_run(run: &Path, sets: &[&str], flags: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_skein"));
    cmd.args(["eval", run.to_str().unwrap(), "--set", "run.threads=1"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    cmd.args(flags);
    cmd.output().unwrap()
}

/// The JSON line of a `skein eval` that succeeded.
fn eval_line(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// One judge of correctness (`eval.correct_by`, here derived from a flexible `math` reward)
/// decides the run's held-out accuracy and `skein eval`'s on its checkpoint: the same number
/// on the same problems, named the same way. The training rows' ground truths are worked
/// answers (`3+4=7`), so the warm-up teaches the model to answer with an equation, as chat
/// models do; the validation rows (every fourth sum, which training never has) have the bare
/// sums, which only the last number of such an answer matches: the dataset's own (strict)
/// check finds none of them correct.
#[test]
fn skein_eval_of_a_run_reports_its_final_accuracy_by_the_runs_judge() {
    let dir = workdir("judge");
    let row = |i: usize, truth: String| {
        let (a, b) = (i / 10, i % 10);
        PromptRow {
            prompt: vec![ChatMessage {
                role: "user".into(),
                content: format!("{a}+{b}"),
            }],
            data_source: "sums".into(),
            ground_truth: truth,
            extra_info: json!({"index": i}),
        }
    };
    // Training has every problem but the held-out ones: every fourth, so the evaluation spans
    // the table.
    let worked: Vec<_> = (0..100)
        .filter(|i| i % 4 != 0)
        .map(|i| row(i, format!("{}+{}={}", i / 10, i % 10, i / 10 + i % 10)))
        .collect();
    let bare: Vec<_> = (0..100)
        .step_by(4)
        .map(|i| row(i, (i / 10 + i % 10).to_string()))
        .collect();
    write_jsonl(&dir.join("train.jsonl"), &worked, "");
    write_jsonl(&dir.join("val.jsonl"), &bare, "");
    let run = dir.join("run");
    let toml = format!(
        r#"
[run]
dir = "{run}"
threads = 1
[model]
hidden_size = 64
num_layers = 2
num_heads = 2
num_kv_heads = 1
intermediate_size = 128
[data]
train_files = ["{train}"]
val_files = ["{val}"]
[sft]
steps = 500
batch_size = 32
lr = 5e-3
eval_every = 0
[rollout]
prompts_per_step = 4
samples_per_prompt = 2
[trainer]
steps = 1
[eval]
problems = 20
every = 0
[reward.sources.answer]
kind = "math"
flexible = true
[reward.default_route]
sources = ["answer"]
"#,
        run = run.display(),
        train = dir.join("train.jsonl").display(),
        val = dir.join("val.jsonl").display(),
    );
    let cfg: TrainConfig = skein_config::load(Some(&toml), "test", &[]).unwrap();
    let summary = skein::trainer::run::train(&cfg).unwrap();
    let flexible = "reward source `answer` (math, flexible: last number)";
    assert_eq!(summary.correct_by, flexible);
    let last = metrics(&run)
        .into_iter()
        .rfind(|m| m.get("eval/accuracy").is_some())
        .unwrap();
    let accuracy = last["eval/accuracy"].as_f64().unwrap();
    assert_eq!(accuracy, summary.eval_after.accuracy);
    assert!(
        accuracy > 0.0,
        "the warmed-up model should get some sums right"
    );

    // The run's held-out problems: the first `eval.problems` of the 25 validation rows.
    let samples = dir.join("samples.jsonl");
    let samples_flag = format!("--samples={}", samples.display());
    let line = eval_line(&eval_run(&run, &[], &[&samples_flag]));
    assert_eq!(line["problems"], 20);
    // --samples: one line per sample with the text the verdict was given on, as many correct
    // as the accuracy says, each right one ending in its ground truth.
    let written: Vec<Value> = std::fs::read_to_string(&samples)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(written.len(), 20);
    let right: Vec<&Value> = written.iter().filter(|v| v["correct"] == true).collect();
    assert_eq!(right.len() as f64 / 20.0, accuracy);
    for v in &right {
        let response = v["response"].as_str().unwrap().trim();
        let truth = v["ground_truth"].as_str().unwrap();
        assert!(response.ends_with(truth), "{v}");
    }
    // A second evaluation never overwrites the first one's samples.
    let again = eval_run(&run, &[], &[&samples_flag]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--samples"));
    assert_eq!(
        std::fs::read_to_string(&samples).unwrap().lines().count(),
        20
    );
    assert_eq!(line["correct_by"], flexible, "{line}");
    assert_eq!(line["eval/accuracy"].as_f64().unwrap(), accuracy, "{line}");
    // The reward too is the run's: its sources score `skein eval`'s answers.
    assert_eq!(line["eval/reward"], last["eval/reward"], "{line}");
    // Loaded in the run's dtype, or the one `--set` asks for.
    assert_eq!(line["dtype"], "float32", "{line}");
    let bf16 = eval_line(&eval_run(&run, &["model.dtype=\"bfloat16\""], &[]));
    assert_eq!(bf16["dtype"], "bfloat16", "{bf16}");

    // The same answers judged by the dataset's own check: not one is a bare or marked number.
    let strict = eval_line(&eval_run(&run, &["eval.correct_by=\"task\""], &[]));
    assert_eq!(strict["eval/accuracy"].as_f64().unwrap(), 0.0, "{strict}");
    assert_eq!(strict["eval/reward"], line["eval/reward"], "{strict}");
    assert!(
        strict["correct_by"]
            .as_str()
            .unwrap()
            .starts_with("the dataset's math check"),
        "{strict}"
    );

    // Without validation files a run evaluates training rows drawn with a seed of their own,
    // and so does `skein eval` of it.
    let drawn = eval_line(&eval_run(&run, &["data.val_files=[]"], &[]));
    assert_eq!(drawn["problems"], 20);
    assert!(
        drawn["data"]
            .as_str()
            .unwrap()
            .ends_with("(train-set problems)"),
        "{drawn}"
    );

    // A judge that has no verdict is refused, naming the key and what it may be.
    let out = eval_run(
        &run,
        &[
            "reward.sources.fmt.kind=\"format\"",
            "reward.sources.fmt.boxed=true",
            "eval.correct_by=\"fmt\"",
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`eval.correct_by`") && err.contains("(allowed: task, answer;"),
        "{err}"
    );
}

/// Held-out accuracy is over distinct problems training never draws: validation prompts the
/// training files also have, and repeats, are left out and counted; a validation split with
/// nothing else is refused.
#[test]
fn held_out_prompts_are_distinct_and_never_trained_on() {
    let dir = workdir("held-out");
    let cfg = config(&dir);
    let train = rows(10, 1, 0);
    skein_data::parquet::write(&dir.join("train.parquet"), &train).unwrap();
    let fresh = |content: &str| PromptRow {
        prompt: vec![ChatMessage {
            role: "user".into(),
            content: content.into(),
        }],
        ..train[0].clone()
    };
    let val = [
        train[0].clone(),
        fresh("91+92="),
        fresh("91+92="),
        train[3].clone(),
        fresh("93+94="),
    ];
    write_jsonl(&dir.join("val.jsonl"), &val, "");
    let data = Data::load(&cfg).unwrap();
    let prompts: Vec<&str> = data.val.iter().map(|p| p.prompt.as_str()).collect();
    assert_eq!(prompts, vec!["91+92=", "93+94="]);
    assert_eq!((data.counts.val_in_train, data.counts.val_repeats), (2, 1));

    write_jsonl(&dir.join("val.jsonl"), &train[..3], "");
    let err = format!("{:#}", Data::load(&cfg).err().unwrap());
    assert!(
        err.contains("`data.val_files` leave no held-out prompt")
            && err.contains("3 also in the training files"),
        "{err}"
    );
}
