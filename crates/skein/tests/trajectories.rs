//! End to end: a run keeps each step's trajectories in `trajectories/step-N.jsonl.zst`, token
//! for token as trained (mask, advantages, mini-batch and rank), `trajectories.keep` bounds
//! them, and a resumed run replaces what the interrupted one wrote past its checkpoint. Credit
//! per turn, with a group estimator and with a critic (turn-level GAE), is read back from them.

mod common;
use common::{step_metrics, workdir, TINY_RUN};
use skein::trainer::config::{CreditMode, Estimator, Keep};
use skein::trainer::run::{resume, train};
use skein::trainer::TrainConfig;
use skein_report::trajectories::{list_steps, read_step, step_path, write_step, Status};
use std::path::Path;

fn config(name: &str) -> TrainConfig {
    let tiny: Vec<String> = TINY_RUN.iter().map(|s| s.to_string()).collect();
    let mut cfg: TrainConfig = skein_config::load(None, "test", &tiny).unwrap();
    cfg.run.dir = workdir("trajectories", name).display().to_string();
    cfg.task.name = "guess".into();
    cfg.task.difficulty = 1;
    cfg.trainer.steps = 2;
    cfg.trainer.num_mini_batches = 2;
    cfg.rollout.prompts_per_step = 4;
    cfg.rollout.samples_per_prompt = 4;
    cfg.sft.steps = 20;
    cfg.sft.batch_size = 16;
    cfg.eval.problems = 4;
    cfg
}

fn steps_on_disk(dir: &Path) -> Vec<usize> {
    list_steps(dir).unwrap().into_iter().map(|s| s.0).collect()
}

#[test]
fn every_trajectory_of_every_step_is_kept_as_trained() {
    let cfg = config("all");
    let run = train(&cfg).expect("run");
    assert_eq!(steps_on_disk(&run.dir), [1, 2]);
    let metrics = step_metrics(&run.dir);
    for (step, m) in (1..=2).zip(&metrics) {
        let records = read_step(&step_path(&run.dir, step)).unwrap();
        assert_eq!(records.len(), 16, "step {step}");
        let turns: usize = records.iter().map(|r| r.turns).sum();
        let turns_mean = m["agent/turns_mean"].as_f64().unwrap();
        assert!(
            (turns as f64 / 16.0 - turns_mean).abs() < 1e-9,
            "{turns} vs {m}"
        );
        let mut mini_batches = std::collections::BTreeSet::new();
        for r in &records {
            // A policy version per optimizer step: two mini-batches a step.
            assert_eq!((r.step, r.policy_version), (step, 2 * (step as u64 - 1)));
            assert_eq!(r.source, "guess");
            assert_ne!(r.status, Status::Failed, "{r:?}");
            // A guessing episode is one merged row: turns with the game's answers between them.
            assert_eq!(r.rows.len(), 1, "{}", r.id);
            let row = &r.rows[0];
            let n = row.response_ids.len();
            assert_eq!(row.response_text.len(), n);
            assert_eq!(row.prompt_text.len(), row.prompt_ids.len());
            for per_token in [
                row.loss_mask.len(),
                row.behavior_logp.len(),
                row.versions.len(),
            ] {
                assert_eq!(per_token, n);
            }
            assert_eq!(row.advantages.len(), n);
            if r.turns > 1 {
                assert!(row.loss_mask.contains(&0), "no inserted reply in {}", r.id);
            }
            // Every sampled token carries the trajectory's advantage, inserted ones none.
            let adv = row.advantages[0];
            for (&m, &a) in row.loss_mask.iter().zip(&row.advantages) {
                assert_eq!(a, if m == 1 { adv } else { 0.0 }, "{}", r.id);
            }
            mini_batches.insert(row.mini_batch.expect("trained rows have a mini-batch"));
            assert_eq!(row.rank, Some(0));
        }
        assert_eq!(mini_batches.len(), 2, "two mini-batches planned");
        // The samples of a group are compared with each other: GRPO's advantages sum to ~0.
        let group: Vec<_> = records
            .iter()
            .filter(|r| r.group == records[0].group)
            .collect();
        assert_eq!(group.len(), 4);
        let sum: f32 = group.iter().map(|r| r.rows[0].advantages[0]).sum();
        // (The first response token is sampled: a reply comes only after a message.)
        assert!(sum.abs() < 1e-3, "{sum}");
    }
}

/// A group left out of training for its equal rewards (`algorithm.drop_equal_reward_groups`)
/// is kept as it was sampled: each of its trajectories with its tokens, in no mini-batch.
#[test]
fn a_dropped_group_is_kept_as_sampled_untrained() {
    let mut cfg = config("dropped");
    cfg.algorithm.drop_equal_reward_groups = true;
    let run = train(&cfg).expect("run");
    let mut dropped = 0;
    for step in [1, 2] {
        let records = read_step(&step_path(&run.dir, step)).unwrap();
        assert_eq!(records.len(), 16, "step {step}");
        for r in &records {
            assert!(!r.rows.is_empty(), "{} has no tokens", r.id);
            assert!(
                r.rows.iter().all(|row| !row.response_ids.is_empty()),
                "{}",
                r.id
            );
            let trained = r.rows.iter().any(|row| row.mini_batch.is_some());
            let group: Vec<f64> = records
                .iter()
                .filter(|o| o.group == r.group)
                .map(|o| o.reward)
                .collect();
            let equal = group.iter().all(|&x| x == group[0]);
            assert_eq!(trained, !equal, "{}: {group:?}", r.id);
            if !trained {
                assert!(r.rows.iter().all(|row| row.advantages.is_empty()));
                dropped += 1;
            }
        }
    }
    assert!(
        dropped > 0,
        "no group had equal rewards: nothing was dropped"
    );
}

#[test]
fn keep_bounds_the_trajectories_of_a_step() {
    let mut cfg = config("keep");
    cfg.trajectories.keep = Keep::First(4);
    let run = train(&cfg).expect("run");
    for step in [1, 2] {
        let records = read_step(&step_path(&run.dir, step)).unwrap();
        // The first group, whole.
        assert_eq!(records.len(), 4);
        assert!(records.iter().all(|r| r.group == records[0].group));
    }
    let mut cfg = config("none");
    cfg.trajectories.keep = Keep::None;
    let run = train(&cfg).expect("run");
    assert!(!run.dir.join("trajectories").exists());
}

#[test]
fn a_resumed_run_replaces_the_steps_past_its_checkpoint() {
    let mut cfg = config("resume");
    cfg.trainer.steps = 3;
    cfg.trainer.checkpoint_every = 2;
    let run = train(&cfg).expect("run");
    assert_eq!(steps_on_disk(&run.dir), [1, 2, 3]);
    let kept = std::fs::read(step_path(&run.dir, 2)).unwrap();
    // What a run that died after step 7 (checkpointed at 2) would have left behind.
    let stale = read_step(&step_path(&run.dir, 3)).unwrap();
    write_step(&run.dir, 7, &stale).unwrap();
    cfg.trainer.steps = 4;
    resume(&cfg).expect("resume");
    assert_eq!(steps_on_disk(&run.dir), [1, 2, 3, 4]);
    assert_eq!(std::fs::read(step_path(&run.dir, 2)).unwrap(), kept);
    let step4 = read_step(&step_path(&run.dir, 4)).unwrap();
    assert!(step4.iter().all(|r| r.step == 4 && r.policy_version == 6));
}

/// Per-turn credit on a model and warm-up large enough that some episodes win and others do
/// not, so the turns have rewards to tell apart.
fn turn_credit_config(name: &str) -> TrainConfig {
    let mut cfg = config(name);
    cfg.model.hidden_size = 64;
    cfg.model.num_layers = 2;
    cfg.sft.steps = 60;
    cfg.sft.lr = 3e-3;
    cfg.algorithm.credit = CreditMode::Turn;
    cfg
}

/// `algorithm.credit = "turn"` with step groups: the turns of one episode train with different
/// advantages, in one merged row (so in one mini-batch), and the step logs the advantages per
/// turn index and the step groups it found.
#[test]
fn turn_credit_gives_the_turns_of_an_episode_their_own_advantages() {
    let mut cfg = turn_credit_config("turn-credit");
    cfg.algorithm.turn_gamma = 0.5;
    cfg.algorithm.step_group_weight = 0.5;
    let run = train(&cfg).expect("run");
    let metrics = step_metrics(&run.dir);
    assert_eq!(metrics.len(), 2);
    for m in &metrics {
        // The guessing game names its states: the turns of a group taken in the same state
        // (every episode's first, at least) make step groups.
        for k in ["credit/step_groups", "credit/step_group_turns"] {
            let n = m[k].as_f64().unwrap_or_else(|| panic!("no `{k}` in {m}"));
            assert!(n > 0.0, "{k}: {m}");
        }
        assert!(
            m["credit/turn1/adv_mean"].as_f64().unwrap().abs() < 1e-6,
            "{m}"
        );
        let positive = m["credit/positive_turn_fraction"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&positive), "{m}");
    }
    let mut distinct = 0;
    for step in [1, 2] {
        for r in read_step(&step_path(&run.dir, step)).unwrap() {
            let turns = turn_advantages(&r);
            distinct += usize::from(turns.windows(2).any(|w| w[0] != w[1]));
        }
    }
    assert!(
        distinct > 0,
        "no episode had turns with different advantages"
    );
}

/// The advantage of each turn of a merged episode row: a run of sampled tokens shares one
/// value, inserted tokens have none. Returns them, one per turn.
fn turn_advantages(r: &skein_report::trajectories::TrajectoryRecord) -> Vec<f32> {
    let row = &r.rows[0];
    let mut turns: Vec<f32> = Vec::new();
    let mut prev = 0;
    for (&m, &a) in row.loss_mask.iter().zip(&row.advantages) {
        match (m, prev) {
            (1, 0) => turns.push(a),
            (1, _) => assert_eq!(Some(&a), turns.last(), "{}", r.id),
            _ => assert_eq!(a, 0.0, "inserted tokens train with no advantage"),
        }
        prev = m;
    }
    assert_eq!(turns.len(), r.turns, "{}", r.id);
    turns
}

/// A critic with per-turn credit: turn-level GAE gives every token of a turn that turn's
/// advantage, the turns of an episode differ, and the critic trains with a finite loss.
#[test]
fn turn_level_gae_gives_each_turn_one_advantage() {
    let mut cfg = turn_credit_config("turn-gae");
    cfg.algorithm.estimator = Estimator::Gae;
    let run = train(&cfg).expect("run");
    let metrics = step_metrics(&run.dir);
    assert_eq!(metrics.len(), 2);
    for m in &metrics {
        let value_loss = m["loss/value"].as_f64().unwrap();
        assert!(value_loss.is_finite() && value_loss > 0.0, "{m}");
        assert!(
            m["credit/turn1/adv_mean"].as_f64().unwrap().is_finite(),
            "{m}"
        );
        let positive = m["credit/positive_turn_fraction"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&positive), "{m}");
    }
    let mut distinct = 0;
    for step in [1, 2] {
        for r in read_step(&step_path(&run.dir, step)).unwrap() {
            let turns = turn_advantages(&r);
            distinct += usize::from(turns.windows(2).any(|w| w[0] != w[1]));
        }
    }
    assert!(
        distinct > 0,
        "no episode had turns with different advantages"
    );
}
