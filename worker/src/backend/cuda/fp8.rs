//! FP8 linear products: launch wrappers of `kernels/src/fp8.cu` (per-row E4M3 quantization of bf16
//! activations, the small-batch product of E4M3 activations with E4M3 weights on the FP8 tensor
//! cores, sm_89 and later) and [`Fp8Gemm`], cuBLASLt's FP8 product for larger batches.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublaslt::sys::cublasLtMatmulDescAttributes_t as Attr;
use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::PushKernelArg;
use kernels::params::{Fp8QuantParams, GemvFp8Params, GemvFp8RopeParams};

use super::device::{Buf, DType, Gpu};
use super::lt::{CANDIDATES, GemmShape, LT_WORKSPACE_BYTES, MIN_GAIN, algo_accepted, time_us};
use super::lt_cache::{Choice, DiskCache};
use super::ops::{RopeKv, cfg, dim, int, tile_grid};
use crate::backend::BackendError;
use crate::backend::switches::{FP8_TILE_LARGE, FP8_TILE_SMALL, Fp8GemvChoice};
use crate::config::ModelConfig;
use crate::quant::LinearQuant;
use crate::tp::LocalDims;

/// Rows of weights per block of the FP8 GEMV kernels (`gemv_fp8_r<R>`): 16 (2 tiles, 4 k-steps of
/// 64 in flight per warp; the backend's choice where it does not run the tile kernels,
/// [`gemv_fp8_tiles`]) or 32 (4 tiles, 2 steps). Run 19d also timed 8
/// rows with 8 steps in flight: 10–35 % slower than 16 at every 8B shape, not kept.
pub const GEMV_FP8_ROWS: &[usize] = &[16, 32];

/// Whether a device of compute capability `(major, minor)` has FP8 tensor cores (sm_89 and later).
pub fn has_fp8(capability: (i32, i32)) -> bool {
    capability >= (8, 9)
}

/// An error naming the device unless it has FP8 tensor cores ([`has_fp8`]).
pub(super) fn require_fp8(gpu: &Gpu) -> Result<(), BackendError> {
    if has_fp8(gpu.capability) {
        return Ok(());
    }
    Err(BackendError::Device(format!(
        "FP8 tensor cores need compute capability 8.9 or later; this device is {}.{}",
        gpu.capability.0, gpu.capability.1
    )))
}

/// `q[m, k]`, `scales[m]` from bf16 `x[m, k]`: each row's codes with its own scale, or with
/// `static_scale` for every row when that is positive.
pub struct QuantRows<'a> {
    pub x: &'a Buf,
    /// U8 codes out.
    pub q: &'a Buf,
    /// F32 scales out.
    pub scales: &'a Buf,
    pub m: usize,
    pub k: usize,
    /// `> 0`: one scale for all rows (static activations); `0.0`: dynamic per row.
    pub static_scale: f32,
}

/// Quantizes `a.x` row by row (see [`QuantRows`]).
pub fn quant_rows(gpu: &Gpu, a: &QuantRows<'_>) -> Result<(), BackendError> {
    a.x.check("fp8 quant x", DType::Bf16, a.m * a.k)?;
    a.q.check("fp8 quant codes", DType::U8, a.m * a.k)?;
    a.scales.check("fp8 quant scales", DType::F32, a.m)?;
    if !(a.static_scale >= 0.0 && a.static_scale.is_finite()) {
        return Err(BackendError::InvalidBatch(format!(
            "fp8 quant: static scale {}",
            a.static_scale
        )));
    }
    if a.m == 0 || a.k == 0 {
        return Ok(());
    }
    let p = Fp8QuantParams {
        x: a.x.ptr(),
        q: a.q.ptr(),
        scales: a.scales.ptr(),
        m: int(a.m, "m")?,
        k: int(a.k, "k")?,
        static_scale: a.static_scale,
        pad: 0,
        in_x_scales: 0,
        in_w_scales: 0,
    };
    // Rows whole in 2 cached vectors a thread take the kernel with fewer registers (more blocks
    // an SM); both give the same codes.
    let name = if a.k <= 2 * 8 * kernels::FP8_QUANT_THREADS as usize {
        "quant_fp8_rows_bf16_c2"
    } else {
        "quant_fp8_rows_bf16"
    };
    let mut b = gpu.stream.launch_builder(gpu.func(name)?);
    b.arg(&p);
    // SAFETY: the checks above gave x >= m*k bf16, q >= m*k bytes and scales >= m floats; block r
    // (one per row, grid m) reads x[r, 0..k) and writes q[r, 0..k) and scales[r] only, striding by
    // kernels::FP8_QUANT_THREADS, the block size its reduction's shared array is sized for.
    unsafe { b.launch(cfg((dim(a.m, "m")?, 1, 1), kernels::FP8_QUANT_THREADS, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// Whether [`silu_mul_quant`] runs for an intermediate size of `k` (else it queues nothing).
pub fn silu_mul_quant_fits(k: usize) -> bool {
    k.is_multiple_of(8)
}

/// The kernels [`silu_mul_quant_with`] can launch; both give the same codes and scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiluQuantKernel {
    /// `silu_mul_quant_fp8_bf16`: a block of [`kernels::FP8_QUANT_THREADS`] a row (several an SM).
    Row,
    /// `silu_mul_quant_fp8_bf16_wide`: a block of [`kernels::FP8_QUANT_WIDE_THREADS`] a row (at
    /// most one an SM: for few rows, where the one block of a row is the launch's latency).
    Wide,
}

impl SiluQuantKernel {
    /// Both kernels.
    pub const ALL: [SiluQuantKernel; 2] = [Self::Row, Self::Wide];

    /// The kernel's name and block size.
    fn launch(self) -> (&'static str, u32) {
        match self {
            Self::Row => ("silu_mul_quant_fp8_bf16", kernels::FP8_QUANT_THREADS),
            Self::Wide => (
                "silu_mul_quant_fp8_bf16_wide",
                kernels::FP8_QUANT_WIDE_THREADS,
            ),
        }
    }

    /// What [`silu_mul_quant`] launches for `m` rows on `gpu`: up to a row an SM, wide blocks
    /// (run 41g: one 256-thread block a row made a one-row step's SiLU 9.6 µs a layer); more, the
    /// narrow ones, several an SM (run 47, H100, k = 14,336: 20.2 against 18.9 µs at 256 rows,
    /// 464 against 530 at 8,176).
    pub fn choose(gpu: &Gpu, m: usize) -> Self {
        if m <= gpu.sms { Self::Wide } else { Self::Row }
    }
}

/// `q[m, k]`, `scales[m]` from the gate/up product `gate_up[m, 2k]` ([gate | up] a row): the codes
/// [`quant_rows`] gives for `silu_mul`'s bf16 output, in one launch (the kernel
/// [`SiluQuantKernel::choose`] picks). With `raw = Some((x_scales[m], w_scales[2k]))`, `gate_up`
/// is an FP8 product left unscaled ([`Fp8Gemm::run_unscaled`]) and is scaled first exactly as
/// [`Fp8Gemm::run`] would have; `x_scales` may be `scales` itself. `Ok(false)` (nothing queued)
/// where the fused kernel does not apply ([`silu_mul_quant_fits`]).
pub fn silu_mul_quant(
    gpu: &Gpu,
    gate_up: &Buf,
    out: (&Buf, &Buf),
    (m, k): (usize, usize),
    static_scale: f32,
    raw: Option<(&Buf, &Buf)>,
) -> Result<bool, BackendError> {
    let kernel = SiluQuantKernel::choose(gpu, m);
    silu_mul_quant_with(gpu, kernel, gate_up, out, (m, k), static_scale, raw)
}

/// [`silu_mul_quant`] on the kernel `kernel` (for tests and benchmarks: both give the same
/// bits).
pub fn silu_mul_quant_with(
    gpu: &Gpu,
    kernel: SiluQuantKernel,
    gate_up: &Buf,
    out: (&Buf, &Buf),
    (m, k): (usize, usize),
    static_scale: f32,
    raw: Option<(&Buf, &Buf)>,
) -> Result<bool, BackendError> {
    let (q, scales) = out;
    if !silu_mul_quant_fits(k) {
        return Ok(false);
    }
    gate_up.check("silu·mul fp8 gate_up", DType::Bf16, m * 2 * k)?;
    q.check("silu·mul fp8 codes", DType::U8, m * k)?;
    scales.check("silu·mul fp8 scales", DType::F32, m)?;
    if let Some((xs, ws)) = raw {
        xs.check("silu·mul fp8 product row scales", DType::F32, m)?;
        ws.check("silu·mul fp8 product column scales", DType::F32, 2 * k)?;
    }
    if !(static_scale >= 0.0 && static_scale.is_finite()) {
        return Err(BackendError::InvalidBatch(format!(
            "silu·mul fp8: static scale {static_scale}"
        )));
    }
    let (name, threads) = kernel.launch();
    if m == 0 {
        return Ok(true);
    }
    let p = Fp8QuantParams {
        x: gate_up.ptr(),
        q: q.ptr(),
        scales: scales.ptr(),
        m: int(m, "m")?,
        k: int(k, "k")?,
        static_scale,
        pad: 0,
        in_x_scales: raw.map_or(0, |(xs, _)| xs.ptr()),
        in_w_scales: raw.map_or(0, |(_, ws)| ws.ptr()),
    };
    let mut b = gpu.stream.launch_builder(gpu.func(name)?);
    b.arg(&p);
    // SAFETY: the checks above gave gate_up >= m*2k bf16, q >= m*k bytes and scales >= m floats
    // (with raw: x_scales >= m and w_scales >= 2k floats); device buffers start 256-byte aligned
    // and k is a multiple of 8, so every row of gate_up is 16-byte, every row of q 8-byte and
    // every 8-column group of w_scales 32-byte aligned, as the kernel's vector accesses need.
    // Block r (grid m) reads gate_up[r, 0..2k) (and x_scales[r], read by every thread before
    // the block's one write of scales[r], then w_scales[0..2k)) and writes q[r, 0..k) and
    // scales[r] only, with `threads` threads: the kernel's launch bound and the size its
    // reduction's shared array has.
    unsafe { b.launch(cfg((dim(m, "m")?, 1, 1), threads, 0)) }
        .map(|_| true)
        .map_err(BackendError::from)
}

/// `y[b, n] = bf16(Σ_k code(x[b, k]) · code(w[n, k]) · x_scales[b] · w_scales[n])`.
pub struct Fp8Linear<'a> {
    /// U8 activation codes `[m, k]`.
    pub x: &'a Buf,
    /// F32 `[m]`.
    pub x_scales: &'a Buf,
    /// U8 weight codes `[n, k]` (HF `Linear` layout).
    pub w: &'a Buf,
    /// F32 `[n]`.
    pub w_scales: &'a Buf,
    /// Bf16 `[m, n]`.
    pub y: &'a Buf,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Fp8Linear<'_> {
    /// Checks every buffer's type and length.
    pub fn check(&self) -> Result<(), BackendError> {
        self.x.check("fp8 x", DType::U8, self.m * self.k)?;
        self.x_scales.check("fp8 x scales", DType::F32, self.m)?;
        self.w.check("fp8 weight", DType::U8, self.n * self.k)?;
        self.w_scales
            .check("fp8 weight scales", DType::F32, self.n)?;
        self.y.check("fp8 y", DType::Bf16, self.m * self.n)
    }

    /// Whether the FP8 GEMV runs this product: at most [`kernels::GEMV_MAX_BATCH`] rows, `k` a
    /// multiple of 16 below 2^30, `x` and `w` 16-byte aligned (so every row of both is).
    pub fn gemv_ok(&self) -> bool {
        self.m <= kernels::GEMV_MAX_BATCH
            && self.k.is_multiple_of(16)
            && self.k < 1 << 30
            && self.x.ptr().is_multiple_of(16)
            && self.w.ptr().is_multiple_of(16)
    }

    /// The kernels' parameters (`y` bf16 `[m, n]`).
    pub(super) fn params(&self) -> Result<GemvFp8Params, BackendError> {
        Ok(GemvFp8Params {
            x: self.x.ptr(),
            x_scales: self.x_scales.ptr(),
            w: self.w.ptr(),
            w_scales: self.w_scales.ptr(),
            y: self.y.ptr(),
            b: int(self.m, "m")?,
            n: int(self.n, "n")?,
            k: int(self.k, "k")?,
            pad: 0,
        })
    }

    /// Whether the tile kernels ([`gemv_fp8_tiles`]) take `l`: [`Self::gemv_ok`], `k` a multiple
    /// of 64 and `n k` below 2^32 (their byte offsets are 32-bit).
    pub fn tiles_ok(&self) -> bool {
        self.gemv_ok() && self.k.is_multiple_of(64) && (self.n as u64) * (self.k as u64) < 1 << 32
    }
}

/// Runs `l` on the kernel `choice` picks for it: a tile kernel where [`Fp8Linear::tiles_ok`], else
/// `gemv_fp8_r16`.
pub fn gemv_fp8_choice(
    gpu: &Gpu,
    l: &Fp8Linear<'_>,
    choice: Fp8GemvChoice,
) -> Result<(), BackendError> {
    if choice == Fp8GemvChoice::Rows16 || !l.tiles_ok() {
        gemv_fp8(gpu, l, 16)
    } else {
        gemv_fp8_tiles(gpu, l, choice)
    }
}

/// Runs `l` on the 16-row tile kernel `choice` picks for it ([`Fp8GemvChoice::tile_for`]; not
/// [`Fp8GemvChoice::Rows16`]).
/// Every tile kernel gives the same bits: each warp sums the same contiguous steps in the same
/// order whatever the steps in flight.
pub fn gemv_fp8_tiles(
    gpu: &Gpu,
    l: &Fp8Linear<'_>,
    choice: Fp8GemvChoice,
) -> Result<(), BackendError> {
    l.check()?;
    let Some(kernel) = choice.tile_for(l.n * l.k).filter(|_| l.tiles_ok()) else {
        return Err(BackendError::InvalidBatch(format!(
            "gemv_fp8 {}: shape or alignment unsupported ({} x {} by {})",
            choice.name(),
            l.m,
            l.n,
            l.k
        )));
    };
    require_fp8(gpu)?;
    if l.m == 0 || l.n == 0 {
        return Ok(());
    }
    let f = gpu.func(&format!("gemv_fp8_{kernel}"))?;
    let grid = (tile_grid(gpu, f, l.n.div_ceil(16), 0)?, 1, 1);
    let p = l.params()?;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&p);
    // SAFETY: check() gave x >= m*k and w >= n*k bytes, x_scales >= m and w_scales >= n floats,
    // y >= m*n bf16; tiles_ok gave 1 <= m <= GEMV_MAX_BATCH (m > 0 above), k a multiple of 64,
    // n*k < 2^32 (the kernel's 32-bit byte offsets do not wrap) and 16-byte-aligned x and w, so
    // every 16-byte load below is aligned. Block i takes the 16-row tiles i, i + grid, ... <
    // ceil(n / 16); a lane reads 16 bytes of weight rows min(row, n - 1) < n and of x row
    // min(g, m - 1) < m at byte 64*s + 16*t <= k - 16 for steps s < k / 64 (loads past a warp's
    // steps are predicated off), and writes y[bb, r] and reads x_scales[bb], w_scales[r] only for
    // bb < m, r < n. The device is sm_89 or later (checked), where the kernel's mma exists; every
    // mma runs on all 32 lanes (the item test is warp-uniform) and every thread reaches each
    // tile's barrier (the tile loop is the same for the whole block); shared memory is static and
    // sized for GEMV_THREADS (256) threads.
    unsafe { b.launch(cfg(grid, kernels::GEMV_THREADS, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// The tile kernel `choice` runs the q/k/v product `l` on when that kernel has a variant with RoPE
/// and the paged KV write `a` in its epilogue (`gemv_fp8_rope_kv_<kernel>`): one of the two
/// [`Fp8GemvChoice::Auto`] picks, [`Fp8Linear::tiles_ok`], bf16 RoPE buffers, `l` producing exactly
/// `a`'s `[n, (hq + 2 hkv) d]`, and a head size that is a multiple of 16 (a tile holds 8 rotation
/// pairs of one head), with no raw input scales (`RopeKv::raw_scales`). `None`: run the product
/// and `rope_kv_write` apart.
pub fn gemv_fp8_rope_kernel(
    l: &Fp8Linear<'_>,
    a: &RopeKv<'_>,
    choice: Fp8GemvChoice,
) -> Option<&'static str> {
    let fits = l.tiles_ok()
        && a.qkv.dtype() == DType::Bf16
        && a.d.is_multiple_of(16)
        && l.m == a.n
        && l.n == (a.hq + 2 * a.hkv) * a.d
        && a.raw_scales.is_none();
    choice
        .tile_for(l.n * l.k)
        .filter(|k| fits && [FP8_TILE_SMALL, FP8_TILE_LARGE].contains(k))
}

/// The FP8 q/k/v product `l` and `rope_kv_write` of its output in one launch on the tile kernel
/// [`gemv_fp8_rope_kernel`] names (`l.y` and `a.qkv` are not written): the same bits as
/// [`gemv_fp8_tiles`] followed by `rope_kv_write`.
///
/// # Safety
/// As `rope_kv_write`: every one of the first `n` slots is `< k_cache.len() / (hkv * d)` (or
/// negative: skipped).
pub unsafe fn gemv_fp8_rope_kv(
    gpu: &Gpu,
    l: &Fp8Linear<'_>,
    a: &RopeKv<'_>,
    choice: Fp8GemvChoice,
) -> Result<(), BackendError> {
    l.check()?;
    let (_, rope) = a.params()?;
    let Some(kernel) = gemv_fp8_rope_kernel(l, a, choice) else {
        return Err(BackendError::InvalidBatch(format!(
            "gemv_fp8_rope_kv {}: shape, type or alignment unsupported ({} x {} by {}, d {})",
            choice.name(),
            l.m,
            l.n,
            l.k,
            a.d
        )));
    };
    require_fp8(gpu)?;
    if l.m == 0 {
        return Ok(());
    }
    let f = gpu.func(&format!("gemv_fp8_rope_kv_{kernel}"))?;
    let grid = (tile_grid(gpu, f, l.n / 16, 0)?, 1, 1);
    let p = GemvFp8RopeParams {
        g: l.params()?,
        rope,
    };
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&p);
    // SAFETY: as gemv_fp8_tiles' launch for the product (l checked; tiles_ok: 1 <= m <= 8, k a
    // multiple of 64, n*k < 2^32, 16-byte aligned x and w), with n = (hq + 2 hkv) d and d a
    // multiple of 16, so tile i's rows — head i / (d/16), dims 8 (i % (d/16)) + 0..8 and the same
    // + d/2 — are < n and the n / 16 tiles cover every row once. The epilogue is rope_kv_write's
    // for token bb < m = a.n, head h < hq + 2 hkv and pair j < d/2, whose buffers a.params()
    // checked; it reads x_scales[bb] and w_scales[row] for row < n. Cache slots are the caller's
    // promise.
    unsafe { b.launch(cfg(grid, kernels::GEMV_THREADS, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// Runs `l` with the FP8 GEMV kernel, `rows_per_block` (one of [`GEMV_FP8_ROWS`]) weight rows a
/// block. Every choice gives the same bits: each warp sums its k-steps in increasing order
/// whatever the tile count and the steps in flight. The device must have FP8 tensor cores ([`has_fp8`]).
pub fn gemv_fp8(gpu: &Gpu, l: &Fp8Linear<'_>, rows_per_block: usize) -> Result<(), BackendError> {
    l.check()?;
    if !l.gemv_ok() {
        return Err(BackendError::InvalidBatch(
            "gemv_fp8: shape or alignment unsupported".into(),
        ));
    }
    if !GEMV_FP8_ROWS.contains(&rows_per_block) {
        return Err(BackendError::InvalidBatch(format!(
            "gemv_fp8: no kernel for {rows_per_block} rows per block"
        )));
    }
    require_fp8(gpu)?;
    if l.m == 0 || l.n == 0 {
        return Ok(());
    }
    let p = l.params()?;
    let name = format!("gemv_fp8_r{rows_per_block}");
    let mut b = gpu.stream.launch_builder(gpu.func(&name)?);
    b.arg(&p);
    let grid = (dim(l.n.div_ceil(rows_per_block), "n")?, 1, 1);
    // SAFETY: check() gave x >= m*k and w >= n*k bytes, x_scales >= m and w_scales >= n floats,
    // y >= m*n bf16; gemv_ok 16-byte-aligned x and w with k a multiple of 16, so every row of both
    // starts 16-byte aligned. Block i owns weight rows [i*R, i*R + R) (R = rows_per_block, the
    // kernel picked: 16 or 32), the grid covers ceil(n / R) blocks. A lane reads 16 bytes of
    // weight row r at byte 64*s + 16*t only for r < n and 64*s + 16*t < k (the unguarded round
    // requires every row of the block < n and every step below floor(k/64)), and x row g < m at
    // the same offsets; it writes y[bb, r] only for bb < m, r < n, reading x_scales[bb] and
    // w_scales[r]. The device is sm_89 or later (checked), where the kernel's mma exists; its
    // shared memory is static and sized for GEMV_THREADS (256) threads.
    unsafe { b.launch(cfg(grid, kernels::GEMV_THREADS, 0)) }
        .map(|_| ())
        .map_err(BackendError::from)
}

/// The FP8 product for more rows than the GEMV takes: cuBLASLt on the raw E4M3 codes, bf16 out,
/// then `scale_fp8_out_bf16` multiplies each output by its activation row's and weight row's
/// scales. (Run 18: on the H200, cuBLASLt 13.0 finds no algorithm for per-row scale vectors,
/// `CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F`: `CUBLAS_STATUS_INVALID_VALUE`.) One description per
/// shape, its algorithm cuBLASLt's first heuristic choice, or for the shapes of a decode graph
/// ([`Self::tune`]) the fastest of its first [`CANDIDATES`] timed on the real weights, kept on
/// disk with bf16's choices (`lt_cache.rs`) for later processes.
pub struct Fp8Gemm {
    handle: lt_sys::cublasLtHandle_t,
    workspace: Buf,
    plans: RefCell<HashMap<(usize, usize, usize), Fp8Plan>>,
    tuned: RefCell<HashMap<(usize, usize, usize), Fp8Tuning>>,
    cache: DiskCache,
}

/// What [`Fp8Gemm::tune`] measured for a shape, µs a product.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp8Tuning {
    /// cuBLASLt's first heuristic choice (`None`: it did not run).
    pub heuristic_us: Option<f64>,
    /// The algorithm kept: the fastest candidate where it beats the first by [`MIN_GAIN`].
    pub kept_us: f64,
    /// Whether the kept algorithm is not the heuristic's first.
    pub retuned: bool,
    /// Whether the choice came from the disk cache (the times are the ones measured then).
    pub from_cache: bool,
}

// SAFETY: used only through the backend, which one thread drives at a time (Send, not Sync);
// cuBLASLt handles may move between threads when calls on them are not concurrent.
unsafe impl Send for Fp8Gemm {}

struct Fp8Plan {
    desc: lt_sys::cublasLtMatmulDesc_t,
    a: lt_sys::cublasLtMatrixLayout_t,
    b: lt_sys::cublasLtMatrixLayout_t,
    d: lt_sys::cublasLtMatrixLayout_t,
    algo: lt_sys::cublasLtMatmulAlgo_t,
}

impl Drop for Fp8Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created by cuBLASLt (or is null and skipped) and is destroyed
        // once, here; queued or captured launches do not refer to these host-side descriptions.
        unsafe {
            for layout in [self.a, self.b, self.d] {
                if !layout.is_null() {
                    let _ = lt::destroy_matrix_layout(layout);
                }
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// Sets one attribute of a matmul description from a live value.
///
/// # Safety
/// `desc` is a live description and `T` is the attribute's documented type.
unsafe fn set_attr<T>(
    desc: lt_sys::cublasLtMatmulDesc_t,
    attr: lt_sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), BackendError> {
    // SAFETY: the caller's contract; `value` is live for the call, which copies it.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            (value as *const T).cast(),
            std::mem::size_of::<T>(),
        )
    }
    .map_err(BackendError::from)
}

impl Fp8Gemm {
    /// A cuBLASLt handle with its workspace on `gpu`.
    pub fn new(gpu: &Gpu) -> Result<Self, BackendError> {
        gpu.ctx.bind_to_thread()?;
        let handle = lt::create_handle()?;
        // SAFETY: takes no arguments; the library is loaded (the handle above was created).
        let version = unsafe { lt_sys::cublasLtGetVersion() };
        Ok(Self {
            handle,
            workspace: gpu.alloc(DType::U32, LT_WORKSPACE_BYTES / 4)?,
            plans: RefCell::new(HashMap::new()),
            tuned: RefCell::new(HashMap::new()),
            cache: DiskCache::open(gpu.cache_dir.as_deref(), &gpu.name, gpu.capability, version),
        })
    }

    /// Whether `l` fits cuBLASLt's FP8 rules: `k` a multiple of 16 and `n` of 8 (every leading
    /// dimension a multiple of 16 bytes; run 18: `n` 300 is `CUBLAS_STATUS_NOT_SUPPORTED`), every
    /// operand 16-byte aligned.
    pub fn fits(l: &Fp8Linear<'_>) -> bool {
        l.k.is_multiple_of(16)
            && l.n.is_multiple_of(8)
            && [l.x.ptr(), l.w.ptr(), l.y.ptr()]
                .iter()
                .all(|p| p.is_multiple_of(16))
    }

    /// Queues `l` (any number of rows).
    pub fn run(&self, gpu: &Gpu, l: &Fp8Linear<'_>) -> Result<(), BackendError> {
        self.run_unscaled(gpu, l)?;
        scale_output(gpu, l)
    }

    /// Queues `l`'s product of the raw codes only: `y` holds the sums, rounded to bf16, which
    /// the consumer must still scale by `x_scales[b] · w_scales[n]` as [`Self::run`] does
    /// ([`silu_mul_quant`] can).
    pub fn run_unscaled(&self, gpu: &Gpu, l: &Fp8Linear<'_>) -> Result<(), BackendError> {
        l.check()?;
        if !Self::fits(l) {
            return Err(BackendError::InvalidBatch(
                "fp8 gemm: k must be a multiple of 16, n of 8, and the operands 16-byte aligned"
                    .into(),
            ));
        }
        if l.m == 0 || l.n == 0 {
            return Ok(());
        }
        let key = (l.m, l.n, l.k);
        if !self.plans.borrow().contains_key(&key) {
            let mut plan = self.describe(l.m, l.n, l.k)?;
            plan.algo = self.candidates(&plan, key, 1)?[0];
            self.plans.borrow_mut().insert(key, plan);
        }
        self.matmul(gpu, &self.plans.borrow()[&key], l)
    }

    /// Times cuBLASLt's first [`CANDIDATES`] heuristic algorithms for `l`'s shape on its operands
    /// and keeps the fastest for every later product of that shape — the heuristic's first unless
    /// another beats it by [`MIN_GAIN`] (as [`super::lt::LtGemm::tune`] does for bf16 weights).
    /// Runs the product about a hundred times, writing `l.y`, and synchronises: never while a
    /// graph is being captured. A shape tuned before, in this process or (on the same GPU model and
    /// cuBLASLt) in an earlier one, returns what was measured then; a cached algorithm runs once
    /// here, so that its kernels load outside any capture.
    pub fn tune(&self, gpu: &Gpu, l: &Fp8Linear<'_>) -> Result<Fp8Tuning, BackendError> {
        let key = (l.m, l.n, l.k);
        if let Some(t) = self.tuned.borrow().get(&key) {
            return Ok(*t);
        }
        l.check()?;
        if !Self::fits(l) || l.m == 0 || l.n == 0 {
            return Err(BackendError::InvalidBatch(format!(
                "fp8 gemm tuning: m {} n {} k {} is not a cuBLASLt FP8 shape",
                l.m, l.n, l.k
            )));
        }
        let shape = GemmShape {
            m: l.m,
            n: l.n,
            k: l.k,
            dtype: DType::U8,
            out: DType::Bf16,
        };
        if let Some(t) = self.restore(gpu, l, shape)? {
            return Ok(t);
        }
        let mut plan = self.describe(l.m, l.n, l.k)?;
        let mut heuristic_us = None;
        let mut best: Option<(f64, usize, lt_sys::cublasLtMatmulAlgo_t)> = None;
        let candidates = self.candidates(&plan, key, CANDIDATES)?;
        for (i, &cand) in candidates.iter().enumerate() {
            plan.algo = cand;
            // A candidate that fails to run (not supported for this shape after all) is skipped.
            let Ok(us) = time_us(gpu, || self.matmul(gpu, &plan, l)) else {
                continue;
            };
            if i == 0 {
                heuristic_us = Some(us);
            }
            if best.is_none_or(|(b, _, _)| us < b) {
                best = Some((us, i, cand));
            }
        }
        let Some((best_us, best_i, best_algo)) = best else {
            return Err(BackendError::Device(format!(
                "cuBLASLt ran no FP8 algorithm for m {} n {} k {}",
                l.m, l.n, l.k
            )));
        };
        let keep_first = heuristic_us.is_some_and(|h| best_us >= h * (1.0 - MIN_GAIN));
        let t = if keep_first {
            plan.algo = candidates[0];
            Fp8Tuning {
                heuristic_us,
                kept_us: heuristic_us.unwrap_or(best_us),
                retuned: false,
                from_cache: false,
            }
        } else {
            plan.algo = best_algo;
            Fp8Tuning {
                heuristic_us,
                kept_us: best_us,
                retuned: best_i != 0,
                from_cache: false,
            }
        };
        self.cache.remember(
            shape,
            Choice {
                gemm_ex_us: t.heuristic_us.unwrap_or(t.kept_us),
                best_lt_us: Some(t.kept_us),
                algo: Some(plan.algo.data),
            },
        );
        self.plans.borrow_mut().insert(key, plan);
        self.tuned.borrow_mut().insert(key, t);
        Ok(t)
    }

    /// The disk cache's choice for `l`'s shape, run once and kept, where the file has one that
    /// this cuBLASLt accepts ([`algo_accepted`]); `None`: time the shape.
    fn restore(
        &self,
        gpu: &Gpu,
        l: &Fp8Linear<'_>,
        shape: GemmShape,
    ) -> Result<Option<Fp8Tuning>, BackendError> {
        let Some(Choice {
            gemm_ex_us,
            best_lt_us,
            algo: Some(words),
        }) = self.cache.get(&shape)
        else {
            return Ok(None);
        };
        let mut plan = self.describe(l.m, l.n, l.k)?;
        plan.algo.data = words;
        // SAFETY: the handle and the plan's descriptors are live.
        if !unsafe { algo_accepted(self.handle, plan.desc, [plan.a, plan.b, plan.d], &plan.algo) } {
            tracing::warn!(
                ?shape,
                "a cached FP8 cuBLASLt algorithm was refused; timing the shape again"
            );
            return Ok(None);
        }
        self.matmul(gpu, &plan, l)?;
        let kept_us = best_lt_us.unwrap_or(gemm_ex_us);
        let t = Fp8Tuning {
            heuristic_us: Some(gemm_ex_us),
            kept_us,
            // A kept algorithm other than the first beat it by MIN_GAIN; the first is kept at its time.
            retuned: kept_us < gemm_ex_us,
            from_cache: true,
        };
        let key = (l.m, l.n, l.k);
        self.plans.borrow_mut().insert(key, plan);
        self.tuned.borrow_mut().insert(key, t);
        Ok(Some(t))
    }

    /// Queues `l`'s raw product on `plan` (described for `l`'s shape).
    fn matmul(&self, gpu: &Gpu, plan: &Fp8Plan, l: &Fp8Linear<'_>) -> Result<(), BackendError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the callers checked w >= n*k and x >= m*k bytes and y >= m*n bf16; the plan's
        // layouts describe exactly those sizes; its algorithm came from cuBLASLt's heuristic for
        // these descriptions with a workspace need within the workspace passed, which is used
        // only in stream order; alpha/beta are f32 (the scale type).
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                l.w.ptr() as *const c_void,
                plan.a,
                l.x.ptr() as *const c_void,
                plan.b,
                l.y.ptr() as *const c_void,
                plan.d,
                l.y.ptr() as *mut c_void,
                plan.d,
                &plan.algo,
                self.workspace.ptr() as *mut c_void,
                LT_WORKSPACE_BYTES,
                gpu.stream.cu_stream() as lt_sys::cudaStream_t,
            )
        }?;
        Ok(())
    }

    /// D[n, m] = Wᵀ X in cuBLASLt's column-major terms (W stored k × n and transposed, X k × m),
    /// E4M3 operands, bf16 D (the raw sums; [`scale_output`] applies the scales).
    fn describe(&self, m: usize, n: usize, k: usize) -> Result<Fp8Plan, BackendError> {
        use lt_sys::cudaDataType::{CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_32F};
        let desc =
            lt::create_matmul_desc(lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, CUDA_R_32F)?;
        let mut plan = Fp8Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            // SAFETY: plain data (an array of u64), replaced by a heuristic result before use.
            algo: unsafe { std::mem::zeroed() },
        };
        let transpose: i32 = 1; // CUBLAS_OP_T
        // SAFETY: desc is live; TRANSA is an int32.
        unsafe { set_attr(plan.desc, Attr::CUBLASLT_MATMUL_DESC_TRANSA, &transpose) }?;
        let (m64, n64, k64) = (m as u64, n as u64, k as u64);
        plan.a = lt::create_matrix_layout(CUDA_R_8F_E4M3, k64, n64, k as i64)?;
        plan.b = lt::create_matrix_layout(CUDA_R_8F_E4M3, k64, m64, k as i64)?;
        plan.d = lt::create_matrix_layout(CUDA_R_16BF, n64, m64, n as i64)?;
        Ok(plan)
    }

    /// cuBLASLt's first `count` (at least one) heuristic algorithms for `plan`'s shape within the
    /// workspace, best first.
    fn candidates(
        &self,
        plan: &Fp8Plan,
        shape: (usize, usize, usize),
        count: usize,
    ) -> Result<Vec<lt_sys::cublasLtMatmulAlgo_t>, BackendError> {
        let pref = lt::create_matmul_pref()?;
        let limit = LT_WORKSPACE_BYTES as u64;
        // SAFETY: pref was just created; the attribute is a u64 read from a live local.
        let set = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&limit as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        // SAFETY: plain data; only entries cuBLASLt reports filled are read.
        let mut results: [lt_sys::cublasLtMatmulHeuristicResult_t; CANDIDATES] =
            unsafe { std::mem::zeroed() };
        let requested = count.clamp(1, CANDIDATES);
        let mut returned = 0i32;
        let found = set.and_then(|()| {
            // SAFETY: every description is live (plan, pref); `requested` <= CANDIDATES results
            // requested into a live array of CANDIDATES; returned is a live i32.
            unsafe {
                lt_sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    plan.desc,
                    plan.a,
                    plan.b,
                    plan.d,
                    plan.d,
                    pref,
                    requested as i32,
                    results.as_mut_ptr(),
                    &mut returned,
                )
            }
            .result()
        });
        // SAFETY: pref was created above and is not used after this.
        unsafe { lt::destroy_matmul_pref(pref) }?;
        let (m, n, k) = shape;
        let algos: Vec<_> = results[..(returned.max(0) as usize).min(requested)]
            .iter()
            .filter(|r| r.state == lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| r.algo)
            .collect();
        match found {
            Ok(()) if !algos.is_empty() => Ok(algos),
            other => Err(BackendError::Device(format!(
                "cuBLASLt has no FP8 (E4M3 × E4M3 → bf16) algorithm for \
                 m {m} n {n} k {k} ({other:?})"
            ))),
        }
    }
}

/// `y[b, n] *= x_scales[b] · w_scales[n]` over `l`'s output, in place.
fn scale_output(gpu: &Gpu, l: &Fp8Linear<'_>) -> Result<(), BackendError> {
    if l.m == 0 || l.n == 0 {
        return Ok(());
    }
    let p = GemvFp8Params {
        x: 0,
        x_scales: l.x_scales.ptr(),
        w: 0,
        w_scales: l.w_scales.ptr(),
        y: l.y.ptr(),
        b: int(l.m, "m")?,
        n: int(l.n, "n")?,
        k: 0,
        pad: 0,
    };
    let threads = kernels::FP8_SCALE_THREADS as usize;
    let blocks = (l.m * l.n).div_ceil(2 * threads).clamp(1, 4 * 132 * 8);
    let mut b = gpu.stream.launch_builder(gpu.func("scale_fp8_out_bf16")?);
    b.arg(&p);
    // SAFETY: the caller checked y >= m*n bf16, x_scales >= m and w_scales >= n floats; the kernel
    // grid-strides over the m*n outputs (pairs when n is even, so a pair never straddles two rows)
    // reading x_scales[b < m] and w_scales[n' < n] only; x and w are not read.
    unsafe {
        b.launch(cfg(
            (dim(blocks, "blocks")?, 1, 1),
            kernels::FP8_SCALE_THREADS,
            0,
        ))
    }
    .map(|_| ())
    .map_err(BackendError::from)
}

impl Drop for Fp8Gemm {
    fn drop(&mut self) {
        self.plans.get_mut().clear();
        // SAFETY: the handle was created in new() and every plan using it is gone.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// What FP8 linear layers need of the options and the model on CUDA (today: one rank, bf16, not
/// batch-invariant, every product's `k` a multiple of 16 and `n` of 8).
pub(super) fn check_fp8_options(
    (cfg, dims): (&ModelConfig, &LocalDims),
    (dtype, batch_invariant): (DType, bool),
    quant: &LinearQuant,
) -> Result<(), BackendError> {
    let what = quant.describe();
    let refuse = |why: String| Err(BackendError::InvalidOptions(format!("{what}: {why}")));
    if dtype != DType::Bf16 {
        return refuse("FP8 linear layers compute in bfloat16 (--dtype bfloat16)".into());
    }
    if batch_invariant {
        return refuse("--batch-invariant is not available with FP8 yet".into());
    }
    let h = cfg.hidden_size;
    let shapes = [
        ("q/k/v", dims.q_dim + 2 * dims.kv_dim, h),
        ("o", h, dims.q_dim),
        ("gate/up", 2 * dims.inter, h),
        ("down", h, dims.inter),
    ];
    for (name, n, k) in shapes {
        if !k.is_multiple_of(16) || !n.is_multiple_of(8) {
            return refuse(format!(
                "the {name} product ({n} × {k}) needs its input width a multiple of 16 and its \
                 output width a multiple of 8"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Quantization;
    use crate::tp::TpShard;

    #[test]
    fn fp8_needs_sm89() {
        assert!(!has_fp8((8, 0)) && !has_fp8((8, 6)));
        assert!(has_fp8((8, 9)) && has_fp8((9, 0)) && has_fp8((10, 0)));
    }

    #[test]
    fn options_fp8_cannot_run_are_refused_by_name() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-llama");
        let cfg = ModelConfig::load(&dir).expect("fixture");
        let quant = LinearQuant::resolve(Some(Quantization::Fp8), None).expect("fp8");
        let solo = LocalDims::new(&cfg, TpShard::SOLO).expect("dims");
        let check = |dims: &LocalDims, dtype, invariant| {
            check_fp8_options((&cfg, dims), (dtype, invariant), &quant)
                .err()
                .map(|e| e.to_string())
        };
        assert_eq!(check(&solo, DType::Bf16, false), None);
        let refused = |e: Option<String>, what: &str| {
            let e = e.expect("refused");
            assert!(
                e.contains(what) && e.starts_with("invalid backend options: fp8"),
                "{e}"
            );
        };
        refused(check(&solo, DType::F32, false), "--dtype bfloat16");
        refused(check(&solo, DType::Bf16, true), "--batch-invariant");
        // A rank's share is what must fit: tiny-llama's 176-wide down input halves to 88.
        let half = LocalDims::new(&cfg, TpShard { rank: 0, world: 2 }).expect("dims");
        refused(check(&half, DType::Bf16, false), "down product (64 × 88)");
        let mut odd = cfg.clone();
        odd.intermediate_size = 100;
        let dims = LocalDims::new(&odd, TpShard::SOLO).expect("dims");
        let e = check_fp8_options((&odd, &dims), (DType::Bf16, false), &quant);
        refused(e.err().map(|e| e.to_string()), "multiple of 16");
    }
}
