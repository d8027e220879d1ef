//! The FP8 MLP of a one-row step without a launch between its products: the gate/up tile GEMV with
//! SiLU·mul in its epilogue ([`gemv_fp8_silu`], `gemv_fp8_silu_*` in `kernels/src/fp8.cu`) and the
//! down tile GEMV that quantizes that bf16 output as it loads it ([`gemv_fp8_xq`],
//! `gemv_fp8_xq_*`). The pair gives the bits of the gate/up GEMV, `silu_mul_quant` and the down
//! GEMV: the row scale comes from each row's largest |h|, which the gate/up epilogue raises by
//! `atomicMax` in a buffer the norm before it zeroed (`ops::NormFp8::amax_reset`).

use cudarc::driver::PushKernelArg;
use kernels::params::{GemvFp8Params, GemvFp8SiluParams, GemvFp8XqParams};

use super::device::{Buf, DType, Gpu};
use super::fp8::{Fp8Linear, require_fp8};
use super::ops::{cfg, int, tile_grid};
use crate::backend::BackendError;
use crate::backend::switches::{FP8_TILE_LARGE, FP8_TILE_SMALL, Fp8GemvChoice};

/// Rows up to which the pair runs: one. Every block of the down product quantizes every row (each
/// warp its k span), work that grows with the rows where the launch it saves does not: on the 8B
/// shape (run 49, H100) the pair took a batch-1 step from 3.68 to 3.65 ms but a two-row step from
/// 3.79 to 3.82 ms. The kernels take up to [`FP8_XQ_SMEM_MAX`] bytes of codes, any rows.
pub const FP8_SILU_MAX_ROWS: usize = 1;

/// Bytes of shared memory the down product's codes may take (`m · k`): below the 48 KiB a launch
/// gets without opting in, beside the kernel's 8 KiB of static shared memory.
pub const FP8_XQ_SMEM_MAX: usize = 40 << 10;

/// The down product of [`gemv_fp8_silu`]'s output:
/// `y[b, n] = bf16(Σ_k code(h[b, k] / s_b) · code(w[n, k]) · s_b · w_scales[n])` with
/// `s_b = static_scale` when positive, else `max(amax[b] / 448, 1 / (448 · 512))`.
pub struct Fp8XqLinear<'a> {
    /// Bf16 `[m, k]`.
    pub h: &'a Buf,
    /// U32 `[m]`: each row's largest |h| as f32 bits.
    pub amax: &'a Buf,
    /// `> 0`: every row's scale (static activations); `0.0`: each row's own.
    pub static_scale: f32,
    /// U8 weight codes `[n, k]`.
    pub w: &'a Buf,
    /// F32 `[n]`.
    pub w_scales: &'a Buf,
    /// Bf16 `[m, n]`.
    pub y: &'a Buf,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Fp8XqLinear<'_> {
    fn check(&self) -> Result<(), BackendError> {
        self.h
            .check("fp8 down input", DType::Bf16, self.m * self.k)?;
        self.amax.check("fp8 row maxima", DType::U32, self.m)?;
        self.w.check("fp8 weight", DType::U8, self.n * self.k)?;
        self.w_scales
            .check("fp8 weight scales", DType::F32, self.n)?;
        self.y.check("fp8 y", DType::Bf16, self.m * self.n)?;
        if !(self.static_scale >= 0.0 && self.static_scale.is_finite()) {
            return Err(BackendError::InvalidBatch(format!(
                "gemv_fp8_xq: static scale {}",
                self.static_scale
            )));
        }
        Ok(())
    }

    /// Whether `gemv_fp8_xq_*` takes this product: 1 to [`FP8_SILU_MAX_ROWS`] rows whose codes
    /// fit [`FP8_XQ_SMEM_MAX`], `k` a multiple of 64, `n k` below 2^32, `h` and `w` 16-byte
    /// aligned.
    pub fn fits(&self) -> bool {
        (1..=FP8_SILU_MAX_ROWS).contains(&self.m)
            && self.m * self.k <= FP8_XQ_SMEM_MAX
            && self.k.is_multiple_of(64)
            && (self.n as u64) * (self.k as u64) < 1 << 32
            && self.h.ptr().is_multiple_of(16)
            && self.w.ptr().is_multiple_of(16)
    }
}

/// The tile variant `choice` runs a product of `weights` weights on, where the pair has it (one of
/// [`Fp8GemvChoice::Auto`]'s two).
fn variant(choice: Fp8GemvChoice, weights: usize) -> Option<&'static str> {
    choice
        .tile_for(weights)
        .filter(|k| [FP8_TILE_SMALL, FP8_TILE_LARGE].contains(k))
}

/// Whether the pair runs gate/up `gu` (`n` = 2 inter: gate rows, then up rows) and down `down`
/// under `choice`: both on a tile variant the pair has, `gu` with [`Fp8Linear::tiles_ok`] and an
/// inter a multiple of 8 (a tile holds 8 gate rows and their 8 up rows), `down` reading what
/// `gu` writes ([`Fp8XqLinear::fits`], `k` = inter, the same rows). `false`: run the gate/up
/// product, `silu_mul_quant` and the down product apart.
pub fn fits(gu: &Fp8Linear<'_>, down: &Fp8XqLinear<'_>, choice: Fp8GemvChoice) -> bool {
    gu.tiles_ok()
        && gu.n.is_multiple_of(16)
        && down.fits()
        && down.k == gu.n / 2
        && down.m == gu.m
        && variant(choice, gu.n * gu.k).is_some()
        && variant(choice, down.n * down.k).is_some()
}

/// The gate/up product `gu` with SiLU·mul in its epilogue: `h[m, n / 2]` = bf16(silu(gate) · up)
/// of the bf16 outputs `gu.y` would hold — `silu_mul_quant`'s h, bit for bit — and `amax[r]`
/// raised to row r's largest |h| (as f32 bits; NaN left out, as `silu_mul_quant` leaves it), which
/// must be zero before the launch. `gu.y` is not written.
pub fn gemv_fp8_silu(
    gpu: &Gpu,
    gu: &Fp8Linear<'_>,
    h: &Buf,
    amax: &Buf,
    choice: Fp8GemvChoice,
) -> Result<(), BackendError> {
    gu.check()?;
    let inter = gu.n / 2;
    h.check("fp8 SiLU·mul output", DType::Bf16, gu.m * inter)?;
    amax.check("fp8 row maxima", DType::U32, gu.m)?;
    let kernel = variant(choice, gu.n * gu.k)
        .filter(|_| gu.tiles_ok() && gu.n.is_multiple_of(16))
        .ok_or_else(|| {
            BackendError::InvalidBatch(format!(
                "gemv_fp8_silu {}: shape or alignment unsupported ({} x {} by {})",
                choice.name(),
                gu.m,
                gu.n,
                gu.k
            ))
        })?;
    require_fp8(gpu)?;
    if gu.m == 0 || gu.n == 0 {
        return Ok(());
    }
    let f = gpu.func(&format!("gemv_fp8_silu_{kernel}"))?;
    let grid = (tile_grid(gpu, f, gu.n / 16, 0)?, 1, 1);
    let p = GemvFp8SiluParams {
        g: gu.params()?,
        h: h.ptr(),
        amax: amax.ptr(),
    };
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&p);
    // SAFETY: as gemv_fp8_tiles' launch for the product (gu checked; tiles_ok and m > 0 above:
    // 1 <= m <= 8, k a multiple of 64, n*k < 2^32, 16-byte aligned x and w), with n a multiple
    // of 16: tile i's rows 8i + r and n/2 + 8i + r (r < 8) are < n, and the n / 16 tiles cover
    // every row once. The epilogue reads x_scales[bb] and w_scales[row] for bb < m, row < n, writes h[bb, 8i + r]
    // (< m * n/2, checked) and raises amax[bb] (< m, checked); warps 0 and 1 take it whole, so
    // their shuffles have every lane.
    unsafe { b.launch(cfg(grid, kernels::GEMV_THREADS, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// The down product `l` of [`gemv_fp8_silu`]'s output ([`Fp8XqLinear`]): the bits of
/// `silu_mul_quant` followed by the tile GEMV, in one launch.
pub fn gemv_fp8_xq(
    gpu: &Gpu,
    l: &Fp8XqLinear<'_>,
    choice: Fp8GemvChoice,
) -> Result<(), BackendError> {
    l.check()?;
    let kernel = variant(choice, l.n * l.k)
        .filter(|_| l.fits())
        .ok_or_else(|| {
            BackendError::InvalidBatch(format!(
                "gemv_fp8_xq {}: shape or alignment unsupported ({} x {} by {})",
                choice.name(),
                l.m,
                l.n,
                l.k
            ))
        })?;
    require_fp8(gpu)?;
    if l.n == 0 {
        return Ok(());
    }
    let f = gpu.func(&format!("gemv_fp8_xq_{kernel}"))?;
    let smem = l.m * l.k;
    let grid = (tile_grid(gpu, f, l.n.div_ceil(16), smem)?, 1, 1);
    let p = GemvFp8XqParams {
        g: GemvFp8Params {
            x: 0,
            x_scales: 0,
            w: l.w.ptr(),
            w_scales: l.w_scales.ptr(),
            y: l.y.ptr(),
            b: int(l.m, "m")?,
            n: int(l.n, "n")?,
            k: int(l.k, "k")?,
            pad: 0,
        },
        h: l.h.ptr(),
        amax: l.amax.ptr(),
        static_scale: l.static_scale,
        pad: 0,
    };
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&p);
    // SAFETY: as gemv_fp8_tiles' launch, with x read from shared memory: check() gave h >= m*k
    // bf16, amax >= m words, w >= n*k bytes, w_scales >= n floats, y >= m*n bf16; fits() gave
    // 1 <= m <= FP8_SILU_MAX_ROWS, k a multiple of 64, n*k < 2^32 and 16-byte aligned h and w. Each warp reads
    // h[r, 64 s .. 64 s + 64) for rows r < m and its steps s < k / 64 in 16-byte loads and writes
    // their codes to shared bytes r*k + 64 s .., inside the m*k (<= FP8_XQ_SMEM_MAX, below the
    // 48 KiB default limit with the kernel's static 8 KiB) requested here, then reads back only
    // its own span (ordered by __syncwarp); the epilogue reads amax[bb] for bb < m.
    unsafe { b.launch(cfg(grid, kernels::GEMV_THREADS, smem)) }
        .map(|_| ())
        .map_err(BackendError::from)
}
