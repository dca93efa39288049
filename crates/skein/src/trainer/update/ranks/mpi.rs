//! Data-parallel ranks as MPI processes (`mpirun -np N skein train --set
//! trainer.dp_backend=mpi --set trainer.dp_size=N`). Rank 0 runs the whole training loop —
//! rollout, rewards, planning, metrics, checkpoints — and at every update sends the other ranks
//! the step's rows and plan; they hold a copy of the policy (and critic), run their rows of each
//! mini-batch, and take part in four collectives per mini-batch: gradients summed into rank 0
//! (MPI reduce), per-rank loss and timing gathered to rank 0, the [`fingerprint`] of the
//! weights each rank ran its pass with gathered to rank 0 (a mini-batch where one differs
//! from rank 0's fails the update at its end), and rank 0's new weights broadcast back.
//!
//! Commands (models, update, stop) go from rank 0 to each rank point to point; an idle rank
//! polls for the next one with a short sleep instead of blocking in MPI, whose busy wait would
//! take a core from rank 0's rollout.

use super::wire::encode_rows;
use super::{
    check_plan, fingerprint, tensor_bytes, zero_grads, Job, PassSums, Ranks, RanksOut, Replica,
    SyncCheck,
};
use crate::model::{ModelConfig, ModelOptions};
use crate::trainer::batch::RowPlan;
use anyhow::{bail, Context, Result};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tch::{nn, Device, Kind, Tensor};

const COMMAND_TAG: i32 = 17;
/// Elements per MPI call: MPI counts are 32-bit.
const CHUNK: usize = 1 << 28;

/// This process's place in the MPI job.
pub struct MpiGroup {
    world: SimpleCommunicator,
    // Dropped after `world`: dropping the universe finalises MPI.
    _universe: Universe,
    /// This process's rank among the job's processes on its own machine: the GPU it takes.
    local_rank: usize,
    /// The job's processes on this machine: their replicas share its memory.
    local_size: usize,
    /// Rank 0 is inside an update (the other ranks wait in a collective, not for a command).
    in_update: Cell<bool>,
}

/// What rank 0 tells the others; an update's rows follow its header in the same message.
#[derive(Serialize, Deserialize)]
pub enum Command {
    /// The shapes of the models this run trains.
    Models {
        config: Box<ModelConfig>,
        options: ModelOptions,
        critic: bool,
    },
    /// The pass's settings as the update encoded them (see `update::PassKind`).
    Update {
        pass: Vec<u8>,
        plan: RowPlan,
    },
    Stop,
}

impl MpiGroup {
    /// Starts MPI and checks that `mpirun` started `dp_size` processes.
    pub fn start(dp_size: usize) -> Result<Self> {
        let universe = mpi::initialize().context("MPI is already initialised in this process")?;
        let world = universe.world();
        let size = world.size() as usize;
        if size != dp_size {
            bail!(
                "invalid value for `trainer.dp_size`: {dp_size} ranks with trainer.dp_backend = \
                 \"mpi\" need {dp_size} processes, but this job has {size}: launch with \
                 `mpirun -np {dp_size} skein train ...` (or set trainer.dp_size={size})"
            );
        }
        // The processes that share this one's memory (its machine), ordered by world rank.
        let here = world.split_shared(world.rank());
        let (local_rank, local_size) = (here.rank() as usize, here.size() as usize);
        Ok(MpiGroup {
            world,
            _universe: universe,
            local_rank,
            local_size,
            in_update: Cell::new(false),
        })
    }

    pub fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    /// The rank among this machine's processes of the job, whatever order `mpirun` placed
    /// the ranks on machines in: on a machine of GPUs, local rank k takes the k-th.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// How many of the job's processes run on this machine, this one included.
    pub fn local_size(&self) -> usize {
        self.local_size
    }

    pub fn size(&self) -> usize {
        self.world.size() as usize
    }

    /// Ends every process of the job: what a rank other than 0 does when it fails. Rank 0
    /// waits for it inside a collective, and MPI_Finalize waits for rank 0, so returning
    /// would leave the whole job blocked, its error never printed.
    pub fn abort(&self) -> ! {
        self.world.abort(2)
    }

    fn is_root(&self) -> bool {
        self.rank() == 0
    }

    /// Rank 0 tells every other rank the shapes of the models it trains.
    pub fn announce_models(
        &self,
        config: &ModelConfig,
        options: &ModelOptions,
        critic: bool,
    ) -> Result<()> {
        let models = Command::Models {
            config: Box::new(config.clone()),
            options: options.clone(),
            critic,
        };
        self.send_command(&models, &[])
    }

    fn send_command(&self, command: &Command, payload: &[u8]) -> Result<()> {
        let header = serde_json::to_vec(command)?;
        let mut msg = (header.len() as u64).to_le_bytes().to_vec();
        msg.extend_from_slice(&header);
        msg.extend_from_slice(payload);
        for rank in 1..self.size() {
            let to = self.world.process_at_rank(rank as i32);
            to.send_with_tag(&(msg.len() as u64), COMMAND_TAG);
            for chunk in msg.chunks(CHUNK) {
                to.send_with_tag(chunk, COMMAND_TAG);
            }
        }
        Ok(())
    }

    pub fn receive_command(&self) -> Result<(Command, Vec<u8>)> {
        let from = self.world.process_at_rank(0);
        while from.immediate_probe_with_tag(COMMAND_TAG).is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (len, _) = from.receive_with_tag::<u64>(COMMAND_TAG);
        let mut msg = Vec::with_capacity(len as usize);
        while msg.len() < len as usize {
            let (chunk, _) = from.receive_vec_with_tag::<u8>(COMMAND_TAG);
            msg.extend_from_slice(&chunk);
        }
        let header_len = msg
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()) as usize)
            .context("a command from rank 0 is shorter than its header")?;
        let header = msg
            .get(8..8 + header_len)
            .context("a command from rank 0 is shorter than its header")?;
        let command = serde_json::from_slice(header).context("decoding a command from rank 0")?;
        Ok((command, msg[8 + header_len..].to_vec()))
    }

    fn broadcast_bytes(&self, buf: &mut [u8]) {
        let root = self.world.process_at_rank(0);
        for chunk in buf.chunks_mut(CHUNK) {
            root.broadcast_into(chunk);
        }
    }

    /// Every rank gets rank 0's weights, bit for bit: all of them, or (between mini-batches,
    /// where only an optimizer step changed them) the trainable ones, so a frozen LoRA base
    /// crosses once per update.
    fn broadcast_weights(&self, vs: &nn::VarStore, all: bool) {
        let mut vars = if all {
            crate::model::sorted_variables(vs)
        } else {
            crate::model::sorted_trainable(vs)
        };
        let mut buf = if self.is_root() {
            vars.iter().flat_map(|(_, t)| tensor_bytes(t)).collect()
        } else {
            let total = vars
                .iter()
                .map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes())
                .sum();
            vec![0u8; total]
        };
        self.broadcast_bytes(&mut buf);
        if self.is_root() {
            return;
        }
        let mut at = 0;
        tch::no_grad(|| {
            for (_, t) in &mut vars {
                let len = t.numel() * t.kind().elt_size_in_bytes();
                let src = Tensor::from_data_size(&buf[at..at + len], &t.size(), t.kind());
                t.copy_(&src);
                at += len;
            }
        });
    }

    /// Sums every rank's gradients into rank 0's (a parameter no rank touched keeps none).
    fn reduce_grads(&self, vs: &nn::VarStore) {
        let params = crate::model::sorted_trainable(vs);
        let mut send: Vec<f32> = Vec::new();
        let mut touched = Vec::with_capacity(params.len());
        for (_, p) in &params {
            let g = p.grad();
            if g.defined() {
                let flat = g.detach().to_kind(Kind::Float).to_device(Device::Cpu);
                send.extend(Vec::<f32>::try_from(flat.contiguous().view([-1])).unwrap_or_default());
                touched.push(1.0);
            } else {
                send.extend(std::iter::repeat_n(0.0, p.numel()));
                touched.push(0.0);
            }
        }
        send.extend(touched);
        let root = self.world.process_at_rank(0);
        if !self.is_root() {
            for chunk in send.chunks(CHUNK) {
                root.reduce_into(chunk, SystemOperation::sum());
            }
            return;
        }
        let mut sum = vec![0f32; send.len()];
        for (s, r) in send.chunks(CHUNK).zip(sum.chunks_mut(CHUNK)) {
            root.reduce_into_root(s, r, SystemOperation::sum());
        }
        let flags = &sum[sum.len() - params.len()..];
        let mut at = 0;
        tch::no_grad(|| {
            for ((_, p), &flag) in params.iter().zip(flags) {
                let n = p.numel();
                if flag > 0.0 {
                    let g = Tensor::from_slice(&sum[at..at + n])
                        .view(p.size().as_slice())
                        .to_kind(p.kind())
                        .to_device(p.device());
                    let mut own = p.grad();
                    if own.defined() {
                        own.copy_(&g);
                    } else {
                        super::add_grad(p, &g);
                    }
                }
                at += n;
            }
        });
    }

    /// Rank 0 gets every rank's (loss, metric sums, seconds), rank 0 first.
    fn gather_stats(&self, loss: f64, s: &PassSums, secs: f64) -> Vec<(f64, PassSums, f64)> {
        let mine = [
            loss,
            s.tokens,
            s.clipped,
            s.kl,
            s.entropy,
            s.ref_kl,
            s.micro_batches as f64,
            s.computed_tokens,
            secs,
        ];
        let root = self.world.process_at_rank(0);
        if !self.is_root() {
            root.gather_into(&mine[..]);
            return Vec::new();
        }
        let mut all = vec![0f64; mine.len() * self.size()];
        root.gather_into_root(&mine[..], &mut all[..]);
        all.chunks(mine.len())
            .map(|v| {
                let sums = PassSums {
                    tokens: v[1],
                    clipped: v[2],
                    kl: v[3],
                    entropy: v[4],
                    ref_kl: v[5],
                    micro_batches: v[6] as usize,
                    computed_tokens: v[7],
                };
                (v[0], sums, v[8])
            })
            .collect()
    }

    /// Rank 0 gets every rank's weight fingerprint, rank 0 first.
    fn gather_fingerprints(&self, mine: u64) -> Vec<u64> {
        let root = self.world.process_at_rank(0);
        if !self.is_root() {
            root.gather_into(&mine);
            return Vec::new();
        }
        let mut all = vec![0u64; self.size()];
        root.gather_into_root(&mine, &mut all[..]);
        all
    }

    /// A rank other than 0: the part of one update its rows take, in the same order of
    /// collectives as rank 0's [`MpiRanks`].
    pub fn serve_update<M, F>(
        &self,
        model: &M,
        plan: &RowPlan,
        epochs: usize,
        pass: F,
    ) -> Result<()>
    where
        M: Replica,
        F: Fn(&M, &[usize], &mut PassSums) -> f64,
    {
        self.broadcast_weights(model.vars(), true);
        let rank = self.rank();
        for _ in 0..epochs {
            for mini_batch in plan {
                let rows = mini_batch
                    .get(rank)
                    .with_context(|| format!("the plan has no rows for rank {rank}"))?;
                zero_grads(model.vars());
                let t = Instant::now();
                let mut sums = PassSums::default();
                let loss = pass(model, rows, &mut sums);
                let secs = t.elapsed().as_secs_f64();
                self.reduce_grads(model.vars());
                self.gather_stats(loss, &sums, secs);
                self.gather_fingerprints(fingerprint(model.vars()));
                self.broadcast_weights(model.vars(), false);
            }
        }
        Ok(())
    }
}

impl Drop for MpiGroup {
    /// Rank 0 releases the other ranks: a stop command when they wait for one, an abort when
    /// it leaves in the middle of an update (they wait inside a collective that will not come).
    fn drop(&mut self) {
        if !self.is_root() {
            return;
        }
        if self.in_update.get() {
            self.world.abort(1);
        }
        let _ = self.send_command(&Command::Stop, &[]);
    }
}

/// Rank 0's side of the MPI ranks.
pub struct MpiRanks {
    group: Rc<MpiGroup>,
    check: SyncCheck,
}

impl MpiRanks {
    pub fn new(group: Rc<MpiGroup>) -> Self {
        MpiRanks {
            group,
            check: SyncCheck::default(),
        }
    }
}

impl<M: Replica> Ranks<M> for MpiRanks {
    fn size(&self) -> usize {
        self.group.size()
    }

    fn begin(&mut self, model: &M, job: &Job) -> Result<()> {
        check_plan(job.plan, self.group.size())?;
        let update = Command::Update {
            pass: job.pass.clone(),
            plan: job.plan.clone(),
        };
        self.group.send_command(&update, &encode_rows(job.rows))?;
        self.group.in_update.set(true);
        self.check = SyncCheck::default();
        self.group.broadcast_weights(model.vars(), true);
        Ok(())
    }

    fn run<F>(&mut self, model: &M, mini_batch: &[Vec<usize>], pass: F) -> Result<RanksOut>
    where
        F: Fn(&M, &[usize], &mut PassSums) -> f64 + Sync,
    {
        let t = Instant::now();
        let mut sums = PassSums::default();
        let loss = pass(model, &mini_batch[0], &mut sums);
        let secs = t.elapsed().as_secs_f64();
        self.group.reduce_grads(model.vars());
        let stats = self.group.gather_stats(loss, &sums, secs);
        let fingerprints = self.group.gather_fingerprints(fingerprint(model.vars()));
        self.check.record(&fingerprints);
        Ok(RanksOut::from_ranks(stats))
    }

    fn sync(&mut self, model: &M) -> Result<()> {
        self.group.broadcast_weights(model.vars(), false);
        Ok(())
    }

    fn finish(&mut self, _model: &M) -> Result<()> {
        self.group.in_update.set(false);
        self.check.take()
    }
}
