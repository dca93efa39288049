//! `skein serve-reward`: the sources of a `[reward]` config (reward models included) behind
//! HTTP, so a trainer's `kind = "remote"` source can score on another process or machine.
//! The config file uses the trainer's keys: `[reward]`, `[reward_models]`, plus `[serve]`.

use crate::trainer::rollout::reward::{build_rewarder, check_reward_models, TASK_SCORER};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use skein_config::Validator;
use skein_reward::{
    serve_with_metrics, BatchScorer, Executor, ExecutorConfig, MetricsSource, RewardConfig,
    RewardError, RewardOutput, RewardRequest, Rewarder, ServeConfig, ServiceConfig, SourceConfig,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct ServeRewardArgs {
    /// A TOML file with `[reward]`, `[reward_models]` and `[serve]` (see --print-config).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one key, e.g. --set reward_models.rm=/models/rm
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Address to listen on; port 0 picks a free port (the URL is printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8700")]
    addr: String,
    /// Print the resolved config as TOML and exit.
    #[arg(long)]
    print_config: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeRewardConfig {
    /// `cpu`, `cuda` or `cuda:N`: where reward models run.
    pub device: String,
    pub reward: RewardConfig,
    /// Reward-model directories by `scorer` source name.
    pub reward_models: BTreeMap<String, String>,
    pub serve: ServeConfig,
}

impl Default for ServeRewardConfig {
    fn default() -> Self {
        ServeRewardConfig {
            device: "cpu".into(),
            reward: RewardConfig::default(),
            reward_models: BTreeMap::new(),
            serve: ServeConfig::default(),
        }
    }
}

/// The whole rewarder as one scorer: a batch of HTTP requests is submitted at once, so the
/// sources' own executors batch across clients.
struct RewarderScorer(Arc<Rewarder>);

impl BatchScorer for RewarderScorer {
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        let pending: Vec<_> = batch.iter().map(|r| self.0.submit(r.clone())).collect();
        pending.into_iter().map(|p| self.0.wait(p)).collect()
    }
}

pub fn run(a: &ServeRewardArgs) -> Result<()> {
    let text = match &a.config {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading config {}", p.display()))?,
        ),
        None => None,
    };
    let source = a
        .config
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "defaults".into());
    let cfg: ServeRewardConfig = skein_config::load(text.as_deref(), &source, &a.overrides)?;
    if a.print_config {
        print!("{}", skein_config::to_toml_string(&cfg));
        return Ok(());
    }
    let mut v = Validator::new();
    check_reward_models(Some(&cfg.reward), &cfg.reward_models, &mut v);
    let task_scorer = cfg.reward.sources.get(TASK_SCORER);
    v.check(
        !matches!(
            task_scorer,
            Some(SourceConfig::Service(ServiceConfig::Scorer {}))
        ),
        &format!("reward.sources.{TASK_SCORER}"),
        "is the task's own checker, which only `skein train` and `skein eval` have (a reward \
         service has no task): use a `math` or `exact_match` source, or a reward model",
        "kind = \"scorer\"",
    );
    if let Err(e) = cfg.reward.validate("reward") {
        for p in e.problems() {
            v.problem(p.clone());
        }
    }
    cfg.serve.validate("serve", &mut v);
    v.finish()?;
    let device = crate::trainer::config::parse_device(&cfg.device)?;
    let rewarder = Arc::new(build_rewarder(
        &cfg.reward,
        &cfg.reward_models,
        None,
        device,
    )?);
    // A pass-through: one thread per HTTP handler, batches cut at once; the real batching is
    // in the sources' executors behind it, so those are the figures `/metrics` gives.
    let front = ExecutorConfig {
        threads: cfg.serve.http_threads,
        max_batch_size: 1024,
        max_batch_tokens: 1 << 40,
        max_wait_ms: 0,
        length_buckets: false,
    };
    let scorer = Arc::new(RewarderScorer(Arc::clone(&rewarder)));
    let executor = Executor::new(scorer, front, "serve", "serve")?;
    let metrics: MetricsSource = Arc::new(move || rewarder.metrics());
    let server = serve_with_metrics(&a.addr, Arc::new(executor), &cfg.serve, metrics)?;
    println!("skein serve-reward: listening on {}", server.score_url());
    eprintln!(
        "skein serve-reward: sources {}; stop with Ctrl-C",
        cfg.reward
            .sources
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    );
    loop {
        std::thread::park();
    }
}
