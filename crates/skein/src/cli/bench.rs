//! `skein bench`: training-step time (forward log-probs, clipped loss, backward, AdamW) and
//! KV-cached decode throughput for one model size. `scripts/bench_pytorch_eager.py` measures
//! the same two numbers with PyTorch eager from Python, for a ratio taken on one machine.
//! Its subcommands ([`BenchWhat`]: `rewards`, `train-tokens`, `memory`) are benches of their own
//! files, dispatched from here; `bench_args.rs` holds what they share.

use super::bench_args::{at_least_one, median, synchronize, ModelShape, Placement};
use super::bench_memory::{self, MemoryBenchArgs};
use super::bench_rewards::{self, RewardBenchArgs};
use super::bench_tokens::{self, TokenBenchArgs};
use crate::engine::{Engine, EngineStats, GenRequest, SamplingParams, StepTimes};
use crate::model::{DecodeForm, Model};
use crate::op_count;
use crate::trainer::batch::TrainRow;
use crate::trainer::update::head::{token_logprobs, Entropy};
use crate::trainer::update::optim::{OptimConfig, Optimizer};
use crate::trainer::update::optim_ops::AdamwForm;
use crate::trainer::update::policy_loss::{policy_loss, LossConfig, TokenBatch};
use crate::trainer::update::tensors::{MicroBatch, PolicyInputs};
use anyhow::Result;
use std::time::Instant;

/// Sizes of the benchmark model and batch: each at least 1, `hidden` a multiple of `heads`,
/// `seq` longer than `decode_prompt` (else libtorch is handed tensors it cannot shape).
fn check(a: &BenchArgs) -> Result<()> {
    a.model.check()?;
    at_least_one(&[
        ("--batch", a.batch),
        ("--seq", a.seq),
        ("--iters", a.iters),
        ("--decode-prompt", a.decode_prompt),
    ])?;
    if a.seq < 2 {
        anyhow::bail!("invalid value for `--seq`: must be ≥ 2 (got {})", a.seq);
    }
    if a.seq <= a.decode_prompt {
        anyhow::bail!(
            "invalid value for `--seq`: {} leaves decode no token to generate after its \
             prompt of `--decode-prompt` = {}; raise --seq or lower --decode-prompt",
            a.seq,
            a.decode_prompt
        );
    }
    Ok(())
}

/// The benches other than the training step and decode, each in a file of its own.
#[derive(clap::Subcommand, Debug)]
pub enum BenchWhat {
    /// Async reward scoring against scoring at the end, with a real reward model.
    Rewards(RewardBenchArgs),
    /// One PPO update of an agentic batch: padded, packed, and packed with shared prompts.
    TrainTokens(TokenBenchArgs),
    /// Peak memory and step time of one GRPO update on Qwen2.5-0.5B's shape: full float32,
    /// LoRA, LoRA on a bfloat16 base, and with activation checkpointing, beside the
    /// preflight's estimate of each.
    Memory(MemoryBenchArgs),
}

#[derive(clap::Args, Debug)]
// The step-and-decode flags belong to that bench alone: given before another bench's name
// (`skein bench --device cuda memory`), they would be taken and silently ignored.
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// A benchmark other than the training step and decode (e.g. `rewards`).
    #[command(subcommand)]
    what: Option<BenchWhat>,
    #[command(flatten)]
    model: ModelShape,
    #[command(flatten)]
    place: Placement,
    #[arg(long, default_value_t = 8)]
    batch: usize,
    #[arg(long, default_value_t = 256)]
    seq: usize,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// Prompt tokens per sequence in the decode benchmark; it generates up to `seq`.
    #[arg(long, default_value_t = 16)]
    decode_prompt: usize,
    /// Also list the operators a training step and a decode step call, most frequent first.
    #[arg(long)]
    op_breakdown: bool,
    /// The form of the decoding copy: `separate` (the CPU's) or `fused` (CUDA's). By default
    /// the device's; naming the other counts its calls on this machine.
    #[arg(long, value_enum)]
    decode_form: Option<DecodeFormArg>,
    /// The form of the AdamW step: `op-by-op` (the CPU's) or `fused` (a GPU's). By default the
    /// device's; naming the other times and counts it on this machine.
    #[arg(long, value_enum)]
    optimizer_form: Option<OptimizerFormArg>,
    /// Decode in the fixed shapes of `rollout.cuda_graphs`: captured and replayed as CUDA
    /// graphs on a GPU, computed eagerly in those shapes elsewhere. Each timed run captures
    /// its own graphs, as each rollout of a training run does.
    #[arg(long)]
    cuda_graphs: bool,
    /// Time decode alone, without the training step: a batch whose decode fits where a
    /// training step of it would not (its activations), or a decode change measured sooner.
    #[arg(long, conflicts_with = "optimizer_form")]
    decode_only: bool,
}

/// `--optimizer-form`'s values, [`AdamwForm`]'s.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum OptimizerFormArg {
    OpByOp,
    Fused,
}

impl From<OptimizerFormArg> for AdamwForm {
    fn from(form: OptimizerFormArg) -> Self {
        match form {
            OptimizerFormArg::OpByOp => AdamwForm::OpByOp,
            OptimizerFormArg::Fused => AdamwForm::Fused,
        }
    }
}

/// `--decode-form`'s values, [`DecodeForm`]'s.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum DecodeFormArg {
    Separate,
    Fused,
}

impl From<DecodeFormArg> for DecodeForm {
    fn from(form: DecodeFormArg) -> Self {
        match form {
            DecodeFormArg::Separate => DecodeForm::Separate,
            DecodeFormArg::Fused => DecodeForm::Fused,
        }
    }
}

pub fn run(a: &BenchArgs) -> Result<()> {
    if let Some(what) = &a.what {
        return run_other(what);
    }
    check(a)?;
    a.place.start()?;
    let cfg = a.model.config(a.seq.max(a.decode_prompt + 1));
    let m = &a.model;
    let model = a.place.model(&cfg, 0)?;
    println!(
        "model: {:.2}M parameters (vocab {}, hidden {}, {} layers, {} heads, intermediate {}), {}",
        cfg.num_parameters() as f64 / 1e6,
        m.vocab,
        m.hidden,
        m.layers,
        m.heads,
        m.intermediate,
        a.place.describe(model.vs.device())
    );
    let train_ops = if a.decode_only {
        None
    } else {
        Some(report_train(&model, a)?)
    };
    let decode_ops = report_decode(&model, a)?;
    if a.op_breakdown {
        print_op_breakdown(train_ops.as_ref(), decode_ops.as_ref());
    }
    Ok(())
}

/// Times the training step and prints its tokens/s and its calls per step, which it returns.
fn report_train(model: &Model, a: &BenchArgs) -> Result<TrainOps> {
    let (times, train_ops) = time_train_steps(model, a)?;
    let train = median(times);
    println!(
        "train step (batch {} x {} tokens): {:.1} ms, {:.0} tokens/s",
        a.batch,
        a.seq,
        train * 1e3,
        (a.batch * a.seq) as f64 / train
    );
    // On a GPU the backward runs on libtorch's device thread, which the count does not see.
    let whose = match model.vs.device() {
        tch::Device::Cpu => "",
        _ => " on this thread (not the backward's)",
    };
    let adamw = match train_ops.form {
        AdamwForm::Fused => "fused",
        AdamwForm::OpByOp => "op by op",
    };
    println!(
        "train ops per step: {} computing (kernels on a GPU){whose}, {} of them the optimizer's \
         (AdamW {adamw})",
        train_ops.step.computing_total(),
        train_ops.optimizer.computing_total()
    );
    Ok(train_ops)
}

/// Times decode and prints its tokens/s (with `--cuda-graphs`, the shapes captured and steps
/// replayed) and its calls per step; returns the calls of its counted run and that run's
/// steps, where they were counted. With `--cuda-graphs`, a decode that went back to the
/// ordinary path (a capture or replay failed) is an error: its figure is not of graphs.
fn report_decode(model: &Model, a: &BenchArgs) -> Result<Option<(op_count::OpCounts, usize)>> {
    let (secs, decoded) = time_decode(model, a);
    let tokens = decoded.generated_tokens;
    println!(
        "decode (batch {}, KV cache, {} form{}): {:.0} tokens/s ({} tokens in {:.2} s)",
        a.batch,
        match decode_form(model, a) {
            DecodeForm::Separate => "separate",
            DecodeForm::Fused => "fused",
        },
        match (a.cuda_graphs, model.vs.device().is_cuda()) {
            (false, _) => "",
            (true, true) => ", CUDA graphs",
            (true, false) => ", fixed shapes",
        },
        tokens as f64 / secs,
        tokens,
        secs
    );
    if a.cuda_graphs {
        let times = decoded.graph_steps;
        println!(
            "decode graphs: {} shapes captured, {} of {} steps replayed; a step {}",
            decoded.graph_captures,
            times.replayed.0,
            decoded.decode_steps,
            step_times(&times)
        );
        let through_graphs = times.replayed.0 + times.captured.0 + times.eager.0;
        if through_graphs < decoded.decode_steps {
            anyhow::bail!(
                "--cuda-graphs: {} of {} decode steps ran without the graph decoder, which \
                 stopped (its reason is printed above), so the figure above is not of graph \
                 decoding",
                decoded.decode_steps - through_graphs,
                decoded.decode_steps
            );
        }
    }
    if a.cuda_graphs && model.vs.device().is_cuda() {
        // A replayed step's kernels run inside one graph launch, which no operator call
        // marks, and a capturing step calls each operator twice: a count would mean neither.
        println!(
            "decode ops per step: not counted through CUDA graphs (the bench without \
             --cuda-graphs counts a step's kernels)"
        );
        return Ok(None);
    }
    // A decode step's calls: those of a run beyond one of the same prompts that stops after
    // its prefill (the same prefill, decoding copy and first token), per step.
    let (_, prefill) = op_count::count(|| decode_to(model, a, 3, 1));
    let (steps, whole) = op_count::count(|| decode(model, a, 3).decode_steps);
    let ops = whole.beyond(&prefill);
    let per_step = |n: u64| n as f64 / steps.max(1) as f64;
    println!(
        "decode ops per step: {:.0} computing (kernels on a GPU), {:.0} made by skein, {:.0} in all",
        per_step(ops.computing_total()),
        per_step(ops.top_level_total()),
        per_step(ops.all)
    );
    Ok(Some((ops, steps)))
}

/// `--op-breakdown`: the calls of a training step and of a decode step (`decode_ops`: the
/// calls of a run and its steps), by name, those that were counted.
fn print_op_breakdown(
    train_ops: Option<&TrainOps>,
    decode_ops: Option<&(op_count::OpCounts, usize)>,
) {
    if let Some(train_ops) = train_ops {
        for (what, counts) in [
            ("computing", &train_ops.step.computing),
            ("the optimizer's computing", &train_ops.optimizer.computing),
        ] {
            println!("  per training step, {what}:");
            for (name, calls) in counts {
                println!("  {calls:>8}  {name}");
            }
        }
    }
    let Some((decode_ops, steps)) = decode_ops else {
        return;
    };
    let per_step = |n: u64| n as f64 / (*steps).max(1) as f64;
    for (what, counts) in [
        ("made by skein", &decode_ops.top_level),
        ("computing", &decode_ops.computing),
    ] {
        println!("  per decode step, {what}:");
        for (name, calls) in counts {
            println!("  {:>8.1}  {name}", per_step(*calls));
        }
    }
}

/// The mean time of a decode step by how its forward ran, e.g. `8.10 ms replayed, 40.31 ms
/// capturing (5), 15.20 ms eager (7)`: what keeping graphs between runs would save is the
/// capturing and eager steps' time beyond a replayed one's.
fn step_times(times: &StepTimes) -> String {
    let mean = |(steps, secs): (usize, f64), how: &str| {
        (steps > 0).then(|| format!("{:.2} ms {how} ({steps})", secs * 1e3 / steps as f64))
    };
    [
        mean(times.replayed, "replayed"),
        mean(times.captured, "capturing"),
        mean(times.eager, "eager"),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ")
}

/// Runs the bench `what` names.
fn run_other(what: &BenchWhat) -> Result<()> {
    match what {
        BenchWhat::Rewards(a) => bench_rewards::run(a),
        BenchWhat::TrainTokens(a) => bench_tokens::run(a),
        BenchWhat::Memory(a) => bench_memory::run(a),
    }
}

/// The bench's training rows: `a.batch` rows of `a.seq` tokens, the first quarter prompt.
fn train_rows(a: &BenchArgs) -> Vec<TrainRow> {
    let prompt = a.seq / 4;
    (0..a.batch)
        .map(|b| {
            let tokens: Vec<u32> = (0..a.seq)
                .map(|i| ((i * 31 + b * 17) % a.model.vocab) as u32)
                .collect();
            let n = a.seq - prompt;
            TrainRow {
                tokens,
                prompt_len: prompt,
                loss_mask: vec![1; n],
                behavior_logp: vec![-5.0; n],
                advantages: (0..n)
                    .map(|i| if (i + b) % 2 == 0 { 1.0 } else { -1.0 })
                    .collect(),
                old_logp: vec![-6.0; n],
                loss_weight: 1.0 / (a.batch * n) as f64,
                ..Default::default()
            }
        })
        .collect()
}

/// The forward log-probs, clipped loss and backward of one training step, leaving the
/// gradients for the optimizer.
fn gradients(model: &Model, refs: &[&TrainRow], opt: &mut Optimizer) {
    let mb = MicroBatch::padded(refs, model.vs.device());
    opt.zero_grad();
    let inputs = PolicyInputs::new(&mb, refs, false);
    let lp = token_logprobs(&model.net, &mb, 1.0, Entropy::Skip);
    let out = policy_loss(
        &TokenBatch {
            logp: &lp.logp,
            old_logp: &inputs.old_logp_or(&lp.logp),
            ref_logp: None,
            entropy: None,
            advantages: &inputs.advantages,
            importance_weights: &inputs.importance_weights,
            loss_weights: &inputs.loss_weights,
            mask: &mb.mask,
            sequences: None,
        },
        &LossConfig::default(),
    );
    out.loss.backward();
    lp.backward();
}

/// What a training step calls: the whole step, and its optimizer step alone.
struct TrainOps {
    step: op_count::OpCounts,
    optimizer: op_count::OpCounts,
    /// The form the optimizer computed in.
    form: AdamwForm,
}

/// Times `a.iters` training steps after one warm-up step, then counts the calls of two more
/// (counts do not nest, so the optimizer's are counted in a step of their own).
fn time_train_steps(model: &Model, a: &BenchArgs) -> Result<(Vec<f64>, TrainOps)> {
    let mut opt = Optimizer::new(&model.vs, &OptimConfig::default(), a.iters + 3)?;
    if let Some(form) = a.optimizer_form {
        opt.set_form(form.into());
    }
    let rows = train_rows(a);
    let refs: Vec<&TrainRow> = rows.iter().collect();
    let mut times = Vec::new();
    for i in 0..=a.iters {
        let t = Instant::now();
        gradients(model, &refs, &mut opt);
        opt.step();
        synchronize(model.vs.device());
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    let (_, step) = op_count::count(|| {
        gradients(model, &refs, &mut opt);
        opt.step();
    });
    gradients(model, &refs, &mut opt);
    let (_, optimizer) = op_count::count(|| opt.step());
    let form = opt.form();
    Ok((
        times,
        TrainOps {
            step,
            optimizer,
            form,
        },
    ))
}

/// The seconds one timed decode run took, after an untimed one, and its counts.
fn time_decode(model: &Model, a: &BenchArgs) -> (f64, EngineStats) {
    decode(model, a, 1);
    synchronize(model.vs.device());
    let t = Instant::now();
    let stats = decode(model, a, 2);
    synchronize(model.vs.device());
    (t.elapsed().as_secs_f64(), stats)
}

/// The decoding copy's form: `--decode-form`, or the device's.
fn decode_form(model: &Model, a: &BenchArgs) -> DecodeForm {
    a.decode_form
        .map(DecodeForm::from)
        .unwrap_or_else(|| DecodeForm::for_device(model.vs.device()))
}

/// One batch of `a.batch` sequences generated to `a.seq` tokens, from prompts that `seed`
/// varies.
fn decode(model: &Model, a: &BenchArgs, seed: usize) -> EngineStats {
    decode_to(model, a, seed, a.seq - a.decode_prompt)
}

/// [`decode`], each sequence generating `max_new` tokens.
fn decode_to(model: &Model, a: &BenchArgs, seed: usize, max_new: usize) -> EngineStats {
    let mut engine = Engine::new(a.batch);
    engine.decode_form = Some(decode_form(model, a));
    engine.cuda_graphs = a.cuda_graphs;
    let requests = |seed: usize| -> Vec<GenRequest> {
        (0..a.batch)
            .map(|b| GenRequest {
                id: b as u64,
                prompt: (0..a.decode_prompt)
                    .map(|i| ((i * 7 + b * 13 + seed) % a.model.vocab) as u32)
                    .collect(),
                resumed: Vec::new(),
                params: SamplingParams {
                    max_new_tokens: max_new,
                    ..Default::default()
                },
                budget: None,
                session: None,
                watch: None,
            })
            .collect()
    };
    engine.generate(model, 0, requests(seed), |_| {})
}
