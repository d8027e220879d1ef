//! The INT4 tile GEMV with the launch after it folded into its epilogue: the q/k/v product with
//! RoPE and the paged KV write ([`gemv_int4_rope_kv`], `gemv_int4_rope_kv_t16_*`), and the
//! gate/up product with SiLU·mul ([`gemv_int4_silu`], `gemv_int4_silu_t16_*`). Each gives the
//! bits of the plain tile kernel followed by `rope_kv_write` or `silu_mul`: a tile holds both
//! halves of every rotation pair (or a gate row and its up row), rounds each sum to bf16 as the
//! product's output would hold it, and finishes it as the second kernel does.

use cudarc::driver::PushKernelArg;
use kernels::params::{GemvInt4RopeParams, GemvInt4SiluParams};

use super::{Int4Linear, TILE_KERNELS, TileKernel, tile_step};
use crate::backend::BackendError;
use crate::backend::cuda::device::{Buf, DType, Gpu};
use crate::backend::cuda::ops::{RopeKv, cfg, tile_grid};

/// The tile kernel of `l`'s shape (its k-step and rows), if the tile family takes it at all and
/// in one launch (1 to [`TILE_MAX_BATCH`](super::TILE_MAX_BATCH) rows).
fn tile_kernel(l: &Int4Linear<'_>) -> Option<&'static TileKernel> {
    let ks = tile_step(l.s, l.k)?;
    TILE_KERNELS
        .iter()
        .find(|t| t.ks == ks && (1..=t.batch).contains(&l.m))
}

/// `kernel`'s fused twin: `gemv_int4_{kind}_t16_*`.
fn fused_name(kernel: &TileKernel, kind: &str) -> String {
    kernel
        .name
        .replacen("gemv_int4_t16", &format!("gemv_int4_{kind}_t16"), 1)
}

/// Whether [`gemv_int4_rope_kv`] takes the q/k/v product `l` (its input already permuted for act
/// order) and the RoPE `a`: 1 to [`TILE_MAX_BATCH`](super::TILE_MAX_BATCH) tokens on a tile
/// kernel, bf16, a head size that is a multiple of 16, the whole fused width, and a scaled output.
pub fn rope_fits(l: &Int4Linear<'_>, a: &RopeKv<'_>) -> bool {
    tile_kernel(l).is_some()
        && a.qkv.dtype() == DType::Bf16
        && a.d.is_multiple_of(16)
        && l.m == a.n
        && l.n == (a.hq + 2 * a.hkv) * a.d
        && a.raw_scales.is_none()
}

/// The q/k/v product `l` and `rope_kv_write` of its output in one launch (`l.y` and `a.qkv` are
/// not written): the bits of [`super::gemv_int4`]'s tile kernel followed by `rope_kv_write`.
///
/// # Safety
/// As `rope_kv_write`: every one of the first `n` slots is `< k_cache.len() / (hkv * d)` (or
/// negative: skipped).
pub unsafe fn gemv_int4_rope_kv(
    gpu: &Gpu,
    l: &Int4Linear<'_>,
    a: &RopeKv<'_>,
) -> Result<(), BackendError> {
    l.check()?;
    let (_, rope) = a.params()?;
    let kernel = tile_kernel(l).filter(|_| rope_fits(l, a)).ok_or_else(|| {
        BackendError::InvalidBatch(format!(
            "gemv_int4_rope_kv: shape or groups unsupported ({} x {} by {}, groups of {}, d {})",
            l.m, l.n, l.k, l.s.group_size, a.d
        ))
    })?;
    let f = gpu.func(&fused_name(kernel, "rope_kv"))?;
    let grid = (tile_grid(gpu, f, l.n / 16, 0)?, 1, 1);
    let p = GemvInt4RopeParams {
        g: l.params(l.y, 0, l.m)?,
        rope,
    };
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&p);
    // SAFETY: as launch_tile's launch for the product (l checked, tile_kernel: the kernel's k-step
    // is tile_step's and 1 <= m <= its batch), with n = (hq + 2 hkv) d and d a multiple of 16, so
    // tile i's rows — head i / (d/16), dims 8 (i % (d/16)) + 0..8 and the same + d/2 — are < n,
    // the n / 16 tiles cover every row once, and each row's tile-scale words (its 16-row tile
    // < ceil(n / 16), group < groups) are inside the array check() measured. The epilogue is
    // rope_kv_write's for token b < m = a.n, head < hq + 2 hkv and pair j < d/2, whose buffers
    // a.params() checked; cache slots are the caller's promise.
    unsafe { b.launch(cfg(grid, kernels::GEMV_THREADS, 0)) }?;
    Ok(())
}

/// Whether [`gemv_int4_silu`] takes the gate/up product `l` (`n` = 2 inter, gate rows then up
/// rows): 1 to [`TILE_MAX_BATCH`](super::TILE_MAX_BATCH) rows on a tile kernel, `inter` a
/// multiple of 8.
pub fn silu_fits(l: &Int4Linear<'_>) -> bool {
    l.n.is_multiple_of(16) && tile_kernel(l).is_some()
}

/// The gate/up product `l` and `silu_mul` of its output in one launch: `h[m, n / 2] =
/// bf16(silu(gate) · up)` from the bf16 values the product would store (`l.y` is not written).
pub fn gemv_int4_silu(gpu: &Gpu, l: &Int4Linear<'_>, h: &Buf) -> Result<(), BackendError> {
    l.check()?;
    h.check("int4 silu output", DType::Bf16, l.m * l.n / 2)?;
    let kernel = tile_kernel(l).filter(|_| silu_fits(l)).ok_or_else(|| {
        BackendError::InvalidBatch(format!(
            "gemv_int4_silu: shape or groups unsupported ({} x {} by {}, groups of {})",
            l.m, l.n, l.k, l.s.group_size
        ))
    })?;
    let f = gpu.func(&fused_name(kernel, "silu"))?;
    let grid = (tile_grid(gpu, f, l.n / 16, 0)?, 1, 1);
    let p = GemvInt4SiluParams {
        g: l.params(l.y, 0, l.m)?,
        h: h.ptr(),
    };
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&p);
    // SAFETY: as launch_tile's launch for the product (l checked, tile_kernel: the kernel's k-step
    // is tile_step's and 1 <= m <= its batch), with n a multiple of 16, so tile i's rows — gate
    // rows 8i .. 8i + 7 and up rows n/2 + 8i .. — are < n, the n / 16 tiles cover every row once,
    // and each row's tile-scale words are inside the array check() measured. The epilogue writes
    // h[b, 8i + r] for b < m, 8i + r < n / 2: inside the m · n / 2 values checked above.
    unsafe { b.launch(cfg(grid, kernels::GEMV_THREADS, 0)) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tile_kernel_has_both_fused_twins() {
        for t in &TILE_KERNELS {
            for kind in ["rope_kv", "silu"] {
                let name = fused_name(t, kind);
                assert!(kernels::KERNELS.contains(&name.as_str()), "{name}");
                assert!(kernels::PDL_KERNELS.contains(&name.as_str()), "{name}");
            }
        }
    }
}
