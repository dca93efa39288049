//! Each step's trajectories to `RUN_DIR/trajectories/step-N.jsonl.zst`, off the hot path: the
//! step hands its rollout and prepared batch over (moved, not copied) and a writer thread
//! decodes token texts, builds the records ([`skein_report::trajectories`]) and writes them,
//! while the next step runs.

use super::batch::StepBatch;
use super::config::{Keep, TrajectoriesConfig};
use super::rollout::stats::StepRollout;
use super::rollout::trajectory_info::TrajectoryInfo;
use anyhow::{Context, Result};
use skein_plan::{Status, Trajectory};
use skein_report::trajectories::{self, RowRecord, TrajectoryRecord};
use skein_text::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

/// One step handed to the writer.
struct StepJob {
    step: usize,
    version: u64,
    trajectories: Vec<Trajectory>,
    correct: Vec<bool>,
    info: Vec<TrajectoryInfo>,
    batch: StepBatch,
}

enum Job {
    Step(Box<StepJob>),
    /// Answered once every step sent before it is on disk.
    Flush(SyncSender<()>),
}

/// The writer of a run's trajectory files (nothing at all with `keep = "none"`).
pub struct TrajectoryLog {
    keep: Keep,
    tx: Option<SyncSender<Job>>,
    writer: Option<JoinHandle<()>>,
}

impl TrajectoryLog {
    /// Starts the writer for a run whose next step is `first_step`. Files of that step and
    /// later ones are removed first: a resumed run trains those steps again.
    pub fn start(
        run_dir: &Path,
        cfg: &TrajectoriesConfig,
        tokenizer: &Tokenizer,
        first_step: usize,
    ) -> Result<TrajectoryLog> {
        trajectories::remove_after(run_dir, first_step.saturating_sub(1))?;
        if cfg.keep == Keep::None {
            return Ok(TrajectoryLog {
                keep: cfg.keep,
                tx: None,
                writer: None,
            });
        }
        let folder = run_dir.join(trajectories::DIR);
        std::fs::create_dir_all(&folder)
            .with_context(|| format!("creating {} (trajectories.keep)", folder.display()))?;
        // Two steps in flight at most: a writer slower than training holds the run back
        // rather than queueing every step's batch in memory.
        let (tx, rx) = sync_channel(2);
        let writer = Writer {
            dir: run_dir.to_path_buf(),
            tokenizer: tokenizer.clone(),
            failed: false,
        };
        let writer = std::thread::Builder::new()
            .name("trajectory-log".into())
            .spawn(move || writer.run(rx))
            .context("starting the trajectory writer")?;
        Ok(TrajectoryLog {
            keep: cfg.keep,
            tx: Some(tx),
            writer: Some(writer),
        })
    }

    /// Hands a finished step's trajectories and batch to the writer.
    pub fn send(&self, step: usize, version: u64, rollout: StepRollout, batch: StepBatch) {
        let Some(tx) = &self.tx else { return };
        let n = self.keep.count(rollout.trajectories.len());
        let mut trajectories = rollout.trajectories;
        trajectories.truncate(n);
        let job = StepJob {
            step,
            version,
            trajectories,
            correct: rollout.correct,
            info: rollout.info,
            batch,
        };
        // A writer that died has already said why; training goes on without it.
        let _ = tx.send(Job::Step(Box::new(job)));
    }

    /// Waits until every step sent so far is on disk (before a checkpoint claims them).
    pub fn flush(&self) {
        if let Some(tx) = &self.tx {
            let (done_tx, done_rx) = sync_channel(1);
            if tx.send(Job::Flush(done_tx)).is_ok() {
                let _ = done_rx.recv();
            }
        }
    }
}

impl Drop for TrajectoryLog {
    /// Writes what is still queued, then stops the writer.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

struct Writer {
    dir: PathBuf,
    tokenizer: Tokenizer,
    /// A write failed once: the run was told and goes on; later failures are not repeated.
    failed: bool,
}

impl Writer {
    fn run(mut self, rx: Receiver<Job>) {
        for job in rx {
            match job {
                Job::Step(s) => {
                    let records = records(&s, &self.tokenizer);
                    if let Err(e) = trajectories::write_step(&self.dir, s.step, &records) {
                        if !self.failed {
                            eprintln!(
                                "skein: could not write the trajectories of step {} ({e:#}); \
                                 training goes on, later failures are not reported",
                                s.step
                            );
                            self.failed = true;
                        }
                    }
                }
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }
}

/// The records of one step: every kept trajectory with its rows, in rollout order.
fn records(s: &StepJob, tokenizer: &Tokenizer) -> Vec<TrajectoryRecord> {
    let batch = &s.batch;
    // Where each real row trained: (mini-batch, rank).
    let mut placed = vec![None; batch.rows.len()];
    for (mb, ranks) in batch.plan.iter().enumerate() {
        for (rank, rows) in ranks.iter().enumerate() {
            for &i in rows {
                placed[i] = Some((mb, rank));
            }
        }
    }
    let text = |before: Option<&u32>, ids: &[u32]| tokenizer.token_texts(before.copied(), ids);
    let mut out: Vec<TrajectoryRecord> = s
        .trajectories
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let info = s
                .info
                .get(i)
                .cloned()
                .unwrap_or_else(|| TrajectoryInfo::of(t));
            let (status, reason) = match &t.status {
                Status::Finished => (trajectories::Status::Finished, None),
                Status::Truncated => (trajectories::Status::Truncated, info.cutoff.clone()),
                Status::Failed(why) => (trajectories::Status::Failed, Some(why.clone())),
            };
            TrajectoryRecord {
                step: s.step,
                policy_version: s.version,
                id: t.id.clone(),
                group: t.group.clone(),
                source: info.source,
                status,
                reason,
                reward: t.reward,
                correct: s.correct.get(i).copied().unwrap_or(false),
                turns: info.turns,
                tool_calls: info.tool_calls,
                turn_rewards: t.transitions.iter().map(|x| x.reward).collect(),
                rows: Vec::new(),
            }
        })
        .collect();
    // The trained rows, each under its trajectory (padding rows have no origin).
    for (i, origin) in batch.origins.iter().enumerate() {
        let Some(record) = out.get_mut(origin.trajectory) else {
            continue;
        };
        let r = &batch.rows[i];
        let (mini_batch, rank) = placed[i].unzip();
        record.rows.push(RowRecord {
            transition: origin.transition,
            mini_batch,
            rank,
            prompt_text: text(None, &r.tokens[..r.prompt_len]),
            prompt_ids: r.tokens[..r.prompt_len].to_vec(),
            response_text: text(r.tokens[..r.prompt_len].last(), &r.tokens[r.prompt_len..]),
            response_ids: r.tokens[r.prompt_len..].to_vec(),
            loss_mask: r.loss_mask.clone(),
            behavior_logp: r.behavior_logp.clone(),
            versions: r.versions.clone(),
            advantages: r.advantages.clone(),
            is_weight: r.importance_weights.clone(),
        });
    }
    // A trajectory that trained no row (failed, or in a group left out for its equal rewards,
    // `algorithm.drop_equal_reward_groups`) is shown as it was sampled, untrained.
    for (record, t) in out.iter_mut().zip(&s.trajectories) {
        if record.rows.is_empty() {
            record.rows = t
                .transitions
                .iter()
                .enumerate()
                .map(|(k, x)| RowRecord {
                    transition: Some(k),
                    mini_batch: None,
                    rank: None,
                    prompt_text: text(None, &x.prompt),
                    prompt_ids: x.prompt.clone(),
                    response_text: text(x.prompt.last(), &x.response),
                    response_ids: x.response.clone(),
                    loss_mask: x.loss_mask.clone(),
                    behavior_logp: x.logprobs.clone(),
                    versions: x.versions.clone(),
                    advantages: Vec::new(),
                    is_weight: Vec::new(),
                })
                .collect();
        }
    }
    out
}
