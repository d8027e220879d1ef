//! The CUDA backend's workspace: activations, step inputs and quantization buffers at fixed
//! addresses (so CUDA graphs can replay against them) until a step needs them larger.

use super::backend::INVARIANT_CHUNK;
use super::device::{Buf, DType, Gpu};
use super::ops;
use crate::backend::BackendError;
use crate::config::ModelConfig;
use crate::tp::LocalDims;

/// Workspace sizes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Caps {
    pub(super) tokens: usize,
    pub(super) seqs: usize,
    pub(super) stride: usize,
    pub(super) splits: usize,
}

/// Activations and step inputs, at fixed addresses until they must grow.
pub(super) struct Workspace {
    pub(super) caps: Caps,
    pub(super) x: Buf,
    pub(super) normed: Buf,
    pub(super) qkv: Buf,
    pub(super) q: Buf,
    pub(super) attn: Buf,
    pub(super) proj: Buf,
    pub(super) gate_up: Buf,
    pub(super) act: Buf,
    pub(super) last: Buf,
    pub(super) logits: Buf,
    pub(super) sampled: Buf,
    pub(super) sample_params: Buf,
    /// The sampling kernel's per-row counters and slice results (kept zeroed between steps).
    pub(super) sample_scratch: Buf,
    pub(super) ids: Buf,
    pub(super) positions: Buf,
    pub(super) slots: Buf,
    pub(super) seqs: Buf,
    pub(super) items_prefill: Buf,
    pub(super) items_decode: Buf,
    pub(super) tables: Buf,
    pub(super) sample_idx: Buf,
    pub(super) part_o: Buf,
    pub(super) part_ml: Buf,
    /// FP8 linear layers: a product's input as E4M3 codes and its per-row scales (one element
    /// each otherwise).
    pub(super) xq: Buf,
    pub(super) xs: Buf,
    /// FP8: the row maxima of the fused SiLU·mul (`fp8_silu`; one element otherwise).
    pub(super) amax: Buf,
    /// INT4 linear layers: the largest product's weights dequantized to bf16 (for steps past
    /// [`INT4_GEMV_MAX_ROWS`](super::backend::INT4_GEMV_MAX_ROWS) rows; the tensor-core product's
    /// split-k partial sums reuse it), and act order's permuted activations.
    pub(super) wdq: Buf,
    pub(super) xperm: Buf,
}

/// The quantization buffers a workspace needs.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct QuantBufs {
    pub(super) fp8: bool,
    /// Elements of the largest INT4 product's weight (0 without INT4).
    pub(super) int4_dequant: usize,
    /// Whether some INT4 product permutes its input (GPTQ act order).
    pub(super) act_order: bool,
}

impl Workspace {
    /// Buffers for steps up to `caps`, in the compute type `dt`, with `quant`'s extras.
    pub(super) fn new(
        gpu: &Gpu,
        cfg: &ModelConfig,
        dims: &LocalDims,
        (dt, quant): (DType, QuantBufs),
        caps: Caps,
    ) -> Result<Self, BackendError> {
        let fp8 = quant.fp8;
        // Whole GEMM blocks of rows, for batch-invariant mode's padding rows.
        let t = caps.tokens.next_multiple_of(INVARIANT_CHUNK);
        let s = caps.seqs.next_multiple_of(INVARIANT_CHUNK);
        let h = cfg.hidden_size;
        let (qd, kvd, inter) = (dims.q_dim, dims.kv_dim, dims.inter);
        let tile = ops::attention_tile_tokens(dt, cfg.head_dim, dims.heads / dims.kv_heads);
        Ok(Self {
            caps,
            x: gpu.alloc(dt, t * h)?,
            normed: gpu.alloc(dt, t * h)?,
            qkv: gpu.alloc(dt, t * (qd + 2 * kvd))?,
            q: gpu.alloc(dt, t * qd)?,
            attn: gpu.alloc(dt, t * qd)?,
            proj: gpu.alloc(dt, t * h)?,
            gate_up: gpu.alloc(dt, t * 2 * inter)?,
            act: gpu.alloc(dt, t * inter)?,
            last: gpu.alloc(dt, s * h)?,
            logits: gpu.alloc(DType::F32, s * cfg.vocab_size)?,
            sampled: gpu.alloc(DType::U32, s)?,
            sample_params: gpu.alloc(DType::U32, 8 * s)?,
            sample_scratch: gpu.alloc(DType::U32, kernels::SAMPLE_SCRATCH_WORDS * s)?,
            ids: gpu.alloc(DType::U32, t)?,
            positions: gpu.alloc(DType::U32, t)?,
            slots: gpu.alloc(DType::I64, t)?,
            seqs: gpu.alloc(DType::I32, 4 * s)?,
            items_prefill: gpu.alloc(DType::I32, 2 * (t.div_ceil(tile) + s))?,
            items_decode: gpu.alloc(DType::I32, 2 * s)?,
            tables: gpu.alloc(DType::U32, s * caps.stride)?,
            sample_idx: gpu.alloc(DType::U32, s)?,
            part_o: gpu.alloc(DType::F32, s * dims.heads * caps.splits * cfg.head_dim)?,
            part_ml: gpu.alloc(DType::F32, s * dims.heads * caps.splits * 2)?,
            xq: gpu.alloc(DType::U8, if fp8 { t * h.max(qd).max(inter) } else { 1 })?,
            xs: gpu.alloc(DType::F32, if fp8 { t } else { 1 })?,
            amax: gpu.alloc(
                DType::U32,
                if fp8 {
                    super::fp8_silu::FP8_SILU_MAX_ROWS
                } else {
                    1
                },
            )?,
            wdq: gpu.alloc(DType::Bf16, quant.int4_dequant.max(1))?,
            xperm: gpu.alloc(
                DType::Bf16,
                if quant.act_order {
                    t * h.max(qd).max(inter)
                } else {
                    1
                },
            )?,
        })
    }
}
