//! Data-parallel ranks. A backend ([`Ranks`]) runs every rank's rows of a planned mini-batch,
//! sums the ranks' gradients into rank 0's model, and after rank 0's optimizer step gives every
//! rank the new weights. Two backends: [`threads::Replicas`], ranks as threads of this process
//! (each holding its own copy of the model), and, with the `mpi` feature, ranks as MPI
//! processes (`mpi.rs`, rows sent with `wire.rs`); `backend.rs` picks one for a run. The same
//! code drives the policy and the critic ([`Replica`]). Nothing here knows what a pass
//! computes: the update hands it a closure (and, for other processes, the pass's settings as
//! bytes).
//!
//! Why one optimizer and a copy rather than N optimizers stepping in lockstep: the copy is
//! exact, so replicas are bit-identical by construction rather than by every rank repeating the
//! same float operations (which would not hold across different machines); and there is one
//! set of moments to checkpoint and resume. What the copy does not prove is that each rank
//! computed its gradients with the weights rank 0 has (a variable the copy misses, a broadcast
//! that delivers other bytes, a replica written between copies): so for every mini-batch each
//! rank [`fingerprint`]s the weights it ran its pass with, rank 0 compares them
//! ([`SyncCheck`]), and [`Ranks::finish`] fails the update when any differed.

pub mod backend;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod threads;
#[cfg(any(feature = "mpi", test))]
pub mod wire;

pub use backend::{Backend, DataParallel};
pub use threads::Replicas;

use crate::model::{Model, ValueModel};
use crate::trainer::batch::{RowPlan, TrainRow};
use anyhow::{bail, Result};
use tch::{nn, Device, Kind, Tensor};

/// A model data-parallel ranks hold copies of: the policy or the critic.
pub trait Replica: Sized + Send {
    fn vars(&self) -> &nn::VarStore;
    fn vars_mut(&mut self) -> &mut nn::VarStore;
    /// A model of the same shape on `device`; its weights are copied in afterwards.
    fn same_shape(&self, device: Device) -> Result<Self>;
}

impl Replica for Model {
    fn vars(&self) -> &nn::VarStore {
        &self.vs
    }
    fn vars_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }
    fn same_shape(&self, device: Device) -> Result<Self> {
        Model::random_with(&self.net.config, &self.replica_options(), device, 0)
    }
}

impl Replica for ValueModel {
    fn vars(&self) -> &nn::VarStore {
        &self.vs
    }
    fn vars_mut(&mut self) -> &mut nn::VarStore {
        &mut self.vs
    }
    fn same_shape(&self, device: Device) -> Result<Self> {
        ValueModel::new(&self.net.config, device)
    }
}

/// What the other ranks need to run their part of one update: the step's rows, the plan, and
/// which pass to run on them (its settings, encoded by the update).
pub struct Job<'a> {
    pub rows: &'a [TrainRow],
    pub plan: &'a RowPlan,
    pub pass: Vec<u8>,
}

/// Metric sums over masked tokens that a rank's pass accumulates, micro-batch by micro-batch.
#[derive(Debug, Default, Clone)]
pub struct PassSums {
    pub tokens: f64,
    pub clipped: f64,
    pub kl: f64,
    pub entropy: f64,
    pub ref_kl: f64,
    pub micro_batches: usize,
    /// Token slots the forwards computed (padding and prompts included).
    pub computed_tokens: f64,
}

impl PassSums {
    pub fn add(&mut self, o: &PassSums) {
        self.tokens += o.tokens;
        self.clipped += o.clipped;
        self.kl += o.kl;
        self.entropy += o.entropy;
        self.ref_kl += o.ref_kl;
        self.micro_batches += o.micro_batches;
        self.computed_tokens += o.computed_tokens;
    }
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

impl RanksOut {
    /// From each rank's (loss, sums, seconds), rank 0 first.
    pub fn from_ranks(results: Vec<(f64, PassSums, f64)>) -> Self {
        let times = results.iter().map(|r| r.2);
        let slowest = times.clone().fold(0.0, f64::max);
        let fastest = times.fold(f64::INFINITY, f64::min);
        RanksOut {
            loss: results.iter().map(|r| r.0).sum(),
            wait_s: slowest - fastest,
            sums: results.into_iter().map(|r| r.1).collect(),
        }
    }
}

/// A data-parallel backend. The update calls, in order: `begin`, then per mini-batch `run`
/// (gradients of all ranks summed into `model`'s) and `sync` (after the optimizer step, applied
/// or not), and `finish`.
pub trait Ranks<M: Replica> {
    /// Ranks in all; 1 is the single-model path.
    fn size(&self) -> usize;
    fn begin(&mut self, model: &M, job: &Job) -> Result<()>;
    /// Runs `pass` for every rank's rows of `mini_batch`. The caller has zeroed `model`'s
    /// gradients.
    fn run<F>(&mut self, model: &M, mini_batch: &[Vec<usize>], pass: F) -> Result<RanksOut>
    where
        F: Fn(&M, &[usize], &mut PassSums) -> f64 + Sync;
    /// Gives every rank `model`'s weights.
    fn sync(&mut self, model: &M) -> Result<()>;
    /// Ends the update: fails when a rank ran a mini-batch's pass with weights whose
    /// [`fingerprint`] differed from rank 0's.
    fn finish(&mut self, model: &M) -> Result<()>;
}

/// The ranks' weight fingerprints over one update's mini-batches: the first mini-batch in
/// which a rank's differed from rank 0's.
#[derive(Debug, Default)]
pub struct SyncCheck {
    mini_batches: usize,
    /// (rank, 1-based mini-batch of the update).
    first_divergence: Option<(usize, usize)>,
}

impl SyncCheck {
    /// Records one mini-batch's fingerprints, rank 0 first.
    pub fn record(&mut self, fingerprints: &[u64]) {
        self.mini_batches += 1;
        if self.first_divergence.is_some() {
            return;
        }
        if let Some((&root, others)) = fingerprints.split_first() {
            if let Some(k) = others.iter().position(|&f| f != root) {
                self.first_divergence = Some((k + 1, self.mini_batches));
            }
        }
    }

    /// The update's verdict; the check starts over for the next update.
    pub fn take(&mut self) -> Result<()> {
        let checked = std::mem::take(self);
        if let Some((rank, mini_batch)) = checked.first_divergence {
            bail!(
                "rank {rank} ran mini-batch {mini_batch} of {} of the update with weights that \
                 differ from rank 0's: the replicas have diverged",
                checked.mini_batches
            );
        }
        Ok(())
    }
}

/// With more than one rank, every mini-batch of the plan must have exactly one row list per
/// rank.
pub fn check_plan(plan: &RowPlan, ranks: usize) -> Result<()> {
    if ranks == 1 {
        return Ok(());
    }
    if let Some(mb) = plan.iter().find(|mb| mb.len() != ranks) {
        bail!(
            "a mini-batch is planned over {} ranks but there are {ranks} (trainer.dp_size)",
            mb.len(),
        );
    }
    Ok(())
}

/// The device of rank `rank` when rank 0 is on `base`: on a machine with several GPUs, rank k
/// takes the k-th one after rank 0's (wrapping around); otherwise every rank shares `base`.
pub fn rank_device(base: Device, rank: usize) -> Device {
    match base {
        Device::Cuda(first) => {
            let count = tch::Cuda::device_count().max(0) as usize;
            if count > 1 {
                Device::Cuda((first + rank) % count)
            } else {
                base
            }
        }
        other => other,
    }
}

/// How many of ranks 1..`dp_size` [`rank_device`] places on rank 0's device `base`: every one
/// on the CPU or a machine's only GPU, those that wrap around onto it where a machine has
/// fewer GPUs than ranks.
pub fn ranks_sharing(base: Device, dp_size: usize) -> usize {
    (1..dp_size)
        .filter(|&rank| rank_device(base, rank) == base)
        .count()
}

/// Adds `g` to `p`'s gradient, creating it when `p` has none yet.
pub fn add_grad(p: &Tensor, g: &Tensor) {
    let mut own = p.grad();
    if own.defined() {
        let _ = own.g_add_(g);
    } else {
        // d/dp Σ(p·g) = g: autograd's own accumulation creates the gradient.
        tch::with_grad(|| (p * g).sum(tch::Kind::Float).backward());
    }
}

pub fn zero_grads(vs: &nn::VarStore) {
    for t in vs.trainable_variables() {
        let mut g = t.grad();
        if g.defined() {
            let _ = g.detach_().zero_();
        }
    }
}

/// Elements of each variable that [`fingerprint`] reads.
const FINGERPRINT_SAMPLES: i64 = 64;

/// A cheap fingerprint of every variable (frozen ones too), in name order: per variable the
/// integer sum of the bit patterns of [`FINGERPRINT_SAMPLES`] evenly strided elements, summed
/// on the variable's device, then all sums read back at once and hashed with the names.
/// Summing bits rather than values makes it exact and independent of summation order and
/// device. Weights that differ by an optimizer step or a lost copy differ in nearly every
/// element, so in the fingerprint; a change confined to unsampled elements goes unseen, which
/// makes this a check that ranks compute with the same weights, not a checksum of them.
pub fn fingerprint(vs: &nn::VarStore) -> u64 {
    let vars = crate::model::sorted_variables(vs);
    let sums: Vec<Tensor> = tch::no_grad(|| {
        vars.iter()
            .map(|(_, t)| sampled_bits_sum(t).to_device(Device::Cpu))
            .collect()
    });
    let mut values = vec![0i64; sums.len()];
    if !sums.is_empty() {
        Tensor::stack(&sums, 0).copy_data(&mut values, sums.len());
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for ((name, _), v) in vars.iter().zip(values) {
        for b in name.bytes().chain(v.to_le_bytes()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The sum, as an int64 scalar, of the bit patterns of `t`'s sampled elements.
fn sampled_bits_sum(t: &Tensor) -> Tensor {
    let flat = t.detach().reshape([-1]);
    let n = flat.numel() as i64;
    let bits = match t.kind().elt_size_in_bytes() {
        1 => Kind::Int8,
        2 => Kind::Int16,
        4 => Kind::Int,
        _ => Kind::Int64,
    };
    flat.slice(0, 0, n, (n / FINGERPRINT_SAMPLES).max(1))
        .view_dtype(bits)
        .sum(Kind::Int64)
}

/// A tensor's elements as bytes, in its own kind, row-major.
pub fn tensor_bytes(t: &Tensor) -> Vec<u8> {
    let t = t.detach().to_device(Device::Cpu).contiguous();
    let numel = t.numel();
    let mut out = vec![0u8; numel * t.kind().elt_size_in_bytes()];
    t.copy_data_u8(&mut out, numel);
    out
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

impl Layout {
    /// The step's `dp/*` metrics, with `wait_s` the ranks' summed wait at the all-reduce.
    pub fn metrics(&self, wait_s: f64) -> [(&'static str, f64); 6] {
        [
            ("dp/rows_per_rank_max", self.rows_max),
            ("dp/rows_per_rank_mean", self.rows_mean),
            ("dp/tokens_per_rank_max", self.tokens_max),
            ("dp/tokens_per_rank_mean", self.tokens_mean),
            ("dp/balance", self.balance),
            ("dp/allreduce_wait_s", wait_s),
        ]
    }
}

pub fn layout(rows: &[TrainRow], plan: &RowPlan) -> Layout {
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
            loss_weight: 0.0,
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
