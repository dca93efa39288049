//! What the benches share: the shape of their random model ([`ModelShape`]), where and in
//! which precision it runs ([`Placement`]), the check that a count is at least 1
//! ([`at_least_one`]), the refusal of a `--set` the command would overwrite
//! ([`refuse_owned_keys`]), the median of timed runs ([`median`]), and the check that a
//! compared training run ran whole ([`whole_run`]).

use crate::model::{Dtype, LoraConfig, Model, ModelConfig, ModelOptions};
use anyhow::Result;
use tch::Device;

/// The median of timed runs: with an even count, the mean of the middle two, as Python's
/// `statistics.median` takes it, so the ratio against a Python reference compares the same
/// statistic. NaN for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A bench's training run, refused when a Ctrl-C cut it short: its figures would be compared
/// with whole runs' (and its "after" evaluation never ran), so the bench stops there.
pub fn whole_run(
    summary: crate::trainer::run::RunSummary,
    bench: &str,
    name: &str,
) -> Result<crate::trainer::run::RunSummary> {
    if summary.interrupted {
        anyhow::bail!(
            "{bench}: the {name} run was interrupted (its checkpoint is in {}), so no figures \
             are reported: a cut run would be compared with whole ones. Run the bench again \
             with --overwrite",
            summary.dir.display()
        );
    }
    Ok(summary)
}

/// Errors naming the first flag whose value is 0.
pub fn at_least_one(flags: &[(&str, usize)]) -> Result<()> {
    match flags.iter().find(|(_, v)| *v == 0) {
        Some((flag, _)) => anyhow::bail!("invalid value for `{flag}`: must be ≥ 1 (got 0)"),
        None => Ok(()),
    }
}

/// Refuses a `--set` of a key the command sets itself (or of a key under it, or of a section
/// above it with an inline table that sets it: `trainer={steps=5}`), which would otherwise
/// change the command's own setting without a word; `owned` pairs each key with the flag to
/// use. An override that does not parse is left for the config's loading to report.
pub fn refuse_owned_keys(
    command: &str,
    overrides: &[String],
    owned: &[(&str, &str)],
) -> Result<()> {
    for set in overrides {
        let Ok(o) = skein_config::Override::parse(set) else {
            continue;
        };
        let hit = owned.iter().find(|(k, _)| sets_key(&o, k));
        if let Some((k, flag)) = hit {
            anyhow::bail!("`--set {set}`: {command} sets `{k}` itself; use {flag} instead");
        }
    }
    Ok(())
}

/// Whether applying `o` sets `key` or a key under it.
fn sets_key(o: &skein_config::Override, key: &str) -> bool {
    let under = |a: &str, b: &str| a.strip_prefix(b).is_some_and(|r| r.starts_with('.'));
    if o.key == key || under(&o.key, key) {
        return true;
    }
    // A section above the key, set with an inline table: does the table reach down to it?
    let Some(rest) = key.strip_prefix(&o.key).and_then(|r| r.strip_prefix('.')) else {
        return false;
    };
    let mut value = &o.value;
    for part in rest.split('.') {
        match value.as_table().and_then(|t| t.get(part)) {
            Some(inner) => value = inner,
            None => return false,
        }
    }
    true
}

/// The shape of a benchmark's random Qwen2-layout model.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelShape {
    #[arg(long, default_value_t = 512)]
    pub vocab: usize,
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Key/value heads (grouped-query attention); 0: as many as `--heads`.
    #[arg(long, default_value_t = 0)]
    pub kv_heads: usize,
    #[arg(long, default_value_t = 688)]
    pub intermediate: usize,
}

impl ModelShape {
    /// Each size at least 1 and `hidden` a multiple of `heads`.
    pub fn check(&self) -> Result<()> {
        at_least_one(&self.flags())?;
        if self.kv_heads > 0 && !self.heads.is_multiple_of(self.kv_heads) {
            anyhow::bail!(
                "invalid value for `--kv-heads`: must divide --heads ({}; got {})",
                self.heads,
                self.kv_heads
            );
        }
        if !self.hidden.is_multiple_of(self.heads) {
            anyhow::bail!(
                "invalid value for `--hidden`: must be a multiple of --heads ({}; got {})",
                self.heads,
                self.hidden
            );
        }
        Ok(())
    }

    /// The flags and their values (to check them, or to pass them on).
    pub fn flags(&self) -> [(&'static str, usize); 5] {
        [
            ("--vocab", self.vocab),
            ("--hidden", self.hidden),
            ("--layers", self.layers),
            ("--heads", self.heads),
            ("--intermediate", self.intermediate),
        ]
    }

    /// Every flag as command-line arguments, `--kv-heads` too (to pass them on).
    pub fn args(&self) -> Vec<String> {
        let mut flags = self.flags().to_vec();
        flags.push(("--kv-heads", self.kv_heads));
        flags
            .into_iter()
            .flat_map(|(f, v)| [f.to_string(), v.to_string()])
            .collect()
    }

    /// The model's configuration, with room for `positions` tokens.
    pub fn config(&self, positions: usize) -> ModelConfig {
        ModelConfig::tiny_qwen2(
            self.vocab,
            self.hidden,
            self.layers,
            self.heads,
            if self.kv_heads == 0 {
                self.heads
            } else {
                self.kv_heads
            },
            self.intermediate,
            positions,
        )
    }
}

/// Where a bench's model runs and in which precision: `--device`, `--dtype` and `--lora-rank`,
/// checked as training checks them.
#[derive(clap::Args, Debug, Clone)]
pub struct Placement {
    /// `cpu`, `cuda` or `cuda:N` (`skein devices` lists what this machine has).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The weights' and the forward's dtype.
    #[arg(long, value_enum, default_value_t = BenchDtype::Float32)]
    pub dtype: BenchDtype,
    /// LoRA adapters of this rank on every projection; 0 trains every weight (below float32,
    /// through the optimizer's float32 master copies).
    #[arg(long, default_value_t = 0)]
    pub lora_rank: usize,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchDtype {
    Float32,
    Bfloat16,
    Float16,
}

impl Placement {
    pub fn options(&self) -> ModelOptions {
        ModelOptions {
            dtype: match self.dtype {
                BenchDtype::Float32 => Dtype::Float32,
                BenchDtype::Bfloat16 => Dtype::Bfloat16,
                BenchDtype::Float16 => Dtype::Float16,
            },
            lora: LoraConfig {
                rank: self.lora_rank,
                ..Default::default()
            },
        }
    }

    /// The device, refused with its reason when this machine lacks it, and the options
    /// checked as training checks them.
    pub fn start(&self) -> Result<Device> {
        let device = crate::trainer::config::parse_device(&self.device)
            .map_err(|e| anyhow::anyhow!("{e:#}").context("--device"))?;
        self.options().check(device)?;
        Ok(device)
    }

    /// A random model of `cfg` on this placement.
    pub fn model(&self, cfg: &ModelConfig, seed: i64) -> Result<Model> {
        Model::random_with(cfg, &self.options(), self.start()?, seed)
    }

    /// The flags as command-line arguments (to pass them on).
    pub fn args(&self) -> Vec<String> {
        [
            ("--device", self.device.clone()),
            ("--dtype", self.options().dtype.name().to_string()),
            ("--lora-rank", self.lora_rank.to_string()),
        ]
        .into_iter()
        .flat_map(|(f, v)| [f.to_string(), v])
        .collect()
    }

    /// A line saying where the bench runs.
    pub fn describe(&self, device: Device) -> String {
        let lora = match (self.lora_rank, self.dtype) {
            (0, BenchDtype::Float32) => "full".to_string(),
            (0, _) => "full, float32 master weights".to_string(),
            (r, _) => format!("LoRA {r}"),
        };
        format!(
            "{} weights, {lora}, on {}",
            self.options().dtype.name(),
            crate::devices::describe(device)
        )
    }
}

/// Waits for the GPU's queued work (a no-op on the CPU), so a timer read after it covers it.
pub fn synchronize(device: Device) {
    if let Device::Cuda(n) = device {
        tch::Cuda::synchronize(n as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::{median, refuse_owned_keys};

    /// A key the bench sets is refused however it is spelled: itself, a key under it, or an
    /// inline table of a section above it that sets it; other keys of that section pass.
    #[test]
    fn an_owned_key_is_refused_however_it_is_spelled() {
        let owned = [("trainer.steps", "--steps"), ("task", "--task")];
        let refused = |set: &str| refuse_owned_keys("bench", &[set.to_string()], &owned).is_err();
        for set in [
            "trainer.steps=5",
            "trainer={steps=5}",
            "task.name=guess",
            "task={name=\"guess\"}",
        ] {
            assert!(refused(set), "{set}");
        }
        for set in [
            "trainer={ppo_epochs=2}",
            "trainer.ppo_epochs=2",
            "trainer_x=1",
        ] {
            assert!(!refused(set), "{set}");
        }
    }

    /// An even count takes the mean of the middle two, as the Python references do: the
    /// upper one made `--iters 2` report skein's slower step against eager's mean.
    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0]), 2.5);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
    }
}
