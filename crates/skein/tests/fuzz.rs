//! A bounded fuzz of every command, run for real: numeric edge values (0, 1, −1, huge, NaN,
//! ±inf, fractions, negatives) in `train` config keys, in `eval`, `sft` and `serve` flags, in
//! `plan` JSON and in the metrics `plot` draws. Each case runs the `skein` binary as a
//! subprocess under a watchdog and must end in one of two ways: a clear error (exit status 2,
//! naming a key or flag) or a run that works. A panic, an abort, a signal or memory growing past
//! [`RSS_LIMIT_MIB`] fails the test, with every failing case listed.
//!
//! The cases are a seeded sample: `SKEIN_FUZZ_SEED` picks another sample and
//! `SKEIN_FUZZ_CASES` sets how many per command (`all` runs every edge value of every train key).

mod common;

use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Values that break code which assumes a sane number.
const EDGES: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "1000000000000",
    "9223372036854775807",
    "0.5",
    "1e-12",
    "-0.5",
    "1e300",
    "nan",
    "inf",
    "-inf",
];

/// Memory a tiny run never needs; past it the case counts as an unbounded allocation.
const RSS_LIMIT_MIB: u64 = 3072;

/// How long a case may run before it is judged: a long run here is a huge step count working
/// as told, which the watchdog has already checked for memory growth.
const DEADLINE: Duration = Duration::from_secs(10);

/// A tiny, fast training run: one step of everything, few problems, one thread.
fn tiny_train(dir: &Path) -> Vec<String> {
    let mut sets: Vec<String> = common::TINY_RUN.iter().map(|s| s.to_string()).collect();
    sets.extend(
        [
            "trainer.steps=1",
            "sft.steps=1",
            "eval.problems=4",
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2",
        ]
        .map(String::from),
    );
    sets.push(format!("run.dir=\"{}\"", dir.display()));
    sets.into_iter().flat_map(|s| ["--set".into(), s]).collect()
}

/// How a watched process ended.
struct Outcome {
    code: Option<i32>,
    stderr: String,
    timed_out: bool,
    peak_rss_mib: u64,
}

/// Resident memory of a live process, from /proc.
fn rss_mib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024)
}

/// Waits for `child`, killing it at the deadline or when its memory passes the limit.
fn watch(mut child: Child) -> Outcome {
    let stderr = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        text
    });
    let start = Instant::now();
    let mut peak = 0;
    let (code, timed_out) = loop {
        if let Some(status) = child.try_wait().expect("waiting for skein") {
            break (status.code(), false);
        }
        peak = peak.max(rss_mib(child.id()));
        if peak > RSS_LIMIT_MIB || start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break (None, peak <= RSS_LIMIT_MIB);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Outcome {
        code,
        stderr: reader.join().unwrap_or_default(),
        timed_out,
        peak_rss_mib: peak,
    }
}

fn skein(args: &[String], stdin: Option<&str>) -> Outcome {
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("skein runs");
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let _ = pipe.write_all(text.as_bytes());
    }
    watch(child)
}

/// Whether an error names what is wrong: a `key`, a --flag, or a file and its row.
fn names_what(stderr: &str) -> bool {
    let row = |l: &str| {
        l.split(':')
            .nth(2)
            .is_some_and(|n| n.trim().parse::<u64>().is_ok())
    };
    stderr.contains('`')
        || stderr.contains("--")
        || stderr.contains(", row ")
        || stderr.lines().any(row)
}

/// None when the outcome is acceptable, else what went wrong.
fn judge(o: &Outcome) -> Option<String> {
    let last = o
        .stderr
        .lines()
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .join(" | ");
    if o.peak_rss_mib > RSS_LIMIT_MIB {
        return Some(format!("memory grew past {RSS_LIMIT_MIB} MiB"));
    }
    if let Some(at) = o.stderr.find("panicked at") {
        let panic: String = o.stderr[at..].lines().take(2).collect::<Vec<_>>().join(" ");
        return Some(panic.chars().take(300).collect());
    }
    match o.code {
        _ if o.timed_out => None,
        Some(0) => None,
        Some(2) if names_what(&o.stderr) => None,
        Some(2) => Some(format!(
            "an error that names no key, flag or file row: {last}"
        )),
        code => Some(format!("exit {code:?}: {last}")),
    }
}

/// A small deterministic generator, so a failing sample can be run again by its seed.
struct Picks(u64);

impl Picks {
    fn from_env() -> Self {
        let seed = std::env::var("SKEIN_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        eprintln!("fuzz seed {seed} (SKEIN_FUZZ_SEED)");
        Picks(seed)
    }

    fn below(&mut self, n: usize) -> usize {
        // SplitMix64.
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }

    fn edge(&mut self) -> &'static str {
        EDGES[self.below(EDGES.len())]
    }
}

/// Cases per command: `SKEIN_FUZZ_CASES`, else `default`.
fn cases(default: usize) -> Option<usize> {
    match std::env::var("SKEIN_FUZZ_CASES").as_deref() {
        Ok("all") => None,
        Ok(n) => Some(n.parse().expect("SKEIN_FUZZ_CASES is a number or `all`")),
        Err(_) => Some(default),
    }
}

/// Fails the test with every failing case, each with the command that reproduces it.
fn report(command: &str, failures: Vec<String>, total: usize) {
    assert!(
        failures.is_empty(),
        "{} of {total} `skein {command}` cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every numeric key of the training config, as `section.key`.
fn numeric_keys() -> Vec<String> {
    let cfg = skein::trainer::TrainConfig::default();
    let table = toml::Value::try_from(&cfg).expect("the default config is TOML");
    skein_config::keys(&cfg)
        .into_iter()
        .filter(|k| {
            let v = k.split('.').try_fold(&table, |t, part| t.get(part));
            matches!(v, Some(toml::Value::Integer(_) | toml::Value::Float(_)))
        })
        .collect()
}

#[test]
fn train_with_edge_values_errors_or_runs() {
    let keys = numeric_keys();
    let grid: Vec<(String, &str)> = keys
        .iter()
        .flat_map(|k| EDGES.iter().map(move |e| (k.clone(), *e)))
        .collect();
    let mut picks = Picks::from_env();
    let chosen: Vec<Vec<(String, &str)>> = match cases(40) {
        None => grid.iter().map(|c| vec![c.clone()]).collect(),
        Some(n) => (0..n)
            .map(|_| {
                // Mostly one key at a time; sometimes two, where values meet.
                let k = 1 + usize::from(picks.below(4) == 0);
                (0..k)
                    .map(|_| grid[picks.below(grid.len())].clone())
                    .collect()
            })
            .collect(),
    };
    let root = common::workdir("fuzz", "train");
    let mut failures = Vec::new();
    for (i, case) in chosen.iter().enumerate() {
        let mut args = vec!["train".to_string()];
        args.extend(tiny_train(&root.join(i.to_string())));
        for (key, value) in case {
            args.extend(["--set".into(), format!("{key}={value}")]);
        }
        let outcome = skein(&args, None);
        let sets: Vec<String> = case.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if outcome.timed_out {
            eprintln!(
                "still running at the deadline: --set {}",
                sets.join(" --set ")
            );
        }
        if let Some(why) = judge(&outcome) {
            failures.push(format!("  --set {}: {why}", sets.join(" --set ")));
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    report("train", failures, chosen.len());
}

/// A tiny model directory and a chat file, made once by a real run.
fn tiny_model(root: &Path) -> PathBuf {
    let run = root.join("model-run");
    let mut args = vec!["train".to_string()];
    args.extend(tiny_train(&run));
    args.extend(["--set".into(), "trainer.steps=0".into()]);
    let out = skein(&args, None);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    run.join("checkpoint")
}

/// Cases of `flags` with edge values, each flag set alone or with another.
fn flag_cases(flags: &[&'static str], picks: &mut Picks, n: usize) -> Vec<Vec<String>> {
    (0..n)
        .map(|_| {
            let k = 1 + usize::from(picks.below(3) == 0);
            (0..k)
                .flat_map(|_| {
                    let flag = flags[picks.below(flags.len())];
                    [format!("{flag}={}", picks.edge())]
                })
                .collect()
        })
        .collect()
}

fn run_flag_cases(command: &str, base: &[String], cases: Vec<Vec<String>>) {
    let mut failures = Vec::new();
    for case in &cases {
        let mut args: Vec<String> = vec![command.into()];
        args.extend(base.iter().cloned());
        args.extend(case.iter().cloned());
        if let Some(why) = judge(&skein(&args, None)) {
            failures.push(format!("  {}: {why}", case.join(" ")));
        }
    }
    report(command, failures, cases.len());
}

#[test]
fn eval_and_sft_with_edge_values_error_or_run() {
    let root = common::workdir("fuzz", "eval-sft");
    let model = tiny_model(&root);
    let mut picks = Picks::from_env();
    let n = cases(24).unwrap_or(60);

    let eval_flags = ["--n", "--temperature", "--k", "--problems"];
    let eval_cases = flag_cases(&eval_flags, &mut picks, n);
    let base = [model.display().to_string()];
    run_flag_cases("eval", &base, eval_cases);

    let chat = root.join("chat.jsonl");
    let line = json!({"messages": [{"role": "user", "content": "2+3="},
                                   {"role": "assistant", "content": "5"}]});
    std::fs::write(&chat, format!("{line}\n{line}\n")).unwrap();
    let sft_flags = [
        "--steps",
        "--batch-size",
        "--lr",
        "--max-tokens",
        "--seed",
        "--threads",
    ];
    let mut failures = Vec::new();
    let sft_cases = flag_cases(&sft_flags, &mut picks, n);
    for (i, case) in sft_cases.iter().enumerate() {
        let mut args: Vec<String> = ["sft", "--model", &model.display().to_string()]
            .map(String::from)
            .to_vec();
        args.extend(["--data".into(), chat.display().to_string()]);
        args.extend([
            "--out".into(),
            root.join(format!("sft-{i}")).display().to_string(),
        ]);
        args.extend(case.iter().cloned());
        if let Some(why) = judge(&skein(&args, None)) {
            failures.push(format!("  {}: {why}", case.join(" ")));
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    report("sft", failures, sft_cases.len());
}

/// A `skein plan` batch with edge values in one or two of its numbers, written as bare words
/// (so NaN and the infinities are JSON a parser must refuse cleanly).
fn plan_input(picks: &mut Picks) -> String {
    // dp_size, num_mini_batches, seed, a reward, a prompt, a response and a loss-token count.
    let mut v = ["2", "2", "0", "1.0", "8", "4", "3"];
    for _ in 0..1 + picks.below(2) {
        v[picks.below(v.len())] = picks.edge();
    }
    format!(
        r#"{{"dp_size": {}, "num_mini_batches": {}, "unit": "trajectory",
  "equal_minibatch_rows": false, "loss_agg_mode": "token-mean", "seed": {},
  "trajectories": [
    {{"id": "a", "group": "g", "reward": {}, "status": "finished",
     "transitions": [{{"prompt_len": {}, "response_len": {}, "loss_tokens": 4}}]}},
    {{"id": "b", "group": "g", "reward": 0.0, "status": "finished",
     "transitions": [{{"prompt_len": 8, "response_len": 2, "loss_tokens": 2}},
                     {{"prompt_len": 12, "response_len": 3, "loss_tokens": {}}}]}}]}}"#,
        v[0], v[1], v[2], v[3], v[4], v[5], v[6]
    )
}

#[test]
fn plan_with_edge_values_errors_or_plans() {
    let mut picks = Picks::from_env();
    let n = cases(40).unwrap_or(200);
    let mut failures = Vec::new();
    for _ in 0..n {
        let input = plan_input(&mut picks);
        if let Some(why) = judge(&skein(&["plan".into()], Some(&input))) {
            failures.push(format!("  {input}: {why}"));
        }
    }
    report("plan", failures, n);
}

/// Values whose sum or difference overflows f64, for `plot`'s axis ranges.
const OVERFLOWING: &[&str] = &["9e307", "-9e307", "1.7e308", "-1.7e308"];

impl Picks {
    /// An edge value, or often one whose range with another overflows.
    fn plot_value(&mut self) -> &'static str {
        if self.below(3) == 0 {
            OVERFLOWING[self.below(OVERFLOWING.len())]
        } else {
            self.edge()
        }
    }
}

/// `plot` draws a file it has read: unlike a training run, it has no reason to still be
/// running at the deadline, so a timeout fails the case.
#[test]
fn plot_of_metrics_with_edge_values_errors_or_draws() {
    let root = common::workdir("fuzz", "plot");
    let mut picks = Picks::from_env();
    let n = cases(16).unwrap_or(60);
    let line = |step: &str, reward: &str, accuracy: &str| {
        format!("{{\"step\": {step}, \"reward/mean\": {reward}, \"eval/accuracy\": {accuracy}}}")
    };
    // Ranges known to overflow come first, then the seeded sample.
    let mut samples: Vec<Vec<String>> = vec![
        vec![line("1", "9e307", "0.5"), line("2", "-9e307", "0.5")],
        vec![line("1", "1.7e308", "0.5"), line("2", "1.7e308", "0.5")],
        vec![
            line("-1.7e308", "0.5", "0.5"),
            line("1.7e308", "0.5", "0.5"),
        ],
    ];
    samples.extend((0..n).map(|_| {
        (0..1 + picks.below(4))
            .map(|_| line(picks.plot_value(), picks.plot_value(), picks.plot_value()))
            .collect()
    }));
    let mut failures = Vec::new();
    for (i, lines) in samples.iter().enumerate() {
        let dir = root.join(i.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("metrics.jsonl"), lines.join("\n")).unwrap();
        let args = ["plot".to_string(), dir.display().to_string()];
        let outcome = skein(&args, None);
        if outcome.timed_out {
            failures.push(format!(
                "  {}: still running after {DEADLINE:?}",
                lines.join(" ")
            ));
        } else if let Some(why) = judge(&outcome) {
            failures.push(format!("  {}: {why}", lines.join(" ")));
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    report("plot", failures, samples.len());
}

/// Starts `skein serve` with `flags`; once it listens, one completion request must get an
/// HTTP answer. Returns what went wrong, if anything.
fn serve_case(flags: &[String]) -> Option<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(["serve", "--port", "0"])
        .env("RUST_BACKTRACE", "0")
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("skein runs");
    let stderr = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("skein serve: listening on http://") {
                let _ = tx.send(url.to_string());
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let answer = rx.recv_timeout(DEADLINE).ok().map(|addr| complete(&addr));
    let _ = child.kill();
    let status = child.wait().expect("waiting for skein serve");
    let stderr = reader.join().unwrap_or_default();
    if let Some(answer) = answer {
        return match answer {
            Ok(()) if !stderr.contains("panicked at") => None,
            Ok(()) => Some(format!("panicked while serving: {stderr}")),
            Err(e) => Some(format!(
                "listening, but the request got no answer: {e}; {stderr}"
            )),
        };
    }
    judge(&Outcome {
        code: status.code(),
        stderr,
        timed_out: false,
        peak_rss_mib: 0,
    })
}

/// One completion request over plain HTTP; any status line is an answer.
fn complete(addr: &str) -> Result<(), String> {
    let body = r#"{"model": "skein-tiny", "prompt": "1+1=", "max_tokens": 4}"#;
    let mut stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(DEADLINE)).ok();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut first = String::new();
    BufReader::new(stream)
        .read_line(&mut first)
        .map_err(|e| e.to_string())?;
    if first.starts_with("HTTP/1.1 ") {
        Ok(())
    } else {
        Err(format!("not an HTTP answer: {first:?}"))
    }
}

#[test]
fn serve_with_edge_values_errors_or_answers() {
    let mut picks = Picks::from_env();
    let n = cases(12).unwrap_or(60);
    let flags = [
        "--max-concurrent",
        "--max-body-bytes",
        "--max-slots",
        "--context",
        "--default-max-tokens",
        "--seed",
    ];
    let mut failures = Vec::new();
    for case in flag_cases(&flags, &mut picks, n) {
        if let Some(why) = serve_case(&case) {
            failures.push(format!("  {}: {why}", case.join(" ")));
        }
    }
    report("serve", failures, n);
}
