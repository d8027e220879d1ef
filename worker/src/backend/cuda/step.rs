//! Turning a [`ForwardBatch`] into the flat arrays the kernels read, after checking it on the host
//! (every index a kernel will follow is validated here, so the kernels never read out of bounds).

use crate::backend::{BackendError, BatchLimits, ForwardBatch};

/// Keys per attention split for decodes in batch-invariant mode, and the smallest split otherwise.
/// Fixed, so a sequence's attention is computed the same way whatever else is in the batch.
pub const DECODE_SPLIT: usize = 128;

/// Split sizes [`decode_split`] picks from, largest first, each with the blocks per
/// multiprocessor it must still give.
const DECODE_SPLITS: [(usize, usize); 4] = [(1024, 4), (512, 1), (256, 1), (DECODE_SPLIT, 1)];

/// Keys per decode attention split for `items` sequences over `kv_heads` KV heads with contexts of
/// at most `max_ctx`: the largest of 512, 256 and 128 that still gives every one of `sms`
/// multiprocessors a block, or 1024 where that still gives each 4 (the bf16 decode kernels keep 4
/// resident; the CUDA-core one 3 at 8 query heads per KV head). Longer splits cost less per key
/// (fewer partials to combine, a longer pipeline per block: on the H200 at batch 128, 512 keys
/// run 18–21 % faster than 128), shorter ones keep small batches spread over the GPU. 1024
/// matters for CUDA graphs, whose context capacity is a power of two: contexts of 513–1024 would
/// otherwise take a second, nearly empty 512-key split and the combine. It depends on the batch,
/// so batch-invariant mode uses [`DECODE_SPLIT`] instead.
pub fn decode_split(items: usize, kv_heads: usize, max_ctx: usize, sms: usize) -> usize {
    DECODE_SPLITS
        .into_iter()
        .find(|&(split, per_sm)| items * kv_heads * max_ctx.div_ceil(split).max(1) >= per_sm * sms)
        .map_or(DECODE_SPLIT, |(split, _)| split)
}

/// Host-side arrays of one step, ready to upload.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct HostStep {
    pub ids: Vec<u32>,
    pub positions: Vec<u32>,
    /// `block * block_size + offset` per token.
    pub slots: Vec<i64>,
    /// Per sequence: query_start, query_len, context_len, 0.
    pub seqs: Vec<i32>,
    /// Prefill work items (sequences with more than one query token): (sequence, first query).
    pub items_prefill: Vec<i32>,
    /// Decode work items (one query token): (sequence, 0).
    pub items_decode: Vec<i32>,
    /// `[seqs, stride]` block tables, zero-padded.
    pub tables: Vec<u32>,
    pub stride: usize,
    /// Token index of each sampling row.
    pub sample_idx: Vec<u32>,
    /// Largest context among decode sequences.
    pub max_decode_ctx: usize,
}

impl HostStep {
    /// Number of tokens.
    pub fn n(&self) -> usize {
        self.ids.len()
    }

    /// Number of sequences.
    pub fn num_seqs(&self) -> usize {
        self.seqs.len() / 4
    }

    /// Attention splits of `split` keys the decode items need.
    pub fn decode_splits(&self, split: usize) -> usize {
        self.max_decode_ctx.div_ceil(split).max(1)
    }
}

/// The model and cache facts a batch is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub vocab: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    /// Query tokens per prefill attention item.
    pub tile_tokens: usize,
}

fn bad<T>(msg: String) -> Result<T, BackendError> {
    Err(BackendError::InvalidBatch(msg))
}

/// Validates `batch` and lays it out; `min_stride` pads the block tables (CUDA graphs need a
/// fixed stride).
pub fn build(
    batch: &ForwardBatch<'_>,
    lim: Limits,
    min_stride: usize,
) -> Result<HostStep, BackendError> {
    let tables = batch.validate(BatchLimits {
        vocab_size: lim.vocab,
        block_size: lim.block_size,
        num_blocks: lim.num_blocks,
    })?;
    let n = batch.token_ids.len();
    // The kernels index with i32.
    if n > i32::MAX as usize / 2 {
        return bad(format!("{n} tokens in one step"));
    }
    if let Some((i, seq)) = batch
        .seqs
        .iter()
        .enumerate()
        .find(|(_, s)| s.context_len > i32::MAX as usize / 2)
    {
        return bad(format!("sequence {i}: context_len {}", seq.context_len));
    }
    let mut stride = min_stride;
    for s in batch.seqs {
        stride = stride.max(s.context_len.div_ceil(lim.block_size));
    }
    let mut st = HostStep {
        ids: batch.token_ids.to_vec(),
        positions: batch.positions.to_vec(),
        slots: Vec::with_capacity(n),
        stride,
        ..Default::default()
    };
    for (i, (seq, table)) in batch.seqs.iter().zip(tables).enumerate() {
        let end = seq.query_start + seq.query_len;
        for &p in &batch.positions[seq.query_start..end] {
            let p = p as usize;
            st.slots.push(
                (table[p / lim.block_size] as usize * lim.block_size + p % lim.block_size) as i64,
            );
        }
        st.seqs.extend([
            seq.query_start as i32,
            seq.query_len as i32,
            seq.context_len as i32,
            0,
        ]);
        if seq.query_len == 1 {
            st.items_decode.extend([i as i32, 0]);
            st.max_decode_ctx = st.max_decode_ctx.max(seq.context_len);
        } else {
            let mut q0 = 0;
            while q0 < seq.query_len {
                st.items_prefill.extend([i as i32, q0 as i32]);
                q0 += lim.tile_tokens;
            }
        }
        st.tables.extend_from_slice(table);
        st.tables.resize((i + 1) * stride, 0);
        if seq.sample {
            st.sample_idx.push((end - 1) as u32);
        }
    }
    Ok(st)
}

/// Pads a decode step to `bucket` sequences and its block tables to `stride` entries a sequence
/// (a CUDA graph's fixed shape): each extra sequence is one token at position 0 whose K/V go to
/// slot 0 of the null block 0 (never read by a real sequence), with no sampling row beyond the
/// bucket's, and table entries past a sequence's own are 0. Returns `None` unless every sequence
/// is a sampling decode and `stride` holds every table.
pub fn pad_decode(st: &HostStep, bucket: usize, stride: usize) -> Option<HostStep> {
    let n = st.n();
    if n > bucket
        || st.num_seqs() != n
        || !st.items_prefill.is_empty()
        || st.sample_idx.len() != n
        || stride < st.stride
    {
        return None;
    }
    let mut p = st.clone();
    if stride != st.stride {
        p.tables = vec![0; n * stride];
        for s in 0..n {
            let old = &st.tables[s * st.stride..(s + 1) * st.stride];
            p.tables[s * stride..s * stride + old.len()].copy_from_slice(old);
        }
        p.stride = stride;
    }
    for i in n..bucket {
        p.ids.push(0);
        p.positions.push(0);
        p.slots.push(0);
        p.seqs.extend([i as i32, 1, 1, 0]);
        p.items_decode.extend([i as i32, 0]);
        p.tables.resize((i + 1) * p.stride, 0);
        p.sample_idx.push(i as u32);
    }
    Some(p)
}

/// Groups decode items whose first attention splits of `split` keys read the same cache blocks
/// (a prompt prefix that prefix caching holds once for many sequences), so that the tensor-core
/// decode kernel reads those blocks once for up to `max_members` sequences
/// ([`kernels::DECODE_SHARE_MEMBERS_SHIFT`]). Items are reordered so that each group's members
/// are consecutive, and every member's second word becomes its share code; the group shares its
/// first `s` splits, where every member's context covers all `s` (no member's split is cut short
/// by its context) and every member's block table equals the first member's over them. Sequences
/// with no such partner keep code 0. Nothing changes when `max_members < 2` or `split` is not a
/// whole number of blocks. The result of every sequence stays bit-identical (the kernel computes
/// a shared split exactly as the member's own block would).
pub fn share_decode_splits(st: &mut HostStep, split: usize, block_size: usize, max_members: usize) {
    let items = st.items_decode.len() / 2;
    if max_members < 2 || items < 2 || block_size == 0 || !split.is_multiple_of(block_size) {
        return;
    }
    let per_split = split / block_size;
    let seq_of = |item: usize| st.items_decode[2 * item] as usize;
    // Splits wholly inside a sequence's context, and its block table over them.
    let full = |item: usize| st.seqs[4 * seq_of(item) + 2] as usize / split;
    let table = |item: usize| {
        let s = seq_of(item);
        &st.tables[s * st.stride..s * st.stride + (full(item) * per_split).min(st.stride)]
    };
    // Candidates: items with a whole split, ordered by their tables (equal prefixes adjacent).
    let mut order: Vec<usize> = (0..items).filter(|&i| full(i) > 0).collect();
    if order.len() < 2 {
        return;
    }
    order.sort_by(|&a, &b| table(a).cmp(table(b)).then(a.cmp(&b)));
    let common = |a: usize, b: usize| {
        let same = table(a)
            .iter()
            .zip(table(b))
            .take_while(|(x, y)| x == y)
            .count();
        same / per_split
    };
    let mut grouped = vec![false; items];
    let mut out = Vec::with_capacity(st.items_decode.len());
    let mut at = 0;
    while at < order.len() {
        let lead = order[at];
        let mut shared = full(lead);
        let mut end = at + 1;
        while end < order.len() && end - at < max_members.min(15) {
            let c = common(lead, order[end]);
            if c == 0 {
                break;
            }
            shared = shared.min(c);
            end += 1;
        }
        let members = end - at;
        let codes: Option<Vec<i32>> = (0..members)
            .map(|m| kernels::decode_share_code(m, members, shared))
            .collect();
        if let Some(codes) = codes.filter(|_| members >= 2) {
            for (&item, code) in order[at..end].iter().zip(codes) {
                out.extend([seq_of(item) as i32, code]);
                grouped[item] = true;
            }
        }
        at = end;
    }
    if out.is_empty() {
        return;
    }
    for (item, done) in grouped.iter().enumerate() {
        if !done {
            out.extend([seq_of(item) as i32, 0]);
        }
    }
    st.items_decode = out;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SeqInput;

    const LIM: Limits = Limits {
        vocab: 100,
        block_size: 4,
        num_blocks: 10,
        tile_tokens: 2,
    };

    #[test]
    fn decode_split_fills_the_gpu_then_grows() {
        // The H200: 132 multiprocessors; the 8B shape: 8 KV heads.
        let split = |items, ctx| decode_split(items, 8, ctx, 132);
        assert_eq!(split(128, 512), 1024); // one split either way: the same blocks as 512
        assert_eq!(split(128, 1024), 1024); // 128 x 8 = 1024 blocks, >= 4 per SM
        assert_eq!(split(128, 2048), 1024);
        assert_eq!(split(64, 1024), 512); // 512 blocks at 1024: under 4 per SM
        assert_eq!(split(32, 2048), 512);
        assert_eq!(split(8, 2048), 512); // 8 x 8 x 4 = 256 blocks
        assert_eq!(split(4, 2048), 256); // 4 x 8 x 8 = 256 blocks
        assert_eq!(split(1, 2048), DECODE_SPLIT); // too few blocks at any size
        assert_eq!(split(1, 1), DECODE_SPLIT);
        assert_eq!(split(64, 1), 512);
    }

    #[test]
    fn lays_out_prefill_and_decode() {
        let t1 = [3u32, 5];
        let t2 = [7u32];
        let seqs = [
            SeqInput {
                query_start: 0,
                query_len: 3,
                context_len: 5,
                block_table: &t1,
                sample: true,
            },
            SeqInput {
                query_start: 3,
                query_len: 1,
                context_len: 2,
                block_table: &t2,
                sample: true,
            },
        ];
        let b = ForwardBatch {
            token_ids: &[1, 2, 3, 4],
            positions: &[2, 3, 4, 1],
            seqs: &seqs,
        };
        let st = build(&b, LIM, 0).unwrap();
        assert_eq!(st.slots, vec![14, 15, 20, 29]);
        assert_eq!(st.items_prefill, vec![0, 0, 0, 2]);
        assert_eq!(st.items_decode, vec![1, 0]);
        assert_eq!(st.stride, 2);
        assert_eq!(st.tables, vec![3, 5, 7, 0]);
        assert_eq!(st.sample_idx, vec![2, 3]);
        assert_eq!(st.max_decode_ctx, 2);
        assert!(
            pad_decode(&st, 4, 4).is_none(),
            "prefill steps are not padded"
        );
    }

    #[test]
    fn rejects_bad_batches() {
        let t = [3u32];
        let mk = |ids: &'static [u32], pos: &'static [u32], table: &'static [u32], ctx| {
            let seqs = vec![SeqInput {
                query_start: 0,
                query_len: 1,
                context_len: ctx,
                block_table: table,
                sample: true,
            }];
            build(
                &ForwardBatch {
                    token_ids: ids,
                    positions: pos,
                    seqs: &seqs,
                },
                LIM,
                0,
            )
        };
        assert!(mk(&[100], &[0], &[3], 1).is_err(), "token beyond vocab");
        assert!(mk(&[1], &[1], &[3], 1).is_err(), "wrong position");
        assert!(mk(&[1], &[0], &[0], 1).is_err(), "null block");
        assert!(mk(&[1], &[0], &[10], 1).is_err(), "block beyond the pool");
        assert!(mk(&[1], &[4], &[3], 5).is_err(), "table too short");
        let _ = t;
    }

    #[test]
    fn pads_decodes_to_the_bucket() {
        let t = [3u32, 4];
        let seqs = [SeqInput {
            query_start: 0,
            query_len: 1,
            context_len: 6,
            block_table: &t,
            sample: true,
        }];
        let b = ForwardBatch {
            token_ids: &[9],
            positions: &[5],
            seqs: &seqs,
        };
        let st = build(&b, LIM, 4).unwrap();
        let p = pad_decode(&st, 4, 4).unwrap();
        assert_eq!(p.n(), 4);
        assert_eq!(p.num_seqs(), 4);
        assert_eq!(p.tables.len(), 16);
        assert_eq!(&p.slots[1..], &[0, 0, 0]);
        assert_eq!(p.items_decode, vec![0, 0, 1, 0, 2, 0, 3, 0]);
        assert_eq!(p.sample_idx, vec![0, 1, 2, 3]);
        // Widening the tables of a step built at its own stride gives the step built at the wider
        // one; a narrower stride than the step's is refused.
        let own = build(&b, LIM, 0).unwrap();
        assert_eq!(own.stride, 2);
        assert_eq!(pad_decode(&own, 4, 4), Some(p));
        assert_eq!(pad_decode(&own, 4, 1), None);
        let same = pad_decode(&own, 1, 2).unwrap();
        assert_eq!(same.tables, vec![3, 4]);
    }

    /// A decode step of one-token sequences with these contexts and block tables (stride 6).
    fn decodes(seqs: &[(usize, [u32; 6])]) -> HostStep {
        let mut st = HostStep {
            stride: 6,
            ..Default::default()
        };
        for (i, (ctx, table)) in seqs.iter().enumerate() {
            st.seqs.extend([i as i32, 1, *ctx as i32, 0]);
            st.items_decode.extend([i as i32, 0]);
            st.tables.extend_from_slice(table);
            st.max_decode_ctx = st.max_decode_ctx.max(*ctx);
        }
        st
    }

    fn code(member: usize, members: usize, splits: usize) -> i32 {
        kernels::decode_share_code(member, members, splits).unwrap()
    }

    #[test]
    fn decodes_sharing_prefix_blocks_share_their_splits() {
        // Blocks of 4 keys, splits of 8 (two blocks). Sequences 0, 2 and 3 hold blocks 1-4 in
        // common (two whole splits), 1 shares block 1 only (no whole split), 4 nothing.
        let shared = [1, 2, 3, 4, 0, 0];
        let mut st = decodes(&[
            (17, [1, 2, 3, 4, 5, 0]),
            (17, [1, 9, 3, 4, 6, 0]),
            (18, [1, 2, 3, 4, 7, 0]),
            (16, shared),
            (17, [8, 2, 3, 4, 9, 0]),
        ]);
        let before = st.clone();
        share_decode_splits(&mut st, 8, 4, 2);
        // Groups of two: (0, 2) share two splits; 3 has no partner left, 1 and 4 match nobody.
        assert_eq!(
            st.items_decode,
            vec![0, code(0, 2, 2), 2, code(1, 2, 2), 1, 0, 3, 0, 4, 0]
        );
        // Everything else is untouched.
        assert_eq!(
            HostStep {
                items_decode: before.items_decode.clone(),
                ..st.clone()
            },
            before
        );

        let mut st = before.clone();
        share_decode_splits(&mut st, 8, 4, 4);
        assert_eq!(
            st.items_decode,
            vec![
                0,
                code(0, 3, 2),
                2,
                code(1, 3, 2),
                3,
                code(2, 3, 2),
                1,
                0,
                4,
                0
            ]
        );

        // Sharing one split only: 1 agrees with 0 on block 1 but not block 2, so no whole split.
        let mut st = decodes(&[(17, [1, 2, 3, 4, 5, 0]), (17, [1, 2, 3, 9, 6, 0])]);
        share_decode_splits(&mut st, 8, 4, 2);
        assert_eq!(st.items_decode, vec![0, code(0, 2, 1), 1, code(1, 2, 1)]);
    }

    #[test]
    fn decode_sharing_needs_whole_splits_in_every_context() {
        let t = [1, 2, 3, 4, 5, 0];
        // A context of 7 keys has no whole split of 8: its first split is cut short.
        let mut st = decodes(&[(7, t), (17, t)]);
        let before = st.clone();
        share_decode_splits(&mut st, 8, 4, 2);
        assert_eq!(st, before);
        // A context of 9 covers one split: the pair shares one, not two.
        let mut st = decodes(&[(9, t), (17, t)]);
        share_decode_splits(&mut st, 8, 4, 2);
        assert_eq!(st.items_decode, vec![0, code(0, 2, 1), 1, code(1, 2, 1)]);
        // Splits that are not whole blocks, or one member a group: nothing changes.
        let mut st = decodes(&[(17, t), (17, t)]);
        let before = st.clone();
        share_decode_splits(&mut st, 6, 4, 2);
        assert_eq!(st, before);
        share_decode_splits(&mut st, 8, 4, 1);
        assert_eq!(st, before);
    }
}
