//! Paged causal attention with grouped-query heads, two ways: per token and head with dot products
//! (decode and short chunks), and per query chunk with GEMMs over the gathered context (prefill).

use rayon::prelude::*;

use super::ops::{MatMut, MatRef, dot, gemm_into};

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
    out.par_chunks_mut(d)
        .enumerate()
        .for_each_init(Vec::new, |scores: &mut Vec<f32>, (idx, o)| {
            let (t, head) = (idx / num_heads, idx % num_heads);
            let ctx = tokens[t];
            if ctx.in_chunk {
                return;
            }
            let q_row = &q[t * q_stride + head * d..t * q_stride + (head + 1) * d];
            let kv_off = (head / group) * d;
            // Offsets of the K/V rows of positions 0..=position, block by block.
            let rows = || {
                ctx.block_table
                    .iter()
                    .flat_map(move |&b| {
                        let base = b as usize * block_size;
                        (base..base + block_size).map(move |slot| slot * kv_dim + kv_off)
                    })
                    .take(ctx.position + 1)
            };
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for s in rows() {
                let score = dot(q_row, &k_cache[s..s + d]) * scale;
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
        });
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
}
