//! `skein eval` of a multi-turn run (a built-in agent task or environment workers): greedy
//! episodes of the run's evaluation problems, played by the same workload its training
//! evaluated with, so `eval/accuracy` and `eval/turns_mean` mean what they meant in its
//! `metrics.jsonl`. The options of sampled evaluation do not apply (the workload plays one
//! greedy episode per problem), and `skein eval` refuses them.

use crate::engine::{Generator, SamplingParams};
use crate::model::Model;
use crate::trainer::rollout::tasks::Tasks;
use crate::trainer::rollout::{eval_kind, StepContext};
use crate::trainer::TrainConfig;
use anyhow::{bail, Result};
use serde_json::{json, Map, Value};
use skein_report::StepProgress;
use skein_text::Tokenizer;
use std::sync::{Mutex, PoisonError};

/// The model an evaluation answers with, and the engine it answers on (a single-turn
/// evaluation's too).
pub struct Loaded<'a> {
    pub model_dir: &'a std::path::Path,
    pub engine: &'a Generator,
    pub policy: &'a Model,
    pub tokenizer: &'a Tokenizer,
}

/// The metrics line of greedy episodes of `cfg`'s evaluation problems (`--problems` of them,
/// else `eval.problems`), played by the `loaded` model.
pub fn evaluate(
    problems: Option<usize>,
    mut cfg: TrainConfig,
    loaded: &Loaded,
) -> Result<Map<String, Value>> {
    if let Some(n) = problems {
        cfg.eval.problems = n;
    }
    let Loaded {
        model_dir,
        engine,
        policy,
        tokenizer,
    } = *loaded;
    let correct_by = cfg.correct_by().map_err(anyhow::Error::msg)?;
    if tokenizer.eos_token_ids().is_empty() {
        bail!("the tokenizer defines no end-of-sequence token");
    }
    let sampling = SamplingParams {
        temperature: 0.0,
        ..cfg
            .rollout
            .sampling
            .stopping_at(&tokenizer.stop_token_ids())
    };
    let tasks = Tasks::from_config(&cfg)?;
    let source = tasks.describe(&cfg);
    let workload = tasks.into_workload(&cfg, tokenizer, policy, None)?;
    tch::manual_seed(cfg.run.seed as i64);
    let progress = Mutex::new((
        StepProgress::counting(workload.eval_problems() as u64, "episode"),
        0,
    ));
    let count = || {
        let mut p = progress.lock().unwrap_or_else(PoisonError::into_inner);
        p.1 += 1;
        let done = p.1;
        p.0.update(done, &[]);
    };
    let ctx = StepContext::new(engine, policy, tokenizer, &sampling).counting_episodes(&count);
    let result = workload.evaluate(&ctx);
    progress
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .0
        .finish();
    let mut line = Map::new();
    line.insert("model".into(), json!(model_dir.display().to_string()));
    let kind = eval_kind(workload.held_out());
    line.insert("data".into(), json!(format!("{source}, {kind} problems")));
    line.insert("problems".into(), json!(result.problems));
    line.insert("n".into(), json!(1));
    line.insert("temperature".into(), json!(0.0));
    line.insert(
        "correct_by".into(),
        json!(correct_by.describe(&cfg.task_checker())),
    );
    for (key, value) in result.scores() {
        line.insert(key.into(), json!(value));
    }
    Ok(line)
}
