//! The pool of physical KV blocks: reference counts, the free lists, and the prefix cache.
//!
//! Follows vLLM's V1 `BlockPool`. Block 0 is a null block, never allocated. A free block is either
//! *plain* (no hash; reused first) or *cached* (it holds a full block registered under its
//! [`BlockHash`]; kept in LRU order and evicted only when no plain block is left). A cached block whose
//! reference count drops to zero stays findable: a later request with the same prefix takes it back.

use std::collections::{BTreeMap, HashMap};

use super::block_hash::BlockHash;

/// A physical KV block index (0 is the reserved null block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// A block registered in the prefix cache: its hash, its parent's, and its tokens (compared on lookup,
/// so a 64-bit hash collision can never hand out the wrong KV).
#[derive(Debug, Clone)]
struct CachedKey {
    hash: BlockHash,
    parent: Option<BlockHash>,
    tokens: Box<[u32]>,
}

#[derive(Debug, Clone, Default)]
struct BlockMeta {
    ref_count: u32,
    cached: Option<CachedKey>,
    /// Position in the LRU of free cached blocks, when this block is there.
    lru_tick: Option<u64>,
}

/// Physical blocks with reference counts, free lists and the prefix-cache index.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<BlockMeta>,
    /// Free blocks with no hash, popped from the end.
    free_plain: Vec<BlockId>,
    /// Free blocks with a hash, oldest (first to evict) first.
    free_cached: BTreeMap<u64, BlockId>,
    next_tick: u64,
    /// Hash → block, for every block registered in the prefix cache (in use or free).
    index: HashMap<BlockHash, BlockId>,
    evictions: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks, block 0 reserved. `num_blocks` must be at least 1.
    pub fn new(num_blocks: usize) -> Self {
        let num_blocks = num_blocks.max(1);
        let free_plain = (1..num_blocks as u32).rev().map(BlockId).collect();
        Self {
            blocks: vec![BlockMeta::default(); num_blocks],
            free_plain,
            free_cached: BTreeMap::new(),
            next_tick: 0,
            index: HashMap::new(),
            evictions: 0,
        }
    }

    /// Blocks that can be handed out (the null block excluded).
    pub fn num_usable(&self) -> usize {
        self.blocks.len() - 1
    }

    /// Free blocks, plain and cached.
    pub fn num_free(&self) -> usize {
        self.free_plain.len() + self.free_cached.len()
    }

    /// Blocks referenced by at least one sequence.
    pub fn num_used(&self) -> usize {
        self.num_usable() - self.num_free()
    }

    /// Free blocks that still hold a cached prefix.
    pub fn num_free_cached(&self) -> usize {
        self.free_cached.len()
    }

    /// Cached blocks evicted so far to make room.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Reference count of `id`.
    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.blocks.get(id.0 as usize).map_or(0, |b| b.ref_count)
    }

    /// The block registered under `hash` whose parent and tokens match, if any (not touched).
    pub fn lookup(
        &self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> Option<BlockId> {
        let id = *self.index.get(&hash)?;
        let key = self.blocks[id.0 as usize].cached.as_ref()?;
        (key.parent == parent && *key.tokens == *tokens).then_some(id)
    }

    /// Whether `id` is free (so that touching it consumes a free block).
    pub fn is_free(&self, id: BlockId) -> bool {
        id.0 != 0 && self.ref_count(id) == 0
    }

    /// Takes a reference on each block (prefix-cache hits); free cached blocks leave the LRU.
    pub fn touch(&mut self, ids: &[BlockId]) {
        for &id in ids {
            let meta = &mut self.blocks[id.0 as usize];
            if let Some(tick) = meta.lru_tick.take() {
                self.free_cached.remove(&tick);
            }
            meta.ref_count += 1;
        }
    }

    /// Allocates `n` blocks with reference count 1, or `None` (allocating nothing) if fewer are free.
    /// Plain free blocks go first; then cached ones, least recently used first, leave the cache.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.num_free() {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = match self.free_plain.pop() {
                Some(id) => id,
                None => {
                    let (_, id) = self.free_cached.pop_first()?;
                    self.evict(id);
                    id
                }
            };
            let meta = &mut self.blocks[id.0 as usize];
            meta.lru_tick = None;
            meta.ref_count = 1;
            out.push(id);
        }
        Some(out)
    }

    fn evict(&mut self, id: BlockId) {
        if let Some(key) = self.blocks[id.0 as usize].cached.take() {
            self.index.remove(&key.hash);
            self.evictions += 1;
        }
    }

    /// Drops one reference from each block, in the order given (pass a sequence's table reversed, so
    /// that its tail blocks are the first to be evicted). Returns an error naming a block freed
    /// more often than it was referenced.
    pub fn free(&mut self, ids: impl IntoIterator<Item = BlockId>) -> Result<(), BlockId> {
        for id in ids {
            let Some(meta) = self.blocks.get_mut(id.0 as usize) else {
                return Err(id);
            };
            if id.0 == 0 || meta.ref_count == 0 {
                return Err(id);
            }
            meta.ref_count -= 1;
            if meta.ref_count == 0 {
                if meta.cached.is_some() {
                    let tick = self.next_tick;
                    self.next_tick += 1;
                    meta.lru_tick = Some(tick);
                    self.free_cached.insert(tick, id);
                } else {
                    self.free_plain.push(id);
                }
            }
        }
        Ok(())
    }

    /// Registers an in-use full block under `hash`. Does nothing (returns false) if the hash is already
    /// registered (another sequence computed the same block) or the block already carries a hash.
    pub fn register(
        &mut self,
        id: BlockId,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> bool {
        if self.index.contains_key(&hash) {
            return false;
        }
        let meta = &mut self.blocks[id.0 as usize];
        if meta.cached.is_some() || meta.ref_count == 0 {
            return false;
        }
        meta.cached = Some(CachedKey {
            hash,
            parent,
            tokens: tokens.into(),
        });
        self.index.insert(hash, id);
        true
    }

    /// Forgets every cached prefix (free cached blocks become plain). Returns how many were dropped.
    pub fn reset_prefix_cache(&mut self) -> usize {
        let n = self.index.len();
        for (_, id) in std::mem::take(&mut self.free_cached) {
            self.blocks[id.0 as usize].lru_tick = None;
            self.free_plain.push(id);
        }
        for meta in &mut self.blocks {
            meta.cached = None;
        }
        self.index.clear();
        n
    }

    /// Checks the pool's invariants (for tests): counts add up, free lists hold exactly the
    /// unreferenced blocks, once each, and the index points at blocks carrying its hash.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut seen = vec![false; self.blocks.len()];
        for &id in self.free_plain.iter().chain(self.free_cached.values()) {
            let i = id.0 as usize;
            if i == 0 || i >= self.blocks.len() {
                return Err(format!("free list holds invalid block {i}"));
            }
            if std::mem::replace(&mut seen[i], true) {
                return Err(format!("block {i} is on a free list twice"));
            }
            if self.blocks[i].ref_count != 0 {
                return Err(format!("free block {i} has references"));
            }
        }
        for (i, meta) in self.blocks.iter().enumerate().skip(1) {
            if meta.ref_count == 0 && !seen[i] {
                return Err(format!("block {i} is unreferenced but not free"));
            }
        }
        if self.num_free() + self.num_used() != self.num_usable() {
            return Err("free + used != total".into());
        }
        for (hash, id) in &self.index {
            match &self.blocks[id.0 as usize].cached {
                Some(key) if key.hash == *hash => {}
                _ => return Err(format!("index entry for block {} is stale", id.0)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::hash_block_tokens;

    #[test]
    fn null_block_is_never_allocated_and_shortage_is_none() {
        let mut pool = BlockPool::new(4);
        assert_eq!(pool.num_usable(), 3);
        let got = pool.allocate(3).expect("3 free");
        assert!(!got.contains(&BlockId(0)));
        assert_eq!(pool.allocate(1), None);
        assert_eq!(pool.num_used(), 3);
        pool.free(got.into_iter().rev()).expect("valid free");
        assert_eq!(pool.num_free(), 3);
        pool.check_invariants().expect("invariants");
    }

    #[test]
    fn double_free_is_detected() {
        let mut pool = BlockPool::new(3);
        let got = pool.allocate(1).expect("free");
        pool.free(got.clone()).expect("first free");
        assert_eq!(pool.free(got.clone()), Err(got[0]));
        assert_eq!(pool.free([BlockId(0)]), Err(BlockId(0)));
        assert_eq!(pool.free([BlockId(9)]), Err(BlockId(9)));
        pool.check_invariants().expect("invariants");
    }

    #[test]
    fn cached_blocks_are_evicted_lru_and_only_when_needed() {
        let mut pool = BlockPool::new(5);
        let ids = pool.allocate(3).expect("free");
        let hashes: Vec<_> = (0..3).map(|i| hash_block_tokens(None, &[i])).collect();
        for (i, (&id, &h)) in ids.iter().zip(&hashes).enumerate() {
            assert!(pool.register(id, h, None, &[i as u32]));
        }
        // Free in the order 2, 0, 1: LRU order is the same.
        pool.free([ids[2], ids[0], ids[1]]).expect("free");
        assert_eq!(pool.num_free_cached(), 3);
        // One plain block is left: it goes first, nothing is evicted.
        let plain = pool.allocate(1).expect("free");
        assert_eq!(pool.evictions(), 0);
        assert!(!ids.contains(&plain[0]));
        assert_eq!(pool.lookup(hashes[2], None, &[2]), Some(ids[2]));
        // Now cached blocks are evicted oldest-freed first.
        let next = pool.allocate(1).expect("free");
        assert_eq!(next, vec![ids[2]]);
        assert_eq!(pool.lookup(hashes[2], None, &[2]), None);
        // Touching a free cached block takes it out of the LRU.
        pool.touch(&[ids[0]]);
        assert_eq!(pool.ref_count(ids[0]), 1);
        let next = pool.allocate(1).expect("free");
        assert_eq!(next, vec![ids[1]]);
        assert_eq!(pool.allocate(1), None);
        assert_eq!(pool.evictions(), 2);
        pool.check_invariants().expect("invariants");
    }

    #[test]
    fn lookup_compares_tokens_and_parent() {
        let mut pool = BlockPool::new(3);
        let id = pool.allocate(1).expect("free")[0];
        let h = hash_block_tokens(None, &[1, 2]);
        assert!(pool.register(id, h, None, &[1, 2]));
        assert!(!pool.register(id, h, None, &[1, 2]), "registered twice");
        assert_eq!(pool.lookup(h, None, &[1, 2]), Some(id));
        assert_eq!(pool.lookup(h, None, &[1, 3]), None);
        assert_eq!(pool.lookup(h, Some(h), &[1, 2]), None);
        assert_eq!(pool.reset_prefix_cache(), 1);
        assert_eq!(pool.lookup(h, None, &[1, 2]), None);
        pool.check_invariants().expect("invariants");
    }
}
