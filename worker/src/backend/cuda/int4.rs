//! INT4 linear layers on CUDA: a checkpoint's [`Int4Weight`] repacked at load into the layout of
//! `kernels/src/int4.cu` (codes in the order its dequantization wants, one `(s_hi, s_lo)` bf16
//! pair per group and row so that `s_hi + s_lo` is the stored scale exactly, act-order layers'
//! columns sorted by group), and the launches: the small-batch GEMVs, the tensor-core product of
//! larger batches (mma.sync, or wgmma on Hopper), whole-matrix dequantization to bf16 for cuBLAS,
//! and the activation permutation act order needs.

use half::bf16;
use rayon::prelude::*;

use super::device::{Buf, DType, Gpu};
use cudarc::driver::PushKernelArg;

use super::ops::{cfg, dim, int, tile_grid};
use crate::backend::BackendError;
use crate::quant::int4::Int4Weight;

mod fused;
mod wgmma;
pub use fused::{gemv_int4_rope_kv, gemv_int4_silu, rope_fits, silu_fits};
pub use wgmma::{
    WGMMA_KERNELS, WgmmaKernel, WgmmaKernels, launch_wgmma, wgmma_fits, wgmma_kernel, wgmma_select,
    wgmma_splits,
};

/// Where int4.cu's dequantization wants code `8c + ORDER[p]` of a word: bits `4p .. 4p + 4`.
const KERNEL_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// A weight in int4.cu's layout, on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Packed {
    pub n: usize,
    pub k: usize,
    pub group_size: usize,
    pub groups: usize,
    /// `[n, k / 8]`.
    pub words: Vec<u32>,
    /// `[n, groups]`: bf16 `s_hi` bits low, `s_lo` high.
    pub scales: Vec<u32>,
    /// `[n, groups]`.
    pub zeros: Vec<u8>,
    /// Act order: packed column `j` is the layer's input column `perm[j]`.
    pub perm: Option<Vec<u32>>,
    /// `[n, groups]` offsets (GGUF `Q4_1`), for the `*_min` kernels.
    pub mins: Option<Vec<f32>>,
    /// The tile kernels' scales and zeros where they take the weight ([`tile_scales`]).
    pub tile_scales: Option<Vec<u32>>,
}

/// `s` as `s_hi + s_lo`, two bf16 values whose sum is `s` exactly for any f16 scale (and any
/// bf16 one, with `s_lo = 0`).
pub fn split_scale(s: f32) -> (bf16, bf16) {
    let hi = bf16::from_f32(s);
    (hi, bf16::from_f32(s - hi.to_f32()))
}

/// Repacks `w` for int4.cu: input width a multiple of 32, group size a multiple of 32; with
/// `g_idx`, its columns sorted by group (stable), which must leave every group `group_size`
/// contiguous columns (the last may be shorter), as GPTQ's act order writes them.
pub fn pack(w: &Int4Weight) -> Result<Int4Packed, String> {
    let (n, k, gs) = (w.rows, w.cols, w.group_size);
    if !k.is_multiple_of(32) || !gs.is_multiple_of(32) {
        return Err(format!(
            "INT4 on CUDA needs the input width ({k}) and group size ({gs}) to be multiples of 32"
        ));
    }
    let groups = w.groups();
    let perm: Option<Vec<u32>> = w.g_idx.as_ref().map(|g| {
        let mut p: Vec<u32> = (0..k as u32).collect();
        p.sort_by_key(|&c| g[c as usize]);
        p
    });
    if let (Some(p), Some(g)) = (&perm, &w.g_idx)
        && let Some(j) = (0..k).find(|&j| g[p[j] as usize] as usize != j / gs)
    {
        return Err(format!(
            "g_idx puts {} columns before group {}'s first: each group must hold group_size \
             ({gs}) columns",
            j, g[p[j] as usize]
        ));
    }
    let col = |j: usize| perm.as_ref().map_or(j, |p| p[j] as usize);
    let mut words = vec![0u32; n * k / 8];
    words
        .par_chunks_mut((k / 8).max(1))
        .enumerate()
        .for_each(|(r, out)| {
            let codes = &w.codes[r * k..][..k];
            for (c, word) in out.iter_mut().enumerate() {
                for (p, &o) in KERNEL_ORDER.iter().enumerate() {
                    *word |= u32::from(codes[col(8 * c + o)] & 0xf) << (4 * p);
                }
            }
        });
    let scales = w
        .scales
        .iter()
        .map(|&s| {
            let (hi, lo) = split_scale(s);
            u32::from(hi.to_bits()) | (u32::from(lo.to_bits()) << 16)
        })
        .collect();
    let tile_scales = (w.mins.is_none() && tile_step_for(k, gs).is_some())
        .then(|| tile_scales(n, groups, &w.scales, &w.zeros))
        .flatten();
    Ok(Int4Packed {
        n,
        k,
        group_size: gs,
        groups,
        words,
        scales,
        zeros: w.zeros.clone(),
        perm,
        mins: w.mins.clone(),
        tile_scales,
    })
}

/// The tile kernels' `u32[ceil(n / 16), groups, 8, 2]` (kernels' `GemvInt4Params::tsz`):
/// entry (tile, group, g, h) holds row `16 tile + g + 8 h`'s scale as f32 bits with its zero
/// point in the low 8 bits, zeros past `n`. None when a scale needs those bits (an f16 or bf16
/// scale never does: both have at most 11 significant bits of f32's 24) or a zero is over 255.
pub fn tile_scales(n: usize, groups: usize, scales: &[f32], zeros: &[u8]) -> Option<Vec<u32>> {
    let tiles = n.div_ceil(16);
    let mut out = vec![0u32; tiles * groups * 16];
    for r in 0..n {
        for grp in 0..groups {
            let (s, z) = (scales[r * groups + grp].to_bits(), zeros[r * groups + grp]);
            if s & 0xff != 0 {
                return None;
            }
            let (tile, g, h) = (r / 16, r % 8, (r % 16) / 8);
            out[((tile * groups + grp) * 8 + g) * 2 + h] = s | u32::from(z);
        }
    }
    Some(out)
}

/// An INT4 product's scales, zero points and column order on the device; its weight buffer holds
/// the packed codes (U32 `[n, k / 8]`).
pub struct Int4Scales {
    /// U32 `[n, groups]`.
    pub scales: Buf,
    /// U8 `[n, groups]`.
    pub zeros: Buf,
    /// U32 `[k]`, act order only.
    pub perm: Option<Buf>,
    /// F32 `[n, groups]` offsets (GGUF `Q4_1`): the weights are `q · s + m`.
    pub mins: Option<Buf>,
    /// U32 `[ceil(n / 16), groups, 16]`: the tile kernels' scales and zeros ([`tile_scales`]).
    pub tile: Option<Buf>,
    pub groups: usize,
    pub group_size: usize,
}

impl Int4Scales {
    /// Uploads `p`: its codes (the weight buffer) and its scales.
    pub fn upload(gpu: &Gpu, p: &Int4Packed) -> Result<(Buf, Self), BackendError> {
        let words = gpu.upload_u32(&p.words)?;
        Ok((
            words,
            Self {
                scales: gpu.upload_u32(&p.scales)?,
                zeros: gpu.upload_bytes(&p.zeros, DType::U8)?,
                perm: p.perm.as_deref().map(|q| gpu.upload_u32(q)).transpose()?,
                mins: p
                    .mins
                    .as_deref()
                    .map(|m| gpu.upload_f32(m, DType::F32))
                    .transpose()?,
                tile: p
                    .tile_scales
                    .as_deref()
                    .map(|t| gpu.upload_u32(t))
                    .transpose()?,
                groups: p.groups,
                group_size: p.group_size,
            },
        ))
    }

    /// Bytes on the device (the codes not included).
    pub fn bytes(&self) -> usize {
        self.scales.bytes()
            + self.zeros.bytes()
            + self.perm.as_ref().map_or(0, Buf::bytes)
            + self.mins.as_ref().map_or(0, Buf::bytes)
            + self.tile.as_ref().map_or(0, Buf::bytes)
    }
}

/// An INT4 product `y[m, n] = x[m, k] · w[n, k]ᵀ` (bf16 `x` and `y`).
pub struct Int4Linear<'a> {
    pub x: &'a Buf,
    /// U32 packed codes.
    pub w: &'a Buf,
    pub s: &'a Int4Scales,
    pub y: &'a Buf,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Int4Linear<'_> {
    /// Checks every buffer's type and length against the shape, and the kernels' constraints.
    pub fn check(&self) -> Result<(), BackendError> {
        let w = self.s;
        if !self.k.is_multiple_of(32)
            || !w.group_size.is_multiple_of(32)
            || w.group_size == 0
            || self.k >= 1 << 30
            || w.groups != self.k.div_ceil(w.group_size)
        {
            return Err(BackendError::InvalidBatch(format!(
                "int4: k {} with groups of {} ({} groups) unsupported",
                self.k, w.group_size, w.groups
            )));
        }
        self.w
            .check("int4 words", DType::U32, self.n * self.k / 8)?;
        w.scales
            .check("int4 scales", DType::U32, self.n * w.groups)?;
        w.zeros.check("int4 zeros", DType::U8, self.n * w.groups)?;
        if let Some(p) = &w.perm {
            p.check("int4 perm", DType::U32, self.k)?;
        }
        if let Some(m) = &w.mins {
            m.check("int4 mins", DType::F32, self.n * w.groups)?;
        }
        if let Some(t) = &w.tile {
            t.check(
                "int4 tile scales",
                DType::U32,
                self.n.div_ceil(16) * w.groups * 16,
            )?;
        }
        self.x.check("int4 x", DType::Bf16, self.m * self.k)?;
        self.y.check("int4 y", DType::Bf16, self.m * self.n)?;
        if !self.x.ptr().is_multiple_of(16) || !self.w.ptr().is_multiple_of(16) {
            return Err(BackendError::InvalidBatch("int4: unaligned x or w".into()));
        }
        Ok(())
    }

    /// The kernels' parameters for rows `row0 .. row0 + b` of `x` and `y` (`y` the dequantized
    /// matrix for `dequant_int4_bf16`, with `row0` 0).
    fn params(
        &self,
        y: &Buf,
        row0: usize,
        b: usize,
    ) -> Result<kernels::params::GemvInt4Params, BackendError> {
        Ok(kernels::params::GemvInt4Params {
            x: self.x.ptr_at(row0 * self.k),
            w: self.w.ptr(),
            sz: self.s.scales.ptr(),
            z: self.s.zeros.ptr(),
            m: self.s.mins.as_ref().map_or(0, Buf::ptr),
            tsz: self.s.tile.as_ref().map_or(0, Buf::ptr),
            y: y.ptr_at(row0 * self.n),
            b: int(b, "m")?,
            n: int(self.n, "n")?,
            k: int(self.k, "k")?,
            groups: int(self.s.groups, "groups")?,
            group_size: int(self.s.group_size, "group_size")?,
            pad: 0,
        })
    }
}

/// The k-step of the tile kernels (`gemv_int4_t16_k{ks}_*`) for a product of input width `k`
/// with scales `s`, if they take it: the weight has their scales ([`Int4Scales::tile`]) and
/// [`tile_step_for`] a step.
pub fn tile_step(s: &Int4Scales, k: usize) -> Option<usize> {
    s.tile.as_ref().and(tile_step_for(k, s.group_size))
}

/// 128 where `k` and the group size are multiples of 128, else 64 where they are multiples of
/// 64; the groups must also hold a power-of-two number of steps (or span `k`).
pub fn tile_step_for(k: usize, group_size: usize) -> Option<usize> {
    [128, 64].into_iter().find(|&ks| {
        k.is_multiple_of(ks)
            && group_size.is_multiple_of(ks)
            && ((group_size / ks).is_power_of_two() || group_size >= k)
    })
}

/// `y = x · wᵀ` on the GEMV kernels for `x` already permuted for act order. With `tiles` and
/// groups [`tile_step`] takes, the 16-row tile kernel, up to [`TILE_MAX_BATCH`] rows a launch;
/// otherwise the per-weight kernel with `rows_per_block` 16 or 32, [`kernels::GEMV_MAX_BATCH`]
/// rows a launch.
pub fn gemv_int4(
    gpu: &Gpu,
    l: &Int4Linear<'_>,
    rows_per_block: usize,
    tiles: bool,
) -> Result<(), BackendError> {
    l.check()?;
    if l.n == 0 {
        return Ok(());
    }
    if let Some(ks) = tile_step(l.s, l.k).filter(|_| tiles) {
        return gemv_int4_tiles(gpu, l, ks);
    }
    let name = match (rows_per_block, l.s.mins.is_some()) {
        (16, false) => "gemv_int4_r16",
        (32, false) => "gemv_int4_r32",
        (16, true) => "gemv_int4_min_r16",
        (32, true) => "gemv_int4_min_r32",
        (other, _) => {
            return Err(BackendError::InvalidBatch(format!(
                "gemv_int4: no kernel for {other} rows per block"
            )));
        }
    };
    let f = gpu.func(name)?;
    let grid = (dim(l.n.div_ceil(rows_per_block), "n")?, 1, 1);
    for row0 in (0..l.m).step_by(kernels::GEMV_MAX_BATCH) {
        let rows = (l.m - row0).min(kernels::GEMV_MAX_BATCH);
        let p = l.params(l.y, row0, rows)?;
        let mut b = gpu.stream.launch_builder(f);
        b.arg(&p);
        // SAFETY: check() gave words >= n*k/8, scales and zeros >= n*groups with groups =
        // ceil(k / group_size), x >= m*k and y >= m*n bf16 elements, x and words 16-byte aligned
        // and k a multiple of 32, so every row of both starts 16-byte aligned; this launch sees
        // rows row0 .. row0 + rows <= m of x and y. Block i owns weight rows [i*R, (i+1)*R) (R
        // matching the kernel picked) and the grid covers ceil(n / R) blocks. A lane reads 16
        // bytes of weight row r < n at word 16 s + 4 t and 64 bytes of x row g < rows at element
        // 128 s + 32 t only when 128 s + 32 t < k (so + 32 <= k), the scale and zero of group
        // (128 s + 32 t) / group_size < groups for such lanes (group 0 for the others), and
        // writes y[bb, r] for bb < rows, r < n. Every mma runs on all 32 lanes (steps are
        // skipped warp-uniformly). The *_min kernels read the offset of the same (row, group) as
        // the scale, and check() gave mins >= n*groups f32 when they are picked (mins is Some).
        // GEMV_WARPS assumes kernels::GEMV_THREADS threads; shared memory is static.
        unsafe { b.launch(cfg(grid, kernels::GEMV_THREADS, 0)) }?;
    }
    Ok(())
}

/// Batch rows one launch of the tile kernels takes at most.
pub const TILE_MAX_BATCH: usize = 32;

/// A kernel of the 16-row tile family (`gemv_int4_t16*`): its name, k-step and batch rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileKernel {
    pub name: &'static str,
    pub ks: usize,
    pub batch: usize,
}

/// The tile kernels [`gemv_int4`] picks from, by k-step and batch rows.
pub const TILE_KERNELS: [TileKernel; 6] = [
    tile("gemv_int4_t16_k128_b8", 128, 8),
    tile("gemv_int4_t16_k128_b16", 128, 16),
    tile("gemv_int4_t16_k128_b32", 128, 32),
    tile("gemv_int4_t16_k64_b8", 64, 8),
    tile("gemv_int4_t16_k64_b16", 64, 16),
    tile("gemv_int4_t16_k64_b32", 64, 32),
];

/// A variant of `gemv_int4_t16_k128_b8` (a ring of 4 items, 2 blocks an SM, against its 2 and 3)
/// that `cuda_bench int4` times beside it: level on the largest product, slower on the others
/// (runs 33a, 34).
pub const TILE_VARIANTS: [TileKernel; 1] = [tile("gemv_int4_t16x_d4_k128_b8", 128, 8)];

const fn tile(name: &'static str, ks: usize, batch: usize) -> TileKernel {
    TileKernel { name, ks, batch }
}

/// [`gemv_int4`] on the tile kernels with k-steps of `ks` (from [`tile_step`]).
fn gemv_int4_tiles(gpu: &Gpu, l: &Int4Linear<'_>, ks: usize) -> Result<(), BackendError> {
    for row0 in (0..l.m).step_by(TILE_MAX_BATCH) {
        let rows = (l.m - row0).min(TILE_MAX_BATCH);
        let kernel = TILE_KERNELS
            .iter()
            .find(|t| t.ks == ks && rows <= t.batch)
            .ok_or_else(|| BackendError::InvalidBatch(format!("int4: no tile kernel for {ks}")))?;
        launch_tile(gpu, l, kernel, row0, rows)?;
    }
    Ok(())
}

/// Rows `row0 .. row0 + rows` of `l` on tile kernel `kernel` (which must take `l`'s groups and
/// that many rows): public for `cuda_bench int4`, which times the variants.
pub fn launch_tile(
    gpu: &Gpu,
    l: &Int4Linear<'_>,
    kernel: &TileKernel,
    row0: usize,
    rows: usize,
) -> Result<(), BackendError> {
    l.check()?;
    if tile_step(l.s, l.k) != Some(kernel.ks) || rows > kernel.batch || row0 + rows > l.m {
        return Err(BackendError::InvalidBatch(format!(
            "int4: {} does not take groups of {} ({} rows from {row0} of {})",
            kernel.name, l.s.group_size, rows, l.m
        )));
    }
    if l.n == 0 || rows == 0 {
        return Ok(());
    }
    let f = gpu.func(kernel.name)?;
    let grid = (tile_grid(gpu, f, l.n.div_ceil(16), 0)?, 1, 1);
    let p = l.params(l.y, row0, rows)?;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&p);
    // SAFETY: check() gave words >= n*k/8, the tile scales (Some: tile_step checked) =
    // ceil(n / 16)*groups*16 u32 with groups = ceil(k / group_size), x >= m*k and y >= m*n bf16
    // elements, x and words 16-byte aligned (the tile scales 8-byte aligned, as allocations are);
    // tile_step gave k and group_size multiples of the kernel's k-step ks, group_size / ks a
    // power of two or group_size >= k. This launch sees rows row0 .. row0 + rows <= m
    // of x and y, 1 <= rows <= the kernel's batch. Block i takes the 16-row tiles i, i + grid, ...
    // < ceil(n / 16), rows clamped below n and x rows below rows. For k-steps s < k / ks (loads
    // of steps past a warp's range are predicated off; its x reads fall back to a step in range),
    // a lane reads ks / 32 words (8 or 16 bytes, aligned) of a weight row < n at word (ks / 8) s +
    // (ks / 32) t <= k/8 - ks / 32, ks / 4 bf16 of an x row < rows at element ks s + (ks / 4) t,
    // the tile-scale pair (tile, s >> log2(group_size / ks) (or group 0) < groups, g), and writes
    // y[bb, r] for bb < rows, r < n. Every mma runs on all 32 lanes (no lane skips an item)
    // and every thread reaches each tile's barrier (the tile loop is the same for the whole
    // block). GEMV_WARPS assumes kernels::GEMV_THREADS threads; shared memory is static.
    unsafe { b.launch(cfg(grid, kernels::GEMV_THREADS, 0)) }?;
    Ok(())
}

/// A kernel of the tensor-core families: `gemm_int4_mma_t{TA}w{W}` (weights dequantized to bf16
/// in registers, the bits of [`dequant_int4`]'s matrix) or, `scaled`, `gemm_int4_mmas_t{TA}w{W}`
/// (operands q - z, exact, and the group scales applied to each 64-wide k-step's f32 sums, as the
/// tile GEMV does; only for weights [`tile_step`] takes). Its name, warps a block and weight rows
/// a block (16 TA W); each takes [`kernels::INT4_MMA_BATCH`] activation rows a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmaKernel {
    pub name: &'static str,
    pub warps: u32,
    pub rows: usize,
    pub scaled: bool,
}

/// The tensor-core kernels [`mma_kernel_for`] picks from, the dequantizing family's four block
/// shapes, then the scaled family's same four; `cuda_bench int4` times them all.
pub const MMA_KERNELS: [MmaKernel; 8] = [
    mma("gemm_int4_mma_t2w4", 4, 2, false),
    mma("gemm_int4_mma_t1w4", 4, 1, false),
    mma("gemm_int4_mma_t1w8", 8, 1, false),
    mma("gemm_int4_mma_t2w8", 8, 2, false),
    mma("gemm_int4_mmas_t2w4", 4, 2, true),
    mma("gemm_int4_mmas_t1w4", 4, 1, true),
    mma("gemm_int4_mmas_t1w8", 8, 1, true),
    mma("gemm_int4_mmas_t2w8", 8, 2, true),
];

const fn mma(name: &'static str, warps: u32, tiles: usize, scaled: bool) -> MmaKernel {
    MmaKernel {
        name,
        warps,
        rows: 16 * tiles * warps as usize,
        scaled,
    }
}

/// How many ranges [`gemm_int4`] splits the k-steps (of 64) of an `m x n x k` product into on a
/// kernel of `rows` weight rows a block: enough blocks for two an SM where the output tiles
/// alone are fewer, at least 8 steps a range, and no more partial sums than `scratch_bytes`
/// holds (f32 `[splits, m, n]`).
pub fn gemm_int4_splits(
    (m, n, k): (usize, usize, usize),
    rows: usize,
    sms: usize,
    scratch_bytes: usize,
) -> usize {
    let blocks = n.div_ceil(rows) * m.div_ceil(kernels::INT4_MMA_BATCH);
    let steps = k.div_ceil(64);
    let fit = scratch_bytes / (4 * m * n).max(1);
    (2 * sms)
        .div_ceil(blocks.max(1))
        .min(steps / 8)
        .min(fit)
        .max(1)
}

/// The tensor-core kernel [`gemm_int4`] runs an `m x n x k` product on, of the scaled family with
/// `scaled`. The block shape is the fastest at the 8B shapes on an H100 for both families (runs
/// 36c, 50a and 51a, `cuda_bench int4`): up to 64 rows, 8 warps of 2 tiles for inputs wider than
/// 8,192 (down), else 4 warps of 2 tiles; past 64 rows, 4 warps of 2 tiles for outputs of 16,384 or
/// more (gate/up), else 4 warps of 1 tile, twice the blocks (q/k/v, o, down). Scaled, at 128 rows
/// (run 51a): q/k/v 0.032, o 0.023, gate/up 0.113, down 0.065 ms against 0.035–0.043,
/// 0.024–0.028, 0.117–0.152, 0.066–0.086 on the other shapes.
pub fn mma_kernel_for(m: usize, n: usize, k: usize, scaled: bool) -> &'static MmaKernel {
    let shape = match (m > kernels::INT4_MMA_BATCH, n >= 16384, k > 8192) {
        (false, _, true) => 3,
        (false, _, false) | (true, true, _) => 0,
        (true, false, _) => 1,
    };
    &MMA_KERNELS[shape + if scaled { 4 } else { 0 }]
}

/// The tensor-core products [`gemm_int4`] may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmaChoice {
    /// The scaled family where the weights have tile scales ([`tile_step`]).
    pub scaled: bool,
    /// Past [`kernels::INT4_MMA_BATCH`] rows, on a device whose kernels are `sm_90a`, where
    /// [`wgmma_fits`]: these Hopper kernels ([`WGMMA_KERNELS`]).
    pub wgmma: Option<WgmmaKernels>,
}

/// `y = x · wᵀ` on the tensor-core product for any number of rows: the Hopper kernel where
/// `choice` names one and it applies, else with `choice.scaled` and weights [`tile_step`] takes
/// the scaled family, else the dequantizing one ([`mma_kernel_for`]).
pub fn gemm_int4(
    gpu: &Gpu,
    l: &Int4Linear<'_>,
    choice: MmaChoice,
    scratch: &Buf,
) -> Result<(), BackendError> {
    if let Some(w) = choice.wgmma
        && gpu.arch == "sm_90a"
        && l.m > kernels::INT4_MMA_BATCH
        && wgmma_fits(l)
    {
        return launch_wgmma(gpu, l, w.for_rows(l.m), scratch);
    }
    let scaled = choice.scaled && tile_step(l.s, l.k).is_some();
    launch_mma(gpu, l, mma_kernel_for(l.m, l.n, l.k, scaled), scratch)
}

/// [`gemm_int4`] on `kernel`; with k split ([`gemm_int4_splits`]), the f32 partial sums go to
/// `scratch` and `gemm_int4_reduce` adds them into `y`. Weights with GGUF offsets are not taken.
pub fn launch_mma(
    gpu: &Gpu,
    l: &Int4Linear<'_>,
    kernel: &MmaKernel,
    scratch: &Buf,
) -> Result<(), BackendError> {
    l.check()?;
    if l.s.mins.is_some() {
        return Err(BackendError::InvalidBatch(
            "gemm_int4_mma does not take weights with offsets (GGUF Q4_1)".into(),
        ));
    }
    if l.n == 0 || l.m == 0 {
        return Ok(());
    }
    check_words_and_scratch(l, scratch, "gemm_int4_mma")?;
    if kernel.scaled && tile_step(l.s, l.k).is_none() {
        return Err(BackendError::InvalidBatch(format!(
            "{}: no tile scales, or groups of {} over k = {} do not hold whole 64-wide k-steps",
            kernel.name, l.s.group_size, l.k
        )));
    }
    let smem = if kernel.scaled {
        kernels::int4_mmas_smem_bytes(kernel.rows)
    } else {
        0
    };
    let splits = gemm_int4_splits((l.m, l.n, l.k), kernel.rows, gpu.sms, scratch.bytes());
    let (p, splits) = split_params(l, splits, scratch)?;
    let grid = (
        dim(l.n.div_ceil(kernel.rows), "n")?,
        dim(l.m.div_ceil(kernels::INT4_MMA_BATCH), "m")?,
        dim(splits, "splits")?,
    );
    let mut b = gpu.stream.launch_builder(gpu.func(kernel.name)?);
    b.arg(&p);
    // SAFETY: check() gave words >= n*k/8 u32 (16-byte aligned, k a multiple of 32 so every row
    // starts 16-byte aligned), scales and zeros >= n*groups with groups = ceil(k / group_size)
    // and group_size a multiple of 32, x >= m*k and y >= m*n bf16 (x 16-byte aligned); n*k/8 fits
    // in u32 (tested above), so the kernel's 32-bit word and group offsets do not wrap. With R =
    // kernel.rows (16 TA W), W = kernel.warps and X = INT4_MMA_BATCH (the kernel's own), block
    // (bx, by, bz) reads weight rows min(R bx + r, n - 1) at words 8 s + 2t (+1) only for
    // 64 s + 16 t < k, so < k/8, and their group (64 s + 16 t) / group_size < groups (group 0
    // otherwise); x rows min(X by + r, m - 1) at 16-byte chunks 64 s + 8 c < k only (the others zero-filled,
    // reading nothing); it stores y[bb, r] for bb < m, r < n, or with splits > 1 the f32
    // part[bz, bb, r] for bz < splits, where scratch holds splits*m*n f32 (gemm_int4_splits caps
    // splits by its bytes) and is 16-byte aligned. Steps [bz*steps, +steps) are clipped to
    // ceil(k / 64). Every mma runs on all 32 lanes and every thread reaches each step's barrier
    // (the step loop is the same for the whole block). The dequantizing family's shared memory
    // is static (INT4_MMA_STAGES x X x 128 bytes, at most 48 KiB: asserted in the kernel). The
    // scaled family (checked above: tile scales, k a multiple of 64, group_size / 64 a power of
    // two or group_size >= k) reads words 8 s .. 8 s + 7 of the same rows for s < k / 64, x the
    // same way (k a multiple of 64, so every chunk of a step in range is), and tile scales u32
    // [ceil(n / 16), groups, 16] at tile min(R bx / 16 + i, ceil(n / 16) - 1) and group
    // s >> log2(group_size / 64) < groups (0 when group_size >= k); its dynamic shared memory is
    // int4_mmas_smem_bytes(R), which Gpu::new allowed each such kernel. The kernel assumes 32 W
    // threads.
    unsafe { b.launch(cfg(grid, 32 * kernel.warps, smem)) }?;
    if splits > 1 {
        reduce_splits(gpu, l, &p)?;
    }
    Ok(())
}

/// What both tensor-core products ask of a launch: word offsets (`n * k / 8`) that fit their u32
/// arithmetic, and a 16-byte-aligned scratch for split sums. `kernel` names the product in the
/// error.
fn check_words_and_scratch(
    l: &Int4Linear<'_>,
    scratch: &Buf,
    kernel: &str,
) -> Result<(), BackendError> {
    if l.n * (l.k / 8) > u32::MAX as usize {
        return Err(BackendError::InvalidBatch(format!(
            "{kernel}: {} x {} weights pass its 32-bit word offsets",
            l.n, l.k
        )));
    }
    if l.m * l.k > u32::MAX as usize {
        return Err(BackendError::InvalidBatch(format!(
            "{kernel}: {} x {} activations pass its 32-bit element offsets",
            l.m, l.k
        )));
    }
    if !scratch.ptr().is_multiple_of(16) {
        return Err(BackendError::InvalidBatch("int4: unaligned scratch".into()));
    }
    Ok(())
}

/// The tensor-core products' parameters for the k-steps of 64 split in `splits` ranges (at most:
/// ranges of equal steps, so none is empty), and how many ranges that makes; the partial sums
/// go to `scratch` when there is more than one.
fn split_params(
    l: &Int4Linear<'_>,
    splits: usize,
    scratch: &Buf,
) -> Result<(kernels::params::GemmInt4Params, usize), BackendError> {
    let total = l.k.div_ceil(64);
    let steps = total.div_ceil(splits.max(1));
    let splits = total.div_ceil(steps);
    let p = kernels::params::GemmInt4Params {
        g: l.params(l.y, 0, l.m)?,
        part: if splits > 1 { scratch.ptr() } else { 0 },
        splits: int(splits, "splits")?,
        steps: int(steps, "steps")?,
    };
    Ok((p, splits))
}

/// `gemm_int4_reduce`: adds the `p.splits` f32 partial sums a tensor-core product wrote to
/// `p.part` into `y`.
fn reduce_splits(
    gpu: &Gpu,
    l: &Int4Linear<'_>,
    p: &kernels::params::GemmInt4Params,
) -> Result<(), BackendError> {
    let threads = kernels::INT4_DEQUANT_THREADS as usize;
    let blocks = (l.m * l.n).div_ceil(threads).min(gpu.sms * 16);
    let mut b = gpu.stream.launch_builder(gpu.func("gemm_int4_reduce")?);
    b.arg(p);
    // SAFETY: part holds splits*m*n f32 that the product launched just before wrote in full
    // (every (bz, bb, r) with bb < m, r < n is stored by the block of split bz that holds row r
    // and x row bb, an empty step range storing zeros), and y m*n bf16; the grid-stride loop
    // touches indices < m*n only.
    unsafe {
        b.launch(cfg(
            (dim(blocks, "blocks")?, 1, 1),
            kernels::INT4_DEQUANT_THREADS,
            0,
        ))
    }?;
    Ok(())
}

/// What INT4 linear layers need of the options and the model on CUDA: bf16, not
/// batch-invariant, every product's input width a multiple of 32 (this rank's share of it).
pub(super) fn check_int4_options(
    dims: &crate::tp::LocalDims,
    cfg: &crate::config::ModelConfig,
    (dtype, batch_invariant): (DType, bool),
    quant: &crate::quant::LinearQuant,
) -> Result<(), BackendError> {
    let what = quant.describe();
    let refuse = |why: String| Err(BackendError::InvalidOptions(format!("{what}: {why}")));
    if dtype != DType::Bf16 {
        return refuse("INT4 linear layers compute in bfloat16 (--dtype bfloat16)".into());
    }
    if batch_invariant {
        return refuse("--batch-invariant is not available with INT4 yet".into());
    }
    for (name, k) in [
        ("q/k/v and gate/up", cfg.hidden_size),
        ("o", dims.q_dim),
        ("down", dims.inter),
    ] {
        if !k.is_multiple_of(32) {
            return refuse(format!(
                "the {name} product's input width {k} is not a multiple of 32"
            ));
        }
    }
    Ok(())
}

/// Whether a GGUF file's `Q4_0` / `Q4_1` layers run on the INT4 kernels: the switch
/// ([`KernelSwitches::gguf_int4`](crate::backend::switches::KernelSwitches::gguf_int4)) is on,
/// the linears are otherwise unquantized, and the kernels take the options and this rank's
/// shapes (bf16, not batch-invariant, input widths multiples of 32); otherwise every weight is
/// dequantized to the compute type.
pub(super) fn gguf_runs_int4(
    opts: &super::backend::CudaOptions,
    quant: &crate::quant::LinearQuant,
    cfg: &crate::config::ModelConfig,
    dims: &crate::tp::LocalDims,
) -> bool {
    opts.kernels.gguf_int4
        && *quant == crate::quant::LinearQuant::None
        && opts.dtype == DType::Bf16
        && !opts.batch_invariant
        && [cfg.hidden_size, dims.q_dim, dims.inter]
            .iter()
            .all(|k| k.is_multiple_of(32))
}

/// Writes `w` as a bf16 `[n, k]` matrix (in its packed column order) into `out`.
pub fn dequant_int4(gpu: &Gpu, l: &Int4Linear<'_>, out: &Buf) -> Result<(), BackendError> {
    l.check()?;
    out.check("int4 dequantized", DType::Bf16, l.n * l.k)?;
    if !out.ptr().is_multiple_of(16) {
        return Err(BackendError::InvalidBatch("int4: unaligned output".into()));
    }
    let words = l.n * l.k / 8;
    if words == 0 {
        return Ok(());
    }
    let p = l.params(out, 0, 0)?;
    let threads = kernels::INT4_DEQUANT_THREADS as usize;
    let blocks = words.div_ceil(threads).min(gpu.sms * 16);
    let name = if l.s.mins.is_some() {
        "dequant_int4_min_bf16"
    } else {
        "dequant_int4_bf16"
    };
    let mut b = gpu.stream.launch_builder(gpu.func(name)?);
    b.arg(&p);
    // SAFETY: check() gave words >= n*k/8 u32, scales and zeros (and mins, for the _min kernel,
    // picked only when they exist) >= n*groups; out holds n*k bf16
    // (16-byte aligned: uint4 stores at word index idx < n*k/8). The grid-stride loop touches word
    // indices < n*k/8 only, and group (8c) / group_size < groups for c < k/8.
    unsafe {
        b.launch(cfg(
            (dim(blocks, "blocks")?, 1, 1),
            kernels::INT4_DEQUANT_THREADS,
            0,
        ))
    }
    .map(|_| ())
    .map_err(BackendError::from)
}

/// `out[r, j] = x[r, perm[j]]` for `m` rows of `k` bf16 (act order's activations).
pub fn permute_cols(
    gpu: &Gpu,
    (x, perm, out): (&Buf, &Buf, &Buf),
    (m, k): (usize, usize),
) -> Result<(), BackendError> {
    x.check("permute x", DType::Bf16, m * k)?;
    out.check("permute out", DType::Bf16, m * k)?;
    perm.check("permute perm", DType::U32, k)?;
    if m * k == 0 {
        return Ok(());
    }
    let p = kernels::params::PermuteColsParams {
        x: x.ptr(),
        perm: perm.ptr(),
        y: out.ptr(),
        m: int(m, "m")?,
        k: int(k, "k")?,
    };
    let threads = kernels::INT4_DEQUANT_THREADS as usize;
    let blocks = (m * k).div_ceil(threads).min(gpu.sms * 16);
    let mut b = gpu.stream.launch_builder(gpu.func("permute_cols_bf16")?);
    b.arg(&p);
    // SAFETY: x and out hold m*k bf16 and perm k u32 (checked); every perm entry is < k
    // (pack() builds it as a permutation of 0..k), so x[r*k + perm[j]] is in range for r < m.
    unsafe {
        b.launch(cfg(
            (dim(blocks, "blocks")?, 1, 1),
            kernels::INT4_DEQUANT_THREADS,
            0,
        ))
    }
    .map(|_| ())
    .map_err(BackendError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weight(n: usize, k: usize, gs: usize, g_idx: Option<Vec<u32>>) -> Int4Weight {
        let groups = k.div_ceil(gs);
        Int4Weight {
            rows: n,
            cols: k,
            group_size: gs,
            codes: (0..n * k).map(|i| ((i * 5 + i / 7) % 16) as u8).collect(),
            scales: (0..n * groups).map(|i| 0.001 + i as f32 * 1e-4).collect(),
            zeros: (0..n * groups).map(|i| (i % 17) as u8).collect(),
            g_idx,
            mins: None,
        }
    }

    #[test]
    fn tile_scales_pair_rows_g_and_g_plus_8_of_each_tile() {
        // 20 rows (two tiles, the second partial), 3 groups; f16 scales.
        let (n, groups) = (20, 3);
        let scales: Vec<f32> = (0..n * groups)
            .map(|i| half::f16::from_f32(0.01 + i as f32 * 1e-3).to_f32())
            .collect();
        let zeros: Vec<u8> = (0..n * groups).map(|i| (i % 17) as u8).collect();
        let t = tile_scales(n, groups, &scales, &zeros).expect("f16 scales fit");
        assert_eq!(t.len(), 2 * groups * 16);
        for r in 0..n {
            for grp in 0..groups {
                let e = t[((r / 16 * groups + grp) * 8 + r % 8) * 2 + (r % 16) / 8];
                assert_eq!(
                    f32::from_bits(e & !0xff),
                    scales[r * groups + grp],
                    "row {r}"
                );
                assert_eq!((e & 0xff) as u8, zeros[r * groups + grp], "row {r}");
            }
        }
        // Rows 20..32 of the second tile are zeros.
        assert_eq!(t[((groups + 2) * 8 + 4) * 2 + 1], 0);
        // A scale using the low bits has no tile form.
        assert!(tile_scales(1, 1, &[0.1], &[3]).is_none());
    }

    #[test]
    fn tile_step_needs_whole_steps_and_power_of_two_groups() {
        assert_eq!(tile_step_for(4096, 128), Some(128));
        assert_eq!(tile_step_for(4096, 4096), Some(128));
        assert_eq!(tile_step_for(14336, 14336), Some(128));
        assert_eq!(tile_step_for(4096, 64), Some(64));
        assert_eq!(tile_step_for(320, 128), Some(64));
        assert_eq!(tile_step_for(4096, 384), None);
        assert_eq!(tile_step_for(4096, 32), None);
        assert_eq!(tile_step_for(96, 96), None);
    }

    /// The kernel's dequantization of packed word `c` of row `r`, pair `i`, in Rust.
    fn unpacked(p: &Int4Packed, r: usize, j: usize) -> u8 {
        let word = p.words[r * p.k / 8 + j / 8];
        let pos = KERNEL_ORDER.iter().position(|&o| o == j % 8).unwrap();
        ((word >> (4 * pos)) & 0xf) as u8
    }

    #[test]
    fn packing_keeps_every_code_and_pairs_come_out_in_order() {
        let w = weight(8, 64, 32, None);
        let p = pack(&w).unwrap();
        for r in 0..8 {
            for j in 0..64 {
                assert_eq!(unpacked(&p, r, j), w.codes[r * 64 + j]);
            }
        }
        // (word >> 4i) & 0x000F000F holds codes 2i (low half) and 2i + 1 (high half).
        let word = p.words[0];
        for i in 0..4 {
            let pair = (word >> (4 * i)) & 0x000f_000f;
            assert_eq!(
                [(pair & 0xf) as u8, (pair >> 16) as u8],
                [w.codes[2 * i], w.codes[2 * i + 1]]
            );
        }
    }

    #[test]
    fn scales_split_exactly_and_dequantize_like_the_twin_in_bf16() {
        for bits in (0u16..0x7c00).step_by(37) {
            let s = half::f16::from_bits(bits).to_f32();
            let (hi, lo) = split_scale(s);
            assert_eq!(hi.to_f32() + lo.to_f32(), s, "{s}");
            // u * s_lo is exact in bf16 for |u| <= 16, so fma(u, s_hi, u * s_lo) rounds once.
            for u in -16i32..=15 {
                let t = u as f32 * lo.to_f32();
                assert_eq!(bf16::from_f32(t).to_f32(), t);
                let fused = (u as f64 * hi.to_f32() as f64 + t as f64) as f32;
                assert_eq!(bf16::from_f32(fused), bf16::from_f32(u as f32 * s));
            }
        }
    }

    #[test]
    fn act_order_columns_are_sorted_by_group() {
        let k = 64;
        // Columns alternate between the two groups of 32.
        let g: Vec<u32> = (0..k as u32).map(|c| c % 2).collect();
        let w = weight(8, k, 32, Some(g.clone()));
        let p = pack(&w).unwrap();
        let perm = p.perm.as_ref().unwrap();
        for j in 0..k {
            assert_eq!(g[perm[j] as usize] as usize, j / 32);
            assert_eq!(unpacked(&p, 3, j), w.codes[3 * k + perm[j] as usize]);
        }
        // Uneven groups cannot be made contiguous blocks of group_size.
        let mut bad = g;
        bad[0] = 1;
        let e = pack(&weight(8, k, 32, Some(bad))).unwrap_err();
        assert!(e.contains("group_size"), "{e}");
        let e = pack(&weight(8, 48, 32, None)).unwrap_err();
        assert!(e.contains("multiples of 32"), "{e}");
    }
}
