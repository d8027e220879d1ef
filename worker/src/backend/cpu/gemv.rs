//! Products of few rows (decode steps): the weight is streamed once, each band of it dotted with
//! every input row while it is in cache. A register tile of three weight rows × four input rows
//! (twelve accumulators) makes seven loads feed twelve multiply-adds.
//!
//! Each output element accumulates in eight lanes (lane `i` takes elements `8c + i`), the lanes
//! summed in order, the tail added sequentially — whatever the tile, so a row's result does not
//! depend on how many rows share its product: a sequence's logits are the same bits alone or in a
//! batch. On x86-64 CPUs with AVX2 and FMA the lanes are one register and accumulate with fused
//! multiply-adds (chosen at run time); elsewhere the same order in plain Rust, a product then a
//! sum, so the two builds differ in rounding, never in order.

use rayon::prelude::*;

/// Lanes of the accumulators (one AVX2 register of f32).
const LANES: usize = 8;

/// Weight rows per parallel task of [`gemv_rows`] (a multiple of the tile's three).
const ROWS_PER_TASK: usize = 24;

/// `a · b` with eight lane accumulators, in plain Rust (vectorises; the order is fixed, so results
/// are repeatable).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    Portable::tile::<1, 1>([a], [b])[0][0]
}

/// `out[j][r] = a[r] · w[j]` for a tile of `W` weight rows and `R` input rows, with the lane
/// arithmetic of the module doc. Every row must be at least `w[0].len()` long (that many elements
/// are read from each).
trait Tile {
    fn tile<const W: usize, const R: usize>(a: [&[f32]; R], w: [&[f32]; W]) -> [[f32; R]; W];
}

/// [`Tile`] in plain Rust: `acc + x · w`, a product then a sum.
struct Portable;

impl Tile for Portable {
    #[inline(always)]
    fn tile<const W: usize, const R: usize>(a: [&[f32]; R], w: [&[f32]; W]) -> [[f32; R]; W] {
        let k = w[0].len();
        let x = a.map(|row| row[..k].as_chunks::<LANES>());
        let y = w.map(|row| row[..k].as_chunks::<LANES>());
        let mut acc = [[[0.0f32; LANES]; R]; W];
        for c in 0..k / LANES {
            for (acc, (wc, _)) in acc.iter_mut().zip(&y) {
                for (acc, (xc, _)) in acc.iter_mut().zip(&x) {
                    for i in 0..LANES {
                        acc[i] += xc[c][i] * wc[c][i];
                    }
                }
            }
        }
        std::array::from_fn(|j| std::array::from_fn(|r| finish(&acc[j][r], x[r].1, y[j].1)))
    }
}

/// The lanes summed in order, plus the tail's sequential dot product.
#[inline(always)]
fn finish(lanes: &[f32; LANES], a_tail: &[f32], w_tail: &[f32]) -> f32 {
    let tail: f32 = a_tail.iter().zip(w_tail).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}

/// [`Tile`] with AVX2 registers and FMA. Only [`band_avx2`] uses it, on a CPU found to have both.
#[cfg(target_arch = "x86_64")]
struct Avx2Fma;

#[cfg(target_arch = "x86_64")]
impl Tile for Avx2Fma {
    #[inline(always)]
    fn tile<const W: usize, const R: usize>(a: [&[f32]; R], w: [&[f32]; W]) -> [[f32; R]; W] {
        // SAFETY: `Avx2Fma` is used only inside `band_avx2`, which runs only after
        // `is_x86_feature_detected!` found AVX2 and FMA, so the CPU has the instructions.
        unsafe { avx2_tile(a, w) }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn avx2_tile<const W: usize, const R: usize>(a: [&[f32]; R], w: [&[f32]; W]) -> [[f32; R]; W] {
    use std::arch::x86_64::{
        __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let k = w[0].len();
    let full = k / LANES * LANES;
    for row in a.iter().chain(&w) {
        assert!(row.len() >= k, "tile row shorter than the weight row");
    }
    let mut acc = [[_mm256_setzero_ps(); R]; W];
    let mut p = 0;
    while p < full {
        // SAFETY: `p + LANES <= full <= k <= row.len()` for every row (asserted above), so each
        // unaligned load reads 8 floats inside its slice.
        let wv: [__m256; W] =
            std::array::from_fn(|j| unsafe { _mm256_loadu_ps(w[j].as_ptr().add(p)) });
        for (r, row) in a.iter().enumerate() {
            // SAFETY: as above.
            let x = unsafe { _mm256_loadu_ps(row.as_ptr().add(p)) };
            for (acc, wv) in acc.iter_mut().zip(&wv) {
                acc[r] = _mm256_fmadd_ps(x, *wv, acc[r]);
            }
        }
        p += LANES;
    }
    std::array::from_fn(|j| {
        std::array::from_fn(|r| {
            let mut lanes = [0.0f32; LANES];
            // SAFETY: `lanes` holds exactly the 8 floats the unaligned store writes.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[j][r]) };
            finish(&lanes, &a[r][full..k], &w[j][full..k])
        })
    })
}

/// `out_t[j · m + i] = a_i · w_j` for one band of weight rows (`w_band`, `k` wide) and all `m` input
/// rows of `a`, in tiles of three weight rows × four input rows (two or one at the edges).
#[inline(always)]
fn band<T: Tile>(a: &[f32], w_band: &[f32], out_t: &mut [f32], m: usize, k: usize) {
    let n = w_band.len() / k;
    let row = |i: usize| &a[i * k..(i + 1) * k];
    let weight = |j: usize| &w_band[j * k..(j + 1) * k];
    macro_rules! tile {
        ($w:literal, $r:literal, $i:expr, $j:expr) => {{
            let t = T::tile::<$w, $r>(
                std::array::from_fn(|r| row($i + r)),
                std::array::from_fn(|q| weight($j + q)),
            );
            for (q, t) in t.iter().enumerate() {
                let at = ($j + q) * m + $i;
                out_t[at..at + $r].copy_from_slice(t);
            }
        }};
    }
    let mut i = 0;
    while i < m {
        let rows = match m - i {
            4.. => 4,
            2 | 3 => 2,
            _ => 1,
        };
        let mut j = 0;
        while j < n {
            let three = n - j >= 3;
            match (three, rows) {
                (true, 4) => tile!(3, 4, i, j),
                (true, 2) => tile!(3, 2, i, j),
                (true, _) => tile!(3, 1, i, j),
                (false, 4) => tile!(1, 4, i, j),
                (false, 2) => tile!(1, 2, i, j),
                (false, _) => tile!(1, 1, i, j),
            }
            j += if three { 3 } else { 1 };
        }
        i += rows;
    }
}

/// [`band`] compiled for AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn band_avx2(a: &[f32], w_band: &[f32], out_t: &mut [f32], m: usize, k: usize) {
    band::<Avx2Fma>(a, w_band, out_t, m, k);
}

/// [`band`], in its AVX2 + FMA build when the CPU has both.
fn band_dispatch(a: &[f32], w_band: &[f32], out_t: &mut [f32], m: usize, k: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: `band_avx2` needs only AVX2 and FMA, which the CPU was just found to support.
        unsafe { band_avx2(a, w_band, out_t, m, k) };
        return;
    }
    band::<Portable>(a, w_band, out_t, m, k);
}

/// `out[m × n] = a[m × k] · wᵀ` (`w` `[n × k]`) with dot products, on all cores: each task takes a
/// band of weight rows and dots every input row with it. The shapes are those
/// [`matmul_t`](super::ops::matmul_t) checked, with `m`, `k` and `n` all positive.
pub(super) fn gemv_rows(a: &[f32], w: &[f32], out: &mut [f32], (m, k, n): (usize, usize, usize)) {
    debug_assert!(m > 0 && k > 0 && n > 0, "matmul_t handles empty products");
    debug_assert!(a.len() == m * k && w.len() == n * k && out.len() == m * n);
    // Transposed result `[n × m]`, so each task writes one contiguous band.
    let mut out_t = vec![0.0f32; n * m];
    out_t
        .par_chunks_mut(ROWS_PER_TASK * m)
        .zip(w.par_chunks(ROWS_PER_TASK * k))
        .for_each(|(o, w_band)| band_dispatch(a, w_band, o, m, k));
    if m == 1 {
        out.copy_from_slice(&out_t);
        return;
    }
    // Back to `[m × n]`, a block of weight rows at a time so the reads stay in L1.
    const BLOCK: usize = 64;
    for (b, block) in out_t.chunks(BLOCK * m).enumerate() {
        let j0 = b * BLOCK;
        for i in 0..m {
            let dst = &mut out[i * n + j0..i * n + j0 + block.len() / m];
            for (d, src) in dst.iter_mut().zip(block.chunks_exact(m)) {
                *d = src[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_sequential_sum() {
        for n in [0, 1, 7, 8, 9, 64, 67] {
            let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
            let b: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
            let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert_eq!(dot(&a, &b), want, "n = {n}");
        }
    }

    fn product(m: usize, k: usize, n: usize, seed: f32) -> (Vec<f32>, Vec<f32>) {
        let a = (0..m * k).map(|i| (i as f32 * 0.37 + seed).sin()).collect();
        let w = (0..n * k).map(|i| (i as f32 * 0.11 - seed).cos()).collect();
        (a, w)
    }

    /// A row's result is the same bits whatever the number of rows beside it (batch invariance),
    /// for widths with and without a tail and weight counts that are and are not multiples of 3.
    #[test]
    fn every_row_count_gives_the_bits_of_one_row() {
        for (m, k, n) in [
            (3, 64, 17),
            (4, 9, 33),
            (5, 71, 16),
            (13, 200, 35),
            (16, 67, 49),
        ] {
            let (a, w) = product(m, k, n, 0.5);
            let mut out = vec![f32::NAN; m * n];
            gemv_rows(&a, &w, &mut out, (m, k, n));
            for i in 0..m {
                let mut alone = vec![f32::NAN; n];
                gemv_rows(&a[i * k..(i + 1) * k], &w, &mut alone, (1, k, n));
                for j in 0..n {
                    assert_eq!(
                        out[i * n + j].to_bits(),
                        alone[j].to_bits(),
                        "({m},{k},{n}) [{i},{j}]"
                    );
                }
            }
        }
    }

    /// The plain-Rust build computes exactly `dot`; the dispatched (AVX2 + FMA where present)
    /// build the same sums, within rounding.
    #[test]
    fn portable_build_is_dot_and_dispatched_build_agrees() {
        let (m, k, n) = (7, 131, 5);
        let (a, w) = product(m, k, n, 1.5);
        let (mut x, mut y) = (vec![0.0f32; n * m], vec![0.0f32; n * m]);
        band::<Portable>(&a, &w, &mut x, m, k);
        band_dispatch(&a, &w, &mut y, m, k);
        for j in 0..n {
            for i in 0..m {
                let want = dot(&a[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                assert_eq!(x[j * m + i].to_bits(), want.to_bits(), "[{i},{j}]");
                assert!(
                    (y[j * m + i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "[{i},{j}]"
                );
            }
        }
    }
}
