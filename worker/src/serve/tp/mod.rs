//! Tensor parallelism in `ringserve worker`: one rank of a group of `T` worker processes.
//!
//! Rank 0 owns the gateway's rings and the one scheduler: it creates one plan ring per follower
//! (`{group}-plan{r}`) and the communicator segment (`{group}-comm`), builds its shard of the
//! backend, plugs a [`RingPlanSink`] into the engine and runs the ordinary serving loop. Ranks
//! 1..T-1 attach their plan ring and the communicator, build their shard and run
//! [`run_follower`] until rank 0 sends shutdown. Both sides meet in one barrier (a one-float
//! all-reduce) once every follower has claimed its ring, so rank 0 never writes a plan that no
//! consumer can see.
//!
//! The CPU backend's collectives go through the shared-memory communicator. The CUDA backend's go
//! through NCCL (`--tp-collectives nccl`, one GPU per rank) or through host memory
//! (`--tp-collectives host`, ranks may share a GPU); the shared-memory communicator then carries
//! NCCL's unique id and the start-up agreements.
//!
//! KV blocks: every rank must have the same count (block ids come from rank 0's scheduler). When
//! `--num-kv-blocks` is not given, each CPU rank computes [`cpu_default_kv_blocks`] for its shard
//! (it depends only on the model, the block size and `T`, so all ranks agree); CUDA ranks size
//! from their free memory and take the smallest count of the group.

pub mod follower;
pub mod plan;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use thiserror::Error;

use super::launch::{WorkerDevice, WorkerOptions};
use super::{ServeConfig, ServeError, ServeExit, serve};
use crate::backend::cpu::{CpuBackend, CpuOptions, CpuTp};
use crate::backend::{Backend, BackendError, BackendOptions, Device, cpu_default_kv_blocks};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use crate::engine::{Engine, EngineError};
use crate::tp::{CommError, CommOptions, Communicator, ShmComm, TpCollectives, TpShard};
use follower::{FollowerError, RingPlanSink, run_follower};

/// How long rank 0 waits for a follower's plan ring to have room.
const PLAN_PUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// This worker's place in a tensor-parallel group (`ringserve worker --tensor-parallel-size T
/// --rank R --tp-group NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpOptions {
    /// Ranks in the group (`T`); 1 is no tensor parallelism.
    pub world: usize,
    /// This worker's rank; rank 0 schedules and talks to the gateway.
    pub rank: usize,
    /// Prefix of the group's shared-memory segments (needed when `world > 1`).
    pub group: Option<String>,
    /// How CUDA ranks exchange activations (the CPU backend always uses shared memory).
    pub collectives: TpCollectives,
}

impl Default for TpOptions {
    fn default() -> Self {
        Self {
            world: 1,
            rank: 0,
            group: None,
            collectives: TpCollectives::Nccl,
        }
    }
}

/// A tensor-parallel worker cannot start, or stopped with an error.
#[derive(Debug, Error)]
pub enum TpError {
    #[error("--tensor-parallel-size must be at least 1")]
    ZeroSize,
    #[error("--rank {rank} must be below --tensor-parallel-size {world}")]
    RankOutOfRange { rank: usize, world: usize },
    #[error(
        "--tensor-parallel-size {world} with --device null: the null device has nothing to shard \
         (use --tensor-parallel-size 1)"
    )]
    NullDevice { world: usize },
    #[error("--tensor-parallel-size {world} must divide the model's {heads} attention heads")]
    Heads { world: usize, heads: usize },
    #[error(
        "--tensor-parallel-size {world} must divide the model's intermediate size {intermediate}"
    )]
    Intermediate { world: usize, intermediate: usize },
    #[error(
        "--tensor-parallel-size {world} and the model's {kv_heads} KV heads: one must divide the \
         other"
    )]
    KvHeads { world: usize, kv_heads: usize },
    #[error("--tensor-parallel-size {world} needs --tp-group NAME (the group's segment prefix)")]
    MissingGroup { world: usize },
    #[error("--tp-group is only used with --tensor-parallel-size above 1")]
    GroupWithoutTp,
    #[error("--rings PREFIX is required (rank 0 serves the gateway's rings)")]
    MissingRings,
    #[error("--rings is only for rank 0 (rank {rank} receives its work from rank 0)")]
    FollowerRings { rank: usize },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("tensor-parallel communicator: {0}")]
    Comm(#[from] CommError),
    #[error("plan ring {name}: {source}")]
    Ring {
        name: String,
        source: ringbuf::Error,
    },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Open(#[from] crate::open::OpenError),
    #[error("rank {rank}: {source}")]
    Follower { rank: usize, source: FollowerError },
}

impl TpOptions {
    /// Whether this worker is part of a group of more than one rank.
    pub fn is_parallel(&self) -> bool {
        self.world > 1
    }

    /// The shard this worker holds.
    pub fn shard(&self) -> TpShard {
        TpShard {
            rank: self.rank,
            world: self.world,
        }
    }

    /// Checks the flags against each other and the device, before any model is read. `has_rings`:
    /// whether `--rings` was given.
    pub fn check(&self, device: WorkerDevice, has_rings: bool) -> Result<(), TpError> {
        if self.world == 0 {
            return Err(TpError::ZeroSize);
        }
        if self.rank >= self.world {
            return Err(TpError::RankOutOfRange {
                rank: self.rank,
                world: self.world,
            });
        }
        if self.world > 1 {
            if device == WorkerDevice::Null {
                return Err(TpError::NullDevice { world: self.world });
            }
            if self.group.is_none() {
                return Err(TpError::MissingGroup { world: self.world });
            }
        } else if self.group.is_some() {
            return Err(TpError::GroupWithoutTp);
        }
        match (self.rank, has_rings) {
            (0, false) => Err(TpError::MissingRings),
            (0, true) => Ok(()),
            (rank, true) => Err(TpError::FollowerRings { rank }),
            (_, false) => Ok(()),
        }
    }
}

/// Checks that `world` ranks can shard `config` (what [`LocalDims`](crate::tp::LocalDims) requires).
pub fn check_model(world: usize, config: &ModelConfig) -> Result<(), TpError> {
    if world == 0 {
        return Err(TpError::ZeroSize);
    }
    let heads = config.num_attention_heads;
    if !heads.is_multiple_of(world) {
        return Err(TpError::Heads { world, heads });
    }
    let intermediate = config.intermediate_size;
    if !intermediate.is_multiple_of(world) {
        return Err(TpError::Intermediate {
            world,
            intermediate,
        });
    }
    let kv_heads = config.num_key_value_heads;
    if !(kv_heads.is_multiple_of(world) || world.is_multiple_of(kv_heads)) {
        return Err(TpError::KvHeads { world, kv_heads });
    }
    Ok(())
}

/// Name of the plan ring of follower `rank` in `group`.
pub fn plan_ring_name(group: &str, rank: usize) -> String {
    format!("{group}-plan{rank}")
}

/// Name of the communicator segment of `group`.
pub fn comm_name(group: &str) -> String {
    format!("{group}-comm")
}

fn comm_options() -> CommOptions {
    CommOptions::default()
}

/// Waits until every rank is here (a one-float all-reduce).
fn barrier(comm: &mut ShmComm) -> Result<(), CommError> {
    let mut one = [1.0f32];
    comm.all_reduce_sum(&mut one)
}

/// Runs one rank of a tensor-parallel group until the gateway goes away or `stop` is set (rank 0),
/// or until rank 0 sends shutdown (followers, which follow rank 0 and ignore `stop`). Rank 0 dying makes a follower fail with
/// [`ringbuf::Error::PeerDead`] or [`CommError::PeerDead`]; a dead follower makes rank 0's next
/// step fail the same way.
pub fn run_rank(opts: &WorkerOptions, stop: Arc<AtomicBool>) -> Result<ServeExit, TpError> {
    let tp = &opts.tp;
    tp.check(opts.device, opts.rings.is_some())?;
    let group = tp
        .group
        .as_deref()
        .ok_or(TpError::MissingGroup { world: tp.world })?;
    let (config, checkpoint) = Checkpoint::load(&opts.model)?;
    check_model(tp.world, &config)?;
    let device = match opts.device {
        WorkerDevice::Model(d) => d,
        WorkerDevice::Null => return Err(TpError::NullDevice { world: tp.world }),
    };
    let backend_opts = BackendOptions {
        device,
        ..opts.backend.clone()
    };
    if tp.rank == 0 {
        let rings = opts.rings.clone().ok_or(TpError::MissingRings)?;
        let mut producers = Vec::with_capacity(tp.world - 1);
        let mut creators = Vec::with_capacity(tp.world - 1);
        for rank in 1..tp.world {
            let name = plan_ring_name(group, rank);
            let ring_err = |source| TpError::Ring {
                name: name.clone(),
                source,
            };
            let ring = ringbuf::create(&name, opts.ring_capacity).map_err(ring_err)?;
            producers.push(ring.producer().map_err(ring_err)?);
            creators.push(ring);
        }
        let mut comm = ShmComm::create(&comm_name(group), tp.world, comm_options())?;
        barrier(&mut comm)?;
        tracing::info!(group, world = tp.world, "tensor-parallel group joined");
        let backend = shard_backend(&config, &checkpoint, &backend_opts, tp, comm)?;
        let kv_blocks = backend.num_kv_blocks();
        let mut engine = Engine::new(backend, &config, opts.engine.clone())?;
        if let Some(tokenizer) = crate::open::load_tokenizer(&opts.model)? {
            crate::open::enable_grammars(&mut engine, &tokenizer, &config);
        }
        engine.set_plan_sink(Box::new(RingPlanSink::new(producers, PLAN_PUSH_TIMEOUT)));
        // The producers keep the plan rings mapped (and their names linked) while rank 0 lives.
        drop(creators);
        tracing::info!(
            model = %opts.model.display(),
            world = tp.world,
            kv_blocks,
            max_model_len = engine.max_model_len(),
            "rank 0 ready"
        );
        let serve_config = ServeConfig {
            rings,
            ring_capacity: opts.ring_capacity,
            vocab_size: config.vocab_size,
            stop,
            lifecycle: opts.lifecycle.clone(),
        };
        Ok(serve(engine, &serve_config)?)
    } else {
        let mut comm = ShmComm::attach(&comm_name(group), tp.rank, comm_options())?;
        // Every rank has joined, so rank 0 has created the plan rings.
        let name = plan_ring_name(group, tp.rank);
        let ring_err = |source| TpError::Ring {
            name: name.clone(),
            source,
        };
        let ring = ringbuf::attach(&name).map_err(ring_err)?;
        let mut consumer = ring.consumer().map_err(ring_err)?;
        barrier(&mut comm)?;
        let mut backend = shard_backend(&config, &checkpoint, &backend_opts, tp, comm)?;
        tracing::info!(
            group,
            rank = tp.rank,
            kv_blocks = backend.num_kv_blocks(),
            "follower ready"
        );
        let steps = run_follower(&mut consumer, backend.as_mut(), None).map_err(|source| {
            TpError::Follower {
                rank: tp.rank,
                source,
            }
        })?;
        tracing::info!(rank = tp.rank, steps, "rank 0 sent shutdown");
        Ok(ServeExit::Stopped)
    }
}

/// This rank's shard of the backend `opts.device` names, joined to the group through `comm`.
fn shard_backend(
    config: &ModelConfig,
    checkpoint: &Checkpoint,
    opts: &BackendOptions,
    tp: &TpOptions,
    comm: ShmComm,
) -> Result<Box<dyn Backend>, TpError> {
    match opts.device {
        Device::Cpu => {
            let cpu = CpuOptions {
                block_size: opts.block_size,
                num_kv_blocks: opts
                    .num_kv_blocks
                    .unwrap_or_else(|| cpu_default_kv_blocks(config, opts.block_size, tp.shard())),
                quantization: opts.quantization,
                kv_cache_dtype: opts.kv_cache_dtype,
            };
            let tp = CpuTp {
                shard: tp.shard(),
                comm: Box::new(comm),
            };
            Ok(Box::new(CpuBackend::new_sharded(
                config,
                checkpoint,
                cpu,
                Some(tp),
            )?))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => {
            use crate::backend::cuda::{CudaBackend, CudaTp};
            let cuda = crate::backend::cuda_options(opts, ordinal);
            let tp = CudaTp {
                shard: tp.shard(),
                host: Box::new(comm),
                collectives: tp.collectives,
            };
            Ok(Box::new(CudaBackend::new_sharded(
                config,
                checkpoint,
                &cuda,
                Some(tp),
            )?))
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => {
            drop(comm);
            Err(BackendError::NotCompiled("cuda").into())
        }
    }
}

#[cfg(test)]
mod tests;
