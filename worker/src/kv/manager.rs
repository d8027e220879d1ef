//! Per-sequence block tables on top of the [`BlockPool`], with prefix-cache lookup and registration.
//!
//! Follows vLLM's V1 `KVCacheManager`: a table only grows while its sequence lives; a new sequence
//! first looks up the cached full blocks of its prompt ([`KvCacheManager::find_cached_prefix`]) and
//! takes them in the same call that allocates the rest ([`KvCacheManager::allocate_slots`]), which
//! either succeeds whole or changes nothing. Full blocks are registered in the cache only after the
//! step that computed them ran ([`KvCacheManager::cache_computed`]).
//!
//! Between admission and that step, a sequence's uncached full prompt blocks are *pending*: marked
//! by [`KvCacheManager::mark_pending`], so that another prompt with the same prefix can see that
//! its next block is being computed right now ([`KvCacheManager::pending_owner`]) and wait for it
//! rather than compute it a second time (SGLang's cache-aware scheduling does the same).

use std::collections::HashMap;

use super::block_hash::{BlockHash, hash_block_tokens};
use super::block_pool::{BlockId, BlockPool};

/// A sequence (one request) in the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// Cached full blocks found for a prompt, to be taken by [`KvCacheManager::allocate_slots`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixHit {
    /// The blocks, in prefix order.
    pub blocks: Vec<BlockId>,
    /// Their chained hashes.
    pub hashes: Vec<BlockHash>,
}

impl PrefixHit {
    /// Tokens covered, for blocks of `block_size` tokens.
    pub fn num_tokens(&self, block_size: usize) -> usize {
        self.blocks.len() * block_size
    }
}

#[derive(Debug, Default)]
struct SeqBlocks {
    blocks: Vec<BlockId>,
    /// Hashes of the first `hashes.len()` full blocks (those already offered to the cache).
    hashes: Vec<BlockHash>,
    /// Full blocks this sequence will compute that no one had cached when it was admitted.
    pending: Vec<BlockHash>,
}

/// Block tables of every live sequence, and the pool they draw from.
#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    prefix_caching: bool,
    seqs: HashMap<SeqId, SeqBlocks>,
    /// Full blocks being computed, by the chained hash they will be cached under → who computes them.
    pending: HashMap<BlockHash, SeqId>,
    /// Prompt tokens looked up in / found in the prefix cache (for a hit-rate metric).
    queried_tokens: u64,
    hit_tokens: u64,
}

/// A bookkeeping bug (never caused by input): the engine must stop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// A block was released more often than it was referenced.
    #[error("KV block {0} freed twice")]
    DoubleFree(u32),
    /// A plan named a sequence the scheduler does not hold.
    #[error("sequence {0} is not live")]
    UnknownSeq(u64),
}

impl KvCacheManager {
    /// `num_blocks` blocks (block 0 reserved) of `block_size` tokens each.
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        Self {
            pool: BlockPool::new(num_blocks),
            block_size: block_size.max(1),
            prefix_caching,
            seqs: HashMap::new(),
            pending: HashMap::new(),
            queried_tokens: 0,
            hit_tokens: 0,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The pool (for statistics and invariant checks).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// `(looked up, found)` prompt tokens in the prefix cache so far.
    pub fn prefix_cache_stats(&self) -> (u64, u64) {
        (self.queried_tokens, self.hit_tokens)
    }

    /// The longest run of cached full blocks that starts `tokens`, leaving at least the last token to
    /// compute (its logits are needed to sample). Takes no reference.
    pub fn find_cached_prefix(&self, tokens: &[u32]) -> PrefixHit {
        let mut hit = PrefixHit::default();
        if !self.prefix_caching || tokens.is_empty() {
            return hit;
        }
        let max_blocks = (tokens.len() - 1) / self.block_size;
        let mut parent = None;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let hash = hash_block_tokens(parent, chunk);
            let Some(id) = self.pool.lookup(hash, parent, chunk) else {
                break;
            };
            hit.blocks.push(id);
            hit.hashes.push(hash);
            parent = Some(hash);
        }
        hit
    }

    /// The live sequence other than `seq` that is computing, right now, the full block of `tokens`
    /// that follows `hit` (what [`Self::find_cached_prefix`] found for them), if any: `seq` would
    /// otherwise compute that block a second time.
    pub fn pending_owner(&self, seq: SeqId, tokens: &[u32], hit: &PrefixHit) -> Option<SeqId> {
        if !self.prefix_caching || self.pending.is_empty() || tokens.is_empty() {
            return None;
        }
        let i = hit.blocks.len();
        if i >= (tokens.len() - 1) / self.block_size {
            return None;
        }
        let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
        let hash = hash_block_tokens(hit.hashes.last().copied(), chunk);
        self.pending
            .get(&hash)
            .copied()
            .filter(|&owner| owner != seq)
    }

    /// Marks the full blocks of `tokens` after `seq`'s first `cached` blocks as pending on `seq`
    /// (those another sequence has pending already stay its). Call at admission.
    pub fn mark_pending(&mut self, seq: SeqId, tokens: &[u32], cached: &PrefixHit) {
        if !self.prefix_caching {
            return;
        }
        let Some(entry) = self.seqs.get_mut(&seq) else {
            return;
        };
        let mut parent = cached.hashes.last().copied();
        let first = cached.blocks.len();
        for chunk in tokens.chunks_exact(self.block_size).skip(first) {
            let hash = hash_block_tokens(parent, chunk);
            if let std::collections::hash_map::Entry::Vacant(v) = self.pending.entry(hash) {
                v.insert(seq);
                entry.pending.push(hash);
            }
            parent = Some(hash);
        }
    }

    fn clear_pending(pending: &mut HashMap<BlockHash, SeqId>, seq: SeqId, hashes: &[BlockHash]) {
        for h in hashes {
            if pending.get(h) == Some(&seq) {
                pending.remove(h);
            }
        }
    }

    /// Counts an admitted prompt of `queried` tokens of which `hit` came from the prefix cache.
    pub fn record_prefix_query(&mut self, queried: usize, hit: usize) {
        self.queried_tokens += queried as u64;
        self.hit_tokens += hit as u64;
    }

    /// Makes `seq`'s table cover `num_tokens` tokens, first taking `hit` (only for a sequence without
    /// blocks). Returns the number of newly allocated blocks, or `None` — changing nothing — when too
    /// few blocks are free.
    pub fn allocate_slots(
        &mut self,
        seq: SeqId,
        num_tokens: usize,
        hit: Option<&PrefixHit>,
    ) -> Option<usize> {
        let have = self.seqs.get(&seq).map_or(0, |s| s.blocks.len());
        let hit = hit.filter(|h| have == 0 && !h.blocks.is_empty());
        let hit_len = hit.map_or(0, |h| h.blocks.len());
        let need = self.blocks_for(num_tokens).saturating_sub(have + hit_len);
        let hits_free = hit.map_or(0, |h| {
            h.blocks.iter().filter(|&&b| self.pool.is_free(b)).count()
        });
        if need + hits_free > self.pool.num_free() {
            return None;
        }
        let entry = self.seqs.entry(seq).or_default();
        if let Some(h) = hit {
            self.pool.touch(&h.blocks);
            entry.blocks.extend_from_slice(&h.blocks);
            entry.hashes.extend_from_slice(&h.hashes);
        }
        let new = self.pool.allocate(need)?;
        entry.blocks.extend_from_slice(&new);
        Some(need)
    }

    /// Registers `seq`'s full blocks among its first `num_computed` tokens (whose KV is now written)
    /// in the prefix cache. `tokens` are the sequence's tokens (at least `num_computed` of them).
    pub fn cache_computed(&mut self, seq: SeqId, tokens: &[u32], num_computed: usize) {
        if !self.prefix_caching {
            return;
        }
        let Some(entry) = self.seqs.get_mut(&seq) else {
            return;
        };
        let full = (num_computed.min(tokens.len()) / self.block_size).min(entry.blocks.len());
        for i in entry.hashes.len()..full {
            let parent = i.checked_sub(1).map(|p| entry.hashes[p]);
            let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let hash = hash_block_tokens(parent, chunk);
            self.pool.register(entry.blocks[i], hash, parent, chunk);
            entry.hashes.push(hash);
            if self.pending.get(&hash) == Some(&seq) {
                self.pending.remove(&hash);
            }
        }
    }

    /// `seq`'s block table (empty if it holds none).
    pub fn block_table(&self, seq: SeqId) -> &[BlockId] {
        self.seqs.get(&seq).map_or(&[], |s| &s.blocks)
    }

    /// Releases all of `seq`'s blocks, last block first. Returns whether it held any.
    pub fn free(&mut self, seq: SeqId) -> Result<bool, KvError> {
        let Some(entry) = self.seqs.remove(&seq) else {
            return Ok(false);
        };
        Self::clear_pending(&mut self.pending, seq, &entry.pending);
        self.pool
            .free(entry.blocks.into_iter().rev())
            .map_err(|b| KvError::DoubleFree(b.0))?;
        Ok(true)
    }

    /// Number of sequences holding blocks.
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(n: usize, base: u32) -> Vec<u32> {
        (0..n as u32).map(|i| base + i).collect()
    }

    #[test]
    fn allocation_covers_tokens_and_is_all_or_nothing() {
        let mut kv = KvCacheManager::new(5, 4, false);
        assert_eq!(kv.allocate_slots(SeqId(1), 5, None), Some(2));
        assert_eq!(kv.allocate_slots(SeqId(1), 8, None), Some(0));
        assert_eq!(kv.allocate_slots(SeqId(1), 9, None), Some(1));
        let table = kv.block_table(SeqId(1)).to_vec();
        assert_eq!(table.len(), 3);
        assert_eq!(
            kv.allocate_slots(SeqId(2), 8, None),
            None,
            "only one block left"
        );
        assert!(kv.block_table(SeqId(2)).is_empty());
        assert_eq!(kv.allocate_slots(SeqId(1), 13, None), Some(1));
        assert_eq!(
            &kv.block_table(SeqId(1))[..3],
            &table[..],
            "tables only grow"
        );
        assert_eq!(kv.free(SeqId(1)), Ok(true));
        assert_eq!(kv.free(SeqId(1)), Ok(false));
        assert_eq!(kv.pool().num_free(), 4);
        kv.pool().check_invariants().expect("invariants");
    }

    #[test]
    fn prefix_hits_share_blocks_and_leave_the_last_token() {
        let mut kv = KvCacheManager::new(16, 4, true);
        let prompt = toks(10, 100);
        assert_eq!(kv.find_cached_prefix(&prompt), PrefixHit::default());
        kv.allocate_slots(SeqId(1), prompt.len(), None)
            .expect("room");
        kv.cache_computed(SeqId(1), &prompt, prompt.len());
        let hit = kv.find_cached_prefix(&prompt);
        assert_eq!(hit.blocks, kv.block_table(SeqId(1))[..2].to_vec());
        // Exactly two full blocks: the hit stops one block short so the last token is computed.
        let hit8 = kv.find_cached_prefix(&prompt[..8]);
        assert_eq!(hit8.blocks.len(), 1);
        kv.allocate_slots(SeqId(2), prompt.len(), Some(&hit))
            .expect("room");
        assert_eq!(kv.block_table(SeqId(2))[..2], kv.block_table(SeqId(1))[..2]);
        assert_ne!(kv.block_table(SeqId(2))[2], kv.block_table(SeqId(1))[2]);
        assert_eq!(kv.pool().ref_count(hit.blocks[0]), 2);
        // A diverging prompt shares only the first block.
        let mut other = prompt.clone();
        other[5] = 7;
        assert_eq!(kv.find_cached_prefix(&other).blocks.len(), 1);
        kv.free(SeqId(1)).expect("free");
        kv.free(SeqId(2)).expect("free");
        assert_eq!(kv.pool().num_free(), 15);
        // Freed cached blocks are still found.
        assert_eq!(kv.find_cached_prefix(&prompt).blocks.len(), 2);
        kv.pool().check_invariants().expect("invariants");
    }

    #[test]
    fn hits_on_free_blocks_count_against_free_space() {
        let mut kv = KvCacheManager::new(4, 2, true);
        let prompt = toks(5, 0);
        kv.allocate_slots(SeqId(1), 5, None).expect("room");
        kv.cache_computed(SeqId(1), &prompt, 5);
        kv.free(SeqId(1)).expect("free");
        let hit = kv.find_cached_prefix(&prompt);
        assert_eq!(hit.blocks.len(), 2);
        // 3 usable blocks, 2 of them are the free hits: a 7-token table needs 4 blocks.
        assert_eq!(kv.allocate_slots(SeqId(2), 7, Some(&hit)), None);
        assert_eq!(
            kv.pool().num_free_cached(),
            2,
            "a failed allocation touches nothing"
        );
        assert_eq!(kv.allocate_slots(SeqId(2), 6, Some(&hit)), Some(1));
        kv.pool().check_invariants().expect("invariants");
    }

    #[test]
    fn disabled_prefix_caching_never_hits() {
        let mut kv = KvCacheManager::new(8, 2, false);
        let prompt = toks(6, 0);
        kv.allocate_slots(SeqId(1), 6, None).expect("room");
        kv.cache_computed(SeqId(1), &prompt, 6);
        assert!(kv.find_cached_prefix(&prompt).blocks.is_empty());
    }
}
