//! Tensor parallelism: the collective-communication trait the sharded backends call, its
//! shared-memory implementation for the ranks of one host, and the step-plan broadcast from rank 0
//! (which owns the one scheduler) to ranks 1..T-1.
//!
//! A TP group of `T` ranks is `T` worker processes. Rank 0 schedules, runs its shard and samples;
//! ranks 1..T-1 mirror the block tables from the plans they receive (see [`plan`]) and run their
//! shard. Within a forward pass the ranks meet in [`Communicator`] collectives: an all-reduce after
//! the row-split `o_proj` and `down_proj`, and an all-gather of the vocabulary-split logits.

pub mod comm;
pub mod follower;
pub mod plan;

pub use comm::{CommError, CommOptions, Communicator, ShmComm};

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
