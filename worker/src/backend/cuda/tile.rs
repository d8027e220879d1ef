//! The bf16 tile product (`gemm_bf16_tile_b<B>_s<S>`, `kernels/src/gemm_tile.cu`) for decode steps
//! of more rows than the GEMV takes: the weights stream straight into the mma's A operand, the
//! step's rows are its B operand, and where a product's output tiles alone are too few blocks for
//! the GPU its k-range is split over a thread-block cluster whose blocks add their sums up in
//! distributed shared memory (no partial sums in global memory, no second launch).

use cudarc::driver::PushKernelArg;

use super::device::{DType, Gpu};
use super::ops::{Linear, cfg, dim, int};
use crate::backend::BackendError;

/// Most rows [`gemm_tile`] takes (the largest of [`kernels::GEMM_TILE_BATCHES`]: one block row).
pub const TILE_MAX_ROWS: usize = 64;

/// Whether the tile product can run `l` on `gpu`: compute capability 9.0 or later (clusters),
/// bf16 weights, activations and output, 1 to [`TILE_MAX_ROWS`] rows, `k` a multiple of 16 below
/// 2^30, `x` and `w` 16-byte aligned (so every row of both is).
pub fn tile_ok(gpu: &Gpu, l: &Linear<'_>) -> bool {
    gpu.capability.0 >= 9
        && [l.w.dtype(), l.x.dtype(), l.y.dtype()] == [DType::Bf16; 3]
        && (1..=TILE_MAX_ROWS).contains(&l.m)
        && l.k.is_multiple_of(16)
        && l.k < 1 << 30
        && l.x.ptr().is_multiple_of(16)
        && l.w.ptr().is_multiple_of(16)
}

/// The activation rows a block of the kernel for `m` rows takes: the smallest of
/// [`kernels::GEMM_TILE_BATCHES`] holding `m`, else the largest.
pub fn tile_batch(m: usize) -> usize {
    let batches = kernels::GEMM_TILE_BATCHES;
    batches
        .iter()
        .copied()
        .find(|&b| b >= m)
        .unwrap_or(batches[batches.len() - 1])
}

/// Fraction of the GPU's block slots over whole waves that [`tile_splits`] takes as filled
/// enough: fewer splits mean longer k ranges, whose two-step register ring fills and drains less
/// often, and no cross-block sum.
pub const TILE_FILL: f64 = 0.7;

/// How many k ranges (cluster blocks, one of [`kernels::GEMM_TILE_SPLITS`]) an `m x n x k`
/// product is split into on `sms` SMs: the fewest whose blocks fill at least [`TILE_FILL`] of the
/// block slots (two an SM) over whole waves, else the one that fills most, keeping at least 8
/// k-steps of 64 a range (the register ring runs two steps ahead).
pub fn tile_splits((m, n, k): (usize, usize, usize), sms: usize) -> usize {
    let blocks = n.div_ceil(kernels::GEMM_TILE_ROWS) * m.div_ceil(tile_batch(m));
    let steps = k.div_ceil(64);
    let slots = (2 * sms).max(1);
    let mut best = (1, 0.0);
    for s in kernels::GEMM_TILE_SPLITS {
        if s > 1 && steps / s < 8 {
            break;
        }
        let b = blocks * s;
        let fill = b as f64 / (b.div_ceil(slots) * slots) as f64;
        if fill >= TILE_FILL {
            return s;
        }
        if fill > best.1 {
            best = (s, fill);
        }
    }
    best.0
}

/// `y = x · wᵀ` on the tile product, k split [`tile_splits`] ways, or `splits` ways when given
/// (one of [`kernels::GEMM_TILE_SPLITS`]; for measuring).
pub fn gemm_tile(gpu: &Gpu, l: &Linear<'_>, splits: Option<usize>) -> Result<(), BackendError> {
    l.check()?;
    if !tile_ok(gpu, l) {
        return Err(BackendError::InvalidBatch(format!(
            "gemm_tile: {} x {} x {} ({:?} weights, {:?} out, sm {}.{}) is not a shape, type or \
             device the tile product takes",
            l.m,
            l.n,
            l.k,
            l.w.dtype(),
            l.y.dtype(),
            gpu.capability.0,
            gpu.capability.1
        )));
    }
    let splits = splits.unwrap_or_else(|| tile_splits((l.m, l.n, l.k), gpu.sms));
    if !kernels::GEMM_TILE_SPLITS.contains(&splits) {
        return Err(BackendError::InvalidBatch(format!(
            "gemm_tile: no kernel splits k {splits} ways"
        )));
    }
    if l.n == 0 {
        return Ok(());
    }
    let batch = tile_batch(l.m);
    let steps = l.k.div_ceil(64).div_ceil(splits).max(1);
    let p = kernels::params::GemmTileParams {
        x: l.x.ptr(),
        w: l.w.ptr(),
        y: l.y.ptr(),
        b: int(l.m, "m")?,
        n: int(l.n, "n")?,
        k: int(l.k, "k")?,
        steps: int(steps, "steps")?,
    };
    let name = format!("gemm_bf16_tile_b{batch}_s{splits}");
    let grid = (
        dim(l.n.div_ceil(kernels::GEMM_TILE_ROWS), "n")?,
        dim(l.m.div_ceil(batch), "m")?,
        dim(splits, "splits")?,
    );
    let mut b = gpu.stream.launch_builder(gpu.func(&name)?);
    b.arg(&p);
    // SAFETY: check() gave w >= n*k, x >= m*k and y >= m*n bf16 elements (tile_ok: all three
    // bf16), x and w 16-byte aligned with k a multiple of 16, so every row of both starts 16-byte
    // aligned; k < 2^30 keeps the kernel's int element offsets in range. With R =
    // GEMM_TILE_ROWS and X = batch (the kernel's B), block (bx, by, bz) reads weight rows
    // min(R bx + r, n - 1) at elements 64 s + 16 t (+16) only where 64 s + 16 t < k (so the whole
    // 16 lie inside the row), x rows min(X by + r, m - 1) at 16-byte chunks 64 s + 8 c < k only
    // (the others zero-filled, reading nothing), and stores y[bb, r] only for bb < m, r < n.
    // Steps [bz steps, +steps) are clipped to ceil(k / 64). The grid's z extent is `splits`, the
    // kernel's compile-time cluster size along z (1 for `_s1`), so every cluster is the splits of
    // one output tile, and every thread of every block reaches both cluster barriers (the step
    // loop is the same for the whole cluster's blocks, empty ranges included). tile_ok checked
    // compute capability 9.0+, where clusters exist. Shared memory is static (at most 32 KiB,
    // asserted in the kernel); the kernel assumes 32 GEMM_TILE_WARPS threads.
    unsafe { b.launch(cfg(grid, 32 * kernels::GEMM_TILE_WARPS as u32, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_and_splits_follow_the_shape() {
        assert_eq!(tile_batch(9), 16);
        assert_eq!(tile_batch(16), 16);
        assert_eq!(tile_batch(17), 32);
        assert_eq!(tile_batch(64), 64);
        assert_eq!(tile_batch(65), 64);
        // 8B shapes on 132 SMs (264 block slots), 32 rows: o and down (32 tiles) split 8 ways
        // (256 blocks, 97 % of a wave); q/k/v (48 tiles) 4 (192 blocks, 73 %); gate/up (224
        // tiles, 85 %) not at all.
        assert_eq!(tile_splits((32, 4096, 4096), 132), 8);
        assert_eq!(tile_splits((32, 4096, 14336), 132), 8);
        assert_eq!(tile_splits((32, 6144, 4096), 132), 4);
        assert_eq!(tile_splits((32, 28672, 4096), 132), 1);
        assert_eq!(tile_splits((64, 28672, 4096), 132), 1);
        // Few k-steps: no split leaves a range under 8 steps.
        assert_eq!(tile_splits((32, 4096, 512), 132), 1);
        assert_eq!(tile_splits((32, 4096, 1024), 132), 2);
    }
}
