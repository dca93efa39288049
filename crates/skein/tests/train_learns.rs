//! End to end: the default job's pipeline (tiny model from scratch, SFT warm-up, GRPO) on the
//! easiest task setting must raise the training reward, and the same run with the policy update
//! switched off must not: so the threshold catches a broken gradient, not just noise.
//!
//! Greedy accuracy is not asserted here: 16 steps on 100 training problems move the sampled
//! reward far more than greedy accuracy (over seeds 0–2 it moved +0.03, +0.14 and +0.15, one
//! standard error being about 0.05), so a floor on it could only be loose. The held-out gain
//! of RL over its warm-up is asserted by `tests/default_job.rs`, on the default job.

use skein::trainer::run::train;
use skein::trainer::TrainConfig;

fn config(dir: &str, rl_lr: f64) -> TrainConfig {
    let mut cfg: TrainConfig = skein_config::load(None, "test", &[]).unwrap();
    cfg.run.dir = std::env::temp_dir()
        .join(format!("skein-{dir}-{}", std::process::id()))
        .display()
        .to_string();
    // The easiest setting (100 problems, evaluated on training problems), with the warm-up
    // it learns from in a few seconds.
    cfg.task.difficulty = 1;
    // Demonstrations that leave something for RL to correct (correct ones are the default).
    cfg.task.dropped_carries = Some(skein_tasks::arithmetic::DEFAULT_DROPPED_CARRIES);
    cfg.sft.steps = 25;
    cfg.sft.lr = 2e-3;
    cfg.trainer.steps = 16;
    cfg.eval.problems = 100;
    cfg.eval.every = 0;
    cfg.optim.lr = rl_lr;
    cfg.trainer.checkpoint_every = 8;
    cfg
}

#[test]
fn grpo_raises_the_reward_and_a_frozen_policy_does_not() {
    let learn = train(&config("learn", 5e-4)).expect("training run");
    let frozen = train(&config("frozen", 1e-12)).expect("frozen run");
    // Same seed, same SFT: both start from the same policy.
    assert_eq!(learn.eval_before.accuracy, frozen.eval_before.accuracy);
    // Every step answered something: no reward is missing.
    let gain = |r: &[Option<f64>]| -> f64 {
        let r: Vec<f64> = r.iter().map(|x| x.expect("a step's reward")).collect();
        r[r.len() - 3..].iter().sum::<f64>() / 3.0 - r[..3].iter().sum::<f64>() / 3.0
    };
    let (g, f) = (gain(&learn.rewards), gain(&frozen.rewards));
    eprintln!(
        "reward gain (last 3 steps − first 3): GRPO {g:.3}, frozen {f:.3}; rewards {:?}",
        learn.rewards
    );
    // 256 samples a step: the mean of 3 steps has a standard error near 0.02, so 0.15 is far
    // outside noise, and the frozen run shows what noise alone does.
    assert!(
        g >= 0.15,
        "GRPO should raise the mean reward by ≥ 0.15 (got {g:.3})"
    );
    assert!(
        f.abs() < 0.08,
        "a policy that is not updated must not improve (got {f:.3})"
    );
    // The checkpoints are HF directories this project loads back, tokenizer and eos included.
    let ckpt = learn.dir.join("checkpoint");
    let model = skein::model::Model::load_dir(&ckpt, tch::Device::Cpu).expect("checkpoint loads");
    let tokenizer = skein_text::Tokenizer::from_dir(&ckpt).expect("tokenizer loads");
    assert_eq!(model.net.config.vocab_size, tokenizer.vocab_size());
    assert!(!tokenizer.eos_token_ids().is_empty());
    assert!(
        learn.dir.join("checkpoint-8/model.safetensors").exists(),
        "periodic checkpoint"
    );
    assert_the_default_panels_are_logged(&learn.dir);
    for run in [&learn, &frozen] {
        for f in [
            "metrics.jsonl",
            "plot.png",
            "config.toml",
            "checkpoint/model.safetensors",
            "checkpoint/tokenizer.json",
            "checkpoint/generation_config.json",
        ] {
            assert!(
                run.dir.join(f).exists(),
                "{} missing in the run directory",
                f
            );
        }
        std::fs::remove_dir_all(&run.dir).ok();
    }
}

/// Every metric the default plot draws is one a run writes: a renamed metric would otherwise
/// drop out of `plot.png` without a word. Those that only some runs write are named.
fn assert_the_default_panels_are_logged(dir: &std::path::Path) {
    let only_some_runs = [
        "sft/eval_accuracy",  // a warm-up evaluated on the way (`sft.eval_every` > 0)
        "loss/value",         // a critic (`gae`)
        "kl_ref",             // a reference policy (`algorithm.kl_coef` > 0)
        "clip_frac/sequence", // `gspo`
        "is/masked_tokens",   // an off-policy correction that masks
        "is/masked_rows",
        "is/weighted_rows",
        "agent/tool_calls_mean", // a multi-turn task
        "agent/turns_mean",
        "eval/turns_mean",
        "staleness/mean", // partial rollout
        "staleness/max",
    ];
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).expect("metrics.jsonl");
    let logged: std::collections::HashSet<String> = text
        .lines()
        .flat_map(|l| {
            let record: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(l).expect("a record");
            record.into_iter().map(|(key, _)| key)
        })
        .collect();
    for key in skein_report::DEFAULT_PANELS
        .iter()
        .flat_map(|p| p.split('|'))
    {
        assert!(
            logged.contains(key) || only_some_runs.contains(&key),
            "`{key}` is drawn by default but no record of the run has it"
        );
    }
}
