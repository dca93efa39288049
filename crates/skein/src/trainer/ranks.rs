//! Data-parallel ranks inside one process. Rank 0 is the policy itself, on the calling thread;
//! each further rank owns a replica of it and runs its rows of a mini-batch on its own OS
//! thread (a `Tensor` may move between threads but not be shared, so every thread holds its
//! own model). When all ranks are done, their gradients are summed into rank 0, rank 0's
//! optimizer takes the one step, and the new weights are copied to every replica.
//!
//! Why one optimizer and a copy rather than N optimizers stepping in lockstep: the copy is
//! exact, so replicas are bit-identical by construction rather than by every rank repeating the
//! same float operations; and there is one set of moments to checkpoint and resume.

use super::microbatch::TrainRow;
use super::update::{PassSums, Plan};
use crate::model::Model;
use anyhow::{bail, Context, Result};
use std::time::Instant;
use tch::Tensor;

/// The model replicas of ranks 1.. (none for dp 1: that path stays on the policy alone).
#[derive(Default)]
pub struct Replicas {
    models: Vec<Model>,
}

/// What the ranks of one mini-batch produced.
pub struct RanksOut {
    /// Sum of the ranks' losses (each already weighted by the mini-batch's global counts).
    pub loss: f64,
    /// Metric sums of each rank, rank 0 first.
    pub sums: Vec<PassSums>,
    /// Slowest rank's compute time minus the fastest's: how long a rank waited to all-reduce.
    pub wait_s: f64,
}

impl Replicas {
    /// `dp_size - 1` copies of `policy`; empty for dp 1.
    pub fn new(policy: &Model, dp_size: usize) -> Result<Self> {
        let mut models = Vec::with_capacity(dp_size.saturating_sub(1));
        for rank in 1..dp_size {
            // The random initialisation is overwritten at once; only the shapes matter.
            let mut m = Model::random(&policy.net.config, policy.vs.device(), 0)
                .with_context(|| format!("building the model replica of rank {rank}"))?;
            m.copy_from(policy)?;
            models.push(m);
        }
        Ok(Replicas { models })
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// Ranks in all: the policy and its replicas.
    pub fn ranks(&self) -> usize {
        self.models.len() + 1
    }

    /// The replicas, for checks (rank 1 first).
    pub fn models(&self) -> &[Model] {
        &self.models
    }

    /// With replicas, every mini-batch of the plan must have exactly one row list per rank.
    pub fn check_plan(&self, plan: &Plan) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        if let Some(mb) = plan.iter().find(|mb| mb.len() != self.ranks()) {
            bail!(
                "a mini-batch is planned over {} ranks but there are {} (trainer.dp_size)",
                mb.len(),
                self.ranks()
            );
        }
        Ok(())
    }

    /// Copies the policy's weights into every replica (exact: replicas stay bit-identical).
    pub fn broadcast(&mut self, policy: &Model) -> Result<()> {
        for m in &mut self.models {
            m.copy_from(policy)?;
        }
        Ok(())
    }

    /// Runs `pass` for every rank of one mini-batch, ranks 1.. on their own threads and rank 0
    /// on this one, then sums all gradients into the policy's. The caller has zeroed the
    /// policy's gradients; the replicas' are zeroed here.
    pub fn run<F>(&mut self, policy: &Model, mini_batch: &[Vec<usize>], pass: F) -> RanksOut
    where
        F: Fn(&Model, &[usize], &mut PassSums) -> f64 + Sync,
    {
        let timed = |model: &Model, rows: &[usize]| {
            let t = Instant::now();
            let mut sums = PassSums::default();
            let loss = pass(model, rows, &mut sums);
            (loss, sums, t.elapsed().as_secs_f64())
        };
        let results: Vec<(f64, PassSums, f64)> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .models
                .iter_mut()
                .zip(&mini_batch[1..])
                .map(|(model, rows)| {
                    let timed = &timed;
                    s.spawn(move || {
                        zero_grads(model);
                        timed(model, rows)
                    })
                })
                .collect();
            let mut out = vec![timed(policy, &mini_batch[0])];
            for h in handles {
                match h.join() {
                    Ok(r) => out.push(r),
                    // A rank that panicked fails the update as it would on one thread.
                    Err(payload) => std::panic::resume_unwind(payload),
                }
            }
            out
        });
        self.all_reduce_into(policy);
        let times = results.iter().map(|r| r.2);
        let slowest = times.clone().fold(0.0, f64::max);
        let fastest = times.fold(f64::INFINITY, f64::min);
        RanksOut {
            loss: results.iter().map(|r| r.0).sum(),
            wait_s: slowest - fastest,
            sums: results.into_iter().map(|r| r.1).collect(),
        }
    }

    /// Adds every replica's gradient to the policy's, rank by rank in a fixed order (so the
    /// result does not depend on which thread finished first).
    fn all_reduce_into(&self, policy: &Model) {
        let params = trainable(policy);
        let replica_params: Vec<_> = self.models.iter().map(trainable).collect();
        tch::no_grad(|| {
            for (k, (name, p)) in params.iter().enumerate() {
                for rp in &replica_params {
                    let (rname, r) = &rp[k];
                    debug_assert_eq!(name, rname);
                    let g = r.grad();
                    if !g.defined() {
                        continue;
                    }
                    let mut own = p.grad();
                    if own.defined() {
                        let _ = own.g_add_(&g);
                    } else {
                        // Rank 0 ran no row touching this parameter: d/dp Σ(p·g) = g gives
                        // it the replica's gradient through autograd's own accumulation.
                        tch::with_grad(|| (p * &g).sum(tch::Kind::Float).backward());
                    }
                }
            }
        });
    }
}

/// Trainable variables by name, sorted: the same order on every replica.
fn trainable(model: &Model) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = model
        .vs
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn zero_grads(model: &Model) {
    for t in model.vs.trainable_variables() {
        let mut g = t.grad();
        if g.defined() {
            let _ = g.detach_().zero_();
        }
    }
}

/// How the plan spread the step's work over ranks (per mini-batch, padding rows included).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Layout {
    pub rows_max: f64,
    pub rows_mean: f64,
    pub tokens_max: f64,
    pub tokens_mean: f64,
    /// Mean over mini-batches of max rank tokens / mean rank tokens: 1.0 is perfect balance.
    pub balance: f64,
}

pub fn layout(rows: &[TrainRow], plan: &Plan) -> Layout {
    let (mut rows_max, mut tokens_max, mut rows_sum, mut tokens_sum) = (0usize, 0usize, 0, 0);
    let (mut ranks, mut balance) = (0usize, 0.0);
    for mb in plan {
        let tokens: Vec<usize> = mb
            .iter()
            .map(|r| r.iter().map(|&i| rows[i].tokens.len()).sum())
            .collect();
        let max = tokens.iter().copied().max().unwrap_or(0);
        let total: usize = tokens.iter().sum();
        balance += if total > 0 {
            max as f64 * tokens.len() as f64 / total as f64
        } else {
            1.0
        };
        rows_max = rows_max.max(mb.iter().map(Vec::len).max().unwrap_or(0));
        rows_sum += mb.iter().map(Vec::len).sum::<usize>();
        tokens_max = tokens_max.max(max);
        tokens_sum += total;
        ranks += mb.len();
    }
    let per = |x: usize| x as f64 / ranks.max(1) as f64;
    Layout {
        rows_max: rows_max as f64,
        rows_mean: per(rows_sum),
        tokens_max: tokens_max as f64,
        tokens_mean: per(tokens_sum),
        balance: if plan.is_empty() {
            1.0
        } else {
            balance / plan.len() as f64
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(len: usize) -> TrainRow {
        TrainRow {
            tokens: vec![1; len],
            prompt_len: 1,
            loss_mask: vec![1; len - 1],
            behavior_logp: vec![0.0; len - 1],
            advantages: vec![0.0; len - 1],
            weight: 0.0,
            ..Default::default()
        }
    }

    #[test]
    fn layout_reports_per_rank_loads_and_balance() {
        let rows = vec![row(6), row(2), row(2), row(4)];
        // One mini-batch: rank 0 has 6 tokens in 1 row, rank 1 has 2 + 2 + 4 = 8 in 3 rows.
        let l = layout(&rows, &vec![vec![vec![0], vec![1, 2, 3]]]);
        assert_eq!((l.rows_max, l.rows_mean), (3.0, 2.0));
        assert_eq!((l.tokens_max, l.tokens_mean), (8.0, 7.0));
        assert!((l.balance - 8.0 / 7.0).abs() < 1e-12);
    }
}
