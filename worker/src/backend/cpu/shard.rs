//! Megatron-style sharding of the CPU backend's weights for tensor parallelism.
//!
//! The split itself (which rows and columns each rank holds) is [`LocalDims`], shared with the
//! CUDA backend; this module holds the CPU backend's communicator handle and slicing helpers. The
//! CPU backend splits the LM head by vocabulary and all-gathers the logits.

use std::ops::Range;

pub(crate) use crate::tp::shard::LocalDims;
use crate::tp::{Communicator, TpShard};

/// A CPU backend's place in a TP group and its link to the other ranks.
pub struct CpuTp {
    pub shard: TpShard,
    pub comm: Box<dyn Communicator>,
}

impl std::fmt::Debug for CpuTp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuTp")
            .field("shard", &self.shard)
            .finish_non_exhaustive()
    }
}

/// Rows `range` of a row-major matrix of `width` columns.
pub(crate) fn rows(m: &[f32], width: usize, range: Range<usize>) -> Vec<f32> {
    m[range.start * width..range.end * width].to_vec()
}

/// Columns `range` of a row-major matrix of `width` columns.
pub(crate) fn cols(m: &[f32], width: usize, range: Range<usize>) -> Vec<f32> {
    m.chunks_exact(width)
        .flat_map(|row| row[range.clone()].iter().copied())
        .collect()
}

/// Scales a head range to element indices.
pub(crate) fn times(r: &Range<usize>, d: usize) -> Range<usize> {
    r.start * d..r.end * d
}

#[cfg(test)]
#[path = "shard_tests.rs"]
mod tests;
