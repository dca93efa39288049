//! Preparing a planned batch for the update: everything that needs the models at the step's
//! start. π_old (and π_ref when a KL term is on) log-probs of every row, importance weights
//! against the behavior log-probs, and with a critic its values and the GAE advantages that
//! replace the group ones. [`prepare`] takes a [`StepBatch`] and returns a [`PreparedBatch`],
//! the only thing the update accepts: its advantages are final.

pub mod checks;
pub mod offpolicy;
pub mod values;

use self::checks::{explained_variance, probe_rows, LogpMismatch};
use self::offpolicy::{importance_weights, ImportanceStats};
use crate::model::{Model, ValueModel};
use crate::trainer::batch::{RowPlan, StepBatch, TrainRow};
use crate::trainer::config::{Batching, CreditMode, OffPolicy, TrainConfig};
use crate::trainer::update::head::{token_logprobs, Entropy};
use crate::trainer::update::pack::micro_batches;
use crate::trainer::update::tensors::MicroBatch;

/// The models a batch is prepared with, all at the step's start.
pub struct Models<'a> {
    pub policy: &'a Model,
    pub reference: Option<&'a Model>,
    pub critic: Option<&'a ValueModel>,
}

/// Settings of preparation.
#[derive(Debug, Clone)]
pub struct PrepareConfig {
    pub batching: Batching,
    /// PPO epochs over the batch: with one, the first mini-batch's rows need no π_old pass.
    pub epochs: usize,
    /// The sampling temperature: log-probs are of the distribution tokens were sampled from.
    pub temperature: f64,
    pub off_policy: OffPolicy,
    pub is_cap: f64,
    /// GAE discount and λ (critic path).
    pub gamma: f64,
    pub lambda: f64,
    /// Turn-level GAE (critic path, `credit = "turn"`): one step per turn, discounted by this
    /// per turn (λ as above). None: one step per token, discounted by `gamma`.
    pub turn_gamma: Option<f64>,
}

impl PrepareConfig {
    pub fn from_config(cfg: &TrainConfig, temperature: f64) -> Self {
        let a = &cfg.algorithm;
        PrepareConfig {
            batching: cfg.trainer.batching(),
            epochs: cfg.trainer.ppo_epochs,
            temperature,
            off_policy: a.off_policy,
            is_cap: a.is_cap,
            gamma: a.gamma,
            lambda: a.lambda,
            turn_gamma: (a.estimator.needs_critic() && a.credit == CreditMode::Turn)
                .then_some(a.turn_gamma),
        }
    }
}

/// A batch whose rows have everything the loss reads, advantages final.
pub struct PreparedBatch {
    batch: StepBatch,
    reference_on: bool,
    pub importance: ImportanceStats,
    /// Engine against trainer on this version's tokens (None: no token to compare).
    pub mismatch: Option<LogpMismatch>,
    /// The critic's explained variance of the returns (None without a critic).
    pub explained_variance: Option<f64>,
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

    /// The batch, final advantages included, once the update is done with it.
    pub fn into_batch(self) -> StepBatch {
        self.batch
    }

    /// Whether rows carry reference log-probs (a KL term is on).
    pub fn has_reference(&self) -> bool {
        self.reference_on
    }
}

/// Fills in what needs the models, in order: π_old/π_ref, importance weights (they need
/// π_old), values and GAE (the advantages become final).
///
/// With one PPO epoch, the first mini-batch is trained on the step-start weights, so its
/// forward computes π_old itself: its rows (those sampled entirely by this version, whose
/// importance weights need no π_old) are left without one and the update takes it from that
/// forward, detached. Every other row with a loss token gets π_old here, and with `icepop`
/// every such row does (its weights need π_old on every token); a padding row never does.
pub fn prepare(
    mut batch: StepBatch,
    models: &Models,
    version: u64,
    cfg: &PrepareConfig,
) -> PreparedBatch {
    // A row without a loss token (a padding row) has nothing to weigh or compare: the update
    // takes its π_old from its own forward.
    let mut needs_old: Vec<bool> = batch
        .rows
        .iter()
        .map(|r| r.loss_mask.contains(&1))
        .collect();
    // `icepop` weighs every token by π_old/π_behavior, so every row needs its π_old first.
    if cfg.epochs == 1 && cfg.off_policy != OffPolicy::Icepop {
        for &i in batch.plan.first().into_iter().flatten().flatten() {
            needs_old[i] &= trains_on_older_tokens(&batch.rows[i], version);
        }
    }
    recompute_logprobs(
        models.policy,
        models.reference,
        &mut batch.rows,
        &needs_old,
        &cfg.batching,
        cfg.temperature,
    );
    let importance = importance_weights(&mut batch.rows, version, cfg.off_policy, cfg.is_cap);
    let mismatch = logp_mismatch(models.policy, &batch.rows, version, cfg);
    if let Some(critic) = models.critic {
        values::compute_values(critic, &mut batch.rows, &cfg.batching);
        match cfg.turn_gamma {
            None => values::apply_gae(&mut batch.rows, &batch.turns, cfg.gamma, cfg.lambda),
            Some(gamma) => {
                let per_turn =
                    values::apply_turn_gae(&mut batch.rows, &batch.turns, gamma, cfg.lambda);
                let credit = crate::trainer::batch::credit_metrics(per_turn.iter());
                batch.turn_metrics.splice(0..0, credit);
            }
        }
    }
    PreparedBatch {
        explained_variance: models.critic.and_then(|_| explained_variance(&batch.rows)),
        batch,
        reference_on: models.reference.is_some(),
        importance,
        mismatch,
    }
}

/// Whether a loss token of `row` was sampled before `version`. Tokens outside the loss (an
/// environment's reply inside a merged multi-turn row, recorded as version 0) were sampled
/// by no policy, and do not make the row need a π_old of its own.
fn trains_on_older_tokens(row: &TrainRow, version: u64) -> bool {
    row.versions
        .iter()
        .zip(&row.loss_mask)
        .any(|(&v, &m)| m != 0 && v < version)
}

/// The engine–trainer log-prob comparison ([`LogpMismatch`]) over the rows that have π_old,
/// or, when the update computes every π_old itself, over a few rows recomputed for it alone
/// (their π_old is not kept: the update's stays the one it trains with).
fn logp_mismatch(
    policy: &Model,
    rows: &[TrainRow],
    version: u64,
    cfg: &PrepareConfig,
) -> Option<LogpMismatch> {
    let tolerance = policy.options.dtype.logp_round_off();
    let with_tolerance = |m: LogpMismatch| LogpMismatch { tolerance, ..m };
    let probe = probe_rows(rows);
    if probe.is_empty() {
        return LogpMismatch::of(rows.iter(), version).map(with_tolerance);
    }
    let probed: Vec<TrainRow> =
        tch::no_grad(|| logprobs_of(policy, rows, &probe, &cfg.batching, cfg.temperature))
            .into_iter()
            .map(|(i, old_logp)| TrainRow {
                old_logp,
                ..rows[i].clone()
            })
            .collect();
    LogpMismatch::of(probed.iter(), version).map(with_tolerance)
}

/// Per-token log-probs of the responses of rows `which` under `model` (call without grad).
fn logprobs_of(
    model: &Model,
    rows: &[TrainRow],
    which: &[usize],
    batching: &Batching,
    temperature: f64,
) -> Vec<(usize, Vec<f32>)> {
    let device = model.vs.device();
    let mut out = Vec::new();
    for plan in micro_batches(rows, which, batching) {
        let mb = MicroBatch::new(rows, &plan, device);
        let batch: Vec<&TrainRow> = plan.rows.iter().map(|&i| &rows[i]).collect();
        let logp = token_logprobs(&model.net, &mb, temperature, Entropy::Skip).logp;
        out.extend(
            plan.rows
                .iter()
                .copied()
                .zip(mb.response_values(&logp, &batch)),
        );
    }
    out
}

/// Fills `old_logp` of the rows `needs_old` marks (and `ref_logp` of every row when a
/// reference is given) with the current weights, without gradients. The others get an empty
/// `old_logp`: the update takes π_old from its own forward for them.
pub fn recompute_logprobs(
    policy: &Model,
    reference: Option<&Model>,
    rows: &mut [TrainRow],
    needs_old: &[bool],
    batching: &Batching,
    temperature: f64,
) {
    let logprobs = |model: &Model, rows: &[TrainRow], which: &[usize]| {
        logprobs_of(model, rows, which, batching, temperature)
    };
    tch::no_grad(|| {
        let old: Vec<usize> = (0..rows.len()).filter(|&i| needs_old[i]).collect();
        for row in rows.iter_mut() {
            row.old_logp.clear();
        }
        for (i, logp) in logprobs(policy, rows, &old) {
            rows[i].old_logp = logp;
        }
        if let Some(reference) = reference {
            let all: Vec<usize> = (0..rows.len()).collect();
            for (i, logp) in logprobs(reference, rows, &all) {
                rows[i].ref_logp = logp;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, GenRequest, SamplingParams};
    use crate::model::ModelConfig;
    use tch::Device;

    /// Rows of `policy`'s own samples (version 5), as the engine recorded them.
    fn sampled_rows(policy: &Model) -> Vec<TrainRow> {
        sampled_rows_with(policy, 1.0, 0)
    }

    /// [`sampled_rows`] sampled with `top_p` and `top_k`, kept sets recorded.
    fn sampled_rows_with(policy: &Model, top_p: f64, top_k: usize) -> Vec<TrainRow> {
        let params = SamplingParams {
            temperature: 1.0,
            max_new_tokens: 8,
            top_p,
            top_k,
            ..Default::default()
        };
        let requests = (0..6u64)
            .map(|id| GenRequest {
                id,
                prompt: (0..5).map(|i| 1 + ((id as u32 * 7 + i) % 30)).collect(),
                resumed: vec![],
                params: params.clone(),
                budget: None,
                session: None,
                watch: None,
            })
            .collect();
        let mut rows = Vec::new();
        Engine::new(8).generate(policy, 5, requests, |out| {
            let prompt: Vec<u32> = (0..5).map(|i| 1 + ((out.id as u32 * 7 + i) % 30)).collect();
            let n = out.tokens.len();
            rows.push(TrainRow {
                tokens: prompt.iter().chain(&out.tokens).copied().collect(),
                prompt_len: prompt.len(),
                loss_mask: vec![1; n],
                behavior_logp: out.logprobs.clone(),
                versions: vec![5; n],
                kept: out.kept.clone(),
                loss_weight: 1.0,
                ..Default::default()
            });
        });
        rows
    }

    /// The engine and the trainer on the same weights agree to float round-off; a trainer on
    /// other weights than the engine sampled with (a remote engine that missed a reload)
    /// disagrees by far more than the `logprob-mismatch` bound.
    #[test]
    fn the_mismatch_is_round_off_on_the_same_weights_and_large_on_others() {
        let cfg = ModelConfig::tiny_qwen2(40, 32, 2, 4, 2, 64, 64);
        let engine_weights = Model::random(&cfg, Device::Cpu, 7).unwrap();
        let other_weights = Model::random(&cfg, Device::Cpu, 8).unwrap();
        let rows = sampled_rows(&engine_weights);
        assert_eq!(
            probe_rows(&rows).len(),
            checks::PROBE_ROWS,
            "no row has a π_old yet"
        );
        let prepare = PrepareConfig {
            batching: Batching::padded(4096),
            epochs: 1,
            temperature: 1.0,
            off_policy: OffPolicy::Tis,
            is_cap: 2.0,
            gamma: 1.0,
            lambda: 1.0,
            turn_gamma: None,
        };
        let same = logp_mismatch(&engine_weights, &rows, 5, &prepare).unwrap();
        assert!(same.mean < 1e-5 && same.max < 1e-4, "{same:?}");
        let other = logp_mismatch(&other_weights, &rows, 5, &prepare).unwrap();
        assert!(other.mean > 1e-2, "{other:?}");
        // Tokens of an older version are the importance weights' business, not this check's.
        assert!(logp_mismatch(&other_weights, &rows, 6, &prepare).is_none());
    }

    /// A merged multi-turn row sampled wholly by this version has its environment's tokens
    /// at version 0: they do not make it need a π_old forward of its own.
    #[test]
    fn only_loss_tokens_decide_whether_a_row_is_older() {
        let row = |versions: Vec<u64>, loss_mask: Vec<u8>| TrainRow {
            versions,
            loss_mask,
            ..Default::default()
        };
        assert!(!trains_on_older_tokens(
            &row(vec![5, 5, 0, 0, 5], vec![1, 1, 0, 0, 1]),
            5
        ));
        assert!(trains_on_older_tokens(
            &row(vec![4, 5, 0, 0, 5], vec![1, 1, 0, 0, 1]),
            5
        ));
        assert!(!trains_on_older_tokens(&row(vec![0, 0], vec![0, 0]), 5));
    }

    /// Where every logit ties (a zero LM head), top-k keeps every token tied at its cut and
    /// top-p keeps the first half of the sort's order, 20 ids of 40 at 0.5: no threshold on
    /// the logits can tell those ids from the others. The recorded ids can, and the trainer's
    /// log-probs over them equal the engine's, ln(1/20), where a threshold would give ln(1/40).
    #[test]
    fn kept_sets_at_ties_give_the_engines_logprobs() {
        let mut cfg = ModelConfig::tiny_qwen2(40, 32, 2, 4, 2, 64, 64);
        cfg.tie_word_embeddings = false;
        let policy = Model::random(&cfg, Device::Cpu, 7).unwrap();
        let mut head = policy.vs.variables()["lm_head.weight"].shallow_clone();
        let _ = tch::no_grad(|| head.fill_(0.0));
        for (top_p, top_k, kept) in [(1.0, 5, 40.0), (0.5, 0, 20.0), (0.5, 12, 20.0)] {
            let mut rows = sampled_rows_with(&policy, top_p, top_k);
            let needs_old = vec![true; rows.len()];
            let batching = Batching {
                micro_batch_tokens: 4096,
                packing: true,
                shared_prefix: true,
            };
            recompute_logprobs(&policy, None, &mut rows, &needs_old, &batching, 1.0);
            for row in &rows {
                for k in 0..row.loss_mask.len() {
                    assert_eq!(row.kept.get(k).len() as f64, kept);
                    let want = -(kept as f32).ln();
                    assert!((row.behavior_logp[k] - want).abs() < 1e-6);
                    assert!((row.old_logp[k] - want).abs() < 1e-6, "{}", row.old_logp[k]);
                }
            }
        }
    }
}
