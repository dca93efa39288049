//! Sizes a run leaves to skein, fitted to the machine before the first step.
//!
//! `trainer.micro_batch_tokens` defaults to 8192 tokens, which suits the small models skein
//! builds itself. A pretrained model keeps far more per token (SmolLM2-135M: about 1.6 MB of
//! activations in float32 over its 30 layers), so the default would not fit a machine with
//! tens of GiB. When the user left the key at its default and the preflight estimate
//! (`preflight::estimate`) exceeds the free memory, the micro-batch is halved until the run
//! fits, and the choice is said. A micro-batch only splits the update into more
//! forward/backward passes: the loss is the same for any split (promise 4), so this changes
//! time, never a number. A value the user set is kept, and the preflight refuses it with the
//! setting to lower.
//!
//! The fit runs before the dataset is loaded, so it sizes a dataset's rollout slots at the
//! `data.max_prompt_tokens` bound; the preflight after loading sizes them by the longest prompt.
//! A fit can then choose a smaller micro-batch than the run needed: time, not a number. It
//! runs before MPI starts, so it counts an MPI job's ranks on this machine as its launcher
//! reports them ([`ranks_here`]).

use super::config::{DpBackend, TrainConfig};
use super::preflight;
use crate::memory::{available_on, GIB};
use crate::model::ModelConfig;
use std::path::Path;

/// The smallest micro-batch a fit goes down to: below it the passes' overhead dominates, and
/// a run that does not fit there has a larger part to lower first.
pub const SMALLEST_FITTED: usize = 256;

/// What a fit chose.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    pub default_tokens: usize,
    pub tokens: usize,
    /// The estimate with the chosen micro-batch and the free memory, in bytes.
    pub needs: f64,
    pub available: f64,
}

impl std::fmt::Display for Fitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`trainer.micro_batch_tokens` = {}: the default {} does not fit the {:.1} GiB of \
             free memory, {} needs about {:.1} GiB (set the key to choose)",
            self.tokens,
            self.default_tokens,
            self.available / GIB,
            self.tokens,
            self.needs / GIB
        )
    }
}

/// Lowers `cfg.trainer.micro_batch_tokens` until the run's estimate fits the free memory, for
/// a run whose config did not set it (`chosen_by_user` false) and whose model is loaded from
/// `model.path`. Returns what it chose, or None when nothing changed: the key was set, the
/// model is built from scratch (small by construction), the free memory or the model's
/// `config.json` cannot be read (the setup reports that), the run fits already, or no
/// micro-batch down to [`SMALLEST_FITTED`] tokens fits (the preflight then names the part to
/// lower).
pub fn fit_micro_batch(cfg: &mut TrainConfig, chosen_by_user: bool) -> Option<Fitted> {
    if chosen_by_user || cfg.model.path.is_empty() {
        return None;
    }
    let device = super::config::parse_device(&cfg.run.device).ok()?;
    let available = available_on(device)?;
    let model = ModelConfig::from_file(&Path::new(&cfg.model.path).join("config.json")).ok()?;
    fit_to(cfg, &model, device, available)
}

/// The data-parallel ranks on this machine, as far as they are known before an MPI job
/// starts: every thread rank; the processes `mpirun` says it placed here (Open MPI's
/// `OMPI_COMM_WORLD_LOCAL_SIZE`, MPICH's `MPI_LOCALNRANKS`), else this process alone. The
/// preflight after MPI starts counts them from MPI itself.
fn ranks_here(cfg: &TrainConfig) -> usize {
    match cfg.trainer.dp_backend {
        DpBackend::Threads => cfg.trainer.dp_size,
        DpBackend::Mpi => ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
            .iter()
            .find_map(|var| std::env::var(var).ok()?.trim().parse().ok())
            .unwrap_or(1),
    }
}

/// [`fit_micro_batch`] against `available` bytes.
fn fit_to(
    cfg: &mut TrainConfig,
    model: &ModelConfig,
    device: tch::Device,
    available: f64,
) -> Option<Fitted> {
    let default_tokens = cfg.trainer.micro_batch_tokens;
    let ranks = ranks_here(cfg);
    let needs = |tokens: usize| {
        let mut sized = cfg.clone();
        sized.trainer.micro_batch_tokens = tokens;
        preflight::total(&preflight::estimate(&sized, model, device, ranks, None))
    };
    let tokens = largest_fitting(default_tokens, |t| needs(t) <= available)?;
    if tokens == default_tokens {
        return None;
    }
    let needs = needs(tokens);
    cfg.trainer.micro_batch_tokens = tokens;
    Some(Fitted {
        default_tokens,
        tokens,
        needs,
        available,
    })
}

/// The largest of `start`, `start / 2`, … down to [`SMALLEST_FITTED`] that `fits`; None when
/// none does.
pub fn largest_fitting(start: usize, fits: impl Fn(usize) -> bool) -> Option<usize> {
    std::iter::successors(Some(start), |&t| Some(t / 2))
        .take_while(|&t| t == start || t >= SMALLEST_FITTED)
        .find(|&t| fits(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LoraConfig;
    use tch::Device;

    /// SmolLM2-135M's shape: 30 layers of 576, 9 heads over 3 KV heads, a 49,152-token
    /// vocabulary.
    fn smollm2() -> ModelConfig {
        let mut cfg = ModelConfig::tiny_qwen2(49_152, 576, 30, 9, 3, 1536, 8192);
        cfg.model_type = "llama".into();
        cfg
    }

    fn lora_run() -> TrainConfig {
        TrainConfig {
            lora: LoraConfig {
                rank: 16,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// With 12 GiB free, the default micro-batch of a LoRA run on SmolLM2's shape is halved
    /// until the estimate fits, and the estimate with the choice is below the free memory.
    #[test]
    fn the_default_micro_batch_is_halved_until_it_fits() {
        let mut cfg = lora_run();
        let before = preflight::total(&preflight::estimate(&cfg, &smollm2(), Device::Cpu, 1, None));
        let available = 6.0 * GIB;
        assert!(before > available, "{}", before / GIB);
        let fitted = fit_to(&mut cfg, &smollm2(), Device::Cpu, available).expect("a fit");
        assert_eq!(fitted.default_tokens, 8192);
        assert_eq!(cfg.trainer.micro_batch_tokens, fitted.tokens);
        assert!(fitted.tokens < 8192 && fitted.tokens.is_power_of_two());
        assert!(fitted.needs <= available);
        // The next size up would not have fitted: the largest that fits is chosen.
        let mut larger = cfg.clone();
        larger.trainer.micro_batch_tokens = 2 * fitted.tokens;
        let over = preflight::total(&preflight::estimate(
            &larger,
            &smollm2(),
            Device::Cpu,
            1,
            None,
        ));
        assert!(over > available);
        let said = fitted.to_string();
        assert!(said.contains("`trainer.micro_batch_tokens`"), "{said}");
    }

    /// A run that fits, or one that fits at no size, is left as it is.
    #[test]
    fn a_fitting_or_hopeless_run_is_unchanged() {
        let mut cfg = lora_run();
        assert_eq!(fit_to(&mut cfg, &smollm2(), Device::Cpu, 1e12), None);
        assert_eq!(fit_to(&mut cfg, &smollm2(), Device::Cpu, 0.1 * GIB), None);
        assert_eq!(cfg.trainer.micro_batch_tokens, 8192);
    }

    /// A key the user set, or a model built from scratch, is never fitted.
    #[test]
    fn a_chosen_size_or_a_tiny_model_is_never_fitted() {
        let mut cfg = lora_run();
        cfg.model.path = "/nonexistent".into();
        assert_eq!(fit_micro_batch(&mut cfg, true), None);
        let mut tiny = lora_run();
        assert_eq!(fit_micro_batch(&mut tiny, false), None);
    }
}
