//! The paged KV cache's bookkeeping: which physical blocks hold which sequence's tokens.
//!
//! The design follows vLLM's V1 `BlockPool` / `KVCacheManager`: fixed-size blocks, block 0 a reserved
//! null block that is never handed out, reference counts so that sequences sharing a prompt prefix share
//! its blocks, and prefix caching by a chained hash over full blocks ([`BlockHash`]). Freed blocks that
//! carry a hash stay in the cache, in LRU order, until a block is needed and none without a hash is free.
//!
//! Nothing here touches the KV memory itself: the backend owns it and reads it through the block tables.

mod block_hash;
mod block_pool;
mod manager;

pub(crate) use block_hash::mix64 as block_hash_mix;
pub use block_hash::{BlockHash, hash_block_tokens};
pub use block_pool::{BlockId, BlockPool};
pub use manager::{KvCacheManager, KvError, PrefixHit, SeqId};
