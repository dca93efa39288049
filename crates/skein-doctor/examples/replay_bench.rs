//! Times `skein_doctor::replay` on a synthetic run directory and reports its peak memory.
//!
//! ```sh
//! cargo run --release -p skein-doctor --example replay_bench -- write /tmp/run-5000 5000
//! cargo run --release -p skein-doctor --example replay_bench -- replay /tmp/run-5000 [OUT]
//! ```
//!
//! `write` makes a run of STEPS RL steps: a `metrics.jsonl` of a few dozen metrics a step (an
//! evaluation every 25 steps as a second record of its step, as the trainer writes it) and a
//! step file of 64 trajectories (8 groups of 8, 32 prompt and 64 response tokens each) per
//! step. Its metrics make several rules hold now and then, so the replay does a doctor's real
//! work. `replay` runs in a process of its own, so the peak resident memory it prints (VmHWM)
//! is the replay's; with OUT it also writes the diagnoses found, one JSON line each, for
//! comparing builds.

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use skein_report::trajectories::{write_step, RowRecord, Status, TrajectoryRecord};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

const GROUPS: usize = 8;
const SAMPLES: usize = 8;
const PROMPT_TOKENS: usize = 32;
const RESPONSE_TOKENS: usize = 64;
const EVAL_EVERY: usize = 25;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["write", dir] => write_run(Path::new(dir), 5000),
        ["write", dir, steps] => write_run(Path::new(dir), steps.parse().context("STEPS")?),
        ["replay", dir] => replay(Path::new(dir), None),
        ["replay", dir, out] => replay(Path::new(dir), Some(Path::new(out))),
        _ => bail!("usage: replay_bench write DIR [STEPS] | replay_bench replay DIR [OUT]"),
    }
}

fn replay(dir: &Path, out: Option<&Path>) -> Result<()> {
    let start = Instant::now();
    let (doctor, replayed) = skein_doctor::replay(dir)?;
    let wall = start.elapsed().as_secs_f64();
    let found = doctor.found();
    println!(
        "replayed {} steps in {wall:.3} s; {} diagnoses; {} unreadable step files; peak RSS {}",
        replayed.steps,
        found.len(),
        replayed.unreadable_step_files,
        peak_rss().unwrap_or_else(|| "unknown".into())
    );
    if let Some(out) = out {
        let mut f = std::fs::File::create(out)?;
        for d in found {
            writeln!(f, "{}", serde_json::to_string(d)?)?;
        }
    }
    Ok(())
}

/// The process's peak resident set size, as /proc/self/status reports it.
fn peak_rss() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.trim_start_matches("VmHWM:").trim().to_string())
}

fn write_run(dir: &Path, steps: usize) -> Result<()> {
    let start = Instant::now();
    std::fs::create_dir_all(dir)?;
    let mut metrics = std::io::BufWriter::new(std::fs::File::create(dir.join("metrics.jsonl"))?);
    writeln!(metrics, "{}", json!({"step": 0, "eval/accuracy": 0.4}))?;
    let mut rng = Rng(0x5eed);
    for s in 1..=steps {
        let m = step_metrics(s, steps);
        writeln!(metrics, "{}", Value::Object(m.clone()))?;
        if s.is_multiple_of(EVAL_EVERY) {
            let accuracy = 0.5 + 0.1 * (s as f64 / 300.0).sin();
            writeln!(metrics, "{}", json!({"step": s, "eval/accuracy": accuracy}))?;
        }
        write_step(dir, s, &trajectories(s, &m, &mut rng))?;
    }
    metrics.flush()?;
    println!(
        "wrote {steps} steps to {} in {:.1} s",
        dir.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One step's record: slow trends with bursts that make rules hold for a while.
fn step_metrics(s: usize, steps: usize) -> Map<String, Value> {
    let t = s as f64 / steps as f64;
    let x = s as f64;
    let burst = |period: usize, len: usize| s % period < len;
    let mut m = json!({
        "step": s,
        "reward/mean": 0.3 + 0.3 * t + 0.05 * (x / 7.0).sin(),
        "reward/min": 0.0,
        "reward/max": if s.is_multiple_of(997) { 40.0 } else { 1.0 },
        "reward/accuracy": 0.3 + 0.2 * t,
        "reward/step_failed": if s.is_multiple_of(450) { 10 } else { 0 },
        "rollout/trajectories": GROUPS * SAMPLES,
        "response_len/mean": 60.0 + 10.0 * (x / 50.0).sin(),
        "response_len/correct_mean": 55.0,
        "response_len/incorrect_mean": 65.0,
        "response/truncated_fraction": if burst(200, 6) && !s.is_multiple_of(3) { 0.3 } else { 0.05 },
        "entropy": if burst(611, 2) { 0.2 } else { 1.0 + 0.3 * (x / 13.0).sin() },
        "grad_norm": if s.is_multiple_of(733) { 30.0 } else { 1.0 + 0.1 * (x / 5.0).sin() },
        "approx_kl": if burst(500, 3) { 0.3 } else { 0.01 },
        "clip_frac": 0.1,
        "batch/equal_reward_group_fraction": if burst(300, 5) { 0.9 } else { 0.5 },
    });
    let m = m.as_object_mut().expect("a JSON object");
    // The rest of a real record: timings, throughput and optimizer figures no rule reads.
    for k in 0..24 {
        m.insert(
            format!("timing/stage_{k}_s"),
            json!(0.01 * (k + 1) as f64 + t),
        );
    }
    m.clone()
}

/// The step's trajectories: groups of samples of one prompt, a few cut off or failed.
fn trajectories(s: usize, m: &Map<String, Value>, rng: &mut Rng) -> Vec<TrajectoryRecord> {
    let failed = m["reward/step_failed"].as_u64().unwrap_or(0) as usize;
    let truncated = m["response/truncated_fraction"].as_f64().unwrap_or(0.0);
    let spike = m["reward/max"].as_f64().unwrap_or(1.0);
    let mut out = Vec::with_capacity(GROUPS * SAMPLES);
    for g in 0..GROUPS {
        for k in 0..SAMPLES {
            let i = g * SAMPLES + k;
            let correct = rng.next() < 0.5;
            let (status, reason) = if i < failed {
                (Status::Failed, Some("reward call timed out".to_string()))
            } else if rng.next() < truncated {
                (Status::Truncated, Some("max_new_tokens".to_string()))
            } else {
                (Status::Finished, None)
            };
            let reward = if i == 0 && spike > 1.0 {
                spike
            } else {
                f64::from(u8::from(correct))
            };
            out.push(TrajectoryRecord {
                step: s,
                policy_version: s as u64,
                id: format!("s{s}-g{g}-{k}"),
                group: format!("s{s}-g{g}"),
                source: "synthetic".into(),
                status,
                reason,
                reward,
                correct,
                turns: 1,
                tool_calls: 0,
                turn_rewards: vec![None],
                rows: vec![row(rng)],
            });
        }
    }
    out
}

fn row(rng: &mut Rng) -> RowRecord {
    let ids = |n: usize, rng: &mut Rng| -> Vec<u32> {
        (0..n).map(|_| (rng.next() * 32000.0) as u32).collect()
    };
    let prompt_ids = ids(PROMPT_TOKENS, rng);
    let response_ids = ids(RESPONSE_TOKENS, rng);
    let text = |ids: &[u32]| ids.iter().map(|t| format!("t{t}")).collect();
    RowRecord {
        transition: None,
        mini_batch: Some(0),
        rank: Some(0),
        prompt_text: text(&prompt_ids),
        response_text: text(&response_ids),
        prompt_ids,
        loss_mask: vec![1; RESPONSE_TOKENS],
        behavior_logp: (0..RESPONSE_TOKENS).map(|_| -rng.next() as f32).collect(),
        versions: vec![0; RESPONSE_TOKENS],
        advantages: (0..RESPONSE_TOKENS)
            .map(|_| rng.next() as f32 - 0.5)
            .collect(),
        is_weight: Vec::new(),
        response_ids,
    }
}

/// A small deterministic generator (xorshift), so every build replays the same run.
struct Rng(u64);

impl Rng {
    /// Uniform in [0, 1).
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}
