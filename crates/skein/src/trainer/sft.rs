//! Supervised fine-tuning on (prompt, response) token pairs: cross-entropy on response tokens
//! only. The default job uses it to warm-start a policy from generated solutions
//! ([`warm_up`]); `skein sft` uses it on conversations.

use super::batch::TrainRow;
use super::update::optim::{OptimConfig, Optimizer, Schedule};
use super::update::tensors::{token_logprobs, MicroBatch};
use crate::model::Model;
use anyhow::Result;
use skein_report::{MetricsLog, StepProgress};
use tch::Kind;

/// The optimizer of a supervised run: `lr` after a warm-up of a tenth of the steps, then a
/// cosine decay.
pub fn sft_optim_config(lr: f64, steps: usize) -> OptimConfig {
    OptimConfig {
        lr,
        warmup_steps: steps / 10,
        schedule: Schedule::Cosine,
        ..OptimConfig::default()
    }
}

/// Supervised warm-up: `steps` batches of `batch_size` demonstrations, each batch one
/// optimizer step, the loss logged as `sft/loss`.
pub fn warm_up(
    policy: &Model,
    steps: usize,
    batch_size: usize,
    lr: f64,
    demo: &mut dyn FnMut() -> Result<TrainRow>,
    log: &mut MetricsLog,
) -> Result<()> {
    let mut opt = Optimizer::new(&policy.vs, &sft_optim_config(lr, steps), steps)?;
    let mut progress = StepProgress::new(steps as u64);
    for step in 1..=steps {
        if super::interrupt::requested() {
            progress.finish();
            anyhow::bail!(
                "interrupted during the warm-up, after {} of {steps} steps: a run has \
                 nothing to resume before its first RL step, so start it again",
                step - 1
            );
        }
        let rows = (0..batch_size)
            .map(|_| demo())
            .collect::<Result<Vec<_>>>()?;
        let positions = policy.net.max_positions() as usize;
        if let Some(long) = rows.iter().find(|r| r.tokens.len() > positions) {
            anyhow::bail!(
                "a warm-up demonstration has {} tokens, more than the model's {positions} \
                 positions: raise `model.max_positions` (or shorten the prompts)",
                long.tokens.len()
            );
        }
        let loss = sft_step(policy, &mut opt, &rows);
        log.append(&skein_report::record(step, [("sft/loss", loss)]))?;
        progress.update(step as u64, &[("sft loss", loss)]);
        if !loss.is_finite() {
            progress.finish();
            anyhow::bail!("the warm-up's loss is {loss} at step {step}: lower `sft.lr`");
        }
    }
    progress.finish();
    // A step so large that the weights overflow leaves the last loss finite.
    if !weights_finite(policy) {
        anyhow::bail!("the warm-up left weights that are not finite numbers: lower `sft.lr`");
    }
    Ok(())
}

/// Whether every trainable weight of `model` is a finite number.
fn weights_finite(model: &Model) -> bool {
    tch::no_grad(|| {
        model
            .vs
            .trainable_variables()
            .iter()
            .all(|t| t.isfinite().all().int64_value(&[]) != 0)
    })
}

/// A supervised example: the response tokens are the ones the loss trains on.
pub fn sft_row(prompt: &[u32], response: &[u32]) -> TrainRow {
    let mut tokens = prompt.to_vec();
    tokens.extend_from_slice(response);
    sft_row_masked(tokens, prompt.len(), vec![1; response.len()])
}

/// A supervised example that trains on the tokens after `prompt_len` whose `loss_mask` is 1
/// (e.g. only the assistant turns of a conversation).
pub fn sft_row_masked(tokens: Vec<u32>, prompt_len: usize, loss_mask: Vec<u8>) -> TrainRow {
    let n = loss_mask.len();
    TrainRow {
        tokens,
        prompt_len,
        loss_mask,
        behavior_logp: vec![0.0; n],
        advantages: vec![0.0; n],
        weight: 1.0,
        ..Default::default()
    }
}

/// One optimizer step on a batch; returns the mean response-token cross-entropy.
pub fn sft_step(model: &Model, opt: &mut Optimizer, rows: &[TrainRow]) -> f64 {
    let batch: Vec<&TrainRow> = rows.iter().collect();
    let mb = MicroBatch::padded(&batch, model.vs.device());
    opt.zero_grad();
    let (logp, _) = token_logprobs(&model.net, &mb, 1.0, false);
    let tokens = mb.mask.sum(Kind::Float).clamp_min(1.0);
    let loss = -(logp * &mb.mask).sum(Kind::Float) / tokens;
    loss.backward();
    opt.step();
    loss.double_value(&[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelConfig;
    use tch::Device;

    /// A handful of steps on one fixed pair must drive its loss down: a broken gradient path
    /// (wrong alignment, detached logits, masked-out targets) would not.
    #[test]
    fn sft_memorises_a_fixed_pair() {
        let cfg = ModelConfig::tiny_qwen2(16, 32, 1, 2, 2, 64, 32);
        let model = Model::random(&cfg, Device::Cpu, 1).unwrap();
        let mut opt = Optimizer::new(
            &model.vs,
            &OptimConfig {
                lr: 1e-2,
                ..Default::default()
            },
            50,
        )
        .unwrap();
        let rows = vec![sft_row(&[1, 2, 3], &[7, 8, 9])];
        let first = sft_step(&model, &mut opt, &rows);
        let mut last = first;
        for _ in 0..40 {
            last = sft_step(&model, &mut opt, &rows);
        }
        assert!(
            first > 2.0,
            "a random model starts near ln(16) ≈ 2.77, got {first}"
        );
        assert!(last < 0.1, "loss after 40 steps: {last}");
    }
}
