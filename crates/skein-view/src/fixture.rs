//! A small made-up run directory with every kind of trajectory the page draws: single-turn
//! groups, a multi-turn episode with a tool call and the tool's reply, stale tokens with
//! importance weights, a truncated one and a failed one. For tests of the viewer.

use anyhow::Result;
use skein_report::trajectories::{write_step, RowRecord, Status, TrajectoryRecord};
use std::io::Write;
use std::path::Path;

/// The reason the failed trajectory of each step gives.
pub const FAILED_REASON: &str =
    "61 tokens, more than the model's 48 positions (model.max_positions)";

/// Writes `metrics.jsonl` for `steps` steps and a trajectory file for each, into `dir`.
/// Returns the number of trajectories of each step.
pub fn write_run(dir: &Path, steps: usize) -> Result<Vec<usize>> {
    std::fs::create_dir_all(dir)?;
    let mut metrics = std::fs::File::create(dir.join("metrics.jsonl"))?;
    let mut counts = Vec::new();
    for step in 1..=steps {
        let records = step_records(step);
        let rewards: Vec<f64> = records.iter().map(|t| t.reward).collect();
        let mean = rewards.iter().sum::<f64>() / rewards.len() as f64;
        writeln!(
            metrics,
            "{}",
            serde_json::json!({
                "step": step,
                "reward/mean": mean,
                "loss/policy": 0.1 / step as f64,
                "time/step_s": 1.5 + step as f64 * 0.1,
                "batch/failed_trajectories": 1,
            })
        )?;
        write_step(dir, step, &records)?;
        counts.push(records.len());
    }
    Ok(counts)
}

/// Writes `diagnoses.jsonl` into the run `dir` written by [`write_run`] with at least 2 steps:
/// a truncation that started at step 2, its examples the truncated samples of step 2.
pub fn write_diagnoses(dir: &Path) -> Result<Vec<skein_doctor::Diagnosis>> {
    let examples = (0..2)
        .map(|g| skein_doctor::Example {
            step: 2,
            id: format!("s2-p{g}-3"),
        })
        .collect();
    let found = vec![skein_doctor::Diagnosis {
        name: "truncation".into(),
        title: "many responses are cut off by the token limit".into(),
        step: 2,
        until: 2,
        steps: vec![1, 2],
        evidence: "0.25 of the trajectories were cut off by a token limit on steps 1–2".into(),
        examples,
        advice: "raise `rollout.sampling.max_new_tokens`".into(),
    }];
    let mut log = skein_doctor::DiagnosisLog::open(dir)?;
    for d in &found {
        log.append(d)?;
    }
    Ok(found)
}

/// Token ids and texts of a few words, one token a word.
fn tokens(words: &[&str]) -> (Vec<u32>, Vec<String>) {
    let ids = words
        .iter()
        .map(|w| w.bytes().fold(7u32, |h, b| h.wrapping_mul(31) ^ b as u32) % 50_000)
        .collect();
    (ids, words.iter().map(|w| w.to_string()).collect())
}

/// A response of (word, sampled) pairs as a trained row of `policy_version`'s step, sampled
/// `behind` versions earlier where `behind` says so.
fn row(
    prompt: &[&str],
    response: &[(&str, bool)],
    policy_version: u64,
    advantage: Option<f32>,
    behind: impl Fn(usize) -> u64,
) -> RowRecord {
    let (prompt_ids, prompt_text) = tokens(prompt);
    let words: Vec<&str> = response.iter().map(|r| r.0).collect();
    let (response_ids, response_text) = tokens(&words);
    let n = response.len();
    let loss_mask: Vec<u8> = response.iter().map(|r| r.1 as u8).collect();
    let versions: Vec<u64> = (0..n)
        .map(|i| policy_version.saturating_sub(behind(i)))
        .collect();
    let stale = versions.iter().any(|&v| v < policy_version);
    RowRecord {
        transition: None,
        mini_batch: advantage.map(|_| 0),
        rank: advantage.map(|_| 0),
        prompt_ids,
        prompt_text,
        response_ids,
        response_text,
        behavior_logp: (0..n).map(|i| -0.1 - 0.37 * (i % 5) as f32).collect(),
        advantages: advantage.map_or(Vec::new(), |a| {
            loss_mask
                .iter()
                .map(|&m| if m == 1 { a } else { 0.0 })
                .collect()
        }),
        is_weight: if stale && advantage.is_some() {
            (0..n).map(|i| 0.6 + 0.25 * (i % 6) as f32).collect()
        } else {
            Vec::new()
        },
        loss_mask,
        versions,
    }
}

fn record(step: usize, id: String, group: &str, source: &str, reward: f64) -> TrajectoryRecord {
    TrajectoryRecord {
        step,
        policy_version: step as u64 - 1,
        id,
        group: group.into(),
        source: source.into(),
        status: Status::Finished,
        reason: None,
        reward,
        correct: reward > 0.5,
        turns: 1,
        tool_calls: 0,
        turn_rewards: vec![None],
        rows: Vec::new(),
    }
}

/// One step: two arithmetic groups of four samples and a tool-using group of two.
pub fn step_records(step: usize) -> Vec<TrajectoryRecord> {
    let version = step as u64 - 1;
    let mut out = Vec::new();
    let arithmetic = [
        (["What", " is", " 3", "+", "4", "?"], ["7", "</s>"]),
        (["What", " is", " 5", "+", "3", "?"], ["8", "</s>"]),
    ];
    for (g, (prompt, right)) in arithmetic.iter().enumerate() {
        let group = format!("s{step}-p{g}");
        let answers: [(&[&str], f64); 4] = [
            (right, 1.0),
            (&["1", "2", "</s>"], 0.0),
            (right, 1.0),
            (&["3", "4", "5", "6", "7", "8"], 0.0),
        ];
        let mean = answers.iter().map(|a| a.1).sum::<f64>() / 4.0;
        for (k, (answer, reward)) in answers.iter().enumerate() {
            let mut t = record(step, format!("{group}-{k}"), &group, "arithmetic", *reward);
            let response: Vec<(&str, bool)> = answer.iter().map(|w| (*w, true)).collect();
            let adv = (*reward - mean) as f32 * 2.0;
            // The second sample of the first group was sampled a version earlier.
            let behind = move |i: usize| u64::from(g == 0 && k == 1 && i > 0);
            t.rows = vec![row(prompt, &response, version, Some(adv), behind)];
            if k == 3 {
                t.status = Status::Truncated;
                t.reason = Some("agent.max_tokens (6) reached".into());
            }
            out.push(t);
        }
    }
    // A tool-using group: one episode calls a tool, reads its reply and answers; the other
    // runs past the model's context and fails.
    let group = format!("s{step}-tools");
    let mut t = record(step, format!("{group}-0"), &group, "calc-tool", 1.0);
    t.turns = 2;
    t.tool_calls = 1;
    t.turn_rewards = vec![None, Some(1.0)];
    let response = [
        ("Let", true),
        (" me", true),
        (" compute.", true),
        ("<tool_call>", true),
        (
            "{\"name\": \"calc\", \"arguments\": {\"expr\": \"12*7\"}}",
            true,
        ),
        ("</tool_call>", true),
        ("\n<tool_response>\n", false),
        ("84", false),
        ("\n</tool_response>\n", false),
        ("It", true),
        (" is", true),
        (" 84", true),
        ("</s>", true),
    ];
    t.rows = vec![row(
        &["Use", " calc:", " 12", "*", "7", "?"],
        &response,
        version,
        Some(0.7),
        |i| (i < 6) as u64 * 2,
    )];
    out.push(t);
    let mut t = record(step, format!("{group}-1"), &group, "calc-tool", 0.0);
    t.status = Status::Failed;
    t.reason = Some(FAILED_REASON.into());
    t.turns = 2;
    t.tool_calls = 1;
    t.turn_rewards = vec![None, None];
    let response = [
        ("<tool_call>", true),
        ("{\"name\": \"calc\"}", true),
        ("</tool_call>", true),
        ("\n<tool_response>\n", false),
        ("error: no expr", false),
        ("\n</tool_response>\n", false),
        ("Hmm", true),
    ];
    t.rows = vec![row(
        &["Use", " calc:", " 12", "*", "7", "?"],
        &response,
        version,
        None,
        |_| 0,
    )];
    out.push(t);
    out
}

/// Writes a hostile step file: `lines` copies of the step's first record, each with
/// `tokens` one-letter prompt tokens, streamed so that writing it costs little. zstd makes
/// it tiny (8M tokens a line: about 3 KB a line), and a reader that keeps it whole holds
/// gigabytes. Returns the file's size in bytes.
pub fn write_hostile_step(dir: &Path, step: usize, lines: usize, tokens: usize) -> Result<u64> {
    let mut record = step_records(step).swap_remove(0);
    record.rows[0].prompt_text.clear();
    let json = serde_json::to_string(&record)?;
    let (head, tail) = json
        .split_once("\"prompt_text\":[]")
        .ok_or_else(|| anyhow::anyhow!("no prompt_text in {json}"))?;
    let path = skein_report::trajectories::step_path(dir, step);
    std::fs::create_dir_all(path.parent().unwrap_or(dir))?;
    let mut z = zstd::Encoder::new(std::fs::File::create(&path)?, 19)?;
    let chunk = "\"a\",".repeat(1 << 14);
    for _ in 0..lines {
        write!(z, "{head}\"prompt_text\":[")?;
        let mut left = tokens.saturating_sub(1);
        while left > 0 {
            let n = left.min(1 << 14);
            z.write_all(&chunk.as_bytes()[..n * 4])?;
            left -= n;
        }
        writeln!(z, "\"a\"]{tail}")?;
    }
    z.finish()?;
    Ok(std::fs::metadata(&path)?.len())
}
