//! The f32 kernels of the CPU backend: GEMM (the `gemm` crate), RMSNorm, RoPE, SiLU·mul and paged
//! attention. Each matches transformers' float32 Llama code op for op.

use gemm::Parallelism;
use rayon::prelude::*;

/// `out[m × n] = a[m × k] · wᵀ`, with `w` an HF linear weight `[n × k]` (row-major), on all cores.
///
/// # Panics
/// When a slice's length disagrees with the dimensions (a bug in the caller, never input data).
pub fn matmul_t(a: &[f32], w: &[f32], out: &mut [f32], (m, k, n): (usize, usize, usize)) {
    assert_eq!(a.len(), m * k, "lhs length");
    assert_eq!(w.len(), n * k, "weight length");
    assert_eq!(out.len(), m * n, "output length");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let (mi, ki, ni) = (m as isize, k as isize, n as isize);
    debug_assert!(mi > 0 && ki > 0 && ni > 0);
    // SAFETY: the asserts above prove `out` holds m·n elements, `a` m·k and `w` n·k. With the strides
    // given, gemm reads lhs[i][p] at a + i·k + p (i < m, p < k), rhs[p][j] = w[j][p] at w + j·k + p
    // (j < n), and writes dst[i][j] at out + i·n + j: all in bounds. `out` is borrowed mutably, so it
    // aliases neither input. `read_dst` is false, so `out`'s old contents are never read.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            ni,
            false,
            a.as_ptr(),
            1,
            ki,
            w.as_ptr(),
            ki,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            Parallelism::Rayon(0),
        );
    }
}

/// HF `LlamaRMSNorm` in f32: `w * (x / sqrt(mean(x²) + eps))`, row by row (`x` is `[rows × w.len()]`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let h = weight.len();
    out.par_chunks_mut(h)
        .zip(x.par_chunks(h))
        .for_each(|(o, row)| {
            let sum_sq: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let variance = (sum_sq / h as f64) as f32;
            let inv = 1.0 / (variance + eps).sqrt();
            for ((o, &v), &w) in o.iter_mut().zip(row).zip(weight) {
                *o = w * (v * inv);
            }
        });
}

/// Rotates every head of one token in place, HF's `rotate_half` way: pair `(x[i], x[i + d/2])`
/// turns by the angle whose cosine and sine are `cos[i]`, `sin[i]`.
pub fn rope_in_place(heads: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for head in heads.chunks_exact_mut(head_dim) {
        let (lo, hi) = head.split_at_mut(half);
        for i in 0..half {
            let (a, b) = (lo[i], hi[i]);
            lo[i] = a * cos[i] - b * sin[i];
            hi[i] = b * cos[i] + a * sin[i];
        }
    }
}

/// Cosines and sines of every token's angles, `[tokens × head_dim/2]` each.
pub fn rope_tables(positions: &[u32], inv_freq: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut cos = Vec::with_capacity(positions.len() * inv_freq.len());
    let mut sin = Vec::with_capacity(positions.len() * inv_freq.len());
    for &p in positions {
        for &f in inv_freq {
            // f32 product, as HF's `inv_freq @ position_ids` in float32.
            let angle = p as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

/// `out = silu(gate) * up` for rows laid out `[gate (inter) | up (inter)]` in `gate_up`.
pub fn silu_mul(gate_up: &[f32], inter: usize, out: &mut [f32]) {
    out.par_chunks_mut(inter)
        .zip(gate_up.par_chunks(2 * inter))
        .for_each(|(o, gu)| {
            let (gate, up) = gu.split_at(inter);
            for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
                *o = g / (1.0 + (-g).exp()) * u;
            }
        });
}

/// Where one query token reads its context from.
#[derive(Debug, Clone, Copy)]
pub struct TokenContext<'a> {
    /// Absolute position; the token attends to positions `0..=position`.
    pub position: usize,
    /// Its sequence's block table (validated to cover `0..=position` with in-range blocks).
    pub block_table: &'a [u32],
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

/// Dot product with eight independent partial sums, so the compiler can keep them in SIMD lanes (a
/// plain `sum()` of f32 must run strictly in order and stays scalar).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 8;
    let mut acc = [0.0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a_chunks.zip(b_chunks) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_naive() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut out = vec![f32::NAN; m * n];
        matmul_t(&a, &w, &mut out, (m, k, n));
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|p| a[i * k + p] * w[j * k + p]).sum();
                assert!((out[i * n + j] - want).abs() < 1e-5, "({i},{j})");
            }
        }
    }

    #[test]
    fn dot_matches_sequential_sum() {
        for n in [0, 1, 7, 8, 9, 64, 67] {
            let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
            let b: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
            let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert_eq!(dot(&a, &b), want, "n = {n}");
        }
    }

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let w = [1.0f32, 2.0, 1.0, 1.0];
        let mut out = [0.0f32; 4];
        rms_norm(&x, &w, 0.0, &mut out);
        // rms = sqrt(25 / 4) = 2.5
        assert_eq!(out, [1.2, 3.2, 0.0, 0.0]);
    }

    #[test]
    fn rope_rotates_half_pairs() {
        let mut x = [1.0f32, 2.0, 3.0, 4.0]; // pairs (1, 3) and (2, 4)
        let (cos, sin) = ([0.0f32, 1.0], [1.0f32, 0.0]);
        rope_in_place(&mut x, 4, &cos, &sin);
        // pair 0 turns by 90°: (1, 3) -> (-3, 1); pair 1 is unchanged.
        assert_eq!(x, [-3.0, 2.0, 1.0, 4.0]);
    }

    #[test]
    fn attention_single_position_returns_v() {
        let d = 2;
        let k_cache = vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0];
        let v_cache = vec![0.0, 0.0, 5.0, -2.0, 0.0, 0.0];
        let table = [1u32];
        let tokens = [TokenContext {
            position: 0,
            block_table: &table,
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
