//! Chained hashes of full KV blocks: a block's hash covers its tokens and, through its parent's hash,
//! every token before it, so equal hashes mean equal prefixes (up to 64-bit collisions, which the pool
//! rules out by also comparing the block's tokens).

/// The hash of a full block and, through the chain, of the whole prefix it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

/// The root of every chain (a block with no parent hashes as if its parent had this value).
const ROOT: u64 = 0x6a09_e667_f3bc_c908;

/// SplitMix64's finalizer: a cheap bijective mix with good avalanche.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hashes one block's tokens chained onto its parent's hash (`None` for the first block).
///
/// Deterministic across processes and runs (no random keys), so any process can compute the same
/// hashes for the same prompt.
pub fn hash_block_tokens(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = mix64(parent.map_or(ROOT, |p| p.0 ^ 0x9e37_79b9_7f4a_7c15));
    for &t in tokens {
        h = mix64(h ^ u64::from(t).wrapping_mul(0xff51_afd7_ed55_8ccd));
    }
    BlockHash(mix64(h ^ tokens.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_parent_and_tokens() {
        let a = hash_block_tokens(None, &[1, 2, 3, 4]);
        assert_eq!(a, hash_block_tokens(None, &[1, 2, 3, 4]));
        assert_ne!(a, hash_block_tokens(None, &[1, 2, 4, 3]));
        let b = hash_block_tokens(Some(a), &[5, 6, 7, 8]);
        let b2 = hash_block_tokens(Some(hash_block_tokens(None, &[1, 2, 3, 5])), &[5, 6, 7, 8]);
        assert_ne!(
            b, b2,
            "same block tokens after a different prefix must hash differently"
        );
        assert_ne!(b, hash_block_tokens(None, &[5, 6, 7, 8]));
        assert_ne!(
            hash_block_tokens(None, &[0]),
            hash_block_tokens(None, &[0, 0])
        );
    }
}
