//! Supervised fine-tuning on (prompt, response) token pairs: cross-entropy on response tokens
//! only. The default job uses it to warm-start a policy from generated solutions
//! ([`warm_up`]); `skein sft` uses it on conversations.

use super::batch::TrainRow;
use super::config::Batching;
use super::update::head::{logprobs_of_hidden, Entropy};
use super::update::optim::{OptimConfig, Optimizer, Schedule};
use super::update::pack::{input_len, micro_batches, MicroPlan};
use super::update::tensors::MicroBatch;
use crate::model::Model;
use anyhow::Result;
use skein_report::{MetricsLog, StepProgress};
use skein_tasks::TaskRng;
use tch::Kind;

/// A Ctrl-C (or SIGTERM) during the warm-up: the run stops with nothing to resume. A type of
/// its own so that the run can still draw the warm-up's curves as it stops.
#[derive(Debug)]
pub struct WarmUpInterrupted {
    pub steps_done: usize,
}

impl std::fmt::Display for WarmUpInterrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "interrupted during the warm-up, after {} of its steps: a run has nothing to \
             resume before its first RL step, so start it again, with --overwrite (its records \
             so far stay in `run.dir` until then)",
            self.steps_done
        )
    }
}

impl std::error::Error for WarmUpInterrupted {}

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

/// A stage of the supervised warm-up: `steps` batches of `batch_size` demonstrations under
/// an optimizer and schedule of its own, logged from step `first`.
pub struct Stage {
    pub steps: usize,
    pub batch_size: usize,
    pub lr: f64,
    pub first: usize,
    /// Evaluate every this many steps (0: never).
    pub eval_every: usize,
    /// Also evaluate at the stage's last step (not for the warm-up's last stage: the run
    /// measures the policy before RL right after it).
    pub eval_last: bool,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Token slots of one forward/backward pass (`trainer.micro_batch_tokens`).
    pub micro_batch_tokens: usize,
    /// Keep only each layer's input and recompute it in the backward
    /// (`trainer.activation_checkpointing`), as the RL update does.
    pub checkpointing: bool,
}

/// Where a warm-up gets its rows, and how it measures the policy on the way.
pub trait Demonstrations {
    /// The next supervised row.
    fn next(&mut self) -> Result<TrainRow>;
    /// The policy's held-out greedy accuracy now.
    fn evaluate(&mut self, policy: &Model) -> Result<f64>;
}

/// A warm-up set of fixed size, as a set of written solutions is: the first `size` rows of
/// `inner`, then the same rows again, in a new seeded order each pass. RL still draws every
/// training problem; only the warm-up is limited to these.
pub struct Pool<'a> {
    inner: &'a mut dyn Demonstrations,
    size: usize,
    rows: Vec<TrainRow>,
    order: Vec<usize>,
    at: usize,
    rng: TaskRng,
}

impl<'a> Pool<'a> {
    pub fn new(inner: &'a mut dyn Demonstrations, size: usize, seed: u64) -> Self {
        Pool {
            inner,
            size,
            rows: Vec::new(),
            order: Vec::new(),
            at: 0,
            rng: TaskRng::new(seed),
        }
    }
}

impl Demonstrations for Pool<'_> {
    fn next(&mut self) -> Result<TrainRow> {
        if self.rows.len() < self.size {
            let row = self.inner.next()?;
            self.rows.push(row.clone());
            return Ok(row);
        }
        if self.at == self.order.len() {
            // Fisher–Yates: every pass visits each row once.
            self.order = (0..self.rows.len()).collect();
            for i in (1..self.order.len()).rev() {
                let j = self.rng.below(i as u64 + 1) as usize;
                self.order.swap(i, j);
            }
            self.at = 0;
        }
        let row = self.rows[self.order[self.at]].clone();
        self.at += 1;
        Ok(row)
    }

    fn evaluate(&mut self, policy: &Model) -> Result<f64> {
        self.inner.evaluate(policy)
    }
}

/// Supervised warm-up: the stage's batches, each one optimizer step, the loss logged as
/// `sft/loss`; every `eval_every` steps the held-out accuracy as `sft/eval_accuracy`, so the
/// warm-up's own learning curve shows where it levels off.
pub fn warm_up(
    policy: &Model,
    stage: &Stage,
    demos: &mut dyn Demonstrations,
    log: &mut MetricsLog,
) -> Result<()> {
    let Stage {
        steps,
        batch_size,
        lr,
        first,
        eval_every,
        eval_last,
        weight_decay,
        micro_batch_tokens,
        checkpointing,
    } = *stage;
    let ocfg = OptimConfig {
        weight_decay,
        ..sft_optim_config(lr, steps)
    };
    let mut opt = Optimizer::new(&policy.vs, &ocfg, steps)?;
    let mut progress = StepProgress::new(steps as u64);
    let _phase = super::interrupt::WarmUpPhase::enter();
    for step in 1..=steps {
        if super::interrupt::requested() {
            progress.finish();
            return Err(WarmUpInterrupted {
                steps_done: first + step - 2,
            }
            .into());
        }
        let rows = (0..batch_size)
            .map(|_| demos.next())
            .collect::<Result<Vec<_>>>()?;
        let positions = policy.net.max_positions() as usize;
        if let Some(long) = rows.iter().find(|r| r.tokens.len() > positions) {
            anyhow::bail!(
                "a warm-up demonstration has {} tokens, more than the model's {positions} \
                 positions: raise `model.max_positions` (or shorten the prompts)",
                long.tokens.len()
            );
        }
        let pass = SftPass {
            micro_batch_tokens,
            checkpointing,
        };
        let outcome = sft_step_with(policy, &mut opt, &rows, pass);
        let loss = outcome.loss;
        let logged = first + step - 1;
        let mut record = skein_report::record(logged, [("sft/loss", loss)]);
        let evaluate = eval_every > 0
            && match step == steps {
                true => eval_last,
                false => step.is_multiple_of(eval_every),
            };
        if evaluate {
            let accuracy = demos.evaluate(policy)?;
            super::metrics::extend(&mut record, [("sft/eval_accuracy", accuracy)]);
        }
        log.append(&record)?;
        progress.update(step as u64, &[("sft loss", loss)]);
        if let Some(why) = outcome.failure() {
            progress.finish();
            anyhow::bail!("warm-up step {logged}: {why}; lower `sft.lr`");
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
        loss_weight: 1.0,
        ..Default::default()
    }
}

/// What one supervised step did.
#[derive(Debug, Clone, Copy)]
pub struct SftStep {
    /// The mean response-token cross-entropy.
    pub loss: f64,
    /// The optimizer skipped the update: the gradient was NaN or infinite.
    pub skipped: bool,
}

impl SftStep {
    /// Why training cannot go on from this step, if it cannot: a loss or a gradient that is not
    /// a finite number. Either alone says the weights diverged: weights so large that the
    /// forward saturates give a finite loss and an infinite gradient, and how large that is
    /// depends on the CPU's kernels.
    pub fn failure(&self) -> Option<String> {
        if !self.loss.is_finite() {
            Some(format!("the loss is {}", self.loss))
        } else if self.skipped {
            Some("the gradient is NaN or infinite (the update was skipped)".into())
        } else {
            None
        }
    }
}

/// One optimizer step on a batch, in forward/backward passes of at most `micro_batch_tokens`
/// token slots each (a longer row gets one of its own). The loss is the mean cross-entropy
/// over the batch's response tokens however it is split: each pass's sum is divided by the
/// whole batch's count, and the gradients add up.
pub fn sft_step(
    model: &Model,
    opt: &mut Optimizer,
    rows: &[TrainRow],
    micro_batch_tokens: usize,
) -> SftStep {
    let pass = SftPass {
        micro_batch_tokens,
        checkpointing: false,
    };
    sft_step_with(model, opt, rows, pass)
}

/// How a supervised step's forward/backward passes run.
#[derive(Debug, Clone, Copy)]
pub struct SftPass {
    /// Token slots of one pass.
    pub micro_batch_tokens: usize,
    /// Activation checkpointing: each layer's input kept, the layer recomputed in the backward.
    pub checkpointing: bool,
}

/// [`sft_step`] with activation checkpointing when `pass` asks for it.
pub fn sft_step_with(
    model: &Model,
    opt: &mut Optimizer,
    rows: &[TrainRow],
    pass: SftPass,
) -> SftStep {
    let SftPass {
        micro_batch_tokens,
        checkpointing,
    } = pass;
    opt.zero_grad();
    let tokens = rows
        .iter()
        .map(|r| r.loss_mask.iter().map(|&m| usize::from(m)).sum::<usize>())
        .sum::<usize>()
        .max(1) as f64;
    let mut loss = 0.0;
    for plan in sft_layout(rows, micro_batch_tokens) {
        let mb = MicroBatch::new(rows, &plan, model.vs.device());
        let (hidden, recompute) = mb.train_hidden(&model.net, checkpointing);
        let lp = logprobs_of_hidden(&model.net, &mb, &hidden, 1.0, Entropy::Skip);
        let part = -(&lp.logp * &mb.mask).sum(Kind::Float) / tokens;
        part.backward();
        lp.backward();
        if let Some(recompute) = recompute {
            recompute.backward();
        }
        loss += part.double_value(&[]);
    }
    let stats = opt.step();
    SftStep {
        loss,
        skipped: stats.skipped,
    }
}

/// The batch's passes within `budget` token slots: padded rows, a row per line, unless the
/// rows differ so much in length (answers with and without a tool call) that packing them
/// saves a quarter of the tokens. A packed line's mask costs more per token than plain causal
/// attention, and rows of like length would save nothing. A batch that fits the budget padded
/// is one pass, its rows in order.
fn sft_layout(rows: &[TrainRow], budget: usize) -> Vec<MicroPlan> {
    let all: Vec<usize> = (0..rows.len()).collect();
    let lens: Vec<usize> = rows.iter().map(input_len).collect();
    let whole = MicroPlan::one_per_line(all.clone(), &lens);
    let fits = whole.computed_tokens() <= budget;
    let layout = |packing, budget| {
        let batching = Batching {
            micro_batch_tokens: budget,
            packing,
            shared_prefix: false,
        };
        micro_batches(rows, &all, &batching)
    };
    let computed =
        |plans: &[MicroPlan]| plans.iter().map(MicroPlan::computed_tokens).sum::<usize>();
    let (padded, packed) = match fits {
        // Packed into the padded size: one pass too, or no use.
        true => {
            let packed = layout(true, whole.computed_tokens());
            (vec![whole], Some(packed).filter(|p| p.len() == 1))
        }
        false => (layout(false, budget), Some(layout(true, budget))),
    };
    match packed {
        Some(packed) if 4 * computed(&packed) <= 3 * computed(&padded) => packed,
        _ => padded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelConfig;
    use crate::trainer::update::pack::LineAttention;
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
        let first = sft_step(&model, &mut opt, &rows, 8192).loss;
        let mut last = first;
        for _ in 0..40 {
            last = sft_step(&model, &mut opt, &rows, 8192).loss;
        }
        assert!(
            first > 2.0,
            "a random model starts near ln(16) ≈ 2.77, got {first}"
        );
        assert!(last < 0.1, "loss after 40 steps: {last}");
    }

    /// Weights blown up by a step far too large fail the next step, whether the CPU's kernels
    /// turn them into a NaN loss or into a finite loss with an infinite gradient, and the
    /// update is not taken.
    #[test]
    fn a_step_from_diverged_weights_fails() {
        let cfg = ModelConfig::tiny_qwen2(16, 32, 1, 2, 2, 64, 32);
        let model = Model::random(&cfg, Device::Cpu, 1).unwrap();
        let mut opt = Optimizer::new(&model.vs, &OptimConfig::default(), 10).unwrap();
        let rows = vec![sft_row(&[1, 2, 3], &[7, 8, 9])];
        let healthy = sft_step(&model, &mut opt, &rows, 8192);
        assert!(healthy.failure().is_none(), "{healthy:?}");
        tch::no_grad(|| {
            for mut w in model.vs.trainable_variables() {
                let _ = w.g_mul_scalar_(1e30);
            }
        });
        let diverged = sft_step(&model, &mut opt, &rows, 8192);
        let why = diverged.failure();
        assert!(why.is_some(), "{diverged:?}");
        assert!(diverged.skipped || !diverged.loss.is_finite());
    }

    /// Rows numbered by their first token; evaluations answer the step count so far.
    struct Numbered {
        drawn: u32,
        evaluations: usize,
    }

    impl Demonstrations for Numbered {
        fn next(&mut self) -> Result<TrainRow> {
            self.drawn += 1;
            Ok(sft_row(&[self.drawn % 16, 1], &[2, 3]))
        }

        fn evaluate(&mut self, _: &Model) -> Result<f64> {
            self.evaluations += 1;
            Ok(self.evaluations as f64)
        }
    }

    /// A pool draws its rows once, then visits each of them once per pass.
    #[test]
    fn a_pool_draws_its_rows_once_and_repeats_them_every_pass() {
        let mut inner = Numbered {
            drawn: 0,
            evaluations: 0,
        };
        let mut pool = Pool::new(&mut inner, 5, 7);
        let firsts: Vec<u32> = (0..23).map(|_| pool.next().unwrap().tokens[0]).collect();
        assert_eq!(&firsts[..5], &[1, 2, 3, 4, 5]);
        for pass in firsts[5..].chunks(5).filter(|c| c.len() == 5) {
            let mut sorted = pass.to_vec();
            sorted.sort();
            assert_eq!(sorted, vec![1, 2, 3, 4, 5], "{firsts:?}");
        }
        // Passes come in new orders.
        assert_ne!(&firsts[5..10], &firsts[10..15]);
        drop(pool);
        assert_eq!(inner.drawn, 5);
    }

    /// The warm-up evaluates every `eval_every` steps and, unless the run measures it right
    /// after, at its last, on those steps' records.
    #[test]
    fn the_warm_up_logs_held_out_accuracy_every_eval_every_steps() {
        assert_eq!(
            evaluated_steps(3, true),
            vec![(13, 1.0), (16, 2.0), (17, 3.0)]
        );
        assert_eq!(evaluated_steps(3, false), vec![(13, 1.0), (16, 2.0)]);
        assert_eq!(evaluated_steps(0, true), vec![]);
    }

    /// (step, accuracy) of the evaluations a 7-step stage logged from step 11 makes.
    fn evaluated_steps(eval_every: usize, eval_last: bool) -> Vec<(u64, f64)> {
        let cfg = ModelConfig::tiny_qwen2(16, 32, 1, 2, 2, 64, 32);
        let model = Model::random(&cfg, Device::Cpu, 1).unwrap();
        let dir = std::env::temp_dir().join(format!(
            "skein-sft-eval-{}-{eval_every}-{eval_last}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        let mut log = MetricsLog::create(&path).unwrap();
        let mut demos = Numbered {
            drawn: 0,
            evaluations: 0,
        };
        let stage = Stage {
            steps: 7,
            batch_size: 2,
            lr: 1e-3,
            first: 11,
            eval_every,
            eval_last,
            weight_decay: 0.1,
            micro_batch_tokens: 8192,
            checkpointing: false,
        };
        warm_up(&model, &stage, &mut demos, &mut log).unwrap();
        drop(log);
        let records = skein_report::read_metrics(&path).unwrap();
        let evaluated: Vec<(u64, f64)> = records
            .iter()
            .filter_map(|r| Some((r["step"].as_u64()?, r.get("sft/eval_accuracy")?.as_f64()?)))
            .collect();
        assert_eq!(records.len(), 7);
        std::fs::remove_dir_all(&dir).ok();
        evaluated
    }

    /// The batch's mean response-token cross-entropy, computed over `plans`.
    fn loss_over(model: &Model, rows: &[TrainRow], plans: &[MicroPlan]) -> f64 {
        let tokens: usize = rows
            .iter()
            .flat_map(|r| &r.loss_mask)
            .map(|&m| m as usize)
            .sum();
        plans
            .iter()
            .map(|p| {
                let mb = MicroBatch::new(rows, p, Device::Cpu);
                let logp =
                    super::super::update::head::token_logprobs(&model.net, &mb, 1.0, Entropy::Skip)
                        .logp;
                -(logp * &mb.mask).sum(Kind::Float).double_value(&[])
            })
            .sum::<f64>()
            / tokens as f64
    }

    /// Rows of like length stay padded; a batch of short answers beside one long one is packed,
    /// computes fewer tokens and has the padded layout's loss.
    #[test]
    fn batches_of_unequal_rows_are_packed_with_the_same_loss() {
        let row = |len: usize| sft_row(&[1, 2, 3], &vec![5; len]);
        let like: Vec<TrainRow> = (8..12).map(row).collect();
        let plans = sft_layout(&like, 8192);
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].attention, LineAttention::Causal);

        let mut unequal: Vec<TrainRow> = (0..7).map(|k| row(2 + k % 3)).collect();
        unequal.push(row(40));
        let plans = sft_layout(&unequal, 8192);
        assert_eq!(plans.len(), 1);
        assert_ne!(plans[0].attention, LineAttention::Causal);
        let lens: Vec<usize> = unequal.iter().map(input_len).collect();
        let padded = MicroPlan::one_per_line((0..unequal.len()).collect(), &lens);
        assert!(plans[0].computed_tokens() * 2 < padded.computed_tokens());

        let cfg = ModelConfig::tiny_qwen2(16, 32, 2, 2, 1, 64, 64);
        let model = Model::random(&cfg, Device::Cpu, 3).unwrap();
        let (a, b) = (
            loss_over(&model, &unequal, &plans),
            loss_over(&model, &unequal, &[padded]),
        );
        assert!((a - b).abs() < 1e-5, "packed {a}, padded {b}");
    }

    /// A batch over the pass budget is split into passes, each within it (a longer row alone),
    /// and takes the same step as one pass: the same loss and the same weights after it. So
    /// does a step with activation checkpointing, which the warm-up takes when the run's
    /// update does.
    #[test]
    fn a_batch_split_into_passes_takes_the_same_step() {
        let row = |len: usize| sft_row(&[1, 2, 3], &vec![5 + len as u32 % 7; len]);
        let rows: Vec<TrainRow> = [3, 9, 4, 30, 6, 2, 11, 5].map(row).to_vec();
        let budget = 24;
        let passes = sft_layout(&rows, budget);
        assert!(passes.len() > 2, "{} passes", passes.len());
        for p in &passes {
            assert!(p.computed_tokens() <= budget || p.rows.len() == 1, "{p:?}");
        }
        let cfg = ModelConfig::tiny_qwen2(16, 32, 2, 2, 1, 64, 64);
        let model = Model::random(&cfg, Device::Cpu, 5).unwrap();
        // The same weights for both (the global seed is shared with tests running alongside).
        let step = |micro_batch_tokens: usize, checkpointing: bool| {
            let mut copy = Model::random(&cfg, Device::Cpu, 0).unwrap();
            copy.vs.copy(&model.vs).unwrap();
            let ocfg = sft_optim_config(1e-2, 10);
            let mut opt = Optimizer::new(&copy.vs, &ocfg, 10).unwrap();
            let pass = SftPass {
                micro_batch_tokens,
                checkpointing,
            };
            let loss = sft_step_with(&copy, &mut opt, &rows, pass).loss;
            (loss, copy)
        };
        let ((whole, one), (split, many)) = (step(8192, false), step(budget, false));
        assert!(
            (whole - split).abs() < 1e-6,
            "one pass {whole}, passes {split}"
        );
        let (recomputed, checkpointed) = step(budget, true);
        assert!((recomputed - split).abs() < 1e-6);
        // The gradients the step took (AdamW's first step divides them by their own size, so
        // a gradient of zero in exact arithmetic, as a key bias has, turns rounding into lr).
        let (a, b) = (one.vs.variables(), many.vs.variables());
        let size: f64 = a
            .values()
            .map(|t| t.grad().abs().sum(Kind::Float).double_value(&[]))
            .sum();
        assert!(size > 1.0, "the step left no gradient to compare ({size})");
        let c = checkpointed.vs.variables();
        for (name, t) in &a {
            for other in [&b[name], &c[name]] {
                let diff = (t.grad() - other.grad()).abs().max().double_value(&[]);
                assert!(diff < 1e-5, "{name}'s gradient differs by {diff}");
            }
        }
    }
}
