//! Every estimator, with a KL-to-reference term, two data-parallel ranks and each loss
//! aggregation mode, runs a short job end to end and logs finite loss terms.

use skein::trainer::run::train;
use skein::trainer::TrainConfig;

fn short(name: &str, overrides: &[&str]) -> TrainConfig {
    let dir = std::env::temp_dir().join(format!("skein-est-{name}-{}", std::process::id()));
    let mut sets: Vec<String> = vec![
        format!("run.dir={}", dir.display()),
        "sft.steps=5".into(),
        "trainer.steps=2".into(),
        "rollout.prompts_per_step=8".into(),
        "rollout.samples_per_prompt=4".into(),
        "eval.problems=16".into(),
        "model.hidden_size=64".into(),
        "model.intermediate_size=128".into(),
        "model.num_layers=2".into(),
    ];
    sets.extend(overrides.iter().map(|s| s.to_string()));
    skein_config::load(None, "test", &sets).unwrap()
}

#[test]
fn every_estimator_and_aggregation_mode_trains() {
    let runs: Vec<(&str, Vec<&str>)> = vec![
        (
            "grpo-kl",
            vec![
                "algorithm.kl_coef=0.01",
                "trainer.dp_size=2",
                "algorithm.entropy_coef=0.001",
            ],
        ),
        (
            "dr-grpo",
            vec![
                "algorithm.estimator=dr-grpo",
                "algorithm.loss_agg_mode=seq-mean-token-sum-norm",
            ],
        ),
        (
            "rloo",
            vec![
                "algorithm.estimator=rloo",
                "algorithm.loss_agg_mode=seq-mean-token-mean",
                "trainer.ppo_epochs=2",
            ],
        ),
        (
            "rpp",
            vec![
                "algorithm.estimator=reinforce++",
                "algorithm.loss_agg_mode=seq-mean-token-sum",
            ],
        ),
        (
            "rppb",
            vec![
                "algorithm.estimator=reinforce++-baseline",
                "algorithm.loss_agg_mode=trajectory-mean",
                "trainer.unit=group",
            ],
        ),
        (
            "gae",
            vec![
                "algorithm.estimator=gae",
                "trainer.dp_size=3",
                "optim.schedule=cosine",
                "optim.warmup_steps=1",
            ],
        ),
    ];
    for (name, overrides) in runs {
        let cfg = short(name, &overrides);
        let summary = train(&cfg).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let records = skein_report::read_metrics(&summary.dir.join("metrics.jsonl")).unwrap();
        let steps: Vec<_> = records
            .iter()
            .filter(|r| r.contains_key("loss/policy"))
            .collect();
        assert_eq!(steps.len(), 2, "{name}");
        for r in steps {
            let mut keys = vec!["loss/policy", "grad_norm", "entropy"];
            if name == "gae" {
                keys.push("loss/value");
            }
            if name == "grpo-kl" {
                keys.push("kl_ref");
            }
            for key in keys {
                let v = r.get(key).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
                assert!(v.is_finite(), "{name}: {key} = {v}");
            }
            if name == "grpo-kl" {
                assert!(r["policy_version"].as_f64().unwrap() >= 2.0);
            }
            // Equal-reward groups keep an advantage only with a critic, or without a group
            // baseline when the step's rewards differ at all: the step says so, and
            // `no-learning-signal` reads it.
            let carry = r.get("batch/equal_reward_groups_carry_signal");
            let rewards_differ = r["reward/min"] != r["reward/max"];
            let carries = name == "gae" || (name == "rpp" && rewards_differ);
            assert_eq!(carry, carries.then(|| 1.0.into()).as_ref(), "{name}: {r:?}");
        }
        std::fs::remove_dir_all(&summary.dir).ok();
    }
}
