//! Weight products through cuBLASLt with the algorithm picked by timing, TensorRT-LLM-profiler
//! style. At the decode shapes (a few to a few hundred rows against an 8B model's weights)
//! `cublasGemmEx`'s default choice left 17–48 % of the H200's HBM bandwidth unused at 128 rows
//! (`scripts/gpu_timeline.sh`, run 12), and a timed pick among cuBLASLt's candidates recovered up
//! to a fifth of a product's time.
//!
//! For each shape a CUDA graph will run (rows a power of two, one of each weight's `n` and `k`),
//! [`LtGemm::tune`] times `cublasGemmEx` (what the product runs otherwise) and cuBLASLt's best
//! [`CANDIDATES`] heuristic algorithms on the real weights, before the graph is captured, and
//! keeps a cuBLASLt plan only where it beats `cublasGemmEx` by [`MIN_GAIN`]. Products of shapes
//! never tuned (prefill, eager batches of other sizes) and f32 weights stay on `cublasGemmEx`.
//! Choices are kept on disk (`lt_cache.rs`): a later process on the same GPU model and
//! cuBLASLt takes them without timing again.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::sys::CUevent_flags;

use super::device::{Buf, DType, Gpu};
use super::lt_cache::{Choice, DiskCache};
use super::ops::{self, Linear};
use crate::backend::BackendError;

/// cuBLASLt heuristic candidates timed per shape.
pub const CANDIDATES: usize = 8;

/// Launches timed per candidate (after one untimed).
const TIMED_REPS: usize = 10;

/// A cuBLASLt plan replaces `cublasGemmEx` only when at least this much faster (timing noise
/// must not flip a shape between two equal algorithms).
pub const MIN_GAIN: f64 = 0.03;

/// Device workspace cuBLASLt algorithms may use.
pub const LT_WORKSPACE_BYTES: usize = 32 << 20;

/// A product's shape: `y[m, n] = x[m, k] · w[n, k]ᵀ`, `w` and `x` of `dtype`, `y` of `out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: DType,
    pub out: DType,
}

/// What tuning one shape measured (µs per product).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TuneRecord {
    pub shape: GemmShape,
    pub gemm_ex_us: f64,
    /// The fastest cuBLASLt candidate, if any ran.
    pub best_lt_us: Option<f64>,
    /// Whether the product now runs through cuBLASLt.
    pub chosen: bool,
    /// Whether the choice came from the disk cache (the times are the ones measured then).
    pub from_cache: bool,
}

/// A cuBLASLt description of one shape with its chosen algorithm.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Plan {
    /// Descriptors for `shape` in the column-major terms of `ops::gemm`: D[n, m] = Wᵀ[n, k] X[k, m]
    /// with W stored k × n (transposed) and X k × m.
    fn describe(shape: GemmShape) -> Result<Self, BackendError> {
        let ty = |d: DType| match d {
            DType::Bf16 => sys::cudaDataType::CUDA_R_16BF,
            _ => sys::cudaDataType::CUDA_R_32F,
        };
        let (m, n, k) = (shape.m as u64, shape.n as u64, shape.k as u64);
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )?;
        // From here on `plan` owns what exists; Drop destroys it if a later step fails.
        let mut plan = Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            // SAFETY: cublasLtMatmulAlgo_t is plain data (an array of u64); all-zero is a valid
            // value, replaced by a heuristic result before any use.
            algo: unsafe { std::mem::zeroed() },
        };
        let transpose: i32 = 1; // CUBLAS_OP_T
        // SAFETY: desc was just created; the attribute is an int32 read from a live local.
        unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&transpose as *const i32).cast(),
                std::mem::size_of::<i32>(),
            )
        }?;
        plan.a = lt::create_matrix_layout(ty(shape.dtype), k, n, k as i64)?;
        plan.b = lt::create_matrix_layout(ty(shape.dtype), k, m, k as i64)?;
        plan.d = lt::create_matrix_layout(ty(shape.out), n, m, n as i64)?;
        Ok(plan)
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created by cuBLASLt (or is null and skipped) and is destroyed
        // once, here. They are host-side descriptions: launches already queued or captured into
        // graphs do not refer to them.
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

/// Whether cuBLASLt accepts the restored algorithm `algo` for the product `desc` with layouts
/// `[a, b, d]` (`d` also as C) within [`LT_WORKSPACE_BYTES`]: `cublasLtMatmulAlgoCheck`, the check
/// cuBLASLt documents for algorithms restored from storage.
///
/// # Safety
/// `handle`, `desc` and the layouts are live cuBLASLt objects.
pub(super) unsafe fn algo_accepted(
    handle: sys::cublasLtHandle_t,
    desc: sys::cublasLtMatmulDesc_t,
    [a, b, d]: [sys::cublasLtMatrixLayout_t; 3],
    algo: &sys::cublasLtMatmulAlgo_t,
) -> bool {
    // SAFETY: cublasLtMatmulHeuristicResult_t is plain data, filled by the check below.
    let mut result: sys::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's handle and descriptors are live; algo and result point to live values
    // of the types cuBLASLt expects (64 bytes read, one result written). Validating the words is
    // the call's job: it answers an algorithm it does not support with an error status.
    let status =
        unsafe { sys::cublasLtMatmulAlgoCheck(handle, desc, a, b, d, d, algo, &mut result) };
    status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
        && result.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
        && result.workspaceSize <= LT_WORKSPACE_BYTES
}

/// The cuBLASLt handle, its workspace and the tuned plans.
pub struct LtGemm {
    handle: sys::cublasLtHandle_t,
    workspace: Buf,
    /// Per tuned shape: the plan, or `None` where `cublasGemmEx` stays.
    plans: RefCell<HashMap<GemmShape, Option<Plan>>>,
    records: RefCell<Vec<TuneRecord>>,
    /// The choices on disk (this process's added as it tunes).
    cache: DiskCache,
}

// SAFETY: the handle and plans are only used through `&CudaBackend` / `&mut CudaBackend`, which
// the engine drives from one thread at a time (the backend is Send, not Sync); cuBLASLt handles
// may move between threads as long as calls on them are not concurrent.
unsafe impl Send for LtGemm {}

impl LtGemm {
    /// A cuBLASLt handle with its workspace on `gpu`.
    pub fn new(gpu: &Gpu) -> Result<Self, BackendError> {
        gpu.ctx.bind_to_thread()?;
        let handle = lt::create_handle()?;
        let workspace = gpu.alloc(DType::U32, LT_WORKSPACE_BYTES / 4)?;
        // SAFETY: takes no arguments; the library is loaded (the handle above was created).
        let version = unsafe { sys::cublasLtGetVersion() };
        let cache = DiskCache::open(gpu.cache_dir.as_deref(), &gpu.name, gpu.capability, version);
        Ok(Self {
            handle,
            workspace,
            plans: RefCell::new(HashMap::new()),
            records: RefCell::new(Vec::new()),
            cache,
        })
    }

    /// Whether `shape` was tuned (then [`LtGemm::run`] knows what to do with it).
    pub fn is_tuned(&self, shape: &GemmShape) -> bool {
        self.plans.borrow().contains_key(shape)
    }

    /// What every tuning so far measured.
    pub fn records(&self) -> Vec<TuneRecord> {
        self.records.borrow().clone()
    }

    /// Times `l`'s product through `cublasGemmEx` and cuBLASLt's candidates and remembers the
    /// choice for its shape. Runs the product (writing `l.y`) about a hundred times and
    /// synchronises: never while a graph is being captured.
    pub fn tune(&self, gpu: &Gpu, l: &Linear<'_>) -> Result<(), BackendError> {
        let shape = shape_of(l);
        if self.is_tuned(&shape) {
            return Ok(());
        }
        l.check()?;
        if let Some(c) = self.cache.get(&shape)
            && let Some(kept) = self.restore(shape, &c)?
        {
            // Run it once now: its kernels load here, not inside a graph capture.
            match &kept {
                Some(plan) => self.matmul(gpu, plan, l)?,
                None => ops::gemm(gpu, l)?,
            }
            self.records.borrow_mut().push(TuneRecord {
                shape,
                gemm_ex_us: c.gemm_ex_us,
                best_lt_us: c.best_lt_us,
                chosen: kept.is_some(),
                from_cache: true,
            });
            self.plans.borrow_mut().insert(shape, kept);
            return Ok(());
        }
        let gemm_ex_us = time_us(gpu, || ops::gemm(gpu, l))?;
        let mut plan = Plan::describe(shape)?;
        let mut best: Option<(f64, sys::cublasLtMatmulAlgo_t)> = None;
        for cand in self.candidates(&plan)? {
            plan.algo = cand;
            // A candidate that fails to run (not supported for this shape after all) is skipped.
            let Ok(us) = time_us(gpu, || self.matmul(gpu, &plan, l)) else {
                continue;
            };
            if best.is_none_or(|(b, _)| us < b) {
                best = Some((us, cand));
            }
        }
        let chosen = best.filter(|&(us, _)| us < gemm_ex_us * (1.0 - MIN_GAIN));
        self.records.borrow_mut().push(TuneRecord {
            shape,
            gemm_ex_us,
            best_lt_us: best.map(|(us, _)| us),
            chosen: chosen.is_some(),
            from_cache: false,
        });
        self.cache.remember(
            shape,
            Choice {
                gemm_ex_us,
                best_lt_us: best.map(|(us, _)| us),
                algo: chosen.map(|(_, algo)| algo.data),
            },
        );
        let kept = chosen.map(|(_, algo)| {
            plan.algo = algo;
            plan
        });
        self.plans.borrow_mut().insert(shape, kept);
        Ok(())
    }

    /// The plan a cached choice stands for: `Some(None)` for `cublasGemmEx`, `Some(plan)` for a
    /// cuBLASLt algorithm this library accepts for the shape within the workspace, `None` where
    /// it does not (the shape is timed again).
    fn restore(&self, shape: GemmShape, c: &Choice) -> Result<Option<Option<Plan>>, BackendError> {
        let Some(words) = c.algo else {
            return Ok(Some(None));
        };
        let mut plan = Plan::describe(shape)?;
        plan.algo.data = words;
        // SAFETY: the handle and the plan's descriptors are live.
        let usable =
            unsafe { algo_accepted(self.handle, plan.desc, [plan.a, plan.b, plan.d], &plan.algo) };
        if !usable {
            tracing::warn!(
                ?shape,
                "a cached cuBLASLt algorithm was refused; timing the shape again"
            );
            return Ok(None);
        }
        Ok(Some(Some(plan)))
    }

    /// Runs `l` through its tuned cuBLASLt plan; `Ok(false)` (nothing queued) where its shape
    /// was not tuned or `cublasGemmEx` won.
    pub fn run(&self, gpu: &Gpu, l: &Linear<'_>) -> Result<bool, BackendError> {
        let plans = self.plans.borrow();
        let Some(Some(plan)) = plans.get(&shape_of(l)) else {
            return Ok(false);
        };
        l.check()?;
        self.matmul(gpu, plan, l)?;
        Ok(true)
    }

    /// cuBLASLt's best [`CANDIDATES`] algorithms for `plan`'s shape within the workspace.
    fn candidates(&self, plan: &Plan) -> Result<Vec<sys::cublasLtMatmulAlgo_t>, BackendError> {
        let pref = lt::create_matmul_pref()?;
        let limit = LT_WORKSPACE_BYTES as u64;
        // SAFETY: pref was just created; the attribute is a u64 read from a live local.
        let set = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&limit as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        // SAFETY: cublasLtMatmulHeuristicResult_t is plain data; zeroed entries are only read
        // up to the count cuBLASLt reports filled.
        let mut results: [sys::cublasLtMatmulHeuristicResult_t; CANDIDATES] =
            unsafe { std::mem::zeroed() };
        let mut count = 0i32;
        let found = set.and_then(|()| {
            // SAFETY: every descriptor is live (plan, pref); results holds CANDIDATES entries,
            // the count requested; count is a live i32.
            unsafe {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    plan.desc,
                    plan.a,
                    plan.b,
                    plan.d,
                    plan.d,
                    pref,
                    CANDIDATES as i32,
                    results.as_mut_ptr(),
                    &mut count,
                )
            }
            .result()
        });
        // SAFETY: pref was created above and is not used after this.
        unsafe { lt::destroy_matmul_pref(pref) }?;
        found?;
        let filled = (count.max(0) as usize).min(CANDIDATES);
        Ok(results[..filled]
            .iter()
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .filter(|r| r.workspaceSize <= LT_WORKSPACE_BYTES)
            .map(|r| r.algo)
            .collect())
    }

    /// Queues `l` through `plan` on the main stream.
    fn matmul(&self, gpu: &Gpu, plan: &Plan, l: &Linear<'_>) -> Result<(), BackendError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: l.check() gave w >= n*k, x >= m*k and y >= m*n elements of the plan's types
        // (its shape is shape_of(l)); the descriptors are live; the algorithm came from
        // cuBLASLt's heuristic for these descriptors with a workspace need <= the workspace
        // passed; alpha/beta are f32 as the f32 scale type requires; the workspace is only used
        // in stream order.
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
                gpu.stream.cu_stream() as sys::cudaStream_t,
            )
        }?;
        Ok(())
    }
}

impl Drop for LtGemm {
    fn drop(&mut self) {
        self.plans.get_mut().clear();
        // SAFETY: the handle was created in new() and every plan using it is gone.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// The shape of `l`'s product.
pub fn shape_of(l: &Linear<'_>) -> GemmShape {
    GemmShape {
        m: l.m,
        n: l.n,
        k: l.k,
        dtype: l.w.dtype(),
        out: l.y.dtype(),
    }
}

/// Mean device time of `f` over [`TIMED_REPS`] launches after one untimed, in µs (CUDA events on
/// the main stream).
pub(super) fn time_us(
    gpu: &Gpu,
    mut f: impl FnMut() -> Result<(), BackendError>,
) -> Result<f64, BackendError> {
    f()?;
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let start = gpu.stream.record_event(flags)?;
    for _ in 0..TIMED_REPS {
        f()?;
    }
    let end = gpu.stream.record_event(flags)?;
    let ms = start.elapsed_ms(&end)?;
    Ok(f64::from(ms) * 1e3 / TIMED_REPS as f64)
}
