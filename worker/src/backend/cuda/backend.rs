//! [`CudaBackend`]: the model's forward pass on one GPU.
//!
//! Per layer: fused residual add + RMSNorm, one q/k/v GEMM, RoPE fused with the paged KV write,
//! paged attention (prefill items direct, decode items split over the context and combined), the
//! o projection, add + RMSNorm, one gate/up GEMM, SiLU·mul, the down projection. GEMMs take
//! cuBLAS, except products of at most [`GEMV_CROSSOVER_ROWS`] rows with bf16 weights of at most
//! [`GEMV_MAX_WEIGHT`](crate::backend::switches::GEMV_MAX_WEIGHT) elements (q/k/v and o at the 8B shape), which take the tensor-core GEMV
//! kernel: it beats cuBLAS there and not on the larger matrices (`cuda_bench gemv`, run 10).
//! Where the q/k/v product takes the GEMV kernel, RoPE and the KV write run in its epilogue
//! ([`ops::gemv_rope_kv`]: one launch fewer a layer, the same bits). Logits are computed only for
//! sampling rows.
//! Decode steps (every sequence one token, all sampling) replay a CUDA graph captured per
//! (batch bucket, block-table width), with inputs copied into fixed device buffers first.
//!
//! In a tensor-parallel group ([`CudaTp`]) the backend holds its rank's shard ([`LocalDims`]) and
//! all-reduces the outputs of `o_proj` and `down_proj`; only rank 0 holds the LM head and computes
//! logits (the other ranks return none).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use grammar::TokenMask;

use super::device::{Buf, DType, Gpu, Readback};
use super::fp8::{
    Fp8Gemm, Fp8Linear, QuantRows, check_fp8_options, gemv_fp8_choice, gemv_fp8_rope_kernel,
    gemv_fp8_rope_kv, has_fp8, quant_rows,
};
use super::fp8_silu::{self, Fp8XqLinear};
use super::graph::{DecodeGraph, PdlKernels};
use super::int4::{Int4Linear, Int4Scales, check_int4_options, gguf_runs_int4};
use super::lt::{LtGemm, TuneRecord};
use super::ops::{self, AddRmsNorm, Attention, CombineFp8, Linear, NormFp8, RopeKv, SampleRow};
use super::step::{self, DECODE_SPLIT, HostStep, Limits};
use super::tp::{CudaTp, DeviceGroup};
use super::weights::{self, Fp8Layer, Fp8Scales, Int4Layer, LayerWeights, Weights};
use super::workspace::{Caps, QuantBufs, Workspace};
use crate::backend::launches::check_launch;
use crate::backend::switches::{Fp8GemvChoice, GemvChoice, KernelSwitches, PdlChoice};
use crate::backend::{Backend, BackendError, DeviceSampling, ForwardBatch, Logits, TokenFeed};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::quant::kv::{KvCacheDtype, KvScales};
use crate::quant::{LinearQuant, Quantization};
use crate::tp::{LocalDims, TpShard, all_min};

/// How to build a [`CudaBackend`].
#[derive(Debug, Clone)]
pub struct CudaOptions {
    pub ordinal: usize,
    /// `F32` or `Bf16`.
    pub dtype: DType,
    pub block_size: usize,
    /// `None`: as many as `gpu_memory_utilization` leaves room for.
    pub num_kv_blocks: Option<usize>,
    pub gpu_memory_utilization: f32,
    /// No CUDA graphs.
    pub enforce_eager: bool,
    /// Tokens per step the workspace is first sized for (it grows when a step needs more).
    pub max_batch_tokens: usize,
    /// Run every GEMM in blocks of [`INVARIANT_CHUNK`] rows so that a sequence's results do not
    /// depend on its batch (costs up to ~1.5 ms per decode step at batch 1 on the 8B shape).
    pub batch_invariant: bool,
    /// Which kernels run where there is a choice.
    pub kernels: KernelSwitches,
    /// `--quantization` (an FP8 checkpoint runs FP8 without it).
    pub quantization: Option<Quantization>,
    /// `--kv-cache-dtype`.
    pub kv_cache_dtype: KvCacheDtype,
}

/// Rows per GEMM in batch-invariant mode.
pub const INVARIANT_CHUNK: usize = 256;

/// Largest decode batch replayed from a CUDA graph.
pub const MAX_GRAPH_BATCH: usize = 256;

/// Steps of at most this many rows run INT4 products on the GEMV kernel, 8 rows a launch (the
/// packed weights read once per launch); larger ones dequantize each weight to bf16 and take
/// cuBLAS.
pub const INT4_GEMV_MAX_ROWS: usize = 32;

/// One layer's products for a step (see [`CudaBackend::layer_products`]).
struct LayerProducts<'a> {
    qkv: Linear<'a>,
    o: Linear<'a>,
    gate_up: Linear<'a>,
    down: Linear<'a>,
    /// The products' FP8 scales (their weights are then E4M3 codes).
    fp8: Option<&'a Fp8Layer>,
    /// The products' INT4 scales (their weights are then packed codes).
    int4: Option<&'a Int4Layer>,
}

impl<'a> LayerProducts<'a> {
    /// One product's scales, picked from the FP8 or INT4 layer.
    fn quant(
        &self,
        fp8: impl Fn(&'a Fp8Layer) -> &'a Fp8Scales,
        int4: impl Fn(&'a Int4Layer) -> &'a Int4Scales,
    ) -> ProductQuant<'a> {
        match (self.fp8, self.int4) {
            (Some(f), _) => ProductQuant::Fp8(fp8(f)),
            (None, Some(i)) => ProductQuant::Int4(int4(i)),
            (None, None) => ProductQuant::None,
        }
    }
}

/// What the q/k/v product left undone ([`CudaBackend::qkv_product`]).
enum QkvLeft<'a> {
    /// RoPE and the KV write ran in the product's epilogue.
    Nothing,
    /// `rope_kv_write` on the product's output: scaled, or raw with its row and column scales.
    Rope(Option<(&'a Buf, &'a Buf)>),
}

/// How one product's weights are stored.
#[derive(Clone, Copy)]
enum ProductQuant<'a> {
    None,
    Fp8(&'a Fp8Scales),
    Int4(&'a Int4Scales),
}

/// INT4 product `l` with its input `x` (`l.x`, or its act-order permutation).
fn int4_linear<'a>(l: &Linear<'a>, s: &'a Int4Scales, x: &'a Buf) -> Int4Linear<'a> {
    Int4Linear {
        x,
        w: l.w,
        s,
        y: l.y,
        m: l.m,
        n: l.n,
        k: l.k,
    }
}

/// The CUDA backend.
pub struct CudaBackend {
    gpu: Gpu,
    cfg: ModelConfig,
    /// This rank's share of the model (all of it without tensor parallelism).
    dims: LocalDims,
    /// The other ranks (`None` alone). In a RefCell because the forward pass is queued through
    /// `&self` (also while capturing a graph).
    group: RefCell<Option<DeviceGroup>>,
    /// Whether this backend computes logits (rank 0).
    samples: bool,
    dtype: DType,
    weights: Weights,
    inv_freq: Buf,
    k_cache: Vec<Buf>,
    v_cache: Vec<Buf>,
    /// With an FP8 cache (`k_cache`/`v_cache` then hold E4M3 codes): its per-layer scales.
    kv_scales: Option<KvScales>,
    block_size: usize,
    num_blocks: usize,
    ws: Workspace,
    /// Decode graphs by (batch bucket, block-table stride, whether the step's draw is left out for
    /// grammar masks to come first).
    graphs: HashMap<(usize, usize, bool), DecodeGraph>,
    /// Grammar masks of a step's constrained rows and those rows' indices, grown on demand.
    masks: Option<MaskBufs>,
    /// Launched steps (async scheduling) whose draws are on their way to the host, oldest
    /// first, and idle host buffers for the next ones.
    launched: VecDeque<Readback>,
    readbacks: Vec<Readback>,
    /// The last launched step's draws, kept beside the workspace (which a bigger step
    /// reallocates) for a step fed from them ([`TokenFeed::PreviousStep`]), and their count.
    feed: Option<Buf>,
    feed_rows: usize,
    enforce_eager: bool,
    batch_invariant: bool,
    /// Which products take the GEMV kernel.
    gemv: GemvChoice,
    /// Tuned cuBLASLt products (bf16, unless [`KernelSwitches::gemm_tune`] is off or in
    /// batch-invariant mode).
    lt: Option<LtGemm>,
    /// With FP8 linear layers: cuBLASLt's FP8 product for steps of more than
    /// [`kernels::GEMV_MAX_BATCH`] rows.
    fp8_gemm: Option<Fp8Gemm>,
    /// What the workspace holds for quantized products.
    quant_bufs: QuantBufs,
    /// [`KernelSwitches::int4_tiles`].
    int4_tiles: bool,
    /// [`KernelSwitches::fp8_gemv`].
    fp8_gemv: Fp8GemvChoice,
    /// [`KernelSwitches::int4_mma`].
    int4_mma: bool,
    /// [`KernelSwitches::int4_mma_scaled`].
    int4_mma_scaled: bool,
    /// [`KernelSwitches::int4_wgmma`] on this device.
    int4_wgmma: Option<super::int4::WgmmaKernels>,
    /// Whether small-batch steps prefetch each layer's o_proj weights into L2 while RoPE and
    /// attention run ([`KernelSwitches::l2_prefetch`], where the device has it).
    l2_prefetch: bool,
    /// Whether the q/k/v product runs fused with RoPE and the KV write where it takes the GEMV
    /// kernel ([`KernelSwitches::fuse_rope`]).
    fuse_rope: bool,
    /// Whether an FP8 o product's input is quantized by decode attention's split combine
    /// ([`KernelSwitches::fuse_o_quant`]).
    fuse_o_quant: bool,
    /// Whether an FP8 MLP of at most `FP8_SILU_MAX_ROWS` rows runs SiLU·mul inside its two tile
    /// GEMVs ([`KernelSwitches::fuse_silu`]).
    fuse_silu: bool,
    /// Decodes one tensor-core decode block may compute a shared split for
    /// ([`step::share_decode_splits`]); below 2 when the switch is off or the decode kernel is
    /// not a tensor-core one ([`KernelSwitches::decode_share`]).
    decode_share: usize,
    /// The kernels whose dependencies decode graphs of at most [`PDL_MAX_ROWS`] sequences make
    /// programmatic ([`KernelSwitches::pdl`]; empty when off for this model, before sm_90 or in a
    /// tensor-parallel group).
    pdl: PdlKernels,
    _blas_workspace: Buf,
}

/// Largest step (tokens) that prefetches o_proj. On the H200 (run 12d) it gained 0.02–0.05 ms a
/// step at batch 1 and cost 0.15 ms at batch 8, where attention reads 8× the KV and the prefetch
/// competes with it for HBM.
pub const L2_PREFETCH_MAX_ROWS: usize = 1;

/// Largest decode graph (sequences) whose kernels launch as programmatic dependents
/// ([`KernelSwitches::pdl`]). On the H200 (run 42e, on and off alternating, two rounds, every
/// graph of up to 32 sequences) one sequence gained 3.4 % with FP8 weights (3.11 → 3.01 ms a
/// step); at 8 sequences bf16 lost 3.8 % and FP8 was unchanged, at 32 (512 keys) FP8 lost
/// 1–1.5 %.
pub const PDL_MAX_ROWS: usize = 1;

/// Fewest rows whose FP8 q/k/v tile product runs RoPE and the KV write in its epilogue
/// ([`KernelSwitches::fuse_rope`]). On the H200 (run 45, on and off alternating, two rounds,
/// 512 keys) the fused kernel gained 0.07 ms a step at 8 sequences (3.37 → 3.30 ms) and lost
/// 0.05–0.07 ms at one, where the unfused q/k/v product with its own RoPE launch overlaps better
/// under programmatic dependent launch.
pub const FP8_ROPE_MIN_ROWS: usize = 2;

/// Fewest rows whose INT4 tile products run RoPE and the KV write (q/k/v) and SiLU·mul (gate/up)
/// in their epilogues ([`KernelSwitches::fuse_rope`], [`KernelSwitches::fuse_silu`]). On an H100
/// (run 57, the random 8B AWQ model, on and off alternating) the fused pair took steps of 8
/// sequences from 3.21–3.24 to 3.05–3.06 ms and of 32 from 7.43–7.45 to 7.22–7.26, but one
/// sequence's from 2.624–2.636 to 2.633–2.657: as FP8's RoPE, the separate launches overlap
/// better under programmatic dependent launch there.
pub const INT4_FUSED_MIN_ROWS: usize = 2;

/// Products of at most this many rows take the GEMV kernel when it is on (the crossover with
/// cuBLAS, from `cuda_bench gemv`); more rows go to cuBLAS.
pub const GEMV_CROSSOVER_ROWS: usize = 8;
const _: () = assert!(GEMV_CROSSOVER_ROWS <= kernels::GEMV_MAX_BATCH);

/// Sizes of one launch sequence.
#[derive(Debug, Clone, Copy)]
struct Dims {
    n: usize,
    seqs: usize,
    items_prefill: usize,
    items_decode: usize,
    stride: usize,
    /// Keys per decode attention split, and the number of splits.
    split: usize,
    splits: usize,
    rows: usize,
    sample: bool,
}

impl CudaBackend {
    /// Opens the GPU, uploads the weights and sizes the KV cache.
    pub fn new(
        cfg: &ModelConfig,
        ckpt: &Checkpoint,
        opts: &CudaOptions,
    ) -> Result<Self, BackendError> {
        Self::new_sharded(cfg, ckpt, opts, None)
    }

    /// Like [`CudaBackend::new`], holding only `tp.shard`'s share of the weights and KV heads and
    /// running every forward pass together with the group's other ranks. Every rank allocates the
    /// smallest KV block count any rank's memory allows.
    pub fn new_sharded(
        cfg: &ModelConfig,
        ckpt: &Checkpoint,
        opts: &CudaOptions,
        tp: Option<CudaTp>,
    ) -> Result<Self, BackendError> {
        let shard = tp.as_ref().map_or(TpShard::SOLO, |t| t.shard);
        let quant = LinearQuant::resolve(opts.quantization, cfg.quantization.as_ref())
            .map_err(|e| BackendError::InvalidOptions(e.to_string()))?;
        let fp8 = matches!(quant, LinearQuant::Fp8 { .. });
        let dims = LocalDims::new(cfg, shard)?;
        if fp8 {
            check_fp8_options((cfg, &dims), (opts.dtype, opts.batch_invariant), &quant)?;
        } else if quant.int4().is_some() {
            check_int4_options(&dims, cfg, (opts.dtype, opts.batch_invariant), &quant)?;
        } else {
            crate::quant::load::check_unquantized(ckpt, cfg)
                .map_err(|e| BackendError::Weights(e.to_string()))?;
        }
        let kv_fp8 = opts.kv_cache_dtype == KvCacheDtype::Fp8E4m3;
        if kv_fp8 && opts.dtype != DType::Bf16 {
            return Err(BackendError::InvalidOptions(
                "--kv-cache-dtype fp8 on CUDA needs --dtype bfloat16".into(),
            ));
        }
        if !matches!(opts.dtype, DType::F32 | DType::Bf16) {
            return Err(BackendError::InvalidOptions(format!(
                "dtype {:?}",
                opts.dtype
            )));
        }
        if opts.block_size == 0 || !(0.05..=1.0).contains(&opts.gpu_memory_utilization) {
            return Err(BackendError::InvalidOptions(
                "block_size must be positive and gpu_memory_utilization in [0.05, 1]".into(),
            ));
        }
        if !cfg.head_dim.is_multiple_of(2) || cfg.head_dim > kernels::ATTN_MAX_HEAD_DIM {
            return Err(BackendError::InvalidOptions(format!(
                "head_dim {} is not supported (even, at most {})",
                cfg.head_dim,
                kernels::ATTN_MAX_HEAD_DIM
            )));
        }
        let group = dims.heads / dims.kv_heads;
        if group > kernels::ATTN_ROWS {
            return Err(BackendError::InvalidOptions(format!(
                "{group} query heads per KV head (at most {})",
                kernels::ATTN_ROWS
            )));
        }
        let gpu = Gpu::new(opts.ordinal, &opts.kernels)?;
        let int4_wgmma = super::int4::wgmma_select(&gpu.arch, opts.kernels.int4_wgmma)?;
        if fp8 && !has_fp8(gpu.capability) {
            return Err(BackendError::InvalidOptions(format!(
                "{}: FP8 tensor cores need compute capability 8.9 or later; GPU {} is {}.{}",
                quant.describe(),
                opts.ordinal,
                gpu.capability.0,
                gpu.capability.1
            )));
        }
        if kv_fp8 && !has_fp8(gpu.capability) {
            return Err(BackendError::InvalidOptions(format!(
                "--kv-cache-dtype fp8: the E4M3 conversions need compute capability 8.9 or later; \
                 GPU {} is {}.{}",
                opts.ordinal, gpu.capability.0, gpu.capability.1
            )));
        }
        let kv_scales = opts
            .kv_cache_dtype
            .scales(ckpt, cfg.num_hidden_layers)
            .map_err(|e| BackendError::Weights(e.to_string()))?;
        if quant != LinearQuant::None {
            tracing::info!(quantization = %quant.describe(), "CUDA linear layers");
        }
        tracing::info!(
            switches = %opts.kernels,
            prefill = gpu.prefill.name(),
            arch = %gpu.arch,
            "CUDA kernels"
        );
        let mut group = tp.map(|tp| DeviceGroup::new(&gpu, tp)).transpose()?;
        let samples = shard.rank == 0;
        let gguf_int4 = gguf_runs_int4(opts, &quant, cfg, &dims);
        let weights = weights::upload(
            &gpu,
            cfg,
            ckpt,
            (opts.dtype, &quant, gguf_int4),
            &dims,
            samples,
        )?;
        if gguf_int4 && gguf::is_gguf_path(ckpt.dir()) {
            tracing::info!(
                int4_layers = weights.layers.iter().filter(|l| l.int4().is_some()).count(),
                layers = weights.layers.len(),
                "GGUF: layers whose linears are all Q4_0/Q4_1 run on the INT4 kernels, the rest \
                 are dequantized to bfloat16"
            );
        }
        tracing::info!(
            gib = weights.copy.bytes as f64 / f64::from(1u32 << 30),
            seconds = weights.copy.seconds,
            gb_per_s = weights.copy.gb_per_s(),
            "weights streamed to the device through pinned buffers"
        );
        let inv_freq = gpu.upload_f32(&cfg.rope.inv_freq(cfg.head_dim), DType::F32)?;
        let caps = Caps {
            tokens: opts.max_batch_tokens.max(MAX_GRAPH_BATCH),
            seqs: MAX_GRAPH_BATCH,
            stride: 64,
            splits: 32,
        };
        let quant_bufs = QuantBufs {
            fp8,
            int4_dequant: weights.layers.iter().find_map(|l| l.int4()).map_or(0, |_| {
                let (h, qd, kvd, inter) = (cfg.hidden_size, dims.q_dim, dims.kv_dim, dims.inter);
                ((qd + 2 * kvd) * h)
                    .max(h * qd)
                    .max(2 * inter * h)
                    .max(h * inter)
            }),
            act_order: weights.layers.iter().filter_map(|l| l.int4()).any(|l| {
                [&l.qkv, &l.o, &l.gate_up, &l.down]
                    .iter()
                    .any(|s| s.perm.is_some())
            }),
        };
        let ws = Workspace::new(&gpu, cfg, &dims, (opts.dtype, quant_bufs), caps)?;
        let blas_ws = gpu.alloc(DType::U32, 8 << 20)?;
        // SAFETY: the handle is live; the 32 MiB workspace outlives it (both owned by the backend,
        // the buffer dropped after the handle's uses end). A fixed workspace keeps cuBLAS from
        // allocating during CUDA-graph capture.
        unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *gpu.blas.handle(),
                blas_ws.ptr() as *mut _,
                blas_ws.bytes(),
            )
        }
        .result()?;

        let kv_dtype = if kv_fp8 { DType::U8 } else { opts.dtype };
        let per_block = 2 * cfg.num_hidden_layers * opts.block_size * dims.kv_dim * kv_dtype.size();
        let num_blocks = match opts.num_kv_blocks {
            Some(n) => n,
            None => {
                let (free, total) = gpu.mem_info()?;
                let reserve = (total as f64 * (1.0 - opts.gpu_memory_utilization as f64)) as usize;
                // Keep 1 GiB for workspace growth, cuBLAS and graphs.
                free.saturating_sub(reserve).saturating_sub(1 << 30) / per_block
            }
        };
        // Block ids come from rank 0's scheduler: every rank needs the same count.
        let num_blocks = match group.as_mut() {
            Some(g) => all_min(g.host(), num_blocks)?,
            None => num_blocks,
        };
        if num_blocks < 2 {
            return Err(BackendError::InvalidOptions(format!(
                "only {num_blocks} KV blocks fit (at least 2 needed); raise gpu_memory_utilization"
            )));
        }
        let cache_len = num_blocks * dims.kv_dim * opts.block_size;
        let gib = |b: usize| b as f64 / f64::from(1u32 << 30);
        tracing::info!(
            weights_gib = gib(weights.bytes),
            kv_cache_gib = gib(num_blocks * per_block),
            kv_blocks = num_blocks,
            kv_tokens = num_blocks * opts.block_size,
            "device memory"
        );
        let mut k_cache = Vec::new();
        let mut v_cache = Vec::new();
        for _ in 0..cfg.num_hidden_layers {
            k_cache.push(gpu.alloc(kv_dtype, cache_len)?);
            v_cache.push(gpu.alloc(kv_dtype, cache_len)?);
        }
        gpu.sync()?;
        // The host path synchronises inside the forward pass, which a graph cannot hold.
        let enforce_eager = opts.enforce_eager || group.as_ref().is_some_and(|g| !g.capturable());
        let capability = gpu.capability;
        let lt = (opts.dtype == DType::Bf16 && !opts.batch_invariant && opts.kernels.gemm_tune)
            .then(|| LtGemm::new(&gpu))
            .transpose()?;
        let fp8_gemm = fp8.then(|| Fp8Gemm::new(&gpu)).transpose()?;
        let pdl_graphs = match opts.kernels.pdl {
            PdlChoice::Off => false,
            PdlChoice::Quantized => fp8 || quant.int4().is_some(),
            PdlChoice::All => true,
        };
        // Not inside a tensor-parallel group: its graphs' NCCL kernels were never measured or
        // checked with programmatic successors.
        let pdl = if pdl_graphs && capability >= (9, 0) && group.is_none() {
            PdlKernels::new(
                kernels::PDL_KERNELS
                    .iter()
                    .map(|name| gpu.func(name).map(|f| f.cu_function()))
                    .collect::<Result<_, _>>()?,
            )
        } else {
            PdlKernels::default()
        };
        let group_size = dims.heads / dims.kv_heads.max(1);
        let decode_share = if opts.kernels.decode_share
            && ops::decode_on_mma(
                opts.dtype,
                cfg.head_dim,
                group_size,
                kv_scales.is_some(),
                gpu.decode_mma,
            ) {
            kernels::DECODE_MMA_ROWS / group_size
        } else {
            0
        };
        Ok(Self {
            gpu,
            cfg: cfg.clone(),
            dims,
            group: RefCell::new(group),
            samples,
            dtype: opts.dtype,
            weights,
            inv_freq,
            k_cache,
            v_cache,
            kv_scales,
            block_size: opts.block_size,
            num_blocks,
            ws,
            graphs: HashMap::new(),
            masks: None,
            launched: VecDeque::new(),
            readbacks: Vec::new(),
            feed: None,
            feed_rows: 0,
            enforce_eager,
            batch_invariant: opts.batch_invariant,
            gemv: opts.kernels.gemv,
            lt,
            fp8_gemm,
            quant_bufs,
            int4_tiles: opts.kernels.int4_tiles,
            fp8_gemv: opts.kernels.fp8_gemv,
            int4_mma: opts.kernels.int4_mma,
            int4_mma_scaled: opts.kernels.int4_mma_scaled,
            int4_wgmma,
            l2_prefetch: opts.dtype == DType::Bf16
                && ops::has_l2_prefetch(capability)
                && opts.kernels.l2_prefetch,
            fuse_rope: opts.kernels.fuse_rope,
            fuse_o_quant: opts.kernels.fuse_o_quant,
            fuse_silu: opts.kernels.fuse_silu,
            decode_share,
            pdl,
            _blas_workspace: blas_ws,
        })
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes
    }

    /// The weights' host-to-device copy at load (bytes, seconds).
    pub fn weight_copy(&self) -> super::staging::CopyStats {
        self.weights.copy
    }

    /// Number of CUDA graphs captured so far.
    pub fn num_graphs(&self) -> usize {
        self.graphs.len()
    }

    fn limits(&self) -> Limits {
        Limits {
            vocab: self.cfg.vocab_size,
            block_size: self.block_size,
            num_blocks: self.num_blocks,
            tile_tokens: ops::attention_tile_tokens(
                self.dtype,
                self.cfg.head_dim,
                self.dims.heads / self.dims.kv_heads,
            ),
        }
    }

    /// Grows the workspace (dropping every graph, whose addresses it invalidates) if needed.
    fn ensure(&mut self, need: Caps) -> Result<(), BackendError> {
        let c = self.ws.caps;
        if need.tokens <= c.tokens
            && need.seqs <= c.seqs
            && need.stride <= c.stride
            && need.splits <= c.splits
        {
            return Ok(());
        }
        let caps = Caps {
            tokens: c.tokens.max(need.tokens),
            seqs: c.seqs.max(need.seqs),
            stride: c.stride.max(need.stride.next_power_of_two()),
            splits: c.splits.max(need.splits.next_power_of_two()),
        };
        self.graphs.clear();
        self.gpu.sync()?;
        self.ws = Workspace::new(
            &self.gpu,
            &self.cfg,
            &self.dims,
            (self.dtype, self.quant_bufs),
            caps,
        )?;
        Ok(())
    }

    fn upload_step(
        &mut self,
        st: &HostStep,
        sampling: Option<&[DeviceSampling]>,
    ) -> Result<(), BackendError> {
        fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
            v.iter().flat_map(|&x| f(x)).collect()
        }
        let g = &self.gpu;
        let ws = &mut self.ws;
        g.write_bytes(&mut ws.ids, &le(&st.ids, u32::to_le_bytes))?;
        g.write_bytes(&mut ws.positions, &le(&st.positions, u32::to_le_bytes))?;
        g.write_bytes(&mut ws.slots, &le(&st.slots, i64::to_le_bytes))?;
        g.write_bytes(&mut ws.seqs, &le(&st.seqs, i32::to_le_bytes))?;
        g.write_bytes(
            &mut ws.items_prefill,
            &le(&st.items_prefill, i32::to_le_bytes),
        )?;
        g.write_bytes(
            &mut ws.items_decode,
            &le(&st.items_decode, i32::to_le_bytes),
        )?;
        g.write_bytes(&mut ws.tables, &le(&st.tables, u32::to_le_bytes))?;
        g.write_bytes(&mut ws.sample_idx, &le(&st.sample_idx, u32::to_le_bytes))?;
        let rows = st.sample_idx.len();
        let mut params = Vec::with_capacity(rows);
        for i in 0..rows {
            // Padding rows (and forward() without sampling) are greedy.
            let s = sampling.and_then(|s| s.get(i));
            params.push(sample_row(s.unwrap_or(&DeviceSampling::GREEDY)));
        }
        g.write_bytes(&mut ws.sample_params, bytemuck::cast_slice(&params))
    }

    /// Keys per decode attention split for `items` decodes of contexts up to `max_ctx`.
    fn decode_split(&self, items: usize, max_ctx: usize) -> usize {
        if self.batch_invariant {
            DECODE_SPLIT
        } else {
            step::decode_split(items, self.dims.kv_heads, max_ctx, self.gpu.sms)
        }
    }

    fn gemv_takes(&self, l: &Linear<'_>) -> bool {
        match self.gemv {
            GemvChoice::Off => false,
            GemvChoice::All => true,
            GemvChoice::UpTo(max) => l.w.dtype() == DType::Bf16 && l.n * l.k <= max,
        }
    }

    /// Whether `l` runs on the GEMV kernel.
    fn uses_gemv(&self, l: &Linear<'_>) -> bool {
        !self.batch_invariant && l.m <= GEMV_CROSSOVER_ROWS && l.gemv_ok() && self.gemv_takes(l)
    }

    /// Whether the q/k/v product `l` runs fused with RoPE and the KV write `a`.
    fn fuses_rope(&self, l: &Linear<'_>, a: &RopeKv<'_>) -> bool {
        self.fuse_rope && self.uses_gemv(l) && ops::gemv_rope_fits(l, a)
    }

    /// Runs a layer's product `l`: on the FP8 kernels when it has FP8 `scales`, its input
    /// quantized per row (or with its static scale) into the workspace first — unless `quantized`,
    /// when the norm that wrote `l.x` already put its codes and scales there — else as
    /// [`Self::linear`].
    fn product(
        &self,
        l: &Linear<'_>,
        scales: ProductQuant<'_>,
        quantized: bool,
    ) -> Result<(), BackendError> {
        self.product_maybe_unscaled(l, scales, quantized, false)
            .map(|_| ())
    }

    /// [`Self::product`]; with `unscaled_ok`, an FP8 product on cuBLASLt leaves its output
    /// unscaled and returns its row and column scales (`Some((x_scales, w_scales))`) for the
    /// consumer to apply ([`super::fp8::silu_mul_quant`], or [`ops::add_rmsnorm`]'s
    /// `delta_scales`), saving the scaling pass.
    fn product_maybe_unscaled<'s>(
        &'s self,
        l: &Linear<'_>,
        scales: ProductQuant<'s>,
        quantized: bool,
        unscaled_ok: bool,
    ) -> Result<Option<(&'s Buf, &'s Buf)>, BackendError> {
        let s = match scales {
            ProductQuant::None => return self.linear(l).map(|_| None),
            ProductQuant::Int4(s) => return self.product_int4(l, s).map(|_| None),
            ProductQuant::Fp8(s) => s,
        };
        let g = &self.gpu;
        let f = self.fp8_linear(l, s, quantized)?;
        match &self.fp8_gemm {
            _ if l.m <= kernels::GEMV_MAX_BATCH && f.gemv_ok() => {
                gemv_fp8_choice(g, &f, self.fp8_gemv).map(|_| None)
            }
            Some(gemm) if unscaled_ok => gemm
                .run_unscaled(g, &f)
                .map(|_| Some((&self.ws.xs, &s.rows))),
            Some(gemm) => gemm.run(g, &f).map(|_| None),
            None => Err(BackendError::InvalidOptions(
                "FP8 weights in a backend built without FP8".into(),
            )),
        }
    }

    /// The FP8 form of the product `l` with weight scales `s`: its input's codes and row scales in
    /// the workspace, quantized there first unless `quantized` (a kernel before already wrote
    /// them).
    fn fp8_linear<'s>(
        &'s self,
        l: &Linear<'s>,
        s: &'s Fp8Scales,
        quantized: bool,
    ) -> Result<Fp8Linear<'s>, BackendError> {
        let ws = &self.ws;
        if !quantized {
            let quant = QuantRows {
                x: l.x,
                q: &ws.xq,
                scales: &ws.xs,
                m: l.m,
                k: l.k,
                static_scale: s.static_input.unwrap_or(0.0),
            };
            quant_rows(&self.gpu, &quant)?;
        }
        Ok(Fp8Linear {
            x: &ws.xq,
            x_scales: &ws.xs,
            w: l.w,
            w_scales: &s.rows,
            y: l.y,
            m: l.m,
            n: l.n,
            k: l.k,
        })
    }

    /// Runs the q/k/v product `l` as [`Self::product`] does, with RoPE and the paged KV write `a`
    /// in its epilogue where a fused kernel takes it ([`KernelSwitches::fuse_rope`]: the bf16
    /// GEMV, or the FP8 tile GEMV's two default variants); returns what is left for
    /// `ops::rope_kv_write` to do. An FP8 product on cuBLASLt leaves its output unscaled for it.
    ///
    /// # Safety
    /// As `ops::rope_kv_write`: every one of the first `n` slots of `a` is inside the cache.
    unsafe fn qkv_product<'s>(
        &'s self,
        l: &Linear<'_>,
        scales: ProductQuant<'s>,
        quantized: bool,
        a: &RopeKv<'_>,
    ) -> Result<QkvLeft<'s>, BackendError> {
        if self.fuses_rope(l, a) {
            // SAFETY: the caller's promise.
            unsafe { ops::gemv_rope_kv(&self.gpu, l, a) }?;
            return Ok(QkvLeft::Nothing);
        }
        if let ProductQuant::Int4(s) = scales
            && self.fuse_rope
            && self.int4_tiles
            && l.m >= INT4_FUSED_MIN_ROWS
            && super::int4::rope_fits(&int4_linear(l, s, l.x), a)
        {
            let q = int4_linear(l, s, self.int4_input(l, s)?);
            // SAFETY: the caller's promise.
            unsafe { super::int4::gemv_int4_rope_kv(&self.gpu, &q, a) }?;
            return Ok(QkvLeft::Nothing);
        }
        if let ProductQuant::Fp8(s) = scales
            && self.fuse_rope
            && (FP8_ROPE_MIN_ROWS..=kernels::GEMV_MAX_BATCH).contains(&l.m)
        {
            let f = self.fp8_linear(l, s, quantized)?;
            if gemv_fp8_rope_kernel(&f, a, self.fp8_gemv).is_some() {
                // SAFETY: the caller's promise.
                unsafe { gemv_fp8_rope_kv(&self.gpu, &f, a, self.fp8_gemv) }?;
                return Ok(QkvLeft::Nothing);
            }
            return self.product(l, scales, true).map(|_| QkvLeft::Rope(None));
        }
        // RoPE reads the q/k/v output alone, so it can scale a raw FP8 product itself.
        self.product_maybe_unscaled(l, scales, quantized, true)
            .map(QkvLeft::Rope)
    }

    /// The FP8 MLP's two products as [`fp8_silu`]'s pair runs them (gate/up's input the codes the
    /// norm before wrote, with `quantized`), where the switch is on and the pair takes their shape
    /// ([`fp8_silu::fits`]); `None`: the products and `silu_mul_quant` apart.
    fn fp8_silu_pair<'s>(
        &'s self,
        p: &LayerProducts<'s>,
        gate_up: ProductQuant<'s>,
        down: ProductQuant<'s>,
        quantized: bool,
    ) -> Option<(Fp8Linear<'s>, Fp8XqLinear<'s>)> {
        let (ProductQuant::Fp8(gs), ProductQuant::Fp8(ds)) = (gate_up, down) else {
            return None;
        };
        if !self.fuse_silu || !quantized {
            return None;
        }
        let ws = &self.ws;
        let (gl, dl) = (&p.gate_up, &p.down);
        let gu = Fp8Linear {
            x: &ws.xq,
            x_scales: &ws.xs,
            w: gl.w,
            w_scales: &gs.rows,
            y: gl.y,
            m: gl.m,
            n: gl.n,
            k: gl.k,
        };
        let dn = Fp8XqLinear {
            h: &ws.act,
            amax: &ws.amax,
            static_scale: ds.static_input.unwrap_or(0.0),
            w: dl.w,
            w_scales: &ds.rows,
            y: dl.y,
            m: dl.m,
            n: dl.n,
            k: dl.k,
        };
        fp8_silu::fits(&gu, &dn, self.fp8_gemv).then_some((gu, dn))
    }

    /// The input of INT4 product `l`: `l.x`, or for act order its columns permuted into the
    /// workspace (launched here).
    fn int4_input<'s>(&'s self, l: &Linear<'s>, s: &Int4Scales) -> Result<&'s Buf, BackendError> {
        match &s.perm {
            Some(perm) => {
                super::int4::permute_cols(&self.gpu, (l.x, perm, &self.ws.xperm), (l.m, l.k))?;
                Ok(&self.ws.xperm)
            }
            None => Ok(l.x),
        }
    }

    /// INT4 gate/up with SiLU·mul in its tile GEMV's epilogue from [`INT4_FUSED_MIN_ROWS`] rows,
    /// writing the down product's input `ws.act` ([`KernelSwitches::fuse_silu`]); `false`: not
    /// taken, nothing launched.
    fn int4_gate_up_silu(
        &self,
        l: &Linear<'_>,
        scales: ProductQuant<'_>,
    ) -> Result<bool, BackendError> {
        let ProductQuant::Int4(s) = scales else {
            return Ok(false);
        };
        if !(self.fuse_silu
            && self.int4_tiles
            && l.m >= INT4_FUSED_MIN_ROWS
            && super::int4::silu_fits(&int4_linear(l, s, l.x)))
        {
            return Ok(false);
        }
        let q = int4_linear(l, s, self.int4_input(l, s)?);
        super::int4::gemv_int4_silu(&self.gpu, &q, &self.ws.act)?;
        Ok(true)
    }

    /// An INT4 product: its input permuted first for act order; the GEMV kernel up to
    /// [`INT4_GEMV_MAX_ROWS`] rows, the tensor-core product up to
    /// [`kernels::INT4_MMA_MAX_ROWS`] ([`kernels::INT4_WGMMA_MAX_ROWS`] where the Hopper kernel
    /// takes it; its split-k partial sums in the dequantization workspace), else the weights
    /// dequantized into the workspace and [`Self::linear`].
    fn product_int4(&self, l: &Linear<'_>, s: &Int4Scales) -> Result<(), BackendError> {
        let (g, ws) = (&self.gpu, &self.ws);
        let x = self.int4_input(l, s)?;
        let q = int4_linear(l, s, x);
        if l.m <= INT4_GEMV_MAX_ROWS {
            let rows = if l.n >= ops::GEMV_TALL_ROWS { 32 } else { 16 };
            return super::int4::gemv_int4(g, &q, rows, self.int4_tiles);
        }
        if self.int4_mma && s.mins.is_none() {
            let wgmma = self.int4_wgmma.filter(|_| super::int4::wgmma_fits(&q));
            let max_rows = match wgmma {
                Some(_) => kernels::INT4_WGMMA_MAX_ROWS,
                None => kernels::INT4_MMA_MAX_ROWS,
            };
            if l.m <= max_rows {
                let choice = super::int4::MmaChoice {
                    scaled: self.int4_mma_scaled,
                    wgmma,
                };
                return super::int4::gemm_int4(g, &q, choice, &ws.wdq);
            }
        }
        super::int4::dequant_int4(g, &q, &ws.wdq)?;
        self.linear(&Linear {
            x,
            w: &ws.wdq,
            y: l.y,
            m: l.m,
            n: l.n,
            k: l.k,
        })
    }

    fn linear(&self, l: &Linear<'_>) -> Result<(), BackendError> {
        if self.batch_invariant {
            ops::linear_chunked(&self.gpu, l, INVARIANT_CHUNK)
        } else if self.uses_gemv(l) {
            ops::gemv(&self.gpu, l)
        } else if let Some(lt) = &self.lt
            && lt.run(&self.gpu, l)?
        {
            Ok(())
        } else {
            ops::linear(&self.gpu, l)
        }
    }

    /// Tunes cuBLASLt for the products of a decode graph of `m` rows (those not on the GEMV
    /// kernel), before the graph is captured. Writes activations: call before the step's launch.
    fn tune_products(&self, m: usize) -> Result<(), BackendError> {
        let Some(w) = self.weights.layers.first() else {
            return Ok(());
        };
        let p = self.layer_products(w, m);
        if let (Some(gemm), Some(f)) = (&self.fp8_gemm, p.fp8) {
            let named = [
                ("qkv", &p.qkv, &f.qkv),
                ("o", &p.o, &f.o),
                ("gate_up", &p.gate_up, &f.gate_up),
                ("down", &p.down, &f.down),
            ];
            for (name, l, s) in named {
                // The codes in the workspace are whatever is there: an FP8 product's time does
                // not depend on them.
                let f = self.fp8_linear(l, s, true)?;
                if (l.m <= kernels::GEMV_MAX_BATCH && f.gemv_ok()) || !Fp8Gemm::fits(&f) {
                    continue;
                }
                let t = gemm.tune(&self.gpu, &f)?;
                tracing::debug!(
                    product = name,
                    m = l.m,
                    n = l.n,
                    k = l.k,
                    heuristic_us = t.heuristic_us,
                    kept_us = t.kept_us,
                    retuned = t.retuned,
                    from_cache = t.from_cache,
                    "fp8 cuBLASLt tuning"
                );
            }
        }
        let Some(lt) = &self.lt else {
            return Ok(());
        };
        let mut products = vec![p.qkv, p.o, p.gate_up, p.down];
        if self.samples {
            products.extend(self.lm_product(m));
        }
        // FP8 products (E4M3 weights) run on their own kernels, never through the bf16 plans.
        for l in products
            .iter()
            .filter(|l| !self.uses_gemv(l) && matches!(l.w.dtype(), DType::Bf16 | DType::F32))
        {
            lt.tune(&self.gpu, l)?;
        }
        Ok(())
    }

    /// The four products of a layer with weights `w` for a step of `m` tokens, on the workspace's
    /// buffers (what [`Self::launch_model`] runs and [`Self::tune_products`] tunes).
    fn layer_products<'a>(&'a self, w: &'a LayerWeights, m: usize) -> LayerProducts<'a> {
        let (ws, h) = (&self.ws, self.cfg.hidden_size);
        let (qd, kvd, inter) = (self.dims.q_dim, self.dims.kv_dim, self.dims.inter);
        LayerProducts {
            qkv: Linear {
                x: &ws.normed,
                w: &w.qkv,
                y: &ws.qkv,
                m,
                n: qd + 2 * kvd,
                k: h,
            },
            o: Linear {
                x: &ws.attn,
                w: &w.o,
                y: &ws.proj,
                m,
                n: h,
                k: qd,
            },
            gate_up: Linear {
                x: &ws.normed,
                w: &w.gate_up,
                y: &ws.gate_up,
                m,
                n: 2 * inter,
                k: h,
            },
            down: Linear {
                x: &ws.act,
                w: &w.down,
                y: &ws.proj,
                m,
                n: h,
                k: inter,
            },
            fp8: w.fp8(),
            int4: w.int4(),
        }
    }

    /// The LM head's product for `rows` sampling rows, if this rank holds the LM head.
    fn lm_product(&self, rows: usize) -> Option<Linear<'_>> {
        Some(Linear {
            x: &self.ws.last,
            w: self.weights.lm_head()?,
            y: &self.ws.logits,
            m: rows,
            n: self.cfg.vocab_size,
            k: self.cfg.hidden_size,
        })
    }

    /// What cuBLASLt tuning measured so far (empty with it off).
    pub fn gemm_tuning(&self) -> Vec<TuneRecord> {
        self.lt.as_ref().map_or_else(Vec::new, LtGemm::records)
    }

    /// Sums the first `len` elements of `buf` over the TP group (nothing alone).
    fn all_reduce(&self, buf: &Buf, len: usize) -> Result<(), BackendError> {
        match self.group.borrow_mut().as_mut() {
            Some(group) => group.all_reduce(&self.gpu, buf, len),
            None => Ok(()),
        }
    }

    /// Queues the whole forward pass for a step already uploaded.
    fn launch_model(&self, d: Dims) -> Result<(), BackendError> {
        let (g, ws, cfg, dims) = (&self.gpu, &self.ws, &self.cfg, &self.dims);
        let (h, n) = (cfg.hidden_size, d.n);
        let (hq, hkv, hd) = (dims.heads, dims.kv_heads, cfg.head_dim);
        let inter = dims.inter;
        let eps = cfg.rms_norm_eps;
        // SAFETY: step::build checked every id < vocab.
        unsafe { ops::embedding(g, &ws.x, &self.weights.embed, &ws.ids, (n, h)) }?;
        // The norms before q/k/v and gate/up also quantize their output for an FP8 product.
        let fused_quant = AddRmsNorm::fuses_fp8(h, self.dtype);
        let norm_fp8 = |s: Option<&'_ Fp8Scales>| {
            s.filter(|_| fused_quant).map(|s| NormFp8 {
                q: &ws.xq,
                scales: &ws.xs,
                static_scale: s.static_input.unwrap_or(0.0),
                // The FP8 layer's q/k/v and gate/up products read the codes, not `normed`.
                codes_only: true,
                amax_reset: None,
            })
        };
        // o and down on cuBLASLt's FP8 product leave their output unscaled for the norm that adds
        // it to the residual to scale (the same bits as the scaling pass), except in a tensor-
        // parallel group, whose all-reduce adds partial products of differently scaled shards.
        let unscaled_ok = self.group.borrow().is_none();
        // The scales of the last down product when it was left unscaled.
        let mut raw_down = None;
        for (l, w) in self.weights.layers.iter().enumerate() {
            let fp8 = w.fp8();
            ops::add_rmsnorm(
                g,
                &AddRmsNorm {
                    residual: &ws.x,
                    delta: (l > 0).then_some(&ws.proj),
                    weight: &w.input_norm,
                    out: &ws.normed,
                    rows: n,
                    hidden: h,
                    eps,
                    fp8: norm_fp8(fp8.map(|f| &f.qkv)),
                    delta_scales: raw_down.take(),
                },
            )?;
            let p = self.layer_products(w, n);
            let rope = RopeKv {
                qkv: &ws.qkv,
                bias: w.qkv_bias.as_ref(),
                positions: &ws.positions,
                inv_freq: &self.inv_freq,
                slots: &ws.slots,
                q_out: &ws.q,
                k_cache: &self.k_cache[l],
                v_cache: &self.v_cache[l],
                n,
                hq,
                hkv,
                d: hd,
                block_size: self.block_size,
                kv_scales: self.kv_scales.as_ref().map(|s| (s.k[l], s.v[l])),
                raw_scales: None,
            };
            // SAFETY: as rope_kv_write's below.
            let qkv_left = unsafe {
                self.qkv_product(&p.qkv, p.quant(|f| &f.qkv, |i| &i.qkv), fused_quant, &rope)
            }?;
            // o_proj's weights into L2 on a branch beside RoPE and attention (joined before o).
            let prefetch_o = self.l2_prefetch && n <= L2_PREFETCH_MAX_ROWS;
            if prefetch_o {
                g.side.join(&g.stream)?;
                ops::l2_prefetch(g, &w.o)?;
            }
            if let QkvLeft::Rope(raw_scales) = qkv_left {
                let rope = RopeKv { raw_scales, ..rope };
                // SAFETY: step::build derived every slot from a checked block id < num_blocks
                // (padding uses block 0), so slots index inside the cache.
                unsafe { ops::rope_kv_write(g, &rope) }?;
            }
            let mut attn = Attention {
                q: &ws.q,
                k_cache: &self.k_cache[l],
                v_cache: &self.v_cache[l],
                out: &ws.attn,
                part_o: &ws.part_o,
                part_ml: &ws.part_ml,
                seqs: &ws.seqs,
                items: &ws.items_prefill,
                block_tables: &ws.tables,
                num_seqs: d.seqs,
                num_items: d.items_prefill,
                table_stride: d.stride,
                n,
                hq,
                hkv,
                d: hd,
                block_size: self.block_size,
                split_size: 1 << 30,
                num_splits: 1,
                scale: 1.0 / (hd as f32).sqrt(),
                kv_scales: self.kv_scales.as_ref().map(|s| (s.k[l], s.v[l])),
                decode: false,
                combine_fp8: None,
            };
            // An FP8 o product's input quantized by the split combine, in a step of decodes only
            // (each token one decode item: step::build lays decodes out so).
            let o_quant = p.quant(|f| &f.o, |i| &i.o);
            let combine_fp8 = match o_quant {
                ProductQuant::Fp8(s)
                    if self.fuse_o_quant
                        && d.items_prefill == 0
                        && d.items_decode == n
                        && ops::combine_fp8_fits(self.dtype, hd, d.splits) =>
                {
                    Some(CombineFp8 {
                        q: &ws.xq,
                        scales: &ws.xs,
                        static_scale: s.static_input.unwrap_or(0.0),
                    })
                }
                _ => None,
            };
            let o_quantized = combine_fp8.is_some();
            // SAFETY: step::build made seqs/items/tables consistent and checked every block id;
            // decode items are single-token sequences, as the split launch requires, and in a
            // step of decodes only item i's token is token i (< n).
            unsafe {
                ops::attention(g, &attn)?;
                attn.items = &ws.items_decode;
                attn.num_items = d.items_decode;
                attn.split_size = d.split;
                attn.num_splits = d.splits;
                attn.decode = true;
                attn.combine_fp8 = combine_fp8;
                ops::attention(g, &attn)?;
            }
            if prefetch_o {
                g.stream.join(&g.side)?;
            }
            let raw_o = self.product_maybe_unscaled(&p.o, o_quant, o_quantized, unscaled_ok)?;
            self.all_reduce(&ws.proj, n * h)?;
            let down = p.quant(|f| &f.down, |i| &i.down);
            let gate_up = p.quant(|f| &f.gate_up, |i| &i.gate_up);
            // FP8 at one row: SiLU·mul in the gate/up GEMV's epilogue and the down GEMV
            // quantizing its output, no launch between; the norm zeroes the row maxima for them.
            let silu_pair = self.fp8_silu_pair(&p, gate_up, down, fused_quant);
            let mut mlp_norm = norm_fp8(fp8.map(|f| &f.gate_up));
            if let Some(q) = mlp_norm.as_mut().filter(|_| silu_pair.is_some()) {
                q.amax_reset = Some(&ws.amax);
            }
            ops::add_rmsnorm(
                g,
                &AddRmsNorm {
                    residual: &ws.x,
                    delta: Some(&ws.proj),
                    weight: &w.post_norm,
                    out: &ws.normed,
                    rows: n,
                    hidden: h,
                    eps,
                    fp8: mlp_norm,
                    delta_scales: raw_o,
                },
            )?;
            if let Some((gu, dn)) = silu_pair {
                fp8_silu::gemv_fp8_silu(g, &gu, &ws.act, &ws.amax, self.fp8_gemv)?;
                fp8_silu::gemv_fp8_xq(g, &dn, self.fp8_gemv)?;
                self.all_reduce(&ws.proj, n * h)?;
                continue;
            }
            // INT4 on the tile GEMV: SiLU·mul in gate/up's epilogue, no launch between.
            if self.int4_gate_up_silu(&p.gate_up, gate_up)? {
                self.product(&p.down, down, false)?;
                self.all_reduce(&ws.proj, n * h)?;
                continue;
            }
            // FP8: SiLU·mul writes the down product's input codes directly, and scales an
            // FP8 gate/up product that cuBLASLt left raw on the way in.
            let silu_quant =
                matches!(down, ProductQuant::Fp8(_)) && super::fp8::silu_mul_quant_fits(inter);
            let raw = self.product_maybe_unscaled(&p.gate_up, gate_up, fused_quant, silu_quant)?;
            let quantized = match down {
                ProductQuant::Fp8(s) if silu_quant => super::fp8::silu_mul_quant(
                    g,
                    &ws.gate_up,
                    (&ws.xq, &ws.xs),
                    (n, inter),
                    s.static_input.unwrap_or(0.0),
                    raw,
                )?,
                _ => false,
            };
            if !quantized {
                ops::silu_mul(g, &ws.gate_up, &ws.act, (n, inter))?;
            }
            raw_down = self.product_maybe_unscaled(&p.down, down, quantized, unscaled_ok)?;
            self.all_reduce(&ws.proj, n * h)?;
        }
        ops::add_rmsnorm(
            g,
            &AddRmsNorm {
                residual: &ws.x,
                delta: Some(&ws.proj),
                weight: &self.weights.final_norm,
                out: &ws.normed,
                rows: n,
                hidden: h,
                eps,
                fp8: None,
                delta_scales: raw_down,
            },
        )?;
        if d.rows == 0 {
            return Ok(());
        }
        let lm = self.lm_product(d.rows).ok_or_else(|| {
            BackendError::InvalidOptions(
                "this tensor-parallel rank holds no LM head (only rank 0 computes logits)".into(),
            )
        })?;
        // SAFETY: sample_idx entries are token indices < n (step::build).
        unsafe { ops::embedding(g, &ws.last, &ws.normed, &ws.sample_idx, (d.rows, h)) }?;
        self.linear(&lm)?;
        if d.sample {
            ops::sample(
                g,
                &ws.logits,
                &ws.sample_params,
                &ws.sampled,
                &ws.sample_scratch,
                (d.rows, cfg.vocab_size),
            )?;
        }
        Ok(())
    }

    /// Runs a step: through a CUDA graph when it is a sampling decode of at most
    /// [`MAX_GRAPH_BATCH`] sequences and graphs are on, else eagerly. Returns the number of rows.
    /// With `draw_later`, the step stops at the logits (the caller masks them, then draws).
    fn run(
        &mut self,
        batch: &ForwardBatch<'_>,
        sampling: Option<&[DeviceSampling]>,
        draw_later: bool,
    ) -> Result<usize, BackendError> {
        self.run_fed(batch, sampling, draw_later, TokenFeed::Host)
    }

    /// [`CudaBackend::run`], with the step's input tokens from `feed`: with
    /// [`TokenFeed::PreviousStep`], the first sequences' are the last launched step's draws,
    /// copied over the uploaded placeholders on the device (the caller checked the launch).
    fn run_fed(
        &mut self,
        batch: &ForwardBatch<'_>,
        sampling: Option<&[DeviceSampling]>,
        draw_later: bool,
        feed: TokenFeed<'_>,
    ) -> Result<usize, BackendError> {
        self.gpu.ctx.bind_to_thread()?;
        let lim = self.limits();
        let st = step::build(batch, lim, 0)?;
        // Ranks other than 0 compute no logits (rank 0 samples for the group).
        let rows = if self.samples { st.sample_idx.len() } else { 0 };
        if let Some(s) = sampling
            && s.len() != rows
        {
            return Err(BackendError::InvalidBatch(format!(
                "{} sampling settings for {rows} sampling rows",
                s.len()
            )));
        }
        let n = st.n();
        let graphable = !self.enforce_eager
            && n > 0
            && n <= MAX_GRAPH_BATCH
            && st.items_prefill.is_empty()
            && st.sample_idx.len() == n;
        if graphable {
            let bucket = n.next_power_of_two();
            let stride = st.stride.next_power_of_two().max(1);
            if let Some(padded) = step::pad_decode(&st, bucket, stride) {
                let split = self.decode_split(bucket, stride * self.block_size);
                let splits = (stride * self.block_size).div_ceil(split).max(1);
                let mut padded = padded;
                step::share_decode_splits(&mut padded, split, self.block_size, self.decode_share);
                self.ensure(Caps {
                    tokens: bucket,
                    seqs: bucket,
                    stride,
                    splits,
                })?;
                self.upload_step(&padded, sampling)?;
                self.feed_ids(feed)?;
                let dims = Dims {
                    n: bucket,
                    seqs: bucket,
                    items_prefill: 0,
                    items_decode: bucket,
                    stride,
                    split,
                    splits,
                    rows: if self.samples { bucket } else { 0 },
                    sample: self.samples && !draw_later,
                };
                let key = (bucket, stride, draw_later);
                if !self.graphs.contains_key(&key) {
                    let t0 = std::time::Instant::now();
                    self.tune_products(bucket)?;
                    let tuned = t0.elapsed();
                    let graph = self.capture(dims)?;
                    tracing::debug!(
                        bucket,
                        stride,
                        tune_ms = tuned.as_secs_f64() * 1e3,
                        capture_ms = (t0.elapsed() - tuned).as_secs_f64() * 1e3,
                        programmatic_edges = graph.programmatic_edges,
                        "decode graph captured"
                    );
                    self.graphs.insert(key, graph);
                }
                self.graphs[&key].launch()?;
                return Ok(rows);
            }
        }
        let split = self.decode_split(st.items_decode.len() / 2, st.max_decode_ctx);
        let splits = st.decode_splits(split);
        let mut st = st;
        step::share_decode_splits(&mut st, split, self.block_size, self.decode_share);
        self.ensure(Caps {
            tokens: n,
            seqs: st.num_seqs().max(rows),
            stride: st.stride,
            splits,
        })?;
        self.upload_step(&st, sampling)?;
        self.feed_ids(feed)?;
        self.launch_model(Dims {
            n,
            seqs: st.num_seqs(),
            items_prefill: st.items_prefill.len() / 2,
            items_decode: st.items_decode.len() / 2,
            stride: st.stride,
            split,
            splits,
            rows,
            sample: sampling.is_some() && rows > 0 && !draw_later,
        })?;
        Ok(rows)
    }

    /// With [`TokenFeed::PreviousStep`], the fed sequences' input tokens (the step's first ids)
    /// are draws of the last launched step: copied from the kept draws over the uploaded
    /// placeholders, one copy per run of consecutive draws, in stream order.
    fn feed_ids(&mut self, feed: TokenFeed<'_>) -> Result<(), BackendError> {
        let TokenFeed::PreviousStep(draws) = feed else {
            return Ok(());
        };
        let mut i = 0;
        while i < draws.len() {
            let kept = self.feed.as_ref().ok_or_else(|| {
                BackendError::InvalidBatch("a fed step with no launched step before it".into())
            })?;
            let mut j = i + 1;
            while j < draws.len() && draws[j] == draws[j - 1] + 1 {
                j += 1;
            }
            self.gpu
                .copy_range(kept, draws[i] as usize, &mut self.ws.ids, i, j - i)?;
            i = j;
        }
        Ok(())
    }

    /// After a launched step's draw: its `rows` tokens are kept for a step fed from them and
    /// start on their way to the host.
    fn read_back(&mut self, rows: usize) -> Result<(), BackendError> {
        let g = &self.gpu;
        let feed = match self.feed.take() {
            Some(f) if f.len() >= rows => f,
            _ => g.alloc(DType::U32, rows.next_power_of_two().max(256))?,
        };
        let mut feed = feed;
        g.copy_range(&self.ws.sampled, 0, &mut feed, 0, rows)?;
        self.feed = Some(feed);
        self.feed_rows = rows;
        let mut rb = match self.readbacks.iter().position(|r| r.capacity() >= rows) {
            Some(i) => self.readbacks.swap_remove(i),
            None => g.readback(rows.next_power_of_two().max(256))?,
        };
        g.start_readback(&self.ws.sampled, rows, &mut rb)?;
        self.launched.push_back(rb);
        Ok(())
    }

    fn capture(&self, dims: Dims) -> Result<DecodeGraph, BackendError> {
        let none = PdlKernels::default();
        let pdl = if dims.n <= PDL_MAX_ROWS {
            &self.pdl
        } else {
            &none
        };
        DecodeGraph::capture(&self.gpu.stream, pdl, || self.launch_model(dims))
    }
}

impl Drop for CudaBackend {
    /// The decode graphs hold the NCCL all-reduces: destroy them before the communicator. No
    /// synchronisation first: with a peer gone, an all-reduce in flight would never finish, and
    /// aborting the communicator is what ends it.
    fn drop(&mut self) {
        self.graphs.clear();
        self.group.get_mut().take();
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn num_kv_blocks(&self) -> usize {
        self.num_blocks
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<Logits, BackendError> {
        let rows = self.run(batch, None, false)?;
        let vocab = self.cfg.vocab_size;
        let mut data = self
            .gpu
            .download_f32_prefix(&self.ws.logits, rows * vocab)?;
        data.truncate(rows * vocab);
        Ok(Logits { vocab, data })
    }

    fn forward_sampled(
        &mut self,
        batch: &ForwardBatch<'_>,
        sampling: &[DeviceSampling],
    ) -> Result<Option<Vec<u32>>, BackendError> {
        let rows = self.run(batch, Some(sampling), false)?;
        Ok(Some(self.gpu.download_u32(&self.ws.sampled, rows)?))
    }

    /// The step is queued on the stream (graph or eager, as [`Backend::forward_sampled`] runs
    /// it), then its draws are copied beside the workspace and, asynchronously, into page-locked
    /// host memory; nothing waits. A fed step's ids are the kept draws, copied on the device
    /// after the upload and before the step, so stream order makes the dependency. Not in a
    /// tensor-parallel group (the ranks mirror plans whose tokens rank 0 has applied).
    fn launch_sampled(
        &mut self,
        batch: &ForwardBatch<'_>,
        sampling: &[DeviceSampling],
        feed: TokenFeed<'_>,
    ) -> Result<bool, BackendError> {
        if self.group.borrow().is_some() || !self.samples {
            return Ok(false);
        }
        check_launch(batch, feed, self.launched.len(), self.feed_rows)?;
        let rows = self.run_fed(batch, Some(sampling), false, feed)?;
        self.read_back(rows)?;
        Ok(true)
    }

    fn collect_sampled(&mut self) -> Result<Vec<u32>, BackendError> {
        let rb = self
            .launched
            .pop_front()
            .ok_or_else(|| BackendError::InvalidBatch("no launched step to collect".into()))?;
        let tokens = rb.wait();
        self.readbacks.push(rb);
        tokens
    }

    /// The forward pass is launched (asynchronously) before `masks` is asked for, so the engine's
    /// mask computation overlaps it; the constrained rows' masks are then uploaded, applied to
    /// their logits on the device, and every row is drawn by the usual sampling kernel.
    fn forward_sampled_masked(
        &mut self,
        batch: &ForwardBatch<'_>,
        sampling: &[DeviceSampling],
        masks: &mut dyn FnMut() -> Vec<Option<TokenMask>>,
    ) -> Result<Option<Vec<u32>>, BackendError> {
        let rows = self.run(batch, Some(sampling), true)?;
        let masks = masks();
        if masks.len() != rows {
            return Err(BackendError::InvalidBatch(format!(
                "{} grammar masks for {rows} sampling rows",
                masks.len()
            )));
        }
        let vocab = self.cfg.vocab_size;
        let words = vocab.div_ceil(32);
        let mut row_ids = Vec::new();
        let mut packed: Vec<u8> = Vec::new();
        for (i, mask) in masks.iter().enumerate() {
            if let Some(mask) = mask {
                row_ids.push(i as u32);
                let w = mask.words();
                packed
                    .extend((0..words).flat_map(|j| w.get(j).copied().unwrap_or(0).to_le_bytes()));
            }
        }
        let bufs = match self.masks.take() {
            Some(b) if b.cap >= row_ids.len() => b,
            _ => MaskBufs::new(
                &self.gpu,
                row_ids.len().max(rows).next_power_of_two(),
                words,
            )?,
        };
        let bufs = self.masks.insert(bufs);
        let g = &self.gpu;
        g.write_bytes(&mut bufs.words, &packed)?;
        ops::mask_logits(
            g,
            &self.ws.logits,
            &bufs.words,
            &mut bufs.rows,
            &row_ids,
            (rows, vocab),
        )?;
        ops::sample(
            g,
            &self.ws.logits,
            &self.ws.sample_params,
            &self.ws.sampled,
            &self.ws.sample_scratch,
            (rows, vocab),
        )?;
        Ok(Some(g.download_u32(&self.ws.sampled, rows)?))
    }
}

/// Device buffers for grammar masks: `cap` masks of `words` words, and `cap` row indices.
struct MaskBufs {
    words: Buf,
    rows: Buf,
    cap: usize,
}

impl MaskBufs {
    fn new(gpu: &Gpu, cap: usize, words: usize) -> Result<Self, BackendError> {
        Ok(Self {
            words: gpu.alloc(DType::U32, cap * words)?,
            rows: gpu.alloc(DType::U32, cap)?,
            cap,
        })
    }
}

/// The device form of one sampling row (the one place engine settings become a kernel's).
fn sample_row(s: &DeviceSampling) -> SampleRow {
    let p = &s.params;
    SampleRow {
        temperature: p.temperature,
        top_k: p.top_k,
        top_p: p.top_p,
        min_p: p.min_p,
        seed: s.seed,
        step: s.step,
    }
}
