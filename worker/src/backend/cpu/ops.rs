//! The f32 kernels of the CPU backend: GEMM (the `gemm` crate), RMSNorm, RoPE and SiLU·mul. Each
//! matches transformers' float32 Llama code op for op.

use gemm::Parallelism;
use rayon::prelude::*;

use super::gemv;

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
    if m <= GEMV_MAX_ROWS {
        gemv::gemv_rows(a, w, out, (m, k, n));
        return;
    }
    let dst = MatMut {
        data: out,
        rows: m,
        cols: n,
        rs: n,
        cs: 1,
    };
    let lhs = MatRef {
        data: a,
        rows: m,
        cols: k,
        rs: k,
        cs: 1,
    };
    // rhs[p][j] = w[j][p]: the weight read transposed.
    let rhs = MatRef {
        data: w,
        rows: k,
        cols: n,
        rs: 1,
        cs: k,
    };
    gemm_into(dst, lhs, rhs, true);
}

/// A strided read-only matrix: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

/// A strided output matrix: element `(i, j)` is `data[i * rs + j]`, rows not overlapping
/// (`rs >= cols`), so no two elements share memory.
#[derive(Debug)]
pub struct MatMut<'a> {
    pub data: &'a mut [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

/// Whether every element `(i, j)` of a `rows × cols` view with strides `rs`, `cs` lies in `0..len`
/// and the strides fit in `isize`.
fn view_fits(len: usize, (rows, cols): (usize, usize), (rs, cs): (usize, usize)) -> bool {
    if isize::try_from(rs).is_err() || isize::try_from(cs).is_err() {
        return false;
    }
    if rows == 0 || cols == 0 {
        return true;
    }
    (rows - 1)
        .checked_mul(rs)
        .zip((cols - 1).checked_mul(cs))
        .and_then(|(a, b)| a.checked_add(b))
        .is_some_and(|last| last < len)
}

/// `dst = lhs · rhs` with the `gemm` crate, on all cores when `parallel`.
///
/// # Panics
/// When the shapes disagree or a view does not fit its slice (a caller bug, never input data).
pub fn gemm_into(dst: MatMut<'_>, lhs: MatRef<'_>, rhs: MatRef<'_>, parallel: bool) {
    let (m, n, k) = (dst.rows, dst.cols, lhs.cols);
    assert!(
        lhs.rows == m && rhs.rows == k && rhs.cols == n,
        "gemm shapes"
    );
    assert!(
        view_fits(lhs.data.len(), (m, k), (lhs.rs, lhs.cs)),
        "gemm lhs view"
    );
    assert!(
        view_fits(rhs.data.len(), (k, n), (rhs.rs, rhs.cs)),
        "gemm rhs view"
    );
    assert!(
        dst.cs == 1 && dst.rs >= n && view_fits(dst.data.len(), (m, n), (dst.rs, 1)),
        "gemm dst view"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for row in dst.data.chunks_mut(dst.rs).take(m) {
            row[..n].fill(0.0);
        }
        return;
    }
    let parallelism = if parallel {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    };
    // Strides fit in isize (checked by `view_fits`).
    let s = |x: usize| x as isize;
    // SAFETY: `view_fits` proved that every element gemm touches, lhs (i, p) at i·rs + p·cs for
    // i < m, p < k, rhs (p, j) for p < k, j < n, and dst (i, j) at i·rs + j for i < m, j < n, lies
    // inside its slice. dst's rows do not overlap (`cs == 1`, `rs >= n`), so no element is written
    // twice (no race between gemm's threads). `dst.data` is a unique borrow, so it aliases neither
    // input. `read_dst` is false: dst's old contents are never read.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr(),
            1,
            s(dst.rs),
            false,
            lhs.data.as_ptr(),
            s(lhs.cs),
            s(lhs.rs),
            rhs.data.as_ptr(),
            s(rhs.cs),
            s(rhs.rs),
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Up to this many rows, [`matmul_t`] streams the weight once with dot products
/// ([`gemv::gemv_rows`]) instead of calling GEMM, which would first copy (pack) the whole weight:
/// decode steps are bandwidth-bound.
const GEMV_MAX_ROWS: usize = 16;

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
    fn gemv_path_matches_naive() {
        for m in 1..=GEMV_MAX_ROWS + 1 {
            let (k, n) = (37, 70);
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.21).sin()).collect();
            let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.07).cos()).collect();
            let mut out = vec![f32::NAN; m * n];
            matmul_t(&a, &w, &mut out, (m, k, n));
            for i in 0..m {
                for j in 0..n {
                    let want: f32 = (0..k).map(|p| a[i * k + p] * w[j * k + p]).sum();
                    assert!((out[i * n + j] - want).abs() < 1e-5, "m {m} ({i},{j})");
                }
            }
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
}
