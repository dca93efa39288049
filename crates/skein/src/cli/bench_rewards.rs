//! `skein bench rewards`: one rollout scored by a real reward model (all-MiniLM-L6-v2 by
//! default), twice: scoring at the end of generation (sequential) and scoring each trajectory
//! as it finishes (async, through the dynamic-batching executor). Reports the step wall time
//! both ways, the fraction of reward time hidden behind generation, and the executor's
//! batched throughput against one request at a time on the same model.

use super::bench_args::median;
use crate::engine::{Engine, GenRequest, SamplingParams};
use crate::model::{Model, ModelConfig};
use crate::trainer::rollout::judge::response_text;
use crate::trainer::rollout::reward::{request, ModelScorer};
use anyhow::{Context, Result};
use skein_reward::{BatchScorer, Executor, ExecutorConfig, RewardRequest, Ticket};
use skein_tasks::{task_by_name, Problem, TaskRng};
use skein_text::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct RewardBenchArgs {
    /// Reward model directory (default: the all-MiniLM-L6-v2 that
    /// scripts/setup-reward-model.sh records in .venv/minilm.path).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompts of the `reverse` task (long-tail response lengths), each sampled `--samples` times.
    #[arg(long, default_value_t = 32)]
    prompts: usize,
    #[arg(long, default_value_t = 8)]
    samples: usize,
    #[arg(long, default_value_t = 96)]
    max_new_tokens: usize,
    /// Policy size: hidden width and layers of a random Qwen2-layout model.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Reward executor: largest batch, and how long a batch waits to fill.
    #[arg(long, default_value_t = 32)]
    max_batch_size: usize,
    #[arg(long, default_value_t = 5)]
    max_wait_ms: u64,
    /// Timed rounds of each mode (medians are reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// libtorch threads (shared by the policy and the reward model).
    #[arg(long, default_value_t = 1)]
    torch_threads: usize,
    /// Requests in the throughput comparison.
    #[arg(long, default_value_t = 128)]
    throughput_requests: usize,
}

struct Setup {
    model: Model,
    tokenizer: Tokenizer,
    problems: Vec<Problem>,
    prompts: Vec<Vec<u32>>,
    params: SamplingParams,
}

/// One rollout's times.
struct Round {
    generate_s: f64,
    step_s: f64,
    /// Executor busy time during generation, and in all.
    overlapped_s: f64,
    busy_s: f64,
    requests: Vec<RewardRequest>,
}

pub fn run(a: &RewardBenchArgs) -> Result<()> {
    // Medians of no rounds, or rounds of no work, would be made-up figures.
    super::bench_args::at_least_one(&[
        ("--rounds", a.rounds),
        ("--prompts", a.prompts),
        ("--samples", a.samples),
        ("--max-new-tokens", a.max_new_tokens),
        ("--throughput-requests", a.throughput_requests),
    ])?;
    tch::set_num_threads(a.torch_threads.max(1) as i32);
    let dir = reward_model_dir(a)?;
    let scorer = Arc::new(ModelScorer::load(&dir, tch::Device::Cpu, 1, "rm")?);
    let exec_cfg = ExecutorConfig {
        threads: 1,
        max_batch_size: a.max_batch_size,
        max_wait_ms: a.max_wait_ms,
        ..ExecutorConfig::default()
    };
    let s = setup(a)?;
    println!(
        "policy: {:.2}M parameters, {} prompts x {} samples, up to {} new tokens; reward model {}; {} torch threads",
        s.model.net.config.num_parameters() as f64 / 1e6,
        a.prompts,
        a.samples,
        a.max_new_tokens,
        dir.display(),
        tch::get_num_threads()
    );
    // Warm-up: first calls allocate.
    let exec = Executor::new(scorer.clone(), exec_cfg.clone(), "bench", "bench")?;
    round(&s, &exec, a.samples, true, 0)?;
    let (mut seq, mut asy) = (Vec::new(), Vec::new());
    for r in 0..a.rounds {
        // Fresh executors so each round's busy time is its own; the same seed, so both
        // modes generate the same responses.
        let e = Executor::new(scorer.clone(), exec_cfg.clone(), "bench", "bench")?;
        seq.push(round(&s, &e, a.samples, false, r as i64 + 1)?);
        let e = Executor::new(scorer.clone(), exec_cfg.clone(), "bench", "bench")?;
        asy.push(round(&s, &e, a.samples, true, r as i64 + 1)?);
    }
    let med = |v: &[Round], f: fn(&Round) -> f64| median(v.iter().map(f).collect());
    let (gen_s, seq_step) = (med(&seq, |r| r.generate_s), med(&seq, |r| r.step_s));
    let reward_s = med(&seq, |r| r.step_s - r.generate_s);
    let asy_step = med(&asy, |r| r.step_s);
    let hidden = med(&asy, |r| r.overlapped_s / r.busy_s.max(1e-9));
    println!(
        "generation {:.0} ms, reward model at the end {:.0} ms (ratio {:.2})",
        gen_s * 1e3,
        reward_s * 1e3,
        reward_s / gen_s.max(1e-9)
    );
    println!(
        "step wall time: sequential {:.0} ms, async {:.0} ms ({:.2}x faster)",
        seq_step * 1e3,
        asy_step * 1e3,
        seq_step / asy_step.max(1e-9)
    );
    println!(
        "reward time hidden behind generation (async): {:.1}%",
        hidden * 100.0
    );

    let requests: Vec<RewardRequest> = asy
        .last()
        .map(|r| r.requests.clone())
        .unwrap_or_default()
        .into_iter()
        .cycle()
        .take(a.throughput_requests)
        .collect();
    throughput(&scorer, exec_cfg, &requests)
}

/// `--model`, or the encoder `scripts/setup-reward-model.sh` recorded.
fn reward_model_dir(a: &RewardBenchArgs) -> Result<PathBuf> {
    if let Some(d) = &a.model {
        return Ok(d.clone());
    }
    let recorded = PathBuf::from(".venv/minilm.path");
    let text = std::fs::read_to_string(&recorded).with_context(|| {
        format!(
            "reading {} (run scripts/setup-reward-model.sh, or pass --model DIR)",
            recorded.display()
        )
    })?;
    Ok(PathBuf::from(text.trim()))
}

/// Requests per second scored one at a time, then through the batching executor.
fn throughput(
    scorer: &Arc<ModelScorer>,
    exec_cfg: ExecutorConfig,
    requests: &[RewardRequest],
) -> Result<()> {
    let t = Instant::now();
    for r in requests {
        scorer.score_batch(std::slice::from_ref(r));
    }
    let single = requests.len() as f64 / t.elapsed().as_secs_f64();
    let e = Executor::new(scorer.clone(), exec_cfg, "bench", "bench")?;
    let t = Instant::now();
    let tickets: Vec<Ticket> = requests.iter().map(|r| e.submit(r.clone())).collect();
    for tk in tickets {
        tk.wait()?;
    }
    let batched = requests.len() as f64 / t.elapsed().as_secs_f64();
    let m = e.metrics();
    println!(
        "reward model throughput: one at a time {single:.0} requests/s, executor {batched:.0} requests/s (mean batch {:.1}): {:.1}x",
        m.batch_size_mean(),
        batched / single.max(1e-9)
    );
    Ok(())
}

fn setup(a: &RewardBenchArgs) -> Result<Setup> {
    let task = task_by_name("reverse", 1)?;
    let tokenizer = Tokenizer::char_level(task.alphabet())?;
    let mut rng = TaskRng::new(5);
    let problems: Vec<Problem> = (0..a.prompts).map(|_| task.sample(&mut rng)).collect();
    let prompts = problems
        .iter()
        .map(|p| tokenizer.encode(&p.prompt, false))
        .collect::<Result<Vec<_>, _>>()?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let heads = (a.hidden / 64).max(1);
    let cfg = ModelConfig::tiny_qwen2(
        tokenizer.vocab_size(),
        a.hidden,
        a.layers,
        heads,
        heads,
        a.hidden * 8 / 3,
        longest + a.max_new_tokens + 1,
    );
    // An untrained policy: response lengths are geometric, a natural long tail.
    let model = Model::random(&cfg, tch::Device::Cpu, 3)?;
    let params = SamplingParams {
        max_new_tokens: a.max_new_tokens,
        stop_token_ids: tokenizer.eos_token_ids().to_vec(),
        ..Default::default()
    };
    Ok(Setup {
        model,
        tokenizer,
        problems,
        prompts,
        params,
    })
}

/// Generates every sample and scores it: `async_scoring` submits each one as it finishes,
/// otherwise all are submitted once generation is over.
fn round(s: &Setup, exec: &Executor, n: usize, async_scoring: bool, seed: i64) -> Result<Round> {
    let mut gen = Vec::new();
    for (p, ids) in s.prompts.iter().enumerate() {
        for k in 0..n {
            gen.push(GenRequest {
                id: (p * n + k) as u64,
                prompt: ids.clone(),
                resumed: Vec::new(),
                params: s.params.clone(),
                budget: None,
                session: None,
                watch: None,
            });
        }
    }
    tch::manual_seed(seed);
    let busy0 = exec.metrics().busy_s;
    let t = Instant::now();
    let mut requests = Vec::new();
    let mut tickets = Vec::new();
    Engine::new(256).generate(&s.model, 0, gen, |out| {
        let p = out.id as usize / n;
        let text = response_text(&s.tokenizer, &out.tokens).unwrap_or_default();
        let req = request(
            out.id.to_string(),
            &s.problems[p],
            &s.prompts[p],
            &out.tokens,
            text,
        );
        if async_scoring {
            tickets.push(exec.submit(req.clone()));
        }
        requests.push(req);
    });
    let generate_s = t.elapsed().as_secs_f64();
    let busy1 = exec.metrics().busy_s;
    if !async_scoring {
        tickets = requests.iter().map(|r| exec.submit(r.clone())).collect();
    }
    for tk in tickets {
        tk.wait()?;
    }
    let step_s = t.elapsed().as_secs_f64();
    Ok(Round {
        generate_s,
        step_s,
        overlapped_s: busy1 - busy0,
        busy_s: exec.metrics().busy_s - busy0,
        requests,
    })
}
