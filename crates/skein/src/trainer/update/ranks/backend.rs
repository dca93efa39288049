//! A run's data-parallel setup (`trainer.dp_size`, `trainer.dp_backend`): which backend the
//! policy's and critic's updates use, and, in an MPI job, whether this process is rank 0 (the
//! whole training loop) or a rank that only serves updates.

use super::{Job, PassSums, Ranks, RanksOut, Replica, Replicas};
use crate::model::{ModelConfig, ModelOptions};
use crate::trainer::config::{DpBackend, TrainConfig};
use anyhow::Result;

#[cfg(feature = "mpi")]
use super::mpi::{MpiGroup, MpiRanks};
#[cfg(feature = "mpi")]
use std::rc::Rc;

pub enum DataParallel {
    /// Ranks as threads of this process.
    Threads { dp_size: usize },
    /// This process is one rank of an MPI job.
    #[cfg(feature = "mpi")]
    Mpi(Rc<MpiGroup>),
}

impl DataParallel {
    /// Starts MPI for `trainer.dp_backend = "mpi"` (validated: only in builds with MPI).
    pub fn start(cfg: &TrainConfig) -> Result<Self> {
        match cfg.trainer.dp_backend {
            #[cfg(feature = "mpi")]
            DpBackend::Mpi => Ok(DataParallel::Mpi(Rc::new(MpiGroup::start(
                cfg.trainer.dp_size,
            )?))),
            #[cfg(not(feature = "mpi"))]
            DpBackend::Mpi => anyhow::bail!(
                "`trainer.dp_backend` = \"mpi\" needs a skein built with `--features mpi`"
            ),
            DpBackend::Threads => Ok(DataParallel::Threads {
                dp_size: cfg.trainer.dp_size,
            }),
        }
    }

    /// The ranks on this machine, this one included: every thread rank; an MPI job's
    /// processes that `mpirun` placed here.
    pub fn ranks_here(&self) -> usize {
        match self {
            DataParallel::Threads { dp_size } => *dp_size,
            #[cfg(feature = "mpi")]
            DataParallel::Mpi(group) => group.local_size(),
        }
    }

    /// Where an MPI job's processes run, for its first line; nothing for thread ranks.
    pub fn placement(&self) -> Option<String> {
        match self {
            DataParallel::Threads { .. } => None,
            #[cfg(feature = "mpi")]
            DataParallel::Mpi(group) => Some(format!(
                "data-parallel over MPI: {} processes, {} of them on this machine",
                group.size(),
                group.local_size()
            )),
        }
    }

    /// This process's rank (0 runs the training loop).
    pub fn rank(&self) -> usize {
        match self {
            DataParallel::Threads { .. } => 0,
            #[cfg(feature = "mpi")]
            DataParallel::Mpi(group) => group.rank(),
        }
    }

    /// Tells an MPI job's other ranks the shapes of the models this run trains (they build
    /// their copies from it); nothing to do for thread ranks. Once, on rank 0, before the
    /// first update.
    pub fn announce_models(
        &self,
        config: &ModelConfig,
        options: &ModelOptions,
        critic: bool,
    ) -> Result<()> {
        match self {
            DataParallel::Threads { .. } => {
                let _ = (config, options, critic);
                Ok(())
            }
            #[cfg(feature = "mpi")]
            DataParallel::Mpi(group) => group.announce_models(config, options, critic),
        }
    }

    /// The backend for one model's updates (the policy's or the critic's), on rank 0.
    pub fn backend<M: Replica>(&self, model: &M) -> Result<Backend<M>> {
        match self {
            DataParallel::Threads { dp_size } => {
                Ok(Backend::Threads(Replicas::new(model, *dp_size)?))
            }
            #[cfg(feature = "mpi")]
            DataParallel::Mpi(group) => Ok(Backend::Mpi(MpiRanks::new(group.clone()))),
        }
    }
}

/// The data-parallel backend a run's update uses.
pub enum Backend<M: Replica> {
    Threads(Replicas<M>),
    #[cfg(feature = "mpi")]
    Mpi(MpiRanks),
}

impl<M: Replica> Ranks<M> for Backend<M> {
    fn size(&self) -> usize {
        match self {
            Backend::Threads(r) => r.size(),
            #[cfg(feature = "mpi")]
            Backend::Mpi(r) => Ranks::<M>::size(r),
        }
    }

    fn begin(&mut self, model: &M, job: &Job) -> Result<()> {
        match self {
            Backend::Threads(r) => r.begin(model, job),
            #[cfg(feature = "mpi")]
            Backend::Mpi(r) => r.begin(model, job),
        }
    }

    fn run<F>(&mut self, model: &M, mini_batch: &[Vec<usize>], pass: F) -> Result<RanksOut>
    where
        F: Fn(&M, &[usize], &mut PassSums) -> f64 + Sync,
    {
        match self {
            Backend::Threads(r) => r.run(model, mini_batch, pass),
            #[cfg(feature = "mpi")]
            Backend::Mpi(r) => r.run(model, mini_batch, pass),
        }
    }

    fn sync(&mut self, model: &M) -> Result<()> {
        match self {
            Backend::Threads(r) => r.sync(model),
            #[cfg(feature = "mpi")]
            Backend::Mpi(r) => r.sync(model),
        }
    }

    fn finish(&mut self, model: &M) -> Result<()> {
        match self {
            Backend::Threads(r) => r.finish(model),
            #[cfg(feature = "mpi")]
            Backend::Mpi(r) => r.finish(model),
        }
    }
}
