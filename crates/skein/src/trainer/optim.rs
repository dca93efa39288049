//! AdamW with a learning-rate schedule (linear warm-up, then constant or cosine) and
//! gradient-norm clipping.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use tch::nn::{self, OptimizerConfig};
use tch::Kind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    Constant,
    Cosine,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimConfig {
    pub lr: f64,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub warmup_steps: usize,
    pub schedule: Schedule,
    /// Lowest learning rate of the cosine schedule, as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// Gradients are rescaled to at most this global L2 norm; 0 disables.
    pub grad_clip: f64,
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            lr: 5e-4,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            warmup_steps: 0,
            schedule: Schedule::Constant,
            min_lr_ratio: 0.1,
            grad_clip: 1.0,
        }
    }
}

impl OptimConfig {
    /// Learning rate at optimizer step `step` (0-based) of `total`.
    pub fn lr_at(&self, step: usize, total: usize) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::Cosine => {
                let span = total.saturating_sub(self.warmup_steps).max(1) as f64;
                let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
                let min = self.lr * self.min_lr_ratio;
                min + (self.lr - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

pub struct Optimizer {
    opt: nn::Optimizer,
    vars: Vec<tch::Tensor>,
    cfg: OptimConfig,
    total_steps: usize,
    pub steps_done: usize,
}

pub struct StepStats {
    pub grad_norm: f64,
    pub lr: f64,
}

impl Optimizer {
    pub fn new(vs: &nn::VarStore, cfg: &OptimConfig, total_steps: usize) -> Result<Self> {
        let opt = nn::AdamW {
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            wd: cfg.weight_decay,
            eps: cfg.eps,
            amsgrad: false,
        }
        .build(vs, cfg.lr)?;
        Ok(Optimizer {
            opt,
            vars: vs.trainable_variables(),
            cfg: cfg.clone(),
            total_steps,
            steps_done: 0,
        })
    }

    pub fn zero_grad(&mut self) {
        self.opt.zero_grad();
    }

    /// Clips the accumulated gradients, applies one update, and advances the schedule.
    pub fn step(&mut self) -> StepStats {
        let grad_norm = tch::no_grad(|| {
            // One device-to-host read for the whole norm, not one per parameter.
            let squares: Vec<tch::Tensor> = self
                .vars
                .iter()
                .map(|v| v.grad())
                .filter(|g| g.defined())
                .map(|g| g.to_kind(Kind::Float).square().sum(Kind::Float))
                .collect();
            let sq = if squares.is_empty() {
                0.0
            } else {
                tch::Tensor::stack(&squares, 0)
                    .sum(Kind::Double)
                    .double_value(&[])
            };
            let norm = sq.sqrt();
            if self.cfg.grad_clip > 0.0 && norm > self.cfg.grad_clip {
                let scale = self.cfg.grad_clip / (norm + 1e-6);
                for v in &self.vars {
                    let mut g = v.grad();
                    if g.defined() {
                        let _ = g.g_mul_scalar_(scale);
                    }
                }
            }
            norm
        });
        let lr = self.cfg.lr_at(self.steps_done, self.total_steps);
        self.opt.set_lr(lr);
        self.opt.step();
        self.steps_done += 1;
        StepStats { grad_norm, lr }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_decays_to_the_floor() {
        let cfg = OptimConfig {
            lr: 1.0,
            warmup_steps: 4,
            schedule: Schedule::Cosine,
            min_lr_ratio: 0.1,
            ..Default::default()
        };
        assert!((cfg.lr_at(0, 14) - 0.25).abs() < 1e-12);
        assert!((cfg.lr_at(3, 14) - 1.0).abs() < 1e-12);
        assert!((cfg.lr_at(4, 14) - 1.0).abs() < 1e-12);
        assert!((cfg.lr_at(14, 14) - 0.1).abs() < 1e-12);
        assert!(cfg.lr_at(9, 14) < 1.0 && cfg.lr_at(9, 14) > 0.1);
    }
}
