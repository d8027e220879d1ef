//! Paged causal attention with grouped-query heads, two ways: per token and head with dot products
//! (decode and short chunks), and per query chunk with GEMMs over the gathered context (prefill).

use rayon::prelude::*;

use super::gemv::dot;
use super::ops::{MatMut, MatRef, gemm_into};

/// Where one query token reads its context from.
#[derive(Debug, Clone, Copy)]
pub struct TokenContext<'a> {
    /// Absolute position; the token attends to positions `0..=position`.
    pub position: usize,
    /// Its sequence's block table (validated to cover `0..=position` with in-range blocks).
    pub block_table: &'a [u32],
    /// Computed by [`chunk_attention`] instead; [`paged_attention`] leaves its output alone.
    pub in_chunk: bool,
}

/// Shapes of the attention problem.
#[derive(Debug, Clone, Copy)]
pub struct AttentionDims {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Row stride of the query matrix (the fused q|k|v width).
    pub q_stride: usize,
}

/// Paged causal attention with GQA: for each token and query head, softmax(q·kᵀ/√d)·v over the
/// token's context, read from the K/V caches (`[blocks × block_size × kv_heads × head_dim]`) through
/// its block table. `q` rows start at `t * q_stride`; `out` is `[tokens × heads × head_dim]`.
pub fn paged_attention(
    q: &[f32],
    caches: (&[f32], &[f32]),
    tokens: &[TokenContext<'_>],
    dims: AttentionDims,
    out: &mut [f32],
) {
    let (k_cache, v_cache) = caches;
    let AttentionDims {
        num_heads,
        num_kv_heads,
        head_dim: d,
        block_size,
        q_stride,
    } = dims;
    let group = num_heads / num_kv_heads;
    let kv_dim = num_kv_heads * d;
    let scale = 1.0 / (d as f32).sqrt();
    let avx2 = has_avx2();
    out.par_chunks_mut(d)
        .enumerate()
        .for_each_init(Vec::new, |scores: &mut Vec<f32>, (idx, o)| {
            let (t, head) = (idx / num_heads, idx % num_heads);
            let ctx = tokens[t];
            if ctx.in_chunk {
                return;
            }
            let one = OneHead {
                q: &q[t * q_stride + head * d..t * q_stride + (head + 1) * d],
                caches: (k_cache, v_cache),
                ctx,
                kv_off: (head / group) * d,
                kv_dim,
                block_size,
                scale,
            };
            if avx2 {
                #[cfg(target_arch = "x86_64")]
                {
                    // SAFETY: `attend_avx2` needs only AVX2, which `has_avx2` found on this CPU.
                    unsafe { attend_avx2(&one, scores, o) };
                    return;
                }
            }
            attend(&one, scores, o);
        });
}

/// Whether the CPU has AVX2 (always false off x86-64).
fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// One query head of one token, and where its K/V rows are.
struct OneHead<'a> {
    q: &'a [f32],
    caches: (&'a [f32], &'a [f32]),
    ctx: TokenContext<'a>,
    /// Offset of the head's KV head within a cache row.
    kv_off: usize,
    /// Width of a cache row (all KV heads).
    kv_dim: usize,
    block_size: usize,
    scale: f32,
}

/// `o = softmax(q·kᵀ · scale) · v` over the token's context, `scores` as scratch. Plain Rust with
/// no fused multiply-add, so [`attend_avx2`] (the same code compiled for wider registers) gives the
/// same bits.
#[inline(always)]
fn attend(one: &OneHead<'_>, scores: &mut Vec<f32>, o: &mut [f32]) {
    let d = one.q.len();
    let (k_cache, v_cache) = one.caches;
    let (bs, kv_dim, kv_off) = (one.block_size, one.kv_dim, one.kv_off);
    // Offsets of the K/V rows of positions 0..=position, block by block.
    let rows = || {
        one.ctx
            .block_table
            .iter()
            .flat_map(move |&b| {
                let base = b as usize * bs;
                (base..base + bs).map(move |slot| slot * kv_dim + kv_off)
            })
            .take(one.ctx.position + 1)
    };
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for s in rows() {
        let score = dot(one.q, &k_cache[s..s + d]) * one.scale;
        max = max.max(score);
        scores.push(score);
    }
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    o.fill(0.0);
    for (s, &w) in rows().zip(scores.iter()) {
        let p = w / sum;
        for (o, &v) in o.iter_mut().zip(&v_cache[s..s + d]) {
            *o += p * v;
        }
    }
}

/// [`attend`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn attend_avx2(one: &OneHead<'_>, scores: &mut Vec<f32>, o: &mut [f32]) {
    attend(one, scores, o);
}

/// A prefill chunk of one sequence, attended with GEMMs by [`chunk_attention`].
#[derive(Debug, Clone, Copy)]
pub struct Chunk<'a> {
    /// Index of the chunk's first token in the step.
    pub first_row: usize,
    /// Tokens in the chunk; they are the last `len` of the context.
    pub len: usize,
    /// Context length including the chunk.
    pub context_len: usize,
    /// The sequence's block table (validated to cover the context with in-range blocks).
    pub block_table: &'a [u32],
}

/// Query rows per task (bounds the score tile at `QUERY_TILE × context` floats).
const QUERY_TILE: usize = 64;

/// Copies one KV head's rows for positions `0..len` out of a paged cache into `[len × head_dim]`.
fn gather_head(cache: &[f32], chunk: &Chunk<'_>, kv_head: usize, dims: AttentionDims) -> Vec<f32> {
    let (d, bs) = (dims.head_dim, dims.block_size);
    let kv_dim = dims.num_kv_heads * d;
    let mut out = Vec::with_capacity(chunk.context_len * d);
    for &block in chunk.block_table {
        let base = block as usize * bs;
        for slot in base..base + bs {
            if out.len() == chunk.context_len * d {
                return out;
            }
            let s = slot * kv_dim + kv_head * d;
            out.extend_from_slice(&cache[s..s + d]);
        }
    }
    out
}

/// In place: `row = softmax(row * scale)`.
fn softmax_scaled(row: &mut [f32], scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for v in row.iter_mut() {
        *v *= scale;
        max = max.max(*v);
    }
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in row.iter_mut() {
        *v /= sum;
    }
}

/// Causal attention of one chunk: for each KV head and tile of query rows, `S = Q·Kᵀ` (GEMM),
/// masked softmax per row, `O = P·V` (GEMM), written into `out` (`[tokens × heads × head_dim]`).
pub fn chunk_attention(
    q: &[f32],
    caches: (&[f32], &[f32]),
    chunk: &Chunk<'_>,
    dims: AttentionDims,
    out: &mut [f32],
) {
    let AttentionDims {
        num_heads,
        num_kv_heads,
        head_dim: d,
        q_stride,
        ..
    } = dims;
    let group = num_heads / num_kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    let first_pos = chunk.context_len - chunk.len;
    let (keys, values): (Vec<Vec<f32>>, Vec<Vec<f32>>) = (0..num_kv_heads)
        .into_par_iter()
        .map(|h| {
            (
                gather_head(caches.0, chunk, h, dims),
                gather_head(caches.1, chunk, h, dims),
            )
        })
        .unzip();
    let tiles: Vec<(usize, usize)> = (0..num_kv_heads)
        .flat_map(|h| (0..chunk.len).step_by(QUERY_TILE).map(move |t| (h, t)))
        .collect();
    let results: Vec<Vec<f32>> = tiles
        .par_iter()
        .map(|&(kv_head, t0)| {
            let rows = QUERY_TILE.min(chunk.len - t0);
            // The tile's last query sits at position first_pos + t0 + rows - 1.
            let ctx = first_pos + t0 + rows;
            let mut scores = vec![0.0f32; rows * ctx];
            let mut o = vec![0.0f32; rows * group * d];
            for g in 0..group {
                let head = kv_head * group + g;
                let q_tile = MatRef {
                    data: &q[(chunk.first_row + t0) * q_stride + head * d..],
                    rows,
                    cols: d,
                    rs: q_stride,
                    cs: 1,
                };
                let k_t = MatRef {
                    data: &keys[kv_head],
                    rows: d,
                    cols: ctx,
                    rs: 1,
                    cs: d,
                };
                let s = MatMut {
                    data: &mut scores,
                    rows,
                    cols: ctx,
                    rs: ctx,
                    cs: 1,
                };
                gemm_into(s, q_tile, k_t, false);
                for (i, row) in scores.chunks_exact_mut(ctx).enumerate() {
                    let (live, masked) = row.split_at_mut(first_pos + t0 + i + 1);
                    softmax_scaled(live, scale);
                    masked.fill(0.0);
                }
                let p = MatRef {
                    data: &scores,
                    rows,
                    cols: ctx,
                    rs: ctx,
                    cs: 1,
                };
                let v = MatRef {
                    data: &values[kv_head],
                    rows: ctx,
                    cols: d,
                    rs: d,
                    cs: 1,
                };
                let dst = MatMut {
                    data: &mut o[g * d..],
                    rows,
                    cols: d,
                    rs: group * d,
                    cs: 1,
                };
                gemm_into(dst, p, v, false);
            }
            o
        })
        .collect();
    let width = group * d;
    for (&(kv_head, t0), o) in tiles.iter().zip(&results) {
        for (i, src) in o.chunks_exact(width).enumerate() {
            let row = chunk.first_row + t0 + i;
            let start = row * num_heads * d + kv_head * width;
            out[start..start + width].copy_from_slice(src);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_single_position_returns_v() {
        let d = 2;
        let k_cache = vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0];
        let v_cache = vec![0.0, 0.0, 5.0, -2.0, 0.0, 0.0];
        let table = [1u32];
        let tokens = [TokenContext {
            position: 0,
            block_table: &table,
            in_chunk: false,
        }];
        let dims = AttentionDims {
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: d,
            block_size: 1,
            q_stride: d,
        };
        let mut out = vec![0.0; 2];
        paged_attention(&[0.3, 0.7], (&k_cache, &v_cache), &tokens, dims, &mut out);
        assert_eq!(out, vec![5.0, -2.0]);
    }

    /// The AVX2 build of one head's attention is the same code in wider registers: the same bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_build_gives_the_portable_bits() {
        if !has_avx2() {
            eprintln!("SKIPPED: this CPU has no AVX2");
            return;
        }
        let (d, bs, kv_heads) = (67, 4, 2);
        let kv_dim = kv_heads * d;
        let cache = |seed: f32| -> Vec<f32> {
            (0..8 * bs * kv_dim)
                .map(|i| (i as f32 * 0.173 + seed).sin())
                .collect()
        };
        let (k_cache, v_cache) = (cache(0.3), cache(1.7));
        let q: Vec<f32> = (0..d).map(|i| (i as f32 * 0.41).cos()).collect();
        let table = [3u32, 1, 6, 2];
        let one = OneHead {
            q: &q,
            caches: (&k_cache, &v_cache),
            ctx: TokenContext {
                position: 13,
                block_table: &table,
                in_chunk: false,
            },
            kv_off: d,
            kv_dim,
            block_size: bs,
            scale: 0.125,
        };
        let (mut a, mut b) = (vec![0.0f32; d], vec![0.0f32; d]);
        attend(&one, &mut Vec::new(), &mut a);
        // SAFETY: the CPU was just found to have AVX2.
        unsafe { attend_avx2(&one, &mut Vec::new(), &mut b) };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b));
    }
}
