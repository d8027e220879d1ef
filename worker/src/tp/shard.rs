//! What one rank of a tensor-parallel group holds: the Megatron split every sharded backend uses.
//!
//! | weight | split | after |
//! | --- | --- | --- |
//! | `q_proj` (+bias) | output rows by query head | — |
//! | `k_proj`, `v_proj` (+bias) | output rows by KV head; replicated when `T > num_kv_heads` | — |
//! | `o_proj` | input columns by query head | all-reduce |
//! | `gate_proj`, `up_proj` | output rows by intermediate slice | — |
//! | `down_proj` | input columns by intermediate slice | all-reduce |
//! | embedding, norms | replicated | — |
//! | `lm_head` (or tied embedding) | CPU: rows by vocabulary slice (`ceil(V/T)`), all-gather; CUDA: replicated, rank 0 only | — |
//!
//! KV heads follow vLLM: with `T ≤ K` each rank owns `K/T` of them; with `T > K` (`T` a multiple of
//! `K`) each KV head is replicated on `T/K` ranks, rank `r` holding head `r / (T/K)`, which is the
//! head every one of its `H/T` query heads attends with.

use std::ops::Range;

use thiserror::Error;

use crate::config::ModelConfig;
use crate::tp::TpShard;

/// Why a model cannot be split over a tensor-parallel group of this size.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShardError {
    /// The rank is outside the group (or the group is empty).
    #[error("tensor-parallel rank {rank} of {world}")]
    BadRank { rank: usize, world: usize },
    /// The group size does not divide the query heads or the MLP width.
    #[error(
        "tensor-parallel size {world} must divide num_attention_heads ({heads}) and intermediate_size ({inter})"
    )]
    Indivisible {
        world: usize,
        heads: usize,
        inter: usize,
    },
    /// Neither the group size nor the KV head count divides the other.
    #[error(
        "tensor-parallel size {world} and num_key_value_heads {kv_heads}: one must divide the other"
    )]
    KvHeads { world: usize, kv_heads: usize },
}

/// The sizes this rank computes with, and the ranges of the full model it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalDims {
    pub heads: usize,
    pub kv_heads: usize,
    pub q_dim: usize,
    pub kv_dim: usize,
    pub inter: usize,
    /// Query heads owned (global indices).
    pub head_range: Range<usize>,
    /// KV heads owned (global indices).
    pub kv_range: Range<usize>,
    pub inter_range: Range<usize>,
    /// Vocabulary rows of the LM head owned.
    pub vocab_range: Range<usize>,
    /// Vocabulary rows per rank in the all-gather (`ceil(V/T)`).
    pub vocab_per_rank: usize,
}

impl LocalDims {
    /// Checks that `config` can be split over `shard.world` ranks and returns this rank's share.
    pub fn new(config: &ModelConfig, shard: TpShard) -> Result<Self, ShardError> {
        let (h, k, t) = (
            config.num_attention_heads,
            config.num_key_value_heads,
            shard.world,
        );
        let inter = config.intermediate_size;
        if t == 0 || shard.rank >= t {
            return Err(ShardError::BadRank {
                rank: shard.rank,
                world: t,
            });
        }
        if !h.is_multiple_of(t) || !inter.is_multiple_of(t) {
            return Err(ShardError::Indivisible {
                world: t,
                heads: h,
                inter,
            });
        }
        if !(k.is_multiple_of(t) || t.is_multiple_of(k)) {
            return Err(ShardError::KvHeads {
                world: t,
                kv_heads: k,
            });
        }
        let head_range = shard.even_range(h);
        let kv_range = if t <= k {
            shard.even_range(k)
        } else {
            let kv = shard.rank / (t / k);
            kv..kv + 1
        };
        let d = config.head_dim;
        let vocab_per_rank = config.vocab_size.div_ceil(t);
        Ok(Self {
            heads: h / t,
            kv_heads: kv_range.len(),
            q_dim: h / t * d,
            kv_dim: kv_range.len() * d,
            inter: inter / t,
            head_range,
            kv_range,
            inter_range: shard.even_range(inter),
            vocab_range: shard.ceil_range(config.vocab_size),
            vocab_per_rank,
        })
    }
}
