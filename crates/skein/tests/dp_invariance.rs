//! "The loss does not depend on parallelism", checked on real gradients: one PPO step on a
//! fixed batch from fixed weights gives the same parameters for dp ∈ {1, 2, 4} (each rank on
//! its own thread and model replica), for several micro-batch token budgets, with and without
//! extra padding rows, padded, packed or packed with shared prompts, in every
//! loss-aggregation mode. The reference computes π_old for every row before the update; the
//! other cases take the first mini-batch's π_old from its own forward. A companion test shows that
//! normalising by the rank-local token count (the usual data-parallel mean) fails the same
//! check.
//!
//! Tolerance. The layouts add the same per-token terms in a different order: other rows share
//! a micro-batch (so matrix products are blocked differently), micro-batch losses are summed
//! per rank, and the ranks' f32 gradients are summed at the all-reduce. Float addition is not
//! associative, so the summed gradients differ in their last bits (about 1e-7 relative per
//! addition). The test's optimizer is AdamW with `lr = eps = 1` and no clipping: its first
//! step g/(|g| + eps) changes by at most |δg|/eps for a gradient change δg, so a gradient
//! difference reaches the parameters at no more than its own size. (With the usual tiny eps,
//! Adam's first step is lr·sign(g), which turns a last-bit difference in a near-zero gradient
//! into a full step: a property of the optimizer, not of the layout.) Every parameter must
//! match the dp 1 result within 1e-4 of the largest parameter change: rounding measured here
//! stays below 1e-5 of it, while the rank-local bug moves parameters by over 1e-1 of it.

use skein::model::{LoraConfig, Model, ModelConfig, ModelOptions};
use skein::trainer::batch::{build_step_batch, StepBatch, StepBatchConfig, TrainRow};
use skein::trainer::config::{Batching, OffPolicy};
use skein::trainer::prepare::{prepare, Models, PrepareConfig};
use skein::trainer::update::optim::{OptimConfig, Optimizer};
use skein::trainer::update::policy_loss::{KlEstimator, LossConfig, PolicyLoss};
use skein::trainer::update::ranks::{Ranks, Replicas};
use skein::trainer::update::{ppo_update, UpdateConfig, UpdateStats};
use skein_plan::{AdvantageConfig, LossAggMode, Status, Trajectory, Transition, Unit};
use std::sync::Mutex;
use tch::{Device, Kind, Tensor};

/// Largest allowed difference from the dp 1 parameters, relative to the largest change the
/// step made to any parameter (see the module comment).
const REL_TOL: f64 = 1e-4;
const VOCAB: usize = 24;
const HORIZON: usize = 12;
const BUDGETS: [usize; 3] = [16, 48, 4096];

/// Models are built under a lock: `Model::random` seeds libtorch's global generator, which the
/// tests of this file would otherwise race on.
static BUILD: Mutex<()> = Mutex::new(());

fn model_config() -> ModelConfig {
    ModelConfig::tiny_qwen2(VOCAB, 32, 2, 2, 1, 64, 64)
}

/// A policy as RL runs it: `base`'s weights, with adapter dropout off (the trainer stops it
/// after the warm-up).
fn copy_of(base: &Model) -> Model {
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let mut m =
        Model::random_with(&model_config(), &base.options, Device::Cpu, 0).expect("tiny model");
    m.copy_from(base).expect("same shapes");
    m.net.stop_adapter_dropout();
    m
}

/// 4 groups of 4 trajectories with real token ids of varied lengths. Every third trajectory
/// has a second turn whose prompt holds the first turn and some environment text, and some
/// responses hold inserted tokens (loss mask 0), so row, token and trajectory counts all differ.
fn trajectories() -> Vec<Trajectory> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut draw = move |n: usize| -> usize {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) % n as u64) as usize
    };
    let mut out = Vec::new();
    for g in 0..4 {
        let prompt: Vec<u32> = (0..3 + draw(5))
            .map(|_| 1 + draw(VOCAB - 1) as u32)
            .collect();
        for s in 0..4 {
            let turns = if (g * 4 + s) % 3 == 0 { 2 } else { 1 };
            let mut context = prompt.clone();
            let mut transitions = Vec::new();
            for _ in 0..turns {
                let n = 2 + draw(HORIZON - 1);
                let response: Vec<u32> = (0..n).map(|_| 1 + draw(VOCAB - 1) as u32).collect();
                let loss_mask: Vec<u8> = (0..n).map(|k| u8::from(k % 5 != 3)).collect();
                transitions.push(Transition {
                    prompt: context.clone(),
                    response: response.clone(),
                    loss_mask,
                    logprobs: (0..n).map(|k| -1.0 - 0.1 * k as f32).collect(),
                    versions: vec![0; n],
                    kept: Default::default(),
                    reward: None,
                    state: None,
                });
                context.extend(&response);
                context.extend([2, 3]);
            }
            out.push(Trajectory {
                id: format!("g{g}s{s}"),
                group: format!("g{g}"),
                transitions,
                reward: draw(3) as f64,
                status: Status::Finished,
            });
        }
    }
    out
}

#[derive(Clone, Copy, Debug)]
struct Case {
    mode: LossAggMode,
    dp: usize,
    budget: usize,
    extra_padding: bool,
    batching: Layout,
    /// π_old of every row from a pass before the update (else the first mini-batch's comes
    /// from its own forward).
    old_pass: bool,
    /// The bug seed 001 fixes: each rank averages over its own loss tokens.
    rank_local: bool,
    loss: PolicyLoss,
}

/// How rows sit in a micro-batch.
#[derive(Clone, Copy, Debug)]
enum Layout {
    Padded,
    Packed,
    SharedPrefix,
}

impl Layout {
    fn batching(self, budget: usize) -> Batching {
        Batching {
            micro_batch_tokens: budget,
            packing: !matches!(self, Layout::Padded),
            shared_prefix: matches!(self, Layout::SharedPrefix),
        }
    }
}

fn update_config(budget: usize, layout: Layout, loss: PolicyLoss) -> UpdateConfig {
    let (clip_low, clip_high) = loss.default_clip().unwrap_or((0.0, 0.0));
    UpdateConfig {
        loss: LossConfig {
            kind: loss,
            clip_low,
            clip_high,
            dual_clip: if loss == PolicyLoss::Ppo { 3.0 } else { 0.0 },
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            entropy_coef: 0.01,
            ..LossConfig::default()
        },
        epochs: 1,
        batching: layout.batching(budget),
        temperature: 1.0,
        activation_checkpointing: false,
    }
}

fn optim() -> OptimConfig {
    OptimConfig {
        lr: 1.0,
        eps: 1.0,
        grad_clip: 0.0,
        ..OptimConfig::default()
    }
}

/// Padding rows of several lengths on every rank (more on later ranks): loss mask 0 and
/// weight 0, so they must change nothing.
fn add_padding(batch: &mut StepBatch) {
    for mb in &mut batch.plan {
        for (r, rank) in mb.iter_mut().enumerate() {
            for k in 0..=r {
                let len = 2 + 3 * k;
                batch.rows.push(TrainRow {
                    tokens: vec![5; len],
                    prompt_len: 1,
                    loss_mask: vec![0; len - 1],
                    behavior_logp: vec![0.0; len - 1],
                    advantages: vec![1.0; len - 1],
                    loss_weight: 0.0,
                    ..Default::default()
                });
                rank.push(batch.rows.len() - 1);
            }
        }
    }
}

fn loss_tokens(row: &TrainRow) -> usize {
    row.loss_mask.iter().map(|&m| m as usize).sum()
}

/// Token-mean as a rank-local mean: every rank divides by its own loss tokens and the ranks'
/// gradients are averaged (each weight also divided by dp).
fn rank_local_weights(batch: &mut StepBatch) {
    for mb in &batch.plan {
        let dp = mb.len() as f64;
        for rank in mb {
            let local: usize = rank.iter().map(|&i| loss_tokens(&batch.rows[i])).sum();
            for &i in rank {
                if local > 0 {
                    batch.rows[i].loss_weight = 1.0 / (dp * local as f64);
                }
            }
        }
    }
}

/// All trainable parameters, flattened in name order.
fn flat(model: &Model) -> Vec<f32> {
    let mut vars: Vec<(String, Tensor)> = model.vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let parts: Vec<Tensor> = vars
        .iter()
        .map(|(_, t)| t.detach().to_kind(Kind::Float).view([-1]))
        .collect();
    Vec::<f32>::try_from(Tensor::cat(&parts, 0)).expect("f32 parameters")
}

/// One PPO step (two mini-batches) from `base`'s weights; the parameters after it, and the
/// per-rank loss tokens of the first mini-batch.
fn step(base: &Model, trajs: &[Trajectory], case: Case) -> (Vec<f32>, Vec<usize>) {
    let (params, rank_tokens, _) = step_of(base, trajs, case, 2, 1);
    (params, rank_tokens)
}

/// [`step`] with `mini_batches` mini-batches and `epochs` PPO epochs, also returning the
/// update's statistics and the loss tokens of each mini-batch.
fn step_of(
    base: &Model,
    trajs: &[Trajectory],
    case: Case,
    mini_batches: usize,
    epochs: usize,
) -> (Vec<f32>, Vec<usize>, (UpdateStats, Vec<usize>)) {
    let policy = copy_of(base);
    let batch_cfg = StepBatchConfig {
        advantage: AdvantageConfig::default(),
        dp_size: case.dp,
        num_mini_batches: mini_batches,
        unit: Unit::Trajectory,
        loss_agg: case.mode,
        horizon: HORIZON,
        critic: None,
    };
    let mut batch = build_step_batch(trajs, &batch_cfg, 11).expect("the batch plans");
    assert_eq!(batch.plan.len(), mini_batches);
    assert!(batch.plan.iter().all(|mb| mb.len() == case.dp));
    if case.extra_padding {
        add_padding(&mut batch);
    }
    if case.rank_local {
        rank_local_weights(&mut batch);
    }
    let rank_tokens = batch.plan[0]
        .iter()
        .map(|r| r.iter().map(|&i| loss_tokens(&batch.rows[i])).sum())
        .collect();
    let mini_batch_tokens = batch
        .plan
        .iter()
        .map(|mb| {
            mb.iter()
                .flatten()
                .map(|&i| loss_tokens(&batch.rows[i]))
                .sum()
        })
        .collect();
    let cfg = UpdateConfig {
        epochs,
        ..update_config(case.budget, case.batching, case.loss)
    };
    let models = Models {
        policy: &policy,
        reference: None,
        critic: None,
    };
    let prepare_cfg = PrepareConfig {
        batching: cfg.batching,
        epochs: if case.old_pass { 2 } else { epochs },
        temperature: cfg.temperature,
        off_policy: OffPolicy::Tis,
        is_cap: 2.0,
        gamma: 1.0,
        lambda: 1.0,
        turn_gamma: None,
    };
    let batch = prepare(batch, &models, 0, &prepare_cfg);
    let mut replicas = {
        let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
        Replicas::new(&policy, case.dp).expect("replicas")
    };
    assert_eq!(replicas.size(), case.dp);
    let mut opt = Optimizer::new(&policy.vs, &optim(), 2).expect("optimizer");
    let stats = ppo_update(&policy, &mut replicas, &mut opt, &batch, &cfg).expect("update");
    assert_eq!(
        stats.optimizer_steps,
        mini_batches * epochs,
        "{case:?}: {stats:?}"
    );
    // Only trainable weights (with LoRA, the adapters) have gradients, on every rank.
    for m in std::iter::once(&policy).chain(replicas.models()) {
        for (name, t) in m.vs.variables() {
            assert_eq!(t.grad().defined(), t.requires_grad(), "{case:?}: {name}");
        }
    }
    // Replicas are bit-identical to rank 0 after the step: same checksum, same bits.
    let params = flat(&policy);
    for (r, m) in replicas.models().iter().enumerate() {
        assert_eq!(m.checksum(), policy.checksum(), "{case:?}: rank {}", r + 1);
        let same = flat(m)
            .iter()
            .zip(&params)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{case:?}: rank {} differs from rank 0", r + 1);
    }
    (params, rank_tokens, (stats, mini_batch_tokens))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .fold(0.0, f64::max)
}

fn base_model() -> Model {
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    Model::random(&model_config(), Device::Cpu, 1234).expect("tiny model")
}

/// The step of `case` (whose parameters after it are `want`) on every rank count, token
/// budget, padding and layout given, with π_old from the update's own forward: each must
/// match `want` within [`REL_TOL`] of the step's size. Returns the worst relative difference.
fn worst_difference(
    base: &Model,
    trajs: &[Trajectory],
    (case, want): (Case, &[f32]),
    dps: &[usize],
    budgets: &[usize],
    paddings: &[bool],
) -> f64 {
    let moved = max_abs_diff(want, &flat(base));
    let mut worst: f64 = 0.0;
    for &dp in dps {
        for &budget in budgets {
            for &extra_padding in paddings {
                for batching in [Layout::Padded, Layout::Packed, Layout::SharedPrefix] {
                    let case = Case {
                        dp,
                        budget,
                        extra_padding,
                        batching,
                        old_pass: false,
                        ..case
                    };
                    let (got, _) = step(base, trajs, case);
                    let diff = max_abs_diff(&got, want);
                    assert!(
                        diff <= REL_TOL * moved,
                        "{case:?}: parameters differ by {diff:e} (step size {moved:e})"
                    );
                    worst = worst.max(diff / moved);
                }
            }
        }
    }
    worst
}

#[test]
fn parameters_after_a_step_do_not_depend_on_ranks_micro_batches_or_padding() {
    tch::set_num_threads(1);
    let base = base_model();
    let start = flat(&base);
    let trajs = trajectories();
    for mode in LossAggMode::ALL {
        let case = Case {
            loss: PolicyLoss::Ppo,
            mode,
            dp: 1,
            budget: 4096,
            extra_padding: false,
            batching: Layout::Padded,
            old_pass: true,
            rank_local: false,
        };
        let (want, _) = step(&base, &trajs, case);
        let moved = max_abs_diff(&want, &start);
        assert!(moved > 1e-3, "{mode}: the step barely moved ({moved:e})");
        let worst = worst_difference(
            &base,
            &trajs,
            (case, &want),
            &[1, 2, 4],
            &BUDGETS,
            &[false, true],
        );
        eprintln!("{mode}: largest step {moved:.3e}, worst relative difference {worst:.2e}");
    }
}

/// Every policy loss steps alike whatever the ranks, micro-batches and layout: GSPO's
/// per-sequence ratio is averaged over each row's own tokens in packed and shared-prefix
/// lines as in padded ones, and SAPO's and DPPO's per-token terms are as global as PPO's.
#[test]
fn every_policy_loss_steps_alike_on_any_ranks_and_layout() {
    tch::set_num_threads(1);
    let base = base_model();
    let start = flat(&base);
    let trajs = trajectories();
    for loss in [
        PolicyLoss::Cispo,
        PolicyLoss::Gspo,
        PolicyLoss::Sapo,
        PolicyLoss::Dppo,
    ] {
        let case = Case {
            mode: LossAggMode::SeqMeanTokenMean,
            dp: 1,
            budget: 4096,
            extra_padding: false,
            batching: Layout::Padded,
            old_pass: true,
            rank_local: false,
            loss,
        };
        let (want, _) = step(&base, &trajs, case);
        let moved = max_abs_diff(&want, &start);
        assert!(moved > 1e-3, "{loss:?}: the step barely moved ({moved:e})");
        worst_difference(&base, &trajs, (case, &want), &[1, 2], &[16, 4096], &[false]);
    }
}

/// Drift (`approx_kl`, `clip_frac`) is measured where the policy has moved from π_old: over
/// the mini-batches after an applied step, not diluted by the first, whose ratio is exactly 1.
/// With one mini-batch no pass sees a moved policy, and nothing is logged rather than a 0
/// that `policy-drift` would read as a policy that never moves.
#[test]
fn drift_is_measured_over_the_mini_batches_after_a_step() {
    tch::set_num_threads(1);
    let base = base_model();
    let trajs = trajectories();
    let case = Case {
        loss: PolicyLoss::Ppo,
        mode: LossAggMode::TokenMean,
        dp: 2,
        budget: 48,
        extra_padding: false,
        batching: Layout::Packed,
        old_pass: false,
        rank_local: false,
    };
    let (_, _, (one, _)) = step_of(&base, &trajs, case, 1, 1);
    assert_eq!(one.drift_tokens, 0.0, "{one:?}");
    let keys: Vec<&str> = one.metrics(false).into_iter().map(|(k, _)| k).collect();
    assert!(
        !keys.contains(&"approx_kl") && !keys.contains(&"clip_frac"),
        "{keys:?}"
    );
    assert!(keys.contains(&"entropy"), "{keys:?}");

    // Every epoch computes the same plan: `tokens/computed` counts one, so a second epoch
    // does not read as twice the padding.
    let (_, _, (two_epochs, _)) = step_of(&base, &trajs, case, 1, 2);
    assert!(one.computed_tokens > 0, "{one:?}");
    assert_eq!(two_epochs.computed_tokens, one.computed_tokens);

    let (_, _, (two, tokens)) = step_of(&base, &trajs, case, 2, 1);
    assert_eq!(
        two.drift_tokens, tokens[1] as f64,
        "the second mini-batch's tokens"
    );
    assert_eq!(two.loss_tokens, (tokens[0] + tokens[1]) as f64);
    assert!(two.approx_kl > 0.0, "{two:?}");
    let keys: Vec<&str> = two.metrics(false).into_iter().map(|(k, _)| k).collect();
    assert!(
        keys.contains(&"approx_kl") && keys.contains(&"clip_frac"),
        "{keys:?}"
    );
}

#[test]
fn a_rank_local_token_mean_makes_the_step_depend_on_dp() {
    tch::set_num_threads(1);
    let base = base_model();
    let start = flat(&base);
    let trajs = trajectories();
    let case = |dp, rank_local| Case {
        loss: PolicyLoss::Ppo,
        mode: LossAggMode::TokenMean,
        dp,
        budget: 48,
        extra_padding: false,
        batching: Layout::Padded,
        old_pass: true,
        rank_local,
    };
    let (right, _) = step(&base, &trajs, case(1, false));
    let moved = max_abs_diff(&right, &start);
    // On one rank the local count is the global one: the bug is invisible at dp 1.
    let (local1, _) = step(&base, &trajs, case(1, true));
    assert!(max_abs_diff(&local1, &right) <= REL_TOL * moved);
    for dp in [2, 4] {
        let (got, rank_tokens) = step(&base, &trajs, case(dp, true));
        assert!(
            rank_tokens.iter().any(|&t| t != rank_tokens[0]),
            "dp {dp}: ranks must hold unequal token counts for the bug to show: {rank_tokens:?}"
        );
        let diff = max_abs_diff(&got, &right);
        eprintln!(
            "rank-local token-mean, dp {dp}: relative difference {:.2e}",
            diff / moved
        );
        assert!(
            diff > 100.0 * REL_TOL * moved,
            "dp {dp}: a rank-local mean should move the parameters, by {diff:e} only"
        );
        // The correct weights at the same layout pass.
        let (ok, _) = step(&base, &trajs, case(dp, false));
        assert!(max_abs_diff(&ok, &right) <= REL_TOL * moved);
    }
}

/// With LoRA the same holds for the adapters, which alone move: the frozen base is bit for bit
/// what it was, on every rank.
/// A LoRA model (rank 2, `dropout` on the adapters) whose adapters have trained already: with
/// B = 0, A's gradient would be zero.
fn lora_base(dropout: f64) -> Model {
    let base = {
        let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
        let options = ModelOptions {
            lora: LoraConfig {
                rank: 2,
                dropout,
                ..Default::default()
            },
            ..Default::default()
        };
        Model::random_with(&model_config(), &options, Device::Cpu, 99).expect("tiny model")
    };
    tch::no_grad(|| {
        for (name, mut t) in base.vs.variables() {
            if name.contains(".lora_B.") {
                t.copy_(&(t.randn_like() * 0.1));
            }
        }
    });
    base
}

/// `lora.dropout` is for the warm-up; RL runs without it on rank 0, and every other rank must
/// too. A rank built from options that still carry the dropout draws masks: its π is another
/// function than the π_old rank 0 recorded, and dp 2 moves the adapters elsewhere than dp 1.
#[test]
fn lora_dropout_of_the_warm_up_stays_off_on_every_rank() {
    tch::set_num_threads(1);
    let base = lora_base(0.3);
    let start = flat(&base);
    let trajs = trajectories();
    let case = |dp| Case {
        loss: PolicyLoss::Ppo,
        mode: LossAggMode::TokenMean,
        dp,
        budget: 4096,
        extra_padding: false,
        batching: Layout::Padded,
        old_pass: true,
        rank_local: false,
    };
    let (want, _) = step(&base, &trajs, case(1));
    let moved = max_abs_diff(&want, &start);
    assert!(moved > 1e-3, "the step barely moved ({moved:e})");
    for dp in [2, 4] {
        let (got, _) = step(&base, &trajs, case(dp));
        let diff = max_abs_diff(&got, &want);
        assert!(
            diff <= REL_TOL * moved,
            "dp {dp}: {diff:e} (step {moved:e})"
        );
    }
}

#[test]
fn lora_adapters_step_alike_for_any_layout_and_the_base_stays_frozen() {
    tch::set_num_threads(1);
    let base = lora_base(0.0);
    // Which entries of `flat` belong to the frozen base.
    let mut vars: Vec<(String, Tensor)> = base.vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let frozen: Vec<bool> = vars
        .iter()
        .flat_map(|(n, t)| std::iter::repeat_n(!n.contains(".lora_"), t.numel()))
        .collect();
    let base_bits = |p: &[f32]| -> Vec<u32> {
        p.iter()
            .zip(&frozen)
            .filter(|(_, f)| **f)
            .map(|(x, _)| x.to_bits())
            .collect()
    };
    let start = flat(&base);
    let trajs = trajectories();
    let case = Case {
        loss: PolicyLoss::Ppo,
        mode: LossAggMode::TokenMean,
        dp: 1,
        budget: 4096,
        extra_padding: false,
        batching: Layout::Padded,
        old_pass: true,
        rank_local: false,
    };
    let (want, _) = step(&base, &trajs, case);
    let moved = max_abs_diff(&want, &start);
    assert!(moved > 1e-3, "the step barely moved ({moved:e})");
    for dp in [1, 2, 4] {
        for batching in [Layout::Padded, Layout::Packed, Layout::SharedPrefix] {
            let case = Case {
                dp,
                budget: 48,
                batching,
                old_pass: false,
                ..case
            };
            let (got, _) = step(&base, &trajs, case);
            let diff = max_abs_diff(&got, &want);
            assert!(
                diff <= REL_TOL * moved,
                "{case:?}: {diff:e} (step {moved:e})"
            );
            assert!(
                base_bits(&got) == base_bits(&start),
                "{case:?}: the base moved"
            );
        }
    }
}
