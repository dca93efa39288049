//! The token slots of one forward/backward pass of `skein sft`, against the memory the machine
//! has free. The estimate is the trainer's preflight for one update of the loaded model, every
//! weight trained: its weights, gradients and AdamW moments, one pass's activations and
//! logits, and the optimizer step's temporaries. A pass's size only splits the batch: the loss
//! and the step are the same for any split (`trainer::sft::sft_step`), so fitting it changes
//! time, never a number.

use crate::memory::{available_on, GIB};
use crate::model::Model;
use crate::trainer::fit::{largest_fitting, SMALLEST_FITTED};
use crate::trainer::preflight::{self, Part, UpdateShape};
use anyhow::{bail, Result};

/// A pass's token slots when `--micro-batch-tokens` is not given and the machine has room.
pub const DEFAULT_PASS_TOKENS: usize = 8192;

/// Token slots per pass: `given` (`--micro-batch-tokens`) checked against the free memory, or
/// without it the largest of 8192, 4096, … 256 that fits (said when below 8192). A conversation
/// of `longest_row` tokens takes a pass of its own when it is longer. On a device whose free
/// memory is not read (a GPU), nothing is checked.
pub fn pass_tokens(given: Option<usize>, policy: &Model, longest_row: usize) -> Result<usize> {
    let device = policy.vs.device();
    let Some(free) = available_on(device) else {
        return Ok(given.unwrap_or(DEFAULT_PASS_TOKENS));
    };
    // The loaded weights are in the estimate and already out of free memory.
    let available = free + preflight::held_bytes(policy);
    let parts = |tokens: usize| {
        let shape = UpdateShape {
            options: policy.options.clone(),
            micro_batch_tokens: tokens.max(longest_row),
            checkpointing: false,
            cuda: device.is_cuda(),
        };
        preflight::update_parts(&policy.net.config, &shape, device, false)
    };
    let tokens = match given {
        Some(tokens) => tokens,
        None => {
            let fits = |t| preflight::total(&parts(t)) <= available;
            // None fitting: the smallest, which is refused below naming what to lower.
            let tokens = largest_fitting(DEFAULT_PASS_TOKENS, fits).unwrap_or(SMALLEST_FITTED);
            if tokens < DEFAULT_PASS_TOKENS && fits(tokens) {
                eprintln!(
                    "skein: --micro-batch-tokens {tokens}: {DEFAULT_PASS_TOKENS} does not fit \
                     the {:.1} GiB of free memory (give the flag to choose)",
                    available / GIB
                );
            }
            tokens
        }
    };
    refuse_a_shortfall(&parts(tokens), available, tokens, longest_row)?;
    Ok(tokens)
}

/// The error of a fine-tuning that does not fit, naming what to lower.
fn refuse_a_shortfall(
    parts: &[Part],
    available: f64,
    tokens: usize,
    longest_row: usize,
) -> Result<()> {
    let Some((said, largest)) = preflight::shortfall(parts, available) else {
        return Ok(());
    };
    // One pass's parts (`preflight::micro_batch_parts`); the rest is the model's own.
    let activations = ["activations", "logits"]
        .iter()
        .any(|p| largest.what.starts_with(p));
    let advice = match activations {
        true if longest_row > tokens => format!(
            "lower --max-tokens: the longest conversation, {longest_row} tokens, takes a pass of \
             its own beyond --micro-batch-tokens {tokens}"
        ),
        true => format!("lower --micro-batch-tokens (a pass of {tokens} token slots)"),
        false => "fine-tune a smaller model: its weights, gradients and AdamW moments alone \
                  do not fit"
            .to_string(),
    };
    bail!(
        "{}\n{advice}",
        said.replacen("this run", "this fine-tuning", 1)
    )
}
