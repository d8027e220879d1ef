//! Tensor parallelism below the backends: how a rank's shard is cut ([`shard`]) and the
//! collective-communication trait the sharded backends call, with its shared-memory
//! implementation for the ranks of one host. The step-plan broadcast from rank 0 (which owns the
//! one scheduler) to ranks 1..T-1 and the followers' loop sit above the engine, with the serving
//! loop, in [`crate::serve::tp`].
//!
//! A TP group of `T` ranks is `T` worker processes. Rank 0 schedules, runs its shard and samples;
//! ranks 1..T-1 mirror the block tables from the plans they receive and run their shard. Within a forward pass the ranks meet in [`Communicator`] collectives: an all-reduce after
//! the row-split `o_proj` and `down_proj`, and an all-gather of the vocabulary-split logits.

pub mod comm;
pub mod shard;

pub use comm::{CommError, CommOptions, Communicator, ShmComm};
pub use shard::{LocalDims, ShardError};

/// This process's place in a tensor-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TpShard {
    /// 0-based rank; rank 0 schedules and samples.
    pub rank: usize,
    /// Number of ranks in the group (`T`).
    pub world: usize,
}

impl TpShard {
    /// The single-process "group".
    pub const SOLO: TpShard = TpShard { rank: 0, world: 1 };

    /// The half-open range `[start, end)` of `n` items (heads, rows, vocabulary ids) this rank owns
    /// when they are split into `world` contiguous equal parts (`n` divisible by `world`).
    pub fn even_range(&self, n: usize) -> std::ops::Range<usize> {
        let per = n / self.world;
        self.rank * per..(self.rank + 1) * per
    }

    /// The range of `n` items this rank owns when split into `world` parts of `ceil(n / world)`
    /// (the last ones shorter, possibly empty): used for the vocabulary, which rarely divides.
    pub fn ceil_range(&self, n: usize) -> std::ops::Range<usize> {
        let per = n.div_ceil(self.world);
        (self.rank * per).min(n)..((self.rank + 1) * per).min(n)
    }
}

/// How the ranks of a CUDA tensor-parallel group exchange activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TpCollectives {
    /// NCCL on the GPUs' stream (one GPU per rank; captured into CUDA graphs).
    #[default]
    Nccl,
    /// Through host memory: copy to the host, sum over the shared-memory [`ShmComm`], copy back.
    /// Slow and never in a CUDA graph, but ranks may share one GPU (for checking a sharded model
    /// on a single device) and nothing beyond the CUDA driver is needed.
    Host,
}

impl std::str::FromStr for TpCollectives {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "nccl" => Ok(Self::Nccl),
            "host" => Ok(Self::Host),
            _ => Err(format!(
                "unknown tensor-parallel collectives `{s}` (nccl or host)"
            )),
        }
    }
}

impl std::fmt::Display for TpCollectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Nccl => "nccl",
            Self::Host => "host",
        })
    }
}

/// Largest value [`all_min`] and [`broadcast_bytes`] carry exactly (integers in f32).
const EXACT_F32_INT: usize = 1 << 24;

/// The smallest of every rank's `value` (values above 2^24 count as 2^24), e.g. the KV blocks
/// each rank's memory allows, so that every rank allocates the same number.
pub fn all_min(comm: &mut dyn Communicator, value: usize) -> Result<usize, CommError> {
    let mine = [value.min(EXACT_F32_INT) as f32];
    let mut all = vec![0.0f32; comm.world_size()];
    comm.all_gather(&mine, &mut all)?;
    Ok(all.iter().map(|&v| v as usize).min().unwrap_or(0))
}

/// Rank 0's `bytes` on every rank (`bytes` has the same length everywhere; other ranks' contents
/// are ignored).
pub fn broadcast_bytes(comm: &mut dyn Communicator, bytes: &mut [u8]) -> Result<(), CommError> {
    let mut data: Vec<f32> = if comm.rank() == 0 {
        bytes.iter().map(|&b| f32::from(b)).collect()
    } else {
        vec![0.0; bytes.len()]
    };
    comm.all_reduce_sum(&mut data)?;
    for (b, v) in bytes.iter_mut().zip(&data) {
        if !(0.0..=255.0).contains(v) || v.fract() != 0.0 {
            return Err(CommError::Invalid(format!(
                "broadcast byte arrived as {v} (ranks out of step?)"
            )));
        }
        *b = *v as u8;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_parse_and_print() {
        for c in [TpCollectives::Nccl, TpCollectives::Host] {
            assert_eq!(c.to_string().parse::<TpCollectives>(), Ok(c));
        }
        assert!("mpi".parse::<TpCollectives>().unwrap_err().contains("mpi"));
    }

    #[test]
    fn min_and_broadcast_across_ranks() {
        let name = ringbuf::unique_name("rs-tpmin");
        let handles: Vec<_> = (0..3usize)
            .map(|rank| {
                let name = name.clone();
                std::thread::spawn(move || {
                    let opts = CommOptions::default();
                    let mut comm = if rank == 0 {
                        ShmComm::create(&name, 3, opts)
                    } else {
                        ShmComm::attach(&name, rank, opts)
                    }
                    .expect("communicator");
                    let min = all_min(&mut comm, [700, 42, 1 << 30][rank]).expect("min");
                    let mut bytes = if rank == 0 {
                        (0..=255u8).collect::<Vec<_>>()
                    } else {
                        vec![7u8; 256]
                    };
                    broadcast_bytes(&mut comm, &mut bytes).expect("broadcast");
                    (min, bytes)
                })
            })
            .collect();
        for h in handles {
            let (min, bytes) = h.join().expect("rank");
            assert_eq!(min, 42);
            assert_eq!(bytes, (0..=255u8).collect::<Vec<_>>());
        }
    }
}
