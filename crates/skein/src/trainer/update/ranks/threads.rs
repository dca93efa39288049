//! Ranks as threads of this process (`trainer.dp_backend = "threads"`).

use super::{add_grad, check_plan, fingerprint, rank_device, zero_grads};
use super::{Job, PassSums, Ranks, RanksOut, Replica};
use anyhow::{bail, Context, Result};
use std::time::Instant;

/// Ranks as threads of this process: rank 0 is the model itself, on the calling thread; each
/// further rank owns a replica and runs on its own OS thread (a `Tensor` may move between
/// threads but not be shared, so every thread holds its own model). With no replicas (dp 1)
/// every rank list of a mini-batch runs on the one model, one after another.
pub struct Replicas<M: Replica> {
    models: Vec<M>,
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
        Ok(Replicas { models })
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
        let results = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .models
                .iter_mut()
                .zip(mini_batch[1..].chunks(1))
                .map(|(m, lists)| {
                    let timed = &timed;
                    s.spawn(move || {
                        zero_grads(m.vars());
                        timed(m, lists)
                    })
                })
                .collect();
            let mut out = vec![timed(model, &mini_batch[..1])];
            for h in handles {
                match h.join() {
                    Ok(r) => out.push(r),
                    // A rank that panicked fails the update as it would on one thread.
                    Err(payload) => std::panic::resume_unwind(payload),
                }
            }
            out
        });
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

    fn finish(&mut self, model: &M) -> Result<()> {
        let want = fingerprint(model.vars());
        for (k, m) in self.models.iter().enumerate() {
            if fingerprint(m.vars()) != want {
                bail!(
                    "rank {}'s weights differ from rank 0's after the update",
                    k + 1
                );
            }
        }
        Ok(())
    }
}
