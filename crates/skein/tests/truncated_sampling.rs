//! Training with top-p and top-k sampling through the real `skein train` binary: the engine
//! records what each truncation kept and the trainer computes π over the same ids, so the
//! engine's and the trainer's log-probs of the step's own tokens agree to float round-off.

mod common;

use common::step_metrics;

fn train(name: &str, set: &str) -> std::path::PathBuf {
    let dir = common::workdir("truncated-sampling", name);
    let sets: Vec<String> = [
        "sft.steps=40",
        "trainer.steps=3",
        "eval.problems=8",
        "rollout.prompts_per_step=8",
        "rollout.samples_per_prompt=4",
        set,
    ]
    .map(String::from)
    .to_vec();
    common::train_tiny(&dir, &sets);
    dir
}

#[test]
fn top_p_and_top_k_train_with_logprob_mismatch_at_round_off() {
    for (name, set) in [
        ("top-p", "rollout.sampling.top_p=0.9"),
        ("top-k", "rollout.sampling.top_k=5"),
    ] {
        let dir = train(name, set);
        let steps = step_metrics(&dir);
        assert_eq!(steps.len(), 3, "{name}");
        for m in &steps {
            let mean = m["logp_mismatch/mean"].as_f64().expect("a mismatch figure");
            let max = m["logp_mismatch/max"].as_f64().unwrap();
            assert!(mean < 1e-5 && max < 1e-3, "{name}: mean {mean}, max {max}");
            let kept = m["sampling/kept_ids_mean"]
                .as_f64()
                .expect("a kept-set figure");
            assert!(kept >= 1.0, "{name}: {kept}");
            if name == "top-k" {
                assert!(kept >= 5.0, "top-k 5 keeps at least 5 ids: {kept}");
            }
        }
    }
}
