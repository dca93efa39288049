//! What the benches share: the shape of their random model ([`ModelShape`]) and the check that
//! a count is at least 1 ([`at_least_one`]).

use crate::model::ModelConfig;
use anyhow::Result;

/// Errors naming the first flag whose value is 0.
pub fn at_least_one(flags: &[(&str, usize)]) -> Result<()> {
    match flags.iter().find(|(_, v)| *v == 0) {
        Some((flag, _)) => anyhow::bail!("invalid value for `{flag}`: must be ≥ 1 (got 0)"),
        None => Ok(()),
    }
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
    #[arg(long, default_value_t = 688)]
    pub intermediate: usize,
}

impl ModelShape {
    /// Each size at least 1 and `hidden` a multiple of `heads`.
    pub fn check(&self) -> Result<()> {
        at_least_one(&self.flags())?;
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

    /// The model's configuration, with room for `positions` tokens.
    pub fn config(&self, positions: usize) -> ModelConfig {
        ModelConfig::tiny_qwen2(
            self.vocab,
            self.hidden,
            self.layers,
            self.heads,
            self.heads,
            self.intermediate,
            positions,
        )
    }
}
