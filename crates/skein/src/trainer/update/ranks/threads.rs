//! Ranks as threads of this process (`trainer.dp_backend = "threads"`).

use super::{add_grad, check_plan, fingerprint, rank_device, zero_grads};
use super::{Job, PassSums, Ranks, RanksOut, Replica, SyncCheck};
use anyhow::{Context, Result};
use std::time::Instant;

/// Ranks as threads of this process: rank 0 is the model itself, on the calling thread; each
/// further rank owns a replica and runs on its own OS thread (a `Tensor` may move between
/// threads but not be shared, so every thread holds its own model). With no replicas (dp 1)
/// every rank list of a mini-batch runs on the one model, one after another.
pub struct Replicas<M: Replica> {
    models: Vec<M>,
    check: SyncCheck,
}

impl<M: Replica> Replicas<M> {
    /// `dp_size - 1` copies of `model`, rank k on [`rank_device`]; none for dp 1.
    pub fn new(model: &M, dp_size: usize) -> Result<Self> {
        let base = model.vars().device();
        let mut models = Vec::with_capacity(dp_size.saturating_sub(1));
        for rank in 1..dp_size {
            let mut m = model
                .same_shape(rank_device(base, rank))
                .with_context(|| format!("building the model replica of rank {rank}"))?;
            m.vars_mut().copy(model.vars())?;
            models.push(m);
        }
        Ok(Replicas {
            models,
            check: SyncCheck::default(),
        })
    }

    /// The replicas, for checks (rank 1 first).
    pub fn models(&self) -> &[M] {
        &self.models
    }

    /// Adds every replica's gradient to the model's, rank by rank in a fixed order (so the
    /// result does not depend on which thread finished first).
    fn all_reduce_into(&self, model: &M) {
        let params = crate::model::sorted_trainable(model.vars());
        let replica_params: Vec<_> = self
            .models
            .iter()
            .map(|m| crate::model::sorted_trainable(m.vars()))
            .collect();
        tch::no_grad(|| {
            for (k, (name, p)) in params.iter().enumerate() {
                for rp in &replica_params {
                    let (rname, r) = &rp[k];
                    debug_assert_eq!(name, rname);
                    let g = r.grad();
                    if !g.defined() {
                        continue;
                    }
                    add_grad(p, &g.to_device(p.device()));
                }
            }
        });
    }
}

impl<M: Replica> Ranks<M> for Replicas<M> {
    fn size(&self) -> usize {
        self.models.len() + 1
    }

    fn begin(&mut self, model: &M, job: &Job) -> Result<()> {
        check_plan(job.plan, self.size())?;
        self.check = SyncCheck::default();
        self.sync(model)
    }

    fn run<F>(&mut self, model: &M, mini_batch: &[Vec<usize>], pass: F) -> Result<RanksOut>
    where
        F: Fn(&M, &[usize], &mut PassSums) -> f64 + Sync,
    {
        let timed = |m: &M, lists: &[Vec<usize>]| {
            let t = Instant::now();
            let mut sums = PassSums::default();
            let loss = lists.iter().map(|rows| pass(m, rows, &mut sums)).sum();
            (loss, sums, t.elapsed().as_secs_f64())
        };
        if self.models.is_empty() {
            return Ok(RanksOut::from_ranks(vec![timed(model, mini_batch)]));
        }
        // Each rank fingerprints the weights it computes with, on its own thread.
        let with_fingerprint =
            |m: &M, lists: &[Vec<usize>]| (timed(m, lists), fingerprint(m.vars()));
        let (results, fingerprints): (Vec<_>, Vec<_>) = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .models
                .iter_mut()
                .zip(mini_batch[1..].chunks(1))
                .map(|(m, lists)| {
                    let with_fingerprint = &with_fingerprint;
                    s.spawn(move || {
                        zero_grads(m.vars());
                        with_fingerprint(m, lists)
                    })
                })
                .collect();
            let mut out = vec![with_fingerprint(model, &mini_batch[..1])];
            for h in handles {
                match h.join() {
                    Ok(r) => out.push(r),
                    // A rank that panicked fails the update as it would on one thread.
                    Err(payload) => std::panic::resume_unwind(payload),
                }
            }
            out.into_iter().unzip()
        });
        self.check.record(&fingerprints);
        self.all_reduce_into(model);
        Ok(RanksOut::from_ranks(results))
    }

    /// Copies the trainable weights: only an optimizer step changed anything since `new`.
    fn sync(&mut self, model: &M) -> Result<()> {
        let src = crate::model::sorted_trainable(model.vars());
        tch::no_grad(|| {
            for m in &mut self.models {
                for ((_, mut dst), (_, s)) in crate::model::sorted_trainable(m.vars())
                    .into_iter()
                    .zip(&src)
                {
                    dst.copy_(s);
                }
            }
        });
        Ok(())
    }

    fn finish(&mut self, _model: &M) -> Result<()> {
        self.check.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{sorted_trainable, sorted_variables, LoraConfig, Model, ModelConfig};
    use crate::model::{Dtype, ModelOptions};
    use crate::trainer::update::mini_batch_step;
    use crate::trainer::update::optim::{OptimConfig, Optimizer};
    use tch::{Device, Kind, Tensor};

    /// A policy of the given shape options, with its two-rank replicas and optimizer.
    fn two_ranks(lora_rank: usize) -> (Model, Replicas<Model>, Optimizer) {
        let options = ModelOptions {
            dtype: Dtype::Float32,
            lora: LoraConfig {
                rank: lora_rank,
                ..LoraConfig::default()
            },
        };
        let cfg = ModelConfig::tiny_qwen2(16, 32, 1, 2, 2, 64, 32);
        let model = Model::random_with(&cfg, &options, Device::Cpu, 5).unwrap();
        let replicas = Replicas::new(&model, 2).unwrap();
        let opt = Optimizer::new(&model.vs, &OptimConfig::default(), 10).unwrap();
        (model, replicas, opt)
    }

    /// A loss of the weights alone, scaled by the rank's row count: every rank gets a gradient
    /// at the weights it holds.
    fn pass(m: &Model, rows: &[usize], _: &mut PassSums) -> f64 {
        let loss = sorted_trainable(&m.vs)
            .iter()
            .map(|(_, p)| p.square().sum(Kind::Float))
            .fold(Tensor::from(0f32), |a, b| a + b)
            * rows.len() as f64;
        loss.backward();
        loss.double_value(&[])
    }

    /// `begin`, then two mini-batches over both ranks with `between` run on the replicas after
    /// the first copy, then `finish`.
    fn update(lora_rank: usize, between: impl Fn(&mut [Model])) -> Result<()> {
        let (model, mut ranks, mut opt) = two_ranks(lora_rank);
        let plan = vec![vec![vec![0], vec![1, 2]]; 2];
        let job = Job {
            rows: &[],
            plan: &plan,
            pass: Vec::new(),
        };
        ranks.begin(&model, &job)?;
        between(&mut ranks.models);
        for mini_batch in &plan {
            let (_, step) = mini_batch_step(&model, &mut ranks, &mut opt, mini_batch, pass)?;
            assert!(step.is_some(), "the step was applied");
        }
        ranks.finish(&model)
    }

    /// Adds `delta` to every element of the replica's variable `name`.
    fn perturb(replica: &Model, name: &str, delta: f64) {
        let (_, mut t) = sorted_variables(&replica.vs)
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap();
        tch::no_grad(|| {
            let _ = t.g_add_scalar_(delta);
        });
    }

    #[test]
    fn ranks_that_compute_with_rank_0s_weights_pass_the_check() {
        update(0, |_| {}).unwrap();
        update(4, |_| {}).unwrap();
    }

    #[test]
    fn a_replica_with_other_weights_fails_the_update() {
        let (model, _, _) = two_ranks(0);
        let (name, _) = sorted_trainable(&model.vs).swap_remove(0);
        let err = update(0, |replicas| perturb(&replicas[0], &name, 1e-3)).unwrap_err();
        assert!(
            err.to_string().contains("rank 1 ran mini-batch 1 of 2"),
            "{err}"
        );
    }

    #[test]
    fn a_replica_with_another_frozen_base_fails_the_update() {
        // The copy between mini-batches moves trainable weights only (the adapters here), so a
        // frozen weight that differs stays different for the whole update.
        let (model, _, _) = two_ranks(4);
        let (name, _) = sorted_variables(&model.vs)
            .into_iter()
            .find(|(_, t)| !t.requires_grad())
            .unwrap();
        let err = update(4, |replicas| perturb(&replicas[0], &name, 1e-3)).unwrap_err();
        assert!(
            err.to_string().contains("rank 1 ran mini-batch 1 of 2"),
            "{err}"
        );
    }
}
