//! One safe-as-possible wrapper per kernel: each checks buffer types and lengths, then launches once.
//!
//! Kernels that index memory through device-side data (token ids, KV slots, block tables) are
//! `unsafe fn`s: those indices cannot be checked here without a copy back to the host, so the
//! caller promises them (the backend validates every batch on the host before uploading it).

use cudarc::cublas::sys as blas_sys;
use cudarc::driver::{LaunchConfig, PushKernelArg};
pub use kernels::params::SampleRow;
use kernels::params::{AttnParams, CombineFp8Params, GemvParams, GemvRopeParams, RopeParams};

use super::device::{Buf, DType, Gpu, PrefillKernel};
use crate::backend::BackendError;

fn float_type(b: &Buf, what: &str) -> Result<DType, BackendError> {
    match b.dtype() {
        DType::F32 | DType::Bf16 => Ok(b.dtype()),
        other => Err(BackendError::InvalidBatch(format!(
            "{what}: float buffer expected, got {other:?}"
        ))),
    }
}

pub(super) fn cfg(grid: (u32, u32, u32), block: u32, smem: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: smem as u32,
    }
}

pub(super) fn dim(x: usize, what: &str) -> Result<u32, BackendError> {
    u32::try_from(x).map_err(|_| BackendError::InvalidBatch(format!("{what} too large: {x}")))
}

pub(super) fn int(x: usize, what: &str) -> Result<i32, BackendError> {
    i32::try_from(x).map_err(|_| BackendError::InvalidBatch(format!("{what} too large: {x}")))
}

/// The grid of a tile kernel over `tiles` tiles: the blocks of `f` (with `smem` bytes of dynamic
/// shared memory) that fit at once (each loops over its tiles), at least one an SM.
pub(super) fn tile_grid(
    gpu: &Gpu,
    f: &cudarc::driver::CudaFunction,
    tiles: usize,
    smem: usize,
) -> Result<u32, BackendError> {
    let per_sm = f
        .occupancy_max_active_blocks_per_multiprocessor(kernels::GEMV_THREADS, smem, None)
        .map_err(BackendError::from)?
        .max(1) as usize;
    dim(tiles.min(per_sm * gpu.sms), "n")
}

/// `out[i] = table[ids[i]]` for `n` rows of `hidden`.
///
/// # Safety
/// The first `n` entries of `ids` are `< table.len() / hidden`.
pub unsafe fn embedding(
    gpu: &Gpu,
    out: &Buf,
    table: &Buf,
    ids: &Buf,
    (n, hidden): (usize, usize),
) -> Result<(), BackendError> {
    let dt = float_type(table, "embedding table")?;
    out.check("embedding out", dt, n * hidden)?;
    ids.check("embedding ids", DType::U32, n)?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.func(&format!("embedding_{}", dt.suffix()))?;
    let hidden_i = int(hidden, "hidden")?;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(out.dptr())
        .arg(table.dptr())
        .arg(ids.dptr())
        .arg(&hidden_i);
    // SAFETY: out holds n*hidden elements (checked); ids holds n entries (checked), each a valid
    // row of table (the caller's promise); the argument list matches embedding_<dt>'s signature.
    unsafe { b.launch(cfg((dim(n, "rows")?, 1, 1), 256, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// Arguments of [`add_rmsnorm`].
pub struct AddRmsNorm<'a> {
    /// `[rows, hidden]`, updated in place with `delta` added.
    pub residual: &'a Buf,
    /// `[rows, hidden]`, or `None` to only normalise.
    pub delta: Option<&'a Buf>,
    /// `[hidden]`.
    pub weight: &'a Buf,
    /// `[rows, hidden]`, must not alias `residual`.
    pub out: &'a Buf,
    pub rows: usize,
    pub hidden: usize,
    pub eps: f32,
    /// Also quantize `out` for an FP8 product, as `fp8::quant_rows` would (bf16 rows that take the
    /// kernel's vector path only: see [`AddRmsNorm::fuses_fp8`]).
    pub fp8: Option<NormFp8<'a>>,
    /// `delta` is an FP8 product cuBLASLt left unscaled: F32 `(row scales [rows], column scales
    /// [hidden])`, applied to each value first exactly as `fp8::Fp8Gemm::run`'s scaling pass would
    /// (the row scales may be `fp8.scales` itself).
    pub delta_scales: Option<(&'a Buf, &'a Buf)>,
}

/// Where [`add_rmsnorm`] writes its output's E4M3 codes and row scales.
#[derive(Clone, Copy)]
pub struct NormFp8<'a> {
    /// U8 `[rows, hidden]`.
    pub q: &'a Buf,
    /// F32 `[rows]`.
    pub scales: &'a Buf,
    /// `> 0`: this scale for every row; `0.0`: each row's own.
    pub static_scale: f32,
    /// Leave `out` unwritten (every reader of the output takes the codes): a bf16 row less
    /// stored per row.
    pub codes_only: bool,
    /// U32 `[rows]` set to 0: the row maxima the FP8 gate/up product after this norm raises
    /// (`fp8_silu::gemv_fp8_silu`).
    pub amax_reset: Option<&'a Buf>,
}

/// Threads of an `add_rmsnorm` launch over rows of `hidden` elements of `dt`, and whether the
/// kernel takes its vector path (the row whole 16-byte chunks, at most 4 a thread).
fn norm_threads(hidden: usize, dt: DType) -> (u32, bool) {
    let vec = 16 / dt.size();
    let per_thread = if hidden.is_multiple_of(vec) { vec } else { 4 };
    let threads = (hidden.div_ceil(per_thread).div_ceil(32) * 32).clamp(32, 1024);
    let vector = hidden.is_multiple_of(vec) && hidden <= 4 * vec * threads;
    (threads as u32, vector)
}

impl AddRmsNorm<'_> {
    /// Whether this norm can also quantize its output (bf16 rows on the vector path).
    pub fn fuses_fp8(hidden: usize, dt: DType) -> bool {
        dt == DType::Bf16 && norm_threads(hidden, dt).1
    }
}

/// `residual += delta; out = rmsnorm(residual) * weight`, row by row.
pub fn add_rmsnorm(gpu: &Gpu, a: &AddRmsNorm<'_>) -> Result<(), BackendError> {
    let dt = float_type(a.residual, "residual")?;
    let n = a.rows * a.hidden;
    a.residual.check("residual", dt, n)?;
    if let Some(d) = a.delta {
        d.check("delta", dt, n)?;
    }
    if let Some((xs, ws)) = a.delta_scales {
        if a.delta.is_none() {
            return Err(BackendError::InvalidBatch(
                "add_rmsnorm: delta scales without a delta".into(),
            ));
        }
        xs.check("delta row scales", DType::F32, a.rows)?;
        ws.check("delta column scales", DType::F32, a.hidden)?;
    }
    a.weight.check("norm weight", dt, a.hidden)?;
    a.out.check("norm out", dt, n)?;
    if a.out.ptr() == a.residual.ptr() {
        return Err(BackendError::InvalidBatch(
            "add_rmsnorm: out aliases residual".into(),
        ));
    }
    if a.rows == 0 {
        return Ok(());
    }
    let delta = a.delta.map_or(0u64, |d| d.ptr());
    let hidden = int(a.hidden, "hidden")?;
    // One 16-byte chunk a thread where the row is whole chunks (the kernel's vector path).
    let (threads, _) = norm_threads(a.hidden, dt);
    if let Some(f) = &a.fp8 {
        if !AddRmsNorm::fuses_fp8(a.hidden, dt) {
            return Err(BackendError::InvalidBatch(format!(
                "add_rmsnorm: FP8 output needs bf16 rows of a multiple of 8 up to 32768, not {} {dt:?}",
                a.hidden
            )));
        }
        f.q.check("norm fp8 codes", DType::U8, n)?;
        f.scales.check("norm fp8 scales", DType::F32, a.rows)?;
        if let Some(r) = f.amax_reset {
            r.check("norm fp8 row maxima", DType::U32, a.rows)?;
        }
        if !(f.static_scale >= 0.0 && f.static_scale.is_finite()) {
            return Err(BackendError::InvalidBatch(format!(
                "add_rmsnorm: static scale {}",
                f.static_scale
            )));
        }
    }
    let name = match a.fp8 {
        Some(_) => "add_rmsnorm_fp8_bf16".to_string(),
        None => format!("add_rmsnorm_{}", dt.suffix()),
    };
    let mut b = gpu.stream.launch_builder(gpu.func(&name)?);
    let out = match a.fp8 {
        Some(f) if f.codes_only => 0u64,
        _ => a.out.ptr(),
    };
    b.arg(a.residual.dptr())
        .arg(&delta)
        .arg(a.weight.dptr())
        .arg(&out);
    if let Some(f) = &a.fp8 {
        b.arg(f.q.dptr()).arg(f.scales.dptr());
    }
    b.arg(&hidden).arg(&a.eps);
    if let Some(f) = &a.fp8 {
        b.arg(&f.static_scale);
    }
    let (dxs, dws) = a
        .delta_scales
        .map_or((0u64, 0u64), |(x, w)| (x.ptr(), w.ptr()));
    b.arg(&dxs).arg(&dws);
    let amax_reset = a.fp8.and_then(|f| f.amax_reset).map_or(0u64, Buf::ptr);
    if a.fp8.is_some() {
        b.arg(&amax_reset);
    }
    // SAFETY: every buffer holds rows*hidden (weight: hidden) elements of dt (checked above;
    // out is null with codes_only, and add_rmsnorm_fp8_bf16 then stores no output);
    // delta is null or rows*hidden long, and with delta scales (null otherwise) rows and hidden
    // floats, read at [row] and [col < hidden] only; the arguments match add_rmsnorm_<dt> (or, with fp8,
    // add_rmsnorm_fp8_bf16's: q rows*hidden bytes and scales rows floats, checked, written only on
    // the vector path, which fuses_fp8 guaranteed, one row per block; amax_reset null or rows
    // words, checked, word [row] zeroed by its block). The kernel's
    // 16-byte accesses happen only where hidden is a multiple of 16 bytes' worth, so every row
    // starts 16-byte aligned in these whole (256-byte aligned) allocations, and so does every
    // group of 4 delta column scales it reads at a multiple of 4 columns.
    unsafe { b.launch(cfg((dim(a.rows, "rows")?, 1, 1), threads, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// `out[r] = silu(gate_up[r][..inter]) * gate_up[r][inter..]`.
pub fn silu_mul(
    gpu: &Gpu,
    gate_up: &Buf,
    out: &Buf,
    (rows, inter): (usize, usize),
) -> Result<(), BackendError> {
    let dt = float_type(gate_up, "gate_up")?;
    gate_up.check("gate_up", dt, rows * 2 * inter)?;
    out.check("silu out", dt, rows * inter)?;
    if rows == 0 {
        return Ok(());
    }
    let f = gpu.func(&format!("silu_mul_{}", dt.suffix()))?;
    let inter_i = int(inter, "intermediate")?;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(gate_up.dptr()).arg(out.dptr()).arg(&inter_i);
    // 16 bytes a thread where the row is whole 16-byte chunks (the kernel's vector path).
    let per_thread = if inter.is_multiple_of(16 / dt.size()) {
        16 / dt.size()
    } else {
        1
    };
    let grid = (
        dim(rows, "rows")?,
        dim(inter.div_ceil(256 * per_thread), "inter")?,
        1,
    );
    // SAFETY: sizes checked above; the kernel bounds-checks the column index against inter (16-byte
    // accesses only where inter is a multiple of 16 bytes' worth, so rows stay aligned).
    unsafe { b.launch(cfg(grid, 256, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// Whether a device of compute capability `(major, minor)` has the bulk L2 prefetch of
/// `l2_prefetch_u8` (`cp.async.bulk.prefetch.L2`, sm_90 and later).
pub fn has_l2_prefetch(capability: (i32, i32)) -> bool {
    capability.0 >= 9
}

/// Asks L2 to fetch all of `buf` (rounded down to 16 bytes), on the side stream: a hint that
/// returns once issued, for a kernel that reads `buf` later. Nothing below sm_90.
pub fn l2_prefetch(gpu: &Gpu, buf: &Buf) -> Result<(), BackendError> {
    let bytes = (buf.len() * buf.dtype().size()) & !15;
    if bytes == 0 || !has_l2_prefetch(gpu.capability) {
        return Ok(());
    }
    let threads = 128;
    let blocks = bytes
        .div_ceil(kernels::PREFETCH_PIECE * threads)
        .clamp(1, gpu.sms);
    let (ptr, len) = (buf.ptr(), bytes as u64);
    let mut b = gpu.side.launch_builder(gpu.func("l2_prefetch_u8")?);
    b.arg(&ptr).arg(&len);
    // SAFETY: ptr is the start of buf's allocation (16-byte aligned: device allocations are
    // 256-byte aligned) and len <= its size in bytes, a multiple of 16, so every prefetch the
    // kernel issues lies inside the allocation; a prefetch writes nothing.
    unsafe { b.launch(cfg((dim(blocks, "blocks")?, 1, 1), threads as u32, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// Converts `n` elements between f32 and bf16.
pub fn cast(gpu: &Gpu, src: &Buf, dst: &Buf, n: usize) -> Result<(), BackendError> {
    let name = match (src.dtype(), dst.dtype()) {
        (DType::F32, DType::Bf16) => "cast_f32_bf16",
        (DType::Bf16, DType::F32) => "cast_bf16_f32",
        (a, b) => return Err(BackendError::InvalidBatch(format!("cast {a:?} -> {b:?}"))),
    };
    src.check("cast src", src.dtype(), n)?;
    dst.check("cast dst", dst.dtype(), n)?;
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let mut b = gpu.stream.launch_builder(gpu.func(name)?);
    b.arg(src.dptr()).arg(dst.dptr()).arg(&n64);
    let blocks = n.div_ceil(256).min(65_535) as u32;
    // SAFETY: both buffers hold n elements of their types (checked); grid-stride loop bounded by n.
    unsafe { b.launch(cfg((blocks, 1, 1), 256, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// Arguments of [`rope_kv_write`].
pub struct RopeKv<'a> {
    /// `[n, (hq + 2 hkv) d]`.
    pub qkv: &'a Buf,
    /// `[(hq + 2 hkv) d]` or `None`.
    pub bias: Option<&'a Buf>,
    /// `[n]` u32.
    pub positions: &'a Buf,
    /// `[d / 2]` f32.
    pub inv_freq: &'a Buf,
    /// `[n]` i64: `block * block_size + offset`.
    pub slots: &'a Buf,
    /// `[n, hq, d]`.
    pub q_out: &'a Buf,
    /// `[blocks, hkv, block_size, d]`.
    pub k_cache: &'a Buf,
    pub v_cache: &'a Buf,
    pub n: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    pub block_size: usize,
    /// An FP8 cache (U8 `k_cache`/`v_cache`): its K and V scales for this layer.
    pub kv_scales: Option<(f32, f32)>,
    /// `qkv` as cuBLASLt's FP8 product left it, unscaled (bf16): its row scales (`[n]` f32) and
    /// column scales (`[(hq + 2 hkv) d]` f32), which [`rope_kv_write`] applies first, with the
    /// bits of the separate scaling pass. `None` for a scaled product (the fused GEMVs' case).
    pub raw_scales: Option<(&'a Buf, &'a Buf)>,
}

/// The caches' element type: the compute type `dt`, or U8 E4M3 codes with `kv_scales`, whose
/// scales must be finite and positive.
fn cache_type(dt: DType, kv_scales: Option<(f32, f32)>) -> Result<DType, BackendError> {
    match kv_scales {
        None => Ok(dt),
        Some((k, v)) if dt == DType::Bf16 && [k, v].iter().all(|s| s.is_finite() && *s > 0.0) => {
            Ok(DType::U8)
        }
        Some(s) => Err(BackendError::InvalidBatch(format!(
            "an FP8 KV cache needs bf16 compute and positive finite scales, got {dt:?} and {s:?}"
        ))),
    }
}

impl RopeKv<'_> {
    /// Checks the buffers against the shape; returns their type and the kernel's parameters.
    pub(super) fn params(&self) -> Result<(DType, RopeParams), BackendError> {
        let dt = float_type(self.qkv, "qkv")?;
        let width = (self.hq + 2 * self.hkv) * self.d;
        if !self.d.is_multiple_of(2) || self.d / 2 > kernels::ROPE_MAX_PAIRS {
            return Err(BackendError::InvalidBatch(format!(
                "head_dim {}: RoPE takes even head sizes up to {}",
                self.d,
                2 * kernels::ROPE_MAX_PAIRS
            )));
        }
        self.qkv.check("qkv", dt, self.n * width)?;
        if let Some(b) = self.bias {
            b.check("qkv bias", dt, width)?;
        }
        self.positions.check("positions", DType::U32, self.n)?;
        self.inv_freq.check("inv_freq", DType::F32, self.d / 2)?;
        self.slots.check("slots", DType::I64, self.n)?;
        self.q_out.check("q_out", dt, self.n * self.hq * self.d)?;
        let ct = cache_type(dt, self.kv_scales)?;
        self.k_cache.check("k_cache", ct, 0)?;
        self.v_cache.check("v_cache", ct, self.k_cache.len())?;
        let (k_scale, v_scale) = self.kv_scales.unwrap_or((1.0, 1.0));
        if let Some((xs, ws)) = self.raw_scales {
            if dt != DType::Bf16 {
                return Err(BackendError::InvalidBatch(format!(
                    "a raw FP8 q/k/v product is bf16, got {dt:?}"
                )));
            }
            xs.check("qkv row scales", DType::F32, self.n)?;
            ws.check("qkv column scales", DType::F32, width)?;
        }
        let p = RopeParams {
            qkv: self.qkv.ptr(),
            bias: self.bias.map_or(0, |b| b.ptr()),
            positions: self.positions.ptr(),
            inv_freq: self.inv_freq.ptr(),
            slots: self.slots.ptr(),
            q_out: self.q_out.ptr(),
            k_cache: self.k_cache.ptr(),
            v_cache: self.v_cache.ptr(),
            hq: int(self.hq, "hq")?,
            hkv: int(self.hkv, "hkv")?,
            d: int(self.d, "d")?,
            block_size: int(self.block_size, "block_size")?,
            k_scale,
            v_scale,
            kv_fp8: i32::from(self.kv_scales.is_some()),
            pad: 0,
            x_scales: self.raw_scales.map_or(0, |(xs, _)| xs.ptr()),
            w_scales: self.raw_scales.map_or(0, |(_, ws)| ws.ptr()),
        };
        Ok((dt, p))
    }
}

/// Rotates q and k and writes k and v into the paged cache.
///
/// # Safety
/// Every one of the first `n` slots is `< k_cache.len() / (hkv * d)` (or negative: skipped).
pub unsafe fn rope_kv_write(gpu: &Gpu, a: &RopeKv<'_>) -> Result<(), BackendError> {
    let (dt, p) = a.params()?;
    if a.n == 0 {
        return Ok(());
    }
    let f = gpu.func(&format!("rope_kv_write_{}", dt.suffix()))?;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&p);
    let heads = a.hq + 2 * a.hkv;
    let grid = (
        dim(a.n, "tokens")?,
        dim(heads.div_ceil(kernels::ROPE_HEADS), "heads")?,
        1,
    );
    // SAFETY: sizes of qkv, bias, positions, inv_freq, q_out checked, and d/2 <= ROPE_MAX_PAIRS
    // (the kernel's sin/cos table); block (t, y) touches token t < n and heads
    // y * ROPE_HEADS .. min(+ROPE_HEADS, hq + 2*hkv), of each elements j .. j + 7 and
    // j + d/2 .. j + d/2 + 7 for j = 8i < d/2 (16-byte accesses inside rows of d elements, taken
    // only when d/2 is a multiple of 8 and every buffer is 16-byte aligned; else single
    // elements j, j + d/2 < d); cache slots are the caller's promise.
    unsafe { b.launch(cfg(grid, kernels::ROPE_THREADS, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// Whether [`gemv_rope_kv`] can run the q/k/v product `l` with `a`: bf16 weights, output and
/// RoPE buffers (the kernel stores bf16 into q_out and the cache), a shape the GEMV kernel takes
/// ([`Linear::gemv_ok`]), `l` producing exactly `a`'s `[n, (hq + 2 hkv) d]` and a head size that
/// is a multiple of 16 (the kernel's blocks take 8 rotation pairs of one head), and no raw FP8
/// input ([`RopeKv::raw_scales`]).
pub fn gemv_rope_fits(l: &Linear<'_>, a: &RopeKv<'_>) -> bool {
    l.w.dtype() == DType::Bf16
        && l.y.dtype() == DType::Bf16
        && a.qkv.dtype() == DType::Bf16
        && l.gemv_ok()
        && a.d.is_multiple_of(16)
        && l.m == a.n
        && l.n == (a.hq + 2 * a.hkv) * a.d
        && a.raw_scales.is_none()
}

/// The q/k/v product `l` and [`rope_kv_write`] of its output in one launch (`l.y` and `a.qkv` are
/// not written): the same bits as [`gemv`] followed by [`rope_kv_write`].
///
/// # Safety
/// As [`rope_kv_write`]: every one of the first `n` slots is `< k_cache.len() / (hkv * d)` (or
/// negative: skipped).
pub unsafe fn gemv_rope_kv(gpu: &Gpu, l: &Linear<'_>, a: &RopeKv<'_>) -> Result<(), BackendError> {
    l.check()?;
    let (_, rope) = a.params()?;
    if !gemv_rope_fits(l, a) {
        return Err(BackendError::InvalidBatch(
            "gemv_rope_kv: shape, type or alignment unsupported".into(),
        ));
    }
    if a.n == 0 {
        return Ok(());
    }
    let p = GemvRopeParams {
        x: l.x.ptr(),
        w: l.w.ptr(),
        b: int(l.m, "m")?,
        k: int(l.k, "k")?,
        rope,
    };
    let mut b = gpu.stream.launch_builder(gpu.func("gemv_rope_kv_bf16")?);
    b.arg(&p);
    let grid = dim((a.hq + 2 * a.hkv) * a.d / 16, "q/k/v rows")?;
    // SAFETY: as gemv_rows for the product (l checked, gemv_ok: m <= 8, k a multiple of 8 and
    // x, w 16-byte aligned), with n = (hq + 2 hkv) d a multiple of 16 so the grid's blocks cover
    // every row once: block i reads rows of head i / (d/16), dims 8 (i % (d/16)) + 0..8 and the
    // same + d/2, all < n. Its epilogue is rope_kv_write's for token t < m = a.n, head h, pair j
    // < d/2, whose buffers a.params() checked; cache slots are the caller's promise.
    unsafe { b.launch(cfg((grid, 1, 1), kernels::GEMV_THREADS, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// Arguments of [`attention`].
pub struct Attention<'a> {
    /// `[n, hq, d]` rotated queries.
    pub q: &'a Buf,
    pub k_cache: &'a Buf,
    pub v_cache: &'a Buf,
    /// `[n, hq, d]`.
    pub out: &'a Buf,
    /// f32 `[num_items, hq, num_splits, d]` and `[num_items, hq, num_splits, 2]`; unused when
    /// `num_splits == 1`.
    pub part_o: &'a Buf,
    pub part_ml: &'a Buf,
    /// i32 `[num_seqs, 4]`: query_start, query_len, context_len, 0.
    pub seqs: &'a Buf,
    /// i32 `[num_items, 2]`: sequence, first query of the tile (see [`attention_items`]).
    pub items: &'a Buf,
    /// u32 `[num_seqs, table_stride]`.
    pub block_tables: &'a Buf,
    pub num_seqs: usize,
    pub num_items: usize,
    pub table_stride: usize,
    pub n: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    pub block_size: usize,
    /// Keys per split (a multiple of 32); the grid has `num_splits` splits.
    pub split_size: usize,
    pub num_splits: usize,
    pub scale: f32,
    /// An FP8 cache (U8 `k_cache`/`v_cache`): this layer's K and V scales.
    pub kv_scales: Option<(f32, f32)>,
    /// Every sequence the items reach has `query_len == 1`: use the decode kernel when the
    /// head size and group allow it.
    pub decode: bool,
    /// With `num_splits > 1`: the split combine quantizes each item's output row to E4M3 for an
    /// FP8 product instead of storing it (`out` is not written) — see [`CombineFp8`].
    pub combine_fp8: Option<CombineFp8<'a>>,
}

/// Where the split combine of [`attention`] puts an FP8 product's input
/// (`attn_combine_quant_fp8_bf16`): for each decode item, its token's row of `[n, hq d]` as the
/// E4M3 codes and scale `quant_fp8_rows_bf16` gives for the bf16 row `attn_combine_bf16` would
/// store. Every token of the step must be the token of exactly one item (a step of decodes only),
/// or the rows of the others stay unwritten.
#[derive(Clone, Copy)]
pub struct CombineFp8<'a> {
    /// U8 `[n, hq d]`, 8-byte aligned.
    pub q: &'a Buf,
    /// F32 `[n]`.
    pub scales: &'a Buf,
    /// `> 0`: every row's scale (a static input scale); 0: each row's own.
    pub static_scale: f32,
}

/// Whether [`attention`] can quantize its combined output ([`Attention::combine_fp8`]): bf16
/// queries, a head size that is a multiple of 8, and a split launch.
pub fn combine_fp8_fits(dt: DType, d: usize, num_splits: usize) -> bool {
    dt == DType::Bf16 && d.is_multiple_of(8) && num_splits > 1
}

/// Whether prefill attention runs on a tensor-core kernel (bf16, head size 128; `Gpu::prefill`
/// picks which).
fn prefill_on_tensor_cores(dt: DType, d: usize) -> bool {
    dt == DType::Bf16 && d == 128
}

/// Query tokens per prefill attention work item for this type, head size and GQA group size.
pub fn attention_tile_tokens(dt: DType, d: usize, group: usize) -> usize {
    if prefill_on_tensor_cores(dt, d) {
        kernels::PREFILL_MMA_TOKENS
    } else {
        (kernels::ATTN_ROWS / group.max(1)).max(1)
    }
}

/// The work items for sequences with `query_lens`: `(sequence, first query)` per `tile` tokens
/// ([`attention_tile_tokens`] for prefill launches; decode launches take one token per item).
pub fn attention_items(query_lens: &[usize], tile: usize) -> Vec<i32> {
    let mut items = Vec::new();
    for (s, &len) in query_lens.iter().enumerate() {
        let mut q0 = 0;
        while q0 < len {
            items.push(s as i32);
            items.push(q0 as i32);
            q0 += tile;
        }
    }
    items
}

/// Paged causal attention (and the split combine when `num_splits > 1`); bf16 head-size-128
/// prefill runs on `gpu.prefill`.
///
/// # Safety
/// `seqs`, `items` and `block_tables` describe the batch consistently: every item's sequence is
/// `< num_seqs`, its first query `< query_len`; `query_start + query_len <= n`; `query_len <=
/// context_len <= table_stride * block_size`; every table entry a context position reaches is a
/// block of the cache. With `num_splits > 1` every sequence has `query_len == 1`.
pub unsafe fn attention(gpu: &Gpu, a: &Attention<'_>) -> Result<(), BackendError> {
    // SAFETY: the caller's promise, passed on.
    unsafe { attention_with(gpu, a, gpu.prefill, gpu.decode_mma) }
}

/// Whether decodes of head size `d` with `group` query heads per KV head have a decode kernel
/// (else the general attention kernel takes them).
fn has_decode_kernel(d: usize, group: usize) -> bool {
    kernels::DECODE_HEAD_DIMS.contains(&d) && kernels::DECODE_GROUPS.contains(&group)
}

/// Whether [`attention`]'s decodes run on a tensor-core decode kernel
/// ([`kernels::DECODE_MMA_KERNEL`], or [`kernels::DECODE_MMA_KV8_KERNEL`] over an FP8 cache):
/// the kernels that read split-sharing codes ([`kernels::DECODE_SHARE_MEMBERS_SHIFT`]), so only
/// then may decode items carry them. `dt`: the queries' type; `decode_mma`: the switch.
pub fn decode_on_mma(dt: DType, d: usize, group: usize, kv8: bool, decode_mma: bool) -> bool {
    has_decode_kernel(d, group) && d == 128 && (kv8 || (decode_mma && dt == DType::Bf16))
}

/// [`attention`] with bf16 head-size-128 prefill on `prefill` (one of
/// [`PrefillKernel::available`] for `gpu.arch`) and bf16 head-size-128 decodes on the tensor-core
/// kernel if `decode_mma` (else the CUDA-core one), for tests and benchmarks of each kernel.
///
/// # Safety
/// As for [`attention`].
pub unsafe fn attention_with(
    gpu: &Gpu,
    a: &Attention<'_>,
    prefill: PrefillKernel,
    decode_mma: bool,
) -> Result<(), BackendError> {
    let dt = float_type(a.q, "q")?;
    if a.hkv == 0 || !a.hq.is_multiple_of(a.hkv) || a.hq / a.hkv > kernels::ATTN_ROWS {
        return Err(BackendError::InvalidBatch(format!(
            "attention: {} query heads over {} kv heads is not supported",
            a.hq, a.hkv
        )));
    }
    if a.d > kernels::ATTN_MAX_HEAD_DIM || a.d == 0 {
        return Err(BackendError::InvalidBatch(format!(
            "head_dim {} not supported",
            a.d
        )));
    }
    if !a.decode && a.num_splits != 1 {
        return Err(BackendError::InvalidBatch(
            "attention: only decodes are split".into(),
        ));
    }
    if a.num_splits == 0
        || !a.split_size.is_multiple_of(kernels::ATTN_KEY_TILE)
        || a.split_size == 0
    {
        return Err(BackendError::InvalidBatch("attention: bad split".into()));
    }
    a.q.check("q", dt, a.n * a.hq * a.d)?;
    a.out.check("attn out", dt, a.n * a.hq * a.d)?;
    let ct = cache_type(dt, a.kv_scales)?;
    a.k_cache.check("k_cache", ct, 0)?;
    a.v_cache.check("v_cache", ct, a.k_cache.len())?;
    let kv8 = a.kv_scales.is_some();
    let (k_scale, v_scale) = a.kv_scales.unwrap_or((1.0, 1.0));
    a.seqs.check("seqs", DType::I32, 4 * a.num_seqs)?;
    a.items.check("items", DType::I32, 2 * a.num_items)?;
    a.block_tables
        .check("block_tables", DType::U32, a.num_seqs * a.table_stride)?;
    if a.num_splits > 1 {
        a.part_o.check(
            "part_o",
            DType::F32,
            a.num_items * a.hq * a.num_splits * a.d,
        )?;
        a.part_ml
            .check("part_ml", DType::F32, a.num_items * a.hq * a.num_splits * 2)?;
    }
    if a.num_items == 0 {
        return Ok(());
    }
    let p = AttnParams {
        q: a.q.ptr(),
        k_cache: a.k_cache.ptr(),
        v_cache: a.v_cache.ptr(),
        out: a.out.ptr(),
        part_o: a.part_o.ptr(),
        part_ml: a.part_ml.ptr(),
        seqs: a.seqs.ptr(),
        items: a.items.ptr(),
        block_tables: a.block_tables.ptr(),
        num_items: int(a.num_items, "items")?,
        table_stride: int(a.table_stride, "table stride")?,
        hq: int(a.hq, "hq")?,
        hkv: int(a.hkv, "hkv")?,
        d: int(a.d, "d")?,
        block_size: int(a.block_size, "block_size")?,
        split_size: int(a.split_size, "split")?,
        num_splits: int(a.num_splits, "splits")?,
        scale_log2: a.scale * std::f32::consts::LOG2_E * k_scale,
        v_scale,
    };
    let grid = (
        dim(a.num_items, "items")?,
        dim(a.hkv, "hkv")?,
        dim(a.num_splits, "splits")?,
    );
    let use_decode = a.decode && has_decode_kernel(a.d, a.hq / a.hkv);
    if kv8 {
        // SAFETY: as for the kernels below; the caches hold U8 codes (checked above). The
        // decode kernel takes single-token sequences (the caller's promise), the prefill kernel
        // items of PREFILL_MMA_TOKENS tokens (attention_tile_tokens gives them for bf16 at head
        // size 128), and Gpu::new allowed each kernel's shared memory.
        unsafe { attention_kv8(gpu, a, &p, grid, use_decode) }?;
    } else if use_decode {
        let name = if decode_on_mma(dt, a.d, a.hq / a.hkv, false, decode_mma) {
            kernels::DECODE_MMA_KERNEL.to_string()
        } else {
            format!("attn_decode_{}_d{}_g{}", dt.suffix(), a.d, a.hq / a.hkv)
        };
        let f = gpu.func(&name)?;
        let mut b = gpu.stream.launch_builder(f);
        b.arg(&p);
        let smem = kernels::decode_smem_bytes(dt.size(), a.d);
        // SAFETY: as for the general kernel below (every attention kernel takes the one
        // AttnParams, whose layout params.cuh checks); the caller promises single-token
        // sequences. Gpu::new allowed `smem`.
        unsafe { b.launch(cfg(grid, kernels::DECODE_THREADS, smem)) }?;
    } else if prefill_on_tensor_cores(dt, a.d) {
        if !PrefillKernel::available(&gpu.arch).contains(&prefill) {
            return Err(BackendError::Device(format!(
                "{} does not run on {}",
                prefill.name(),
                gpu.arch
            )));
        }
        let f = gpu.func(prefill.name())?;
        let mut b = gpu.stream.launch_builder(f);
        b.arg(&p);
        let grid = (dim(a.num_items, "items")?, dim(a.hq, "hq")?, 1);
        // SAFETY: as for the general kernel; items were built with attention_tile_tokens (128
        // tokens each) for this type and head size, which both prefill kernels assume. The kernel
        // runs on this architecture (checked above) and Gpu::new allowed its shared memory.
        unsafe { b.launch(cfg(grid, prefill.threads(), prefill.smem_bytes())) }?;
    } else {
        let f = gpu.func(&format!("attention_{}", dt.suffix()))?;
        let mut b = gpu.stream.launch_builder(f);
        b.arg(&p);
        let smem = kernels::attention_smem_bytes(a.d);
        // SAFETY: q/out/partials sized (checked); the index data is the caller's promise.
        unsafe { b.launch(cfg(grid, kernels::ATTN_THREADS, smem)) }?;
    }
    if let Some(c) = &a.combine_fp8 {
        // SAFETY: the caller's promise (items, seqs and tokens consistent), passed on; the
        // partials were written above.
        unsafe { combine_quant_fp8(gpu, a, c, p) }?;
    } else if a.num_splits > 1 {
        let f = gpu.func(&format!("attn_combine_{}", dt.suffix()))?;
        let mut b = gpu.stream.launch_builder(f);
        b.arg(&p);
        let threads = (a.d.div_ceil(32) * 32) as u32;
        let grid = (dim(a.num_items, "items")?, dim(a.hq, "hq")?, 1);
        // SAFETY: the combine reads the items*hq*num_splits partials written above and writes out.
        unsafe { b.launch(cfg(grid, threads, 0)) }?;
    }
    Ok(())
}

/// The split combine of `a` with its rows quantized into `c` (`attn_combine_quant_fp8_bf16`).
///
/// # Safety
/// As [`attention`], with `p` built from `a`: every item's token `< n`.
unsafe fn combine_quant_fp8(
    gpu: &Gpu,
    a: &Attention<'_>,
    c: &CombineFp8<'_>,
    p: AttnParams,
) -> Result<(), BackendError> {
    let dt = float_type(a.q, "q")?;
    if !combine_fp8_fits(dt, a.d, a.num_splits) {
        return Err(BackendError::InvalidBatch(format!(
            "attention: the FP8 combine takes bf16 split launches of a head size that is a \
             multiple of 8, not {dt:?}, d {}, {} splits",
            a.d, a.num_splits
        )));
    }
    let row = a.hq * a.d;
    c.q.check("combine fp8 codes", DType::U8, a.n * row)?;
    c.scales.check("combine fp8 scales", DType::F32, a.n)?;
    if !(c.q.ptr().is_multiple_of(8) && c.static_scale >= 0.0 && c.static_scale.is_finite()) {
        return Err(BackendError::InvalidBatch(format!(
            "attention: FP8 combine codes must be 8-byte aligned and the static scale finite and \
             non-negative, got {}",
            c.static_scale
        )));
    }
    let cp = CombineFp8Params {
        attn: p,
        q: c.q.ptr(),
        scales: c.scales.ptr(),
        static_scale: c.static_scale,
        pad: 0,
    };
    let mut b = gpu
        .stream
        .launch_builder(gpu.func("attn_combine_quant_fp8_bf16")?);
    b.arg(&cp);
    // SAFETY: block i (one per item, grid num_items) reads the hq*num_splits partials of item i
    // (part_o/part_ml sized for num_items*hq*num_splits, checked by attention_with) and writes
    // codes [tok*hq*d, (tok+1)*hq*d) and scales[tok] for its token tok < n (the caller's
    // promise), in 8-byte stores at 8-byte aligned offsets (hq*d is a multiple of 8, q 8-byte
    // aligned); part_o's 16-byte loads start at multiples of 8 floats of a 256-byte aligned
    // allocation. FP8_QUANT_WIDE_THREADS is the block size the kernel's reduction is sized for.
    unsafe {
        b.launch(cfg(
            (dim(a.num_items, "items")?, 1, 1),
            kernels::FP8_QUANT_WIDE_THREADS,
            0,
        ))
    }
    .map(|_| ())
    .map_err(BackendError::from)
}

/// The FP8-cache launch of [`attention_with`]: at head size 128 the tensor-core decode kernel
/// for `decode` (single-token items of a group it is built for) and the tensor-core prefill
/// kernel for prefill items; everything else on the general kernel.
///
/// # Safety
/// As for [`attention`], with `p` built from `a` and the caches holding E4M3 codes.
unsafe fn attention_kv8(
    gpu: &Gpu,
    a: &Attention<'_>,
    p: &AttnParams,
    grid: (u32, u32, u32),
    decode: bool,
) -> Result<(), BackendError> {
    let (name, grid, threads, smem) =
        if decode && decode_on_mma(DType::Bf16, a.d, a.hq / a.hkv, true, true) {
            (
                kernels::DECODE_MMA_KV8_KERNEL,
                grid,
                kernels::DECODE_THREADS,
                kernels::DECODE_KV8_SMEM_BYTES,
            )
        } else if !a.decode && a.d == 128 {
            (
                kernels::PREFILL_MMA_KV8_KERNEL,
                (dim(a.num_items, "items")?, dim(a.hq, "hq")?, 1),
                kernels::PREFILL_MMA_THREADS,
                kernels::PREFILL_MMA_SMEM_BYTES,
            )
        } else {
            (
                "attention_bf16_kv8",
                grid,
                kernels::ATTN_THREADS,
                kernels::attention_smem_bytes(a.d),
            )
        };
    let mut b = gpu.stream.launch_builder(gpu.func(name)?);
    b.arg(p);
    // SAFETY: the caller's promise (see attention_with's call); every kernel takes the one
    // AttnParams, whose layout params.cuh checks.
    unsafe { b.launch(cfg(grid, threads, smem)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// A linear layer `y[m, n] = x[m, k] · w[n, k]ᵀ` (HF `Linear` weight layout).
pub struct Linear<'a> {
    pub x: &'a Buf,
    pub w: &'a Buf,
    /// Output; same type as `w`, or f32 for logits.
    pub y: &'a Buf,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Linear<'_> {
    /// Checks the buffers hold the product's elements of matching types; returns the weights'.
    pub fn check(&self) -> Result<DType, BackendError> {
        let dt = float_type(self.w, "weight")?;
        self.w.check("weight", dt, self.n * self.k)?;
        self.x.check("linear x", dt, self.m * self.k)?;
        let yt = float_type(self.y, "linear y")?;
        if yt != dt && yt != DType::F32 {
            return Err(BackendError::InvalidBatch("linear: bad output type".into()));
        }
        self.y.check("linear y", yt, self.m * self.n)?;
        Ok(dt)
    }

    /// Whether the GEMV kernel can run this product: at most [`kernels::GEMV_MAX_BATCH`] rows,
    /// `k` a multiple of 16 bytes' worth of elements (8 bf16, 4 f32) and below 2^30, `x` and `w`
    /// 16-byte aligned (so every row of both is), output of the weights' type or f32 for bf16.
    pub fn gemv_ok(&self) -> bool {
        let vec = 16 / self.w.dtype().size();
        let aligned = |p: u64| p.is_multiple_of(16);
        self.m <= kernels::GEMV_MAX_BATCH
            && self.k.is_multiple_of(vec)
            && self.k < 1 << 30
            && aligned(self.x.ptr())
            && aligned(self.w.ptr())
            && (self.y.dtype() == self.w.dtype()
                || (self.w.dtype() == DType::Bf16 && self.y.dtype() == DType::F32))
    }
}

/// Weight matrices with at least this many rows take the bf16 GEMV kernel with 32 rows per block
/// (half the activation reads per weight byte, 4 × 132 SMs' worth of blocks from 16384 rows);
/// smaller ones take 16 rows per block, so a 4096-row matrix still spreads over 256 blocks. The
/// two give bit-identical results; `cuda_bench gemv` times both.
pub const GEMV_TALL_ROWS: usize = 16384;

/// Runs the product with the GEMV kernel (`m <= 8`; see [`Linear::gemv_ok`]), picking the block
/// height by [`GEMV_TALL_ROWS`].
pub fn gemv(gpu: &Gpu, l: &Linear<'_>) -> Result<(), BackendError> {
    gemv_rows(gpu, l, if l.n >= GEMV_TALL_ROWS { 32 } else { 16 })
}

/// [`gemv`] with bf16 weights taken `rows_per_block` (one of [`kernels::GEMV_BF16_ROWS`]) rows per
/// block; f32 weights ignore it (8 rows, one per warp). Every choice gives the same bits.
pub fn gemv_rows(gpu: &Gpu, l: &Linear<'_>, rows_per_block: usize) -> Result<(), BackendError> {
    let dt = l.check()?;
    if !l.gemv_ok() {
        return Err(BackendError::InvalidBatch(
            "gemv: shape or alignment unsupported".into(),
        ));
    }
    if !kernels::GEMV_BF16_ROWS.contains(&rows_per_block) {
        return Err(BackendError::InvalidBatch(format!(
            "gemv: no kernel for {rows_per_block} rows per block"
        )));
    }
    if l.m == 0 || l.n == 0 {
        return Ok(());
    }
    let (name, rows) = match (dt, l.y.dtype()) {
        (DType::Bf16, DType::F32) => (
            format!("gemv_bf16_f32out_r{rows_per_block}"),
            rows_per_block,
        ),
        (DType::Bf16, _) => (format!("gemv_bf16_r{rows_per_block}"), rows_per_block),
        _ => ("gemv_f32".to_string(), 8),
    };
    let p = GemvParams {
        x: l.x.ptr(),
        w: l.w.ptr(),
        y: l.y.ptr(),
        b: int(l.m, "m")?,
        n: int(l.n, "n")?,
        k: int(l.k, "k")?,
        pad: 0,
    };
    let mut b = gpu.stream.launch_builder(gpu.func(&name)?);
    b.arg(&p);
    let grid = (dim(l.n.div_ceil(rows), "n")?, 1, 1);
    // SAFETY: l.check() gave w >= n*k, x >= m*k and y >= m*n elements of the kernel's types, and
    // gemv_ok 16-byte-aligned x and w with k a multiple of 16 bytes' worth, so every row of both
    // starts 16-byte aligned. Block i owns weight rows [i*rows, i*rows + rows) (rows matching the
    // kernel picked: 16 or 32 for bf16, 8 for f32), and the grid covers ceil(n / rows) blocks.
    // bf16: a lane reads 16 bytes of weight row r at element 32*s + 8*t only for r < n and
    // 32*s + 8*t < k (the unguarded round requires every row of the block < n and every step s
    // below floor(k/32), so 32*s + 8*t + 8 <= k), and x row g at the same offsets only for g < m;
    // it writes y[bb, r] only for bb < m, r < n. f32: one warp per row r < n, 16-byte loads at
    // element offsets < k (k a multiple of 4), writes y[b, r] for b < m. The kernels' GEMV_WARPS
    // split of K assumes kernels::GEMV_THREADS (256) threads; their shared memory is static.
    unsafe { b.launch(cfg(grid, kernels::GEMV_THREADS, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// Runs the product with cuBLAS (f32 accumulation; bf16 or f32 inputs).
pub fn gemm(gpu: &Gpu, l: &Linear<'_>) -> Result<(), BackendError> {
    l.check()?;
    gemm_rows(gpu, l, 0, l.m)
}

/// cuBLAS over rows `row0 .. row0 + rows` of `x` and `y` (which may lie past `l.m`, up to the
/// buffers' lengths).
fn gemm_rows(gpu: &Gpu, l: &Linear<'_>, row0: usize, rows: usize) -> Result<(), BackendError> {
    let dt = float_type(l.w, "weight")?;
    let end = row0 + rows;
    l.x.check("linear x", dt, end * l.k)?;
    l.y.check("linear y", l.y.dtype(), end * l.n)?;
    if rows == 0 {
        return Ok(());
    }
    let ty = |d: DType| match d {
        DType::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
        _ => blas_sys::cudaDataType::CUDA_R_32F,
    };
    let (alpha, beta) = (1.0f32, 0.0f32);
    // Row-major y[m,n] = x[m,k] w[n,k]^T is column-major y^T[n,m] = w^T... : A = w (k x n
    // column-major, transposed), B = x (k x m column-major).
    // SAFETY: w holds n*k, x (row0+rows)*k and y (row0+rows)*n elements (checked); the handle is
    // bound to our stream; alpha/beta are f32 as CUBLAS_COMPUTE_32F requires.
    unsafe {
        cudarc::cublas::result::gemm_ex(
            *gpu.blas.handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_T,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            int(l.n, "n")?,
            int(rows, "m")?,
            int(l.k, "k")?,
            (&alpha as *const f32).cast(),
            l.w.ptr() as *const _,
            ty(dt),
            int(l.k, "k")?,
            l.x.ptr_at(row0 * l.k) as *const _,
            ty(dt),
            int(l.k, "k")?,
            (&beta as *const f32).cast(),
            l.y.ptr_at(row0 * l.n) as *mut _,
            ty(l.y.dtype()),
            int(l.n, "n")?,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(BackendError::from)
}

/// The product the backend uses for more rows than the GEMV crossover (or with the GEMV kernel
/// off; `CudaBackend::linear` decides): cuBLAS.
pub fn linear(gpu: &Gpu, l: &Linear<'_>) -> Result<(), BackendError> {
    gemm(gpu, l)
}

/// [`linear`] in blocks of exactly `chunk` rows (the last one running over padding rows of `x`
/// and `y`, which must hold `m` rounded up to `chunk` rows). cuBLAS then always sees the same
/// shape, so a row's result never depends on how many rows are in the batch (batch invariance).
pub fn linear_chunked(gpu: &Gpu, l: &Linear<'_>, chunk: usize) -> Result<(), BackendError> {
    float_type(l.w, "weight")?;
    l.w.check("weight", l.w.dtype(), l.n * l.k)?;
    let mut row0 = 0;
    while row0 < l.m {
        gemm_rows(gpu, l, row0, chunk)?;
        row0 += chunk;
    }
    Ok(())
}

/// Samples one token per row of f32 `logits[rows, vocab]` into u32 `out[rows]`; `params` holds
/// `rows` [`SampleRow`]s (`bytemuck::cast_slice` of them) (a U32 buffer of `8 * rows` words).
/// `scratch` is a U32 buffer of `cap * kernels::SAMPLE_SCRATCH_WORDS` words for some `cap >= rows`,
/// zeroed when allocated: its first `4 * cap` words hold per-row done-counters (word `r` for row
/// `r`), which the kernel leaves zero again, the rest the slices' partial results. The split is at
/// `4 * cap` whatever `rows` is, so a call with fewer rows never leaves partial results where a
/// later call with more rows expects zeroed counters.
pub fn sample(
    gpu: &Gpu,
    logits: &Buf,
    params: &Buf,
    out: &Buf,
    scratch: &Buf,
    (rows, vocab): (usize, usize),
) -> Result<(), BackendError> {
    logits.check("logits", DType::F32, rows * vocab)?;
    params.check("sample params", DType::U32, rows * 8)?;
    out.check("sampled", DType::U32, rows)?;
    scratch.check(
        "sample scratch",
        DType::U32,
        rows * kernels::SAMPLE_SCRATCH_WORDS,
    )?;
    if rows == 0 {
        return Ok(());
    }
    let vocab_i = int(vocab, "vocab")?;
    let slices = kernels::sample_slices(vocab);
    // Counters first (16-byte aligned: 4 words a row of the capacity), then the slice results.
    let cap = scratch.len() / kernels::SAMPLE_SCRATCH_WORDS;
    let parts = scratch.ptr_at(4 * cap);
    let done = scratch.ptr();
    let mut b = gpu.stream.launch_builder(gpu.func("sample_f32")?);
    b.arg(logits.dptr())
        .arg(params.dptr())
        .arg(out.dptr())
        .arg(&vocab_i)
        .arg(&parts)
        .arg(&done);
    let grid = (dim(slices, "slices")?, dim(rows, "rows")?, 1);
    // SAFETY: sizes checked above (cap >= rows); block (s, r) reads logits of row r < rows in
    // slice s < slices (bounded by vocab), writes its SlicePart at parts[r * slices + s] (inside the
    // scratch: 4 * cap counter words, then cap * SAMPLE_MAX_SLICES >= rows * slices 16-byte parts)
    // and bumps done[r] (word r < cap of the counters, never written as a part); the row's last
    // block writes out[r].
    unsafe { b.launch(cfg(grid, kernels::SAMPLE_THREADS, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// Threads per block of `mask_logits`.
const MASK_THREADS: u32 = 256;

/// Structured output: sets to -inf every logit of row `row_ids[r]` of f32 `logits[total_rows,
/// vocab]` whose token's bit is clear in mask `r` of U32 `masks` (`ceil(vocab / 32)` words a mask,
/// bit `t % 32` of word `t / 32`). `rows` (U32, at least `row_ids.len()` words) receives
/// `row_ids` for the kernel.
pub fn mask_logits(
    gpu: &Gpu,
    logits: &Buf,
    masks: &Buf,
    rows: &mut Buf,
    row_ids: &[u32],
    (total_rows, vocab): (usize, usize),
) -> Result<(), BackendError> {
    let (masked, words) = (row_ids.len(), vocab.div_ceil(32));
    logits.check("logits", DType::F32, total_rows * vocab)?;
    masks.check("masks", DType::U32, masked * words)?;
    rows.check("mask rows", DType::U32, masked)?;
    if let Some(bad) = row_ids.iter().find(|&&r| r as usize >= total_rows) {
        return Err(BackendError::InvalidBatch(format!(
            "mask row {bad} of {total_rows} rows"
        )));
    }
    if masked == 0 {
        return Ok(());
    }
    let ids: Vec<u8> = row_ids.iter().flat_map(|r| r.to_le_bytes()).collect();
    gpu.write_bytes(rows, &ids)?;
    let mut b = gpu.stream.launch_builder(gpu.func("mask_logits")?);
    let (vocab_i, words_i) = (int(vocab, "vocab")?, int(words, "mask words")?);
    b.arg(logits.dptr())
        .arg(masks.dptr())
        .arg(rows.dptr())
        .arg(&vocab_i)
        .arg(&words_i);
    let grid = (
        dim(vocab.div_ceil(MASK_THREADS as usize), "mask blocks")?,
        dim(masked, "masked rows")?,
        1,
    );
    // SAFETY: sizes checked above; thread (t, r) with t < vocab reads word t / 32 < words of mask
    // r < masked and writes logits[rows[r] * vocab + t]; rows[r] is row_ids[r] (written just above,
    // on this stream, before the launch), checked to be below total_rows.
    unsafe { b.launch(cfg(grid, MASK_THREADS, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

#[cfg(test)]
mod tests {
    use super::has_l2_prefetch;

    #[test]
    fn bulk_l2_prefetch_from_sm_90() {
        for (capability, has) in [
            ((8, 0), false),
            ((8, 9), false),
            ((9, 0), true),
            ((10, 0), true),
            ((12, 0), true),
        ] {
            assert_eq!(has_l2_prefetch(capability), has, "{capability:?}");
        }
    }
}
