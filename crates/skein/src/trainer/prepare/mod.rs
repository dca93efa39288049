//! Preparing a planned batch for the update: everything that needs the models at the step's
//! start. π_old (and π_ref when a KL term is on) log-probs of every row, importance weights
//! against the behavior log-probs, and with a critic its values and the GAE advantages that
//! replace the group ones. [`prepare`] takes a [`StepBatch`] and returns a [`PreparedBatch`],
//! the only thing the update accepts: its advantages are final.

pub mod offpolicy;
pub mod values;

use self::offpolicy::{importance_weights, ImportanceStats};
use crate::model::{Model, ValueModel};
use crate::trainer::batch::{RowPlan, StepBatch, TrainRow};
use crate::trainer::config::{OffPolicy, TrainConfig};
use crate::trainer::update::tensors::{micro_batches, response_values, token_logprobs, MicroBatch};

/// The models a batch is prepared with, all at the step's start.
pub struct Models<'a> {
    pub policy: &'a Model,
    pub reference: Option<&'a Model>,
    pub critic: Option<&'a ValueModel>,
}

/// Settings of preparation.
#[derive(Debug, Clone)]
pub struct PrepareConfig {
    pub micro_batch_tokens: usize,
    /// The sampling temperature: log-probs are of the distribution tokens were sampled from.
    pub temperature: f64,
    pub off_policy: OffPolicy,
    pub is_cap: f64,
    /// GAE discount and λ (critic path).
    pub gamma: f64,
    pub lambda: f64,
}

impl PrepareConfig {
    pub fn from_config(cfg: &TrainConfig, temperature: f64) -> Self {
        let a = &cfg.algorithm;
        PrepareConfig {
            micro_batch_tokens: cfg.trainer.micro_batch_tokens,
            temperature,
            off_policy: a.off_policy,
            is_cap: a.is_cap,
            gamma: a.gamma,
            lambda: a.lambda,
        }
    }
}

/// A batch whose rows have everything the loss reads, advantages final.
pub struct PreparedBatch {
    batch: StepBatch,
    reference_on: bool,
    pub importance: ImportanceStats,
}

impl PreparedBatch {
    pub fn rows(&self) -> &[TrainRow] {
        &self.batch.rows
    }

    pub fn plan(&self) -> &RowPlan {
        &self.batch.plan
    }

    /// The planned batch it was prepared from (counts for metrics).
    pub fn batch(&self) -> &StepBatch {
        &self.batch
    }

    /// Whether rows carry reference log-probs (a KL term is on).
    pub fn has_reference(&self) -> bool {
        self.reference_on
    }
}

/// Fills in what needs the models, in order: π_old/π_ref, importance weights (they need
/// π_old), values and GAE (the advantages become final).
pub fn prepare(
    mut batch: StepBatch,
    models: &Models,
    version: u64,
    cfg: &PrepareConfig,
) -> PreparedBatch {
    recompute_logprobs(
        models.policy,
        models.reference,
        &mut batch.rows,
        cfg.micro_batch_tokens,
        cfg.temperature,
    );
    let importance = importance_weights(&mut batch.rows, version, cfg.off_policy, cfg.is_cap);
    if let Some(critic) = models.critic {
        values::compute_values(critic, &mut batch.rows, cfg.micro_batch_tokens);
        values::apply_gae(&mut batch.rows, &batch.row_rewards, cfg.gamma, cfg.lambda);
    }
    PreparedBatch {
        batch,
        reference_on: models.reference.is_some(),
        importance,
    }
}

/// Fills `old_logp` (and `ref_logp` when a reference is given) of every row with the current
/// weights, without gradients.
pub fn recompute_logprobs(
    policy: &Model,
    reference: Option<&Model>,
    rows: &mut [TrainRow],
    micro_batch_tokens: usize,
    temperature: f64,
) {
    let all: Vec<usize> = (0..rows.len()).collect();
    let device = policy.vs.device();
    tch::no_grad(|| {
        for idx in micro_batches(rows, &all, micro_batch_tokens) {
            let batch: Vec<&TrainRow> = idx.iter().map(|&i| &rows[i]).collect();
            let mb = MicroBatch::new(&batch, device);
            let (old, _) = token_logprobs(&policy.net, &mb, temperature, false);
            let old = response_values(&old, &batch);
            let refs = reference.map(|m| {
                response_values(&token_logprobs(&m.net, &mb, temperature, false).0, &batch)
            });
            for (k, &i) in idx.iter().enumerate() {
                rows[i].old_logp = old[k].clone();
                if let Some(r) = &refs {
                    rows[i].ref_logp = r[k].clone();
                }
            }
        }
    });
}
