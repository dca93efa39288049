//! `skein serve`: a model behind the OpenAI-compatible HTTP API of [`crate::serve`], recording
//! the token-exact rollouts of agents that call it. With no `--model`, a fresh random tiny model
//! with the character-level tokenizer, so the command runs with no arguments.

use crate::engine::{self, Engine};
use crate::model::{Dtype, Model, ModelOptions};
use crate::serve::{self, ServeConfig, ServeState, TextSide};
use crate::trainer::config::ModelSection;
use anyhow::{bail, Context, Result};
use skein_text::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// A Hugging Face model directory (config.json, model.safetensors, tokenizer.json), or a
    /// run directory (its `checkpoint/` is served). Without it: a random tiny model with a
    /// character-level tokenizer over printable ASCII.
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port; the address is printed on stderr either way.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long)]
    api_key: Option<String>,
    /// Requests handled at once; more are answered 503 with Retry-After.
    #[arg(long, default_value_t = 2048)]
    max_concurrent: usize,
    /// Largest request body in bytes (larger: 413).
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// The model name clients send (default: the model directory's name, or `skein-tiny`).
    #[arg(long)]
    name: Option<String>,
    /// Sequences the engine decodes together (KV-cache slots). Default: 64, or as many as
    /// fit the KV cache in half the free memory.
    #[arg(long)]
    max_slots: Option<usize>,
    /// Longest context (prompt + completion); maximum: the model's. Default: the model's, or
    /// less when one slot's KV cache at it does not fit.
    #[arg(long)]
    context: Option<usize>,
    /// New tokens per completion when a request names no `max_tokens`.
    #[arg(long, default_value_t = 256)]
    default_max_tokens: usize,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Seed of the random tiny model (without --model).
    #[arg(long, default_value_t = 0)]
    seed: i64,
    /// Decode through CUDA graphs (`rollout.cuda_graphs`; a CUDA device only). Graphs are
    /// captured again after each weight reload or end of a phase (a new engine run).
    #[arg(long)]
    cuda_graphs: bool,
    /// The dtype the weights are served in: float32, bfloat16 or float16 (a bfloat16 model
    /// served in bfloat16 takes half the memory). Reloaded weights take it too.
    #[arg(long, default_value = "float32", value_parser = parse_dtype)]
    dtype: Dtype,
}

fn parse_dtype(name: &str) -> Result<Dtype, String> {
    [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16]
        .into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| format!("`{name}` is not a dtype (allowed: float32, bfloat16, float16)"))
}

/// Requests in flight at once; more wait for a permit.
const MAX_CONCURRENT: usize = 1 << 20;

/// KV-cache slots: far more than one model decodes at once on any device.
const MAX_SLOTS: usize = 1 << 16;

/// Slots when --max-slots is not given and they fit.
const DEFAULT_SLOTS: usize = 64;

/// The share of the free memory a KV cache sized by default may take: the rest is for the
/// forward's activations, the HTTP side and whatever else the machine runs.
const DEFAULT_CACHE_SHARE: f64 = 0.5;

/// The shortest context a default size goes down to.
const SMALLEST_DEFAULT_CONTEXT: usize = 256;

/// The engine's size: KV-cache slots and the context of each.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CacheSize {
    slots: usize,
    context: usize,
}

/// The size asked for, with what was left out chosen to fit `budget` bytes of KV cache
/// (`bytes(slots, context)`): slots up to [`DEFAULT_SLOTS`] at the given or the model's
/// context; without --context, when one slot does not fit at the model's, the longest
/// context that does (down to [`SMALLEST_DEFAULT_CONTEXT`]). What the user gave is kept
/// whole; `check_cache_fits` judges it.
fn default_size(
    slots: Option<usize>,
    context: Option<usize>,
    model_context: usize,
    budget: Option<f64>,
    bytes: impl Fn(usize, usize) -> f64,
) -> CacheSize {
    let Some(budget) = budget else {
        return CacheSize {
            slots: slots.unwrap_or(DEFAULT_SLOTS),
            context: context.unwrap_or(model_context),
        };
    };
    let context = context.unwrap_or_else(|| {
        let want = slots.unwrap_or(1);
        if bytes(want, model_context) <= budget {
            return model_context;
        }
        let per_token = bytes(want, 1);
        let fits = (budget / per_token).floor() as usize;
        fits.clamp(SMALLEST_DEFAULT_CONTEXT.min(model_context), model_context)
    });
    let fitting = |context: usize| (budget / bytes(1, context)).floor() as usize;
    let slots = slots.unwrap_or_else(|| fitting(context).clamp(1, DEFAULT_SLOTS));
    CacheSize { slots, context }
}

/// The KV cache of `slots` sequences of `context` tokens fits in the free memory (on the CPU,
/// where it can be read); else the engine would abort on its first full batch.
fn check_cache_fits(
    model: &Model,
    slots: usize,
    context: usize,
    device: tch::Device,
) -> Result<()> {
    let element = model.options.dtype.bytes();
    let bytes = model.net.config.kv_cache_bytes(slots, context, element);
    if let Some(free) = crate::memory::available_on(device).filter(|&free| bytes > free) {
        bail!(
            "--max-slots {slots} with a context of {context} tokens needs a {:.1} GiB KV cache, \
             but {:.1} GiB of memory is free: lower --max-slots or --context",
            bytes / crate::memory::GIB,
            free / crate::memory::GIB
        );
    }
    Ok(())
}

/// Context of the tiny model served without `--model`.
const TINY_CONTEXT: usize = 256;

/// The tiny model's alphabet: printable ASCII and newline.
fn tiny_alphabet() -> String {
    (' '..='~').chain(['\n']).collect()
}

fn load(args: &ServeArgs, device: tch::Device) -> Result<(Model, Tokenizer, String)> {
    match &args.model {
        Some(given) => {
            let dir = &served_dir(given)?;
            let tokenizer = Tokenizer::from_dir(dir)
                .with_context(|| format!("loading the tokenizer of {}", dir.display()))?;
            let options = ModelOptions {
                dtype: args.dtype,
                ..Default::default()
            };
            let model = Model::load_dir_with(dir, &options, device)
                .with_context(|| format!("loading the model of {}", dir.display()))?;
            Ok((model, tokenizer, dir_name(given)))
        }
        None => {
            let tokenizer = Tokenizer::char_level(&tiny_alphabet())?;
            let cfg = ModelSection::default().tiny_config(tokenizer.vocab_size(), TINY_CONTEXT);
            let options = ModelOptions {
                dtype: args.dtype,
                ..Default::default()
            };
            let model = Model::random_with(&cfg, &options, device, args.seed)?;
            Ok((model, tokenizer, "skein-tiny".into()))
        }
    }
}

/// The model directory `--model` names: a run directory (config.toml and its checkpoints)
/// serves its newest weights, as `skein eval RUN_DIR` evaluates them; a LoRA adapter, which is
/// no model by itself, is refused saying what to serve instead.
fn served_dir(dir: &Path) -> Result<PathBuf> {
    if dir.join("config.toml").is_file() {
        if let Some(weights) = crate::trainer::final_checkpoint::newest(dir)? {
            if let Some(note) = &weights.note {
                eprintln!("skein: {note}");
            }
            eprintln!(
                "skein: {} is a run directory: serving {}",
                dir.display(),
                weights.dir.display()
            );
            return Ok(weights.dir);
        }
    }
    let adapter_config = dir.join(crate::model::peft::CONFIG_FILE);
    if adapter_config.is_file() && !dir.join("config.json").is_file() {
        let base = std::fs::read_to_string(&adapter_config)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|c| c["base_model_name_or_path"].as_str().map(String::from));
        let base = match base {
            Some(b) => format!(" (its adapter_config.json names `{b}`)"),
            None => String::new(),
        };
        let merged = dir
            .parent()
            .filter(|p| p.join("config.json").is_file())
            .map_or_else(
                || "a checkpoint with the adapter merged in".to_string(),
                |p| format!("{}, the checkpoint with it merged in", p.display()),
            );
        bail!(
            "--model {}: a LoRA adapter, not a model: serve {merged}, or serve the model it \
             adapts{base} and load the adapter into that server with POST /v1/reload \
             {{\"path\": \"{}\"}}",
            dir.display(),
            dir.display()
        );
    }
    Ok(dir.to_path_buf())
}

fn dir_name(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "skein".into())
}

/// A key clients can send back: header values are visible ASCII, and clients trim the spaces
/// at their ends, so an empty key, or one outside that, would refuse every request.
fn check_api_key(key: &str) -> Result<()> {
    let visible = |c: char| c.is_ascii_graphic() || c == ' ';
    if key.trim().is_empty() || key.trim() != key || !key.chars().all(visible) {
        bail!(
            "--api-key must be visible ASCII characters with no spaces at its ends \
             (got {key:?}); leave --api-key out to serve without one"
        );
    }
    Ok(())
}

/// Without a key, a server other hosts reach serves them all: said once at start-up.
fn warn_if_open(addr: std::net::SocketAddr, api_key: Option<&str>) {
    if api_key.is_none() && !addr.ip().is_loopback() {
        eprintln!(
            "skein serve: warning: listening on {addr}, reachable from other hosts, with no \
             --api-key: anyone who reaches it can generate, and /v1/reload is refused"
        );
    }
}

pub fn run(args: &ServeArgs) -> Result<()> {
    if let Some(key) = &args.api_key {
        check_api_key(key)?;
    }
    let asked_slots = args.max_slots.unwrap_or(DEFAULT_SLOTS);
    if args.max_concurrent == 0 || asked_slots == 0 || args.default_max_tokens == 0 {
        bail!("--max-concurrent, --max-slots and --default-max-tokens must be at least 1");
    }
    if args.max_concurrent > MAX_CONCURRENT || asked_slots > MAX_SLOTS {
        bail!(
            "--max-concurrent must be at most {MAX_CONCURRENT} and --max-slots at most \
             {MAX_SLOTS} (got {} and {asked_slots})",
            args.max_concurrent,
        );
    }
    let device = crate::trainer::config::parse_device(&args.device)?;
    if args.cuda_graphs {
        if !device.is_cuda() {
            bail!("--cuda-graphs replays CUDA kernels: it needs --device cuda (or cuda:N)");
        }
        crate::engine::cuda_graph::available()
            .map_err(|why| anyhow::anyhow!("--cuda-graphs: {why}"))?;
    }
    let (model, tokenizer, default_name) = load(args, device)?;
    eprintln!(
        "skein serve: {default_name}, {:.2}M parameters, {} weights on {}",
        model.net.config.num_parameters() as f64 / 1e6,
        model.options.dtype.name(),
        args.device
    );
    let model_context = model.net.max_positions() as usize;
    if let Some(c) = args.context.filter(|c| !(2..=model_context).contains(c)) {
        bail!("--context {c} must be between 2 and the model's {model_context}");
    }
    let element = model.options.dtype.bytes();
    let free = crate::memory::available_on(device);
    let size = default_size(
        args.max_slots,
        args.context,
        model_context,
        free.map(|f| f * DEFAULT_CACHE_SHARE),
        |slots, context| model.net.config.kv_cache_bytes(slots, context, element),
    );
    if (args.max_slots, args.context) != (Some(size.slots), Some(size.context)) {
        eprintln!(
            "skein serve: {} slots × {} tokens of context, a {:.1} GiB KV cache{} \
             (--max-slots and --context choose)",
            size.slots,
            size.context,
            model
                .net
                .config
                .kv_cache_bytes(size.slots, size.context, element)
                / crate::memory::GIB,
            free.map_or(String::new(), |f| format!(
                " of the {:.1} GiB free",
                f / crate::memory::GIB
            ))
        );
    }
    let CacheSize { slots, context } = size;
    check_cache_fits(&model, slots, context, device)?;
    if tokenizer.eos_token_ids().is_empty() {
        eprintln!(
            "skein serve: the tokenizer names no eos token, so completions end only at max_tokens"
        );
    }
    let vocab = model.net.config.vocab_size;
    let text = TextSide::new(tokenizer, vocab)?;
    let config = ServeConfig {
        api_key: args.api_key.clone(),
        max_concurrent: args.max_concurrent,
        max_body_bytes: args.max_body_bytes,
        model_name: args.name.clone().unwrap_or(default_name),
        default_max_tokens: args.default_max_tokens,
        capacity: context as i64,
        ..ServeConfig::default()
    };
    let (handle, queue) = engine::channel();
    let version = Arc::new(AtomicU64::new(0));
    let mut engine = Engine::new(slots);
    engine.cuda_graphs = args.cuda_graphs;
    let store = Arc::new(serve::RolloutStore::new());
    let state = ServeState::from_parts(handle, text, config, store, version.clone());
    let _engine_thread = serve::spawn_engine_thread(model, engine, queue, context as i64, version)
        .context("starting the engine thread")?;
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(2))
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let addr = format!("{}:{}", args.host, args.port);
    runtime.block_on(async move {
        let server = serve::bind(&addr, state).await?;
        warn_if_open(server.addr(), args.api_key.as_deref());
        eprintln!("skein serve: listening on http://{}", server.addr());
        server.wait().await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of 1 KiB per token and slot.
    fn bytes(slots: usize, context: usize) -> f64 {
        (slots * context * 1024) as f64
    }

    #[test]
    fn default_slots_fit_the_budget_at_the_models_context() {
        // 8192 tokens × 1 KiB = 8 MiB a slot: 20 MiB holds 2 of them.
        let size = default_size(None, None, 8192, Some(20.0 * 1024.0 * 1024.0), bytes);
        assert_eq!(
            size,
            CacheSize {
                slots: 2,
                context: 8192
            }
        );
        // A large budget stops at the default number of slots.
        let size = default_size(None, None, 8192, Some(1e12), bytes);
        assert_eq!(size.slots, DEFAULT_SLOTS);
    }

    #[test]
    fn the_context_shrinks_when_one_slot_does_not_fit() {
        let size = default_size(None, None, 8192, Some(2.0 * 1024.0 * 1024.0), bytes);
        assert_eq!(
            size,
            CacheSize {
                slots: 1,
                context: 2048
            }
        );
        // Four slots asked for: the context that fits four.
        let size = default_size(Some(4), None, 8192, Some(2.0 * 1024.0 * 1024.0), bytes);
        assert_eq!(
            size,
            CacheSize {
                slots: 4,
                context: 512
            }
        );
    }

    #[test]
    fn what_the_user_gave_is_kept() {
        let size = default_size(Some(64), Some(8192), 8192, Some(1024.0), bytes);
        assert_eq!(
            size,
            CacheSize {
                slots: 64,
                context: 8192
            }
        );
        // Unknown free memory: the plain defaults.
        let size = default_size(None, None, 8192, None, bytes);
        assert_eq!(
            size,
            CacheSize {
                slots: 64,
                context: 8192
            }
        );
    }
}
