//! A whole training run, readable top to bottom: set up (`setup.rs`), then RL steps — rollout
//! → batch → prepare → update → publish → log → checkpoint, each a call into its own room —
//! evaluate again, save the policy and plot the curves.

use super::batch::build_step_batch;
use super::checkpoint::StopStreaks;
use super::diagnoses::{kept_digests, summary};
use super::metrics::{extend, StageTimes, StepReport};
use super::prepare::prepare;
use super::rollout::stats::UntrainedSteps;
use super::rollout::{eval_kind, eval_metrics, EvalResult};
use super::setup::{start, Begin, Started, Trainer};
use super::update::ranks::{layout, Ranks};
use super::update::CriticStats;
use super::update::UpdateStats;
use super::{checkpoint, final_checkpoint, interrupt};
use crate::engine::Generator;
use crate::trainer::config::TrainConfig;
use anyhow::{bail, Result};
use serde_json::{Map, Value};
use skein_report::record;
use skein_report::StepProgress;
use std::path::PathBuf;
use std::time::Instant;

/// What a finished run reports (also written to metrics.jsonl and the plot).
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub dir: PathBuf,
    pub eval_before: EvalResult,
    pub eval_after: EvalResult,
    /// Mean training reward of each RL step (None for a step whose every trajectory failed).
    pub rewards: Vec<Option<f64>>,
    /// Stopped by Ctrl-C after a step and its checkpoint: resume to continue.
    pub interrupted: bool,
    /// This process's data-parallel rank: anything but 0 only served rank 0's updates.
    pub rank: usize,
    /// The evaluations were on held-out problems (else on training problems).
    pub held_out: bool,
    /// What decided `correct` in every accuracy of the run (`eval.correct_by`), in words.
    pub correct_by: String,
}

/// A new run in `cfg.run.dir`; a directory that holds another run is refused.
pub fn train(cfg: &TrainConfig) -> Result<RunSummary> {
    run(cfg, Begin::New)
}

/// Refuses a new run as [`train_new`] would, its config or its directory, without taking the
/// directory: for a command that trains several runs and checks every one before the first
/// spends any time.
pub fn check_new_run(cfg: &TrainConfig, overwrite: bool) -> Result<()> {
    super::config::validate::validate(cfg)?;
    super::run_dir::RunDir::for_new_run(cfg, overwrite).map(drop)
}

/// A new run in `cfg.run.dir`: with `overwrite`, replacing the run there (set aside until
/// this one has a checkpoint), else refused where another run is ([`train`]).
pub fn train_new(cfg: &TrainConfig, overwrite: bool) -> Result<RunSummary> {
    run(
        cfg,
        if overwrite {
            Begin::Overwrite
        } else {
            Begin::New
        },
    )
}

/// Continues the run in `cfg.run.dir` from its newest intact `checkpoint-N`, exactly where it
/// stopped.
pub fn resume(cfg: &TrainConfig) -> Result<RunSummary> {
    run(cfg, Begin::Resume)
}

/// [`start`], with the curves drawn of a warm-up stopped by Ctrl-C, as a stopped RL phase
/// has them.
fn start_drawing_a_stopped_warm_up(cfg: &TrainConfig, begin: Begin) -> Result<Started<'_>> {
    start(cfg, begin).map_err(|e| {
        let warm_up_stopped = e.chain().any(|c| c.is::<super::sft::WarmUpInterrupted>());
        match warm_up_stopped {
            true => with_curves(std::path::Path::new(&cfg.run.dir), e),
            false => e,
        }
    })
}

fn run(cfg: &TrainConfig, begin: Begin) -> Result<RunSummary> {
    let mut t = match start_drawing_a_stopped_warm_up(cfg, begin)? {
        Started::Trainer(t) => t,
        Started::OtherRank { rank } => return Ok(RunSummary::other_rank(cfg, rank)),
    };
    let steps = cfg.trainer.steps;
    // A resumed run goes on with its checkpoint's streaks.
    let mut skips = SkipStreak::resumed(&t.streaks);
    let mut untrained = UntrainedSteps::resumed(t.streaks.untrained_steps);
    let mut interrupted = false;
    let mut progress = StepProgress::resumed(steps as u64, t.first_step.saturating_sub(1) as u64);

    for step in t.first_step..=steps {
        // Sampling draws from libtorch's global generator: seeding it per step makes a step's
        // rollout independent of how the run got there, so a resumed run samples exactly what
        // the uninterrupted one did.
        tch::manual_seed(step_seed(cfg.run.seed, step));
        let t0 = Instant::now();
        let version = t.opt.steps_done as u64;

        // Rollout: whole groups, every trajectory scored.
        let rollout = t.rollout(version, step)?;
        let rollout_s = t0.elapsed().as_secs_f64();
        untrained.count(step, &rollout);
        interrupt::exit_if_urgent("the rollout");

        // Batch and prepare: group advantages, the mini-batch plan, then π_old/π_ref,
        // importance weights and (with a critic) GAE — the advantages are final after this.
        let t1 = Instant::now();
        let batch = build_step_batch(&rollout.trajectories, &t.batch_cfg, step as u64)?;
        let batch = prepare(batch, &t.models(), version, &t.prepare_cfg);
        let prepare_s = t1.elapsed().as_secs_f64();
        interrupt::exit_if_urgent("preparing the batch");

        // Update the policy (and the critic), then publish the weights to a remote engine.
        let t2 = Instant::now();
        let (upd, critic) = t.update(step, &batch)?;
        let update_s = t2.elapsed().as_secs_f64();
        interrupt::exit_if_urgent("the update");
        skips.count(step, &upd, critic.as_ref());

        // Log the step (and, every `eval.every` steps, the held-out accuracy).
        t.rewards.push(rollout.reward_mean());
        let report = StepReport {
            step,
            rollout: &rollout,
            remote: matches!(t.engine, Generator::Remote(_)),
            batch: &batch,
            update: &upd,
            critic: critic.as_ref(),
            layout: (t.policy_ranks.size() > 1).then(|| layout(batch.rows(), batch.plan())),
            policy_version: t.opt.steps_done,
            times: StageTimes {
                rollout_s,
                prepare_s,
                update_s,
                step_s: t0.elapsed().as_secs_f64(),
            },
            staleness_cap: cfg.rollout.partial.reachable_staleness(
                (cfg.trainer.num_mini_batches * cfg.trainer.ppo_epochs) as u64,
            ),
            estimator: cfg.algorithm.estimator,
        };
        let record = t.log_step(report.record(), step)?;
        // Name what is going wrong, the moment it starts.
        let kept = kept_digests(&rollout, cfg.trajectories.keep);
        let files = t.files()?;
        files
            .doctor
            .observe(record, kept, |l| progress.println(l))?;
        let gen_tok_s = rollout.engine.generated_tokens as f64 / rollout_s.max(1e-9);
        let shown = [
            ("reward", rollout.reward_mean().unwrap_or(f64::NAN)),
            ("acc", rollout.accuracy().unwrap_or(f64::NAN)),
            ("gen tok/s", gen_tok_s),
        ];
        // Keep the step's trajectories for `skein view`: moved to a writer thread.
        files
            .trajectories
            .send(step, version, rollout, batch.into_batch());

        // Checkpoint every `trainer.checkpoint_every` steps, and on Ctrl-C.
        let every = cfg.trainer.checkpoint_every;
        interrupted = interrupt::requested();
        if (every > 0 && step % every == 0) || interrupted {
            t.streaks = stop_streaks(&skips, &untrained);
            t.save_checkpoint(step)?;
        }
        progress.update(step as u64, &shown);
        stop_early(&t, step, &skips, &untrained).inspect_err(|_| progress.finish())?;
        if interrupted {
            break;
        }
    }
    progress.finish();
    finish(*t, interrupted)
}

/// The streaks that stop a run, as a checkpoint keeps them for its resume.
fn stop_streaks(skips: &SkipStreak, untrained: &UntrainedSteps) -> StopStreaks {
    StopStreaks {
        skipped_updates: skips.streak,
        critic_skipped_updates: skips.critic_streak,
        untrained_steps: untrained.streak(),
    }
}

/// Updates skipped for a NaN or infinite loss or gradient, the policy's and the critic's
/// apart: a critic whose every update is skipped stops the run as the policy's would, rather
/// than train on under a frozen value model.
struct SkipStreak {
    /// Consecutive policy updates skipped, in the order they ran, the last one included.
    streak: usize,
    /// The same of the critic's updates.
    critic_streak: usize,
    /// The longest run of consecutive skips, of either, the last step's updates held.
    longest: usize,
}

impl SkipStreak {
    /// Going on from a checkpoint's streaks (0 for a new run).
    fn resumed(streaks: &StopStreaks) -> Self {
        SkipStreak {
            streak: streaks.skipped_updates,
            critic_streak: streaks.critic_skipped_updates,
            longest: 0,
        }
    }

    fn count(&mut self, step: usize, policy: &UpdateStats, critic: Option<&CriticStats>) {
        (self.longest, self.streak) = policy.skip_runs.continue_streak(self.streak);
        if let Some(c) = critic {
            let critic_longest;
            (critic_longest, self.critic_streak) = c.skip_runs.continue_streak(self.critic_streak);
            self.longest = self.longest.max(critic_longest);
        }
        let skipped = policy.skipped_updates + critic.map_or(0, |c| c.skipped_updates);
        if skipped > 0 {
            eprintln!(
                "skein: step {step}: {skipped} update(s) skipped (NaN or infinite loss or \
                 gradient)"
            );
        }
    }
}

impl RunSummary {
    /// Another rank of an MPI job: it only served rank 0's updates.
    fn other_rank(cfg: &TrainConfig, rank: usize) -> Self {
        RunSummary {
            dir: PathBuf::from(&cfg.run.dir),
            eval_before: EvalResult::default(),
            eval_after: EvalResult::default(),
            rewards: Vec::new(),
            interrupted: false,
            rank,
            held_out: false,
            correct_by: String::new(),
        }
    }
}

impl Trainer<'_> {
    /// Appends a step's record, with the data's own metrics and, every `eval.every` steps
    /// (but the last, which the final evaluation covers), the held-out accuracy. Returns the
    /// record as written.
    fn log_step(&mut self, mut m: Map<String, Value>, step: usize) -> Result<Map<String, Value>> {
        extend(&mut m, self.workload.data_metrics(false));
        let every = self.cfg.eval.every;
        if every > 0 && step.is_multiple_of(every) && step != self.cfg.trainer.steps {
            let held_out = self.workload.held_out();
            extend(&mut m, eval_metrics(&self.evaluate(), held_out));
        }
        self.files()?.log.append(&m)?;
        Ok(m)
    }
}

/// After the last step (or a Ctrl-C): evaluate, save the policy in HF layout, plot the curves.
fn finish(mut t: Trainer, interrupted: bool) -> Result<RunSummary> {
    let dir = t.dir.clone();
    let correct_by = t
        .cfg
        .correct_by()
        .map_err(anyhow::Error::msg)?
        .describe(&t.cfg.task_checker());
    if interrupted {
        let plot = skein_report::plot_run_dir(&dir, None)?;
        let step = t.rewards.len();
        eprintln!(
            "skein: interrupted after step {step}; checkpoint {} written, curves {}. \
             Continue with: skein train --resume {}",
            dir.join(format!("checkpoint-{step}")).display(),
            plot.display(),
            dir.display()
        );
        return Ok(RunSummary {
            dir,
            eval_before: t.eval_before,
            eval_after: t.eval_before,
            rewards: t.rewards,
            interrupted: true,
            rank: 0,
            held_out: t.workload.held_out(),
            correct_by,
        });
    }
    let eval_after = t.evaluate();
    let mut last = record(t.cfg.trainer.steps, []);
    extend(&mut last, eval_metrics(&eval_after, t.workload.held_out()));
    let files = t.files()?;
    files.log.append(&last)?;
    files
        .doctor
        .observe(last, Vec::new(), |l| eprintln!("{l}"))?;
    eprintln!(
        "skein: eval after RL: {} accuracy {:.3}{} (before: {:.3})",
        eval_kind(t.workload.held_out()),
        eval_after.accuracy,
        eval_after.failures_note(),
        t.eval_before.accuracy
    );
    let ckpt = final_checkpoint::save(
        &dir,
        &t.policy,
        &t.tokenizer,
        &t.sampling,
        t.cfg.trainer.steps,
        t.last_checkpoint.as_deref(),
    )?;
    t.keep_over_replaced_run()?;
    let plot = skein_report::plot_run_dir(&dir, None)?;
    eprintln!(
        "skein: checkpoint {} (HF layout), curves {}",
        ckpt.display(),
        plot.display()
    );
    eprintln!("{}", summary(t.files()?.doctor.found(), &dir));
    Ok(RunSummary {
        dir,
        eval_before: t.eval_before,
        eval_after,
        rewards: t.rewards,
        interrupted: false,
        rank: 0,
        held_out: t.workload.held_out(),
        correct_by,
    })
}

/// Stops a run whose updates kept failing, naming its last good checkpoint.
fn stop_for_skips(t: &Trainer, step: usize, streak: usize) -> Result<()> {
    let (last_good, then) = match checkpoint::latest_up_to(&t.dir, step)? {
        Some((_, p)) => (p.display().to_string(), "before resuming"),
        None if t.cfg.trainer.checkpoint_every == 0 => (
            "none (trainer.checkpoint_every is 0)".to_string(),
            "before starting again",
        ),
        None => (
            format!(
                "none yet (one is written every {} steps, trainer.checkpoint_every)",
                t.cfg.trainer.checkpoint_every
            ),
            "before starting again",
        ),
    };
    bail!(
        "stopping at step {step}: {streak} consecutive updates (of the policy, or of the \
         critic) had a NaN or infinite loss or \
         gradient (limit `trainer.max_consecutive_skips`); the last good checkpoint is \
         {last_good}. Lower `optim.lr`, keep `optim.grad_clip` > 0, and check the rewards for \
         non-finite values {then}."
    )
}

/// Whether the run stops itself after `step`: its updates kept failing, or its steps trained
/// nothing. The error comes with the curves so far drawn.
fn stop_early(
    t: &Trainer,
    step: usize,
    skips: &SkipStreak,
    untrained: &UntrainedSteps,
) -> Result<()> {
    let stop = if skips.longest >= t.cfg.trainer.max_consecutive_skips {
        stop_for_skips(t, step, skips.longest)
    } else {
        untrained.check(step)
    };
    stop.map_err(|why| with_curves(&t.dir, why))
}

/// `why` a run stops early, with its curves so far drawn (where they matter most): the
/// plot's path is added to the message, or why it could not be drawn.
fn with_curves(dir: &std::path::Path, why: anyhow::Error) -> anyhow::Error {
    match skein_report::plot_run_dir(dir, None) {
        Ok(plot) => anyhow::anyhow!("{why:#}\nThe curves so far: {}", plot.display()),
        Err(e) => anyhow::anyhow!("{why:#}\n(The curves could not be drawn: {e:#})"),
    }
}

/// The libtorch seed of one step.
fn step_seed(seed: u64, step: usize) -> i64 {
    (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ step as u64) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trainer::update::SkipRuns;

    fn runs(applied: &[bool]) -> SkipRuns {
        let mut r = SkipRuns::default();
        applied.iter().for_each(|&a| r.record(a));
        r
    }

    /// A critic whose updates are all skipped builds a streak of its own across steps while
    /// the policy's updates apply, and a resumed run goes on with it.
    #[test]
    fn the_critics_skips_build_a_streak_of_their_own() {
        let policy = UpdateStats {
            skip_runs: runs(&[true, true]),
            ..UpdateStats::default()
        };
        let critic = CriticStats {
            skipped_updates: 2,
            skip_runs: runs(&[false, false]),
            ..CriticStats::default()
        };
        let mut skips = SkipStreak::resumed(&StopStreaks::default());
        skips.count(1, &policy, Some(&critic));
        assert_eq!(
            (skips.streak, skips.critic_streak, skips.longest),
            (0, 2, 2)
        );
        let saved = StopStreaks {
            skipped_updates: skips.streak,
            critic_skipped_updates: skips.critic_streak,
            untrained_steps: 0,
        };
        let mut resumed = SkipStreak::resumed(&saved);
        resumed.count(2, &policy, Some(&critic));
        assert_eq!(resumed.longest, 4, "the critic's run goes on across steps");
        // Without a critic only the policy's skips count.
        resumed.count(3, &policy, None);
        assert_eq!(resumed.longest, 0);
    }
}
