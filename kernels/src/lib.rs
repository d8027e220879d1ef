//! The CUDA kernel sources (`*.cu`, `*.cuh`) and their compilation with NVRTC at worker start-up,
//! cached on disk by source hash, architecture and NVRTC version.
//!
//! Every kernel is `extern "C"` and named `<op>_<dtype>` (`f32`, `bf16`; head-size and group
//! specialisations add `_d<D>_g<G>`); [`KERNELS`] lists them all. Sources: `elementwise.cu`
//! (embedding gather, fused residual add + RMSNorm, SiLU·mul, casts), `rope.cu` (RoPE fused with
//! the paged KV write), `attention.cu` (general paged attention, any head size, split combine),
//! `decode.cu` (bandwidth-oriented single-token attention), `decode_mma.cu` (the same on tensor
//! cores for bf16 head size 128), `prefill_mma.cu` (tensor-core prefill
//! attention, bf16, head size 128), `prefill_wgmma.cu` (the same on Hopper's wgmma; its body is
//! compiled only for `sm_90a`, elsewhere it traps), `gemv.cu` (small-batch matrix-vector, alone
//! or fused with RoPE and the KV write), `fp8.cu` (per-row E4M3 quantization and the FP8 small-batch
//! product on sm_89+ tensor cores), `int4.cu` (the AWQ/GPTQ small-batch products and the
//! tensor-core product of larger batches with weights dequantized in registers, whole-matrix
//! dequantization, act-order column permutation), `int4_wgmma.cu` (that product on Hopper's
//! wgmma, `sm_90a` only), `sampling.cu` (greedy, temperature, top-k, top-p, min-p,
//! seeded). The parameter structs the kernels take live in `params.cuh`, mirrored once in
//! [`params`] and checked against it at compile time; the launch constants come from
//! [`LAUNCH_CONSTANTS`] as `-D` options. All sources form one translation unit, compiled straight to a CUBIN for the device's
//! architecture (`sm_90a` on compute capability 9.0), so loading it needs no JIT. NVRTC is loaded
//! at run time (cudarc's dynamic loading): a machine without CUDA builds and runs everything else,
//! and [`compile`] answers [`KernelError::NvrtcMissing`] there.
//!
//! ```no_run
//! let opts = kernels::CompileOptions::for_arch("sm_90");
//! let compiled = kernels::compile(&opts)?;
//! println!("{} bytes of CUBIN (from cache: {})", compiled.cubin.len(), compiled.from_cache);
//! # Ok::<(), kernels::KernelError>(())
//! ```

use std::ffi::{CString, c_char, c_int};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result as nvrtc, sys};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// The sources, as `(file name, text)`. `all.cu` includes the others.
pub const SOURCES: &[(&str, &str)] = &[
    ("params.cuh", include_str!("params.cuh")),
    ("common.cuh", include_str!("common.cuh")),
    ("elementwise.cu", include_str!("elementwise.cu")),
    ("rope.cu", include_str!("rope.cu")),
    ("attention.cu", include_str!("attention.cu")),
    ("decode.cu", include_str!("decode.cu")),
    ("prefill_mma.cu", include_str!("prefill_mma.cu")),
    // After decode.cu and prefill_mma.cu: uses their parameter struct and mma helpers.
    ("decode_mma.cu", include_str!("decode_mma.cu")),
    // After prefill_mma.cu: uses its parameter struct and helpers.
    ("prefill_wgmma.cu", include_str!("prefill_wgmma.cu")),
    ("gemv.cu", include_str!("gemv.cu")),
    // After gemv.cu: uses its streamed loads and partial-sum reduction.
    ("fp8.cu", include_str!("fp8.cu")),
    // After gemv.cu: uses its streamed loads, bf16 mma and partial-sum reduction.
    ("int4.cu", include_str!("int4.cu")),
    // After int4.cu and prefill_wgmma.cu: uses their dequantization, store and wgmma helpers.
    ("int4_wgmma.cu", include_str!("int4_wgmma.cu")),
    ("sampling.cu", include_str!("sampling.cu")),
    ("prefetch.cu", include_str!("prefetch.cu")),
];

/// Kernels that enter through `PDL_ENTRY` (common.cuh): nothing before it reads what another
/// kernel wrote or writes anything, so in a decode graph each may launch while the kernel it
/// depends on finishes (programmatic dependent launch, sm_90+).
pub const PDL_KERNELS: &[&str] = &[
    "add_rmsnorm_bf16",
    "add_rmsnorm_fp8_bf16",
    "silu_mul_bf16",
    "rope_kv_write_bf16",
    "attn_combine_bf16",
    "attn_decode_mma_bf16_d128",
    "attn_decode_mma_kv8_d128",
    "gemv_bf16_r16",
    "gemv_bf16_r32",
    "gemv_bf16_f32out_r16",
    "gemv_bf16_f32out_r32",
    "gemv_rope_kv_bf16",
    "quant_fp8_rows_bf16",
    "quant_fp8_rows_bf16_c2",
    "silu_mul_quant_fp8_bf16",
    "silu_mul_quant_fp8_bf16_wide",
    "gemv_fp8_r16",
    "gemv_fp8_r32",
    "gemv_fp8_t16_d2x_b4",
    "gemv_fp8_t16_d4x_b2",
    "gemv_fp8_t16_d3x",
    "gemv_fp8_t16_d4x",
    "gemv_fp8_t16_d6x_b2",
    "gemv_fp8_t16_d8x",
    "gemv_fp8_t16_d4",
    "gemv_fp8_rope_kv_t16_d2x_b4",
    "gemv_fp8_rope_kv_t16_d4x_b2",
    "gemv_fp8_silu_t16_d2x_b4",
    "gemv_fp8_silu_t16_d4x_b2",
    "gemv_fp8_xq_t16_d2x_b4",
    "gemv_fp8_xq_t16_d4x_b2",
    "attn_combine_quant_fp8_bf16",
    "scale_fp8_out_bf16",
    "gemv_int4_t16_k128_b8",
    "gemv_int4_t16_k128_b16",
    "gemv_int4_t16_k128_b32",
    "gemv_int4_t16_k64_b8",
    "gemv_int4_t16_k64_b16",
    "gemv_int4_t16_k64_b32",
    "gemv_int4_t16x_d4_k128_b8",
    "gemv_int4_rope_kv_t16_k128_b8",
    "gemv_int4_rope_kv_t16_k128_b16",
    "gemv_int4_rope_kv_t16_k128_b32",
    "gemv_int4_rope_kv_t16_k64_b8",
    "gemv_int4_rope_kv_t16_k64_b16",
    "gemv_int4_rope_kv_t16_k64_b32",
    "gemv_int4_silu_t16_k128_b8",
    "gemv_int4_silu_t16_k128_b16",
    "gemv_int4_silu_t16_k128_b32",
    "gemv_int4_silu_t16_k64_b8",
    "gemv_int4_silu_t16_k64_b16",
    "gemv_int4_silu_t16_k64_b32",
];

/// Every kernel the sources define.
pub const KERNELS: &[&str] = &[
    "embedding_f32",
    "embedding_bf16",
    "add_rmsnorm_f32",
    "add_rmsnorm_bf16",
    "add_rmsnorm_fp8_bf16",
    "silu_mul_f32",
    "silu_mul_bf16",
    "cast_f32_bf16",
    "cast_bf16_f32",
    "rope_kv_write_f32",
    "rope_kv_write_bf16",
    "attention_f32",
    "attention_bf16",
    "attention_bf16_kv8",
    "attn_combine_f32",
    "attn_combine_bf16",
    "attn_decode_f32_d64_g1",
    "attn_decode_f32_d64_g2",
    "attn_decode_f32_d64_g4",
    "attn_decode_f32_d64_g8",
    "attn_decode_f32_d128_g1",
    "attn_decode_f32_d128_g2",
    "attn_decode_f32_d128_g4",
    "attn_decode_f32_d128_g8",
    "attn_decode_bf16_d64_g1",
    "attn_decode_bf16_d64_g2",
    "attn_decode_bf16_d64_g4",
    "attn_decode_bf16_d64_g8",
    "attn_decode_bf16_d128_g1",
    "attn_decode_bf16_d128_g2",
    "attn_decode_bf16_d128_g4",
    "attn_decode_bf16_d128_g8",
    "attn_decode_mma_bf16_d128",
    "attn_decode_mma_kv8_d128",
    "attn_prefill_bf16_d128",
    "attn_prefill_kv8_d128",
    "attn_prefill_wgmma_bf16_d128",
    "gemv_f32",
    "gemv_bf16_r16",
    "gemv_bf16_r32",
    "gemv_bf16_f32out_r16",
    "gemv_bf16_f32out_r32",
    "gemv_rope_kv_bf16",
    "quant_fp8_rows_bf16",
    "quant_fp8_rows_bf16_c2",
    "silu_mul_quant_fp8_bf16",
    "silu_mul_quant_fp8_bf16_wide",
    "gemv_fp8_r16",
    "gemv_fp8_r32",
    "gemv_fp8_t16_d2x_b4",
    "gemv_fp8_t16_d4x_b2",
    "gemv_fp8_t16_d3x",
    "gemv_fp8_t16_d4x",
    "gemv_fp8_t16_d6x_b2",
    "gemv_fp8_t16_d8x",
    "gemv_fp8_t16_d4",
    "gemv_fp8_rope_kv_t16_d2x_b4",
    "gemv_fp8_rope_kv_t16_d4x_b2",
    "gemv_fp8_silu_t16_d2x_b4",
    "gemv_fp8_silu_t16_d4x_b2",
    "gemv_fp8_xq_t16_d2x_b4",
    "gemv_fp8_xq_t16_d4x_b2",
    "attn_combine_quant_fp8_bf16",
    "scale_fp8_out_bf16",
    "gemv_int4_r16",
    "gemv_int4_r32",
    "gemv_int4_t16_k128_b8",
    "gemv_int4_t16_k128_b16",
    "gemv_int4_t16_k128_b32",
    "gemv_int4_t16_k64_b8",
    "gemv_int4_t16_k64_b16",
    "gemv_int4_t16_k64_b32",
    "gemv_int4_t16x_d4_k128_b8",
    "gemv_int4_rope_kv_t16_k128_b8",
    "gemv_int4_rope_kv_t16_k128_b16",
    "gemv_int4_rope_kv_t16_k128_b32",
    "gemv_int4_rope_kv_t16_k64_b8",
    "gemv_int4_rope_kv_t16_k64_b16",
    "gemv_int4_rope_kv_t16_k64_b32",
    "gemv_int4_silu_t16_k128_b8",
    "gemv_int4_silu_t16_k128_b16",
    "gemv_int4_silu_t16_k128_b32",
    "gemv_int4_silu_t16_k64_b8",
    "gemv_int4_silu_t16_k64_b16",
    "gemv_int4_silu_t16_k64_b32",
    "dequant_int4_bf16",
    "gemv_int4_min_r16",
    "gemv_int4_min_r32",
    "dequant_int4_min_bf16",
    "gemm_int4_mma_t2w4",
    "gemm_int4_mma_t1w4",
    "gemm_int4_mma_t1w8",
    "gemm_int4_mma_t2w8",
    "gemm_int4_mmas_t2w4",
    "gemm_int4_mmas_t1w4",
    "gemm_int4_mmas_t1w8",
    "gemm_int4_mmas_t2w8",
    "gemm_int4_wgmma_s3",
    "gemm_int4_wgmma_p3",
    "gemm_int4_wgmma_p4",
    "gemm_int4_wgmma_p4_b256",
    "gemm_int4_wgmma_p6_b256",
    "gemm_int4_reduce",
    "permute_cols_bf16",
    "sample_f32",
    "mask_logits",
    "l2_prefetch_u8",
];

pub mod params;

/// Query rows one attention block handles (`ROWS` in `attention.cu`).
pub const ATTN_ROWS: usize = 16;
/// Keys per shared-memory tile in attention (`KTILE`).
pub const ATTN_KEY_TILE: usize = 32;
/// Largest head dimension the attention kernel supports (`MAX_D`).
pub const ATTN_MAX_HEAD_DIM: usize = 256;
/// Threads per attention block.
pub const ATTN_THREADS: u32 = 128;
/// Head dimensions the decode attention kernel is built for (`attn_decode_<dtype>_d<D>_g<G>`).
pub const DECODE_HEAD_DIMS: &[usize] = &[64, 128];
/// Query-heads-per-KV-head group sizes the decode attention kernel is built for.
pub const DECODE_GROUPS: &[usize] = &[1, 2, 4, 8];
/// Threads per decode attention block.
pub const DECODE_THREADS: u32 = 128;
/// Keys per stage of a decode block's K/V ring (`DEC_TK`).
pub const DECODE_KEY_TILE: usize = 32;
/// The K/V ring budget of a decode block for 2-byte elements (4 blocks an SM).
pub const DECODE_RING_BYTES_2: usize = 49152;
/// The K/V ring budget of a decode block for 4-byte elements.
pub const DECODE_RING_BYTES_4: usize = 65536;
/// Dynamic shared memory of the FP8-cache decode kernel: 6 E4M3 stages of 8 KiB, so that 4 blocks
/// fit an SM with their 1 KiB of static shared memory and the driver's 1 KiB each (7 stages left
/// room for 3: run 40b).
pub const DECODE_KV8_SMEM_BYTES: usize = 49152;
/// The tensor-core decode attention kernel (bf16, head size 128, every group of
/// [`DECODE_GROUPS`]); same grid, block, shared memory and parameters as
/// `attn_decode_bf16_d128_g<G>`.
pub const DECODE_MMA_KERNEL: &str = "attn_decode_mma_bf16_d128";
/// [`DECODE_MMA_KERNEL`] over an FP8 (E4M3) cache: same grid, block and parameters; its shared
/// memory is [`DECODE_KV8_SMEM_BYTES`] (a ring of E4M3 stages, converted to f16 in registers).
pub const DECODE_MMA_KV8_KERNEL: &str = "attn_decode_mma_kv8_d128";
/// Heads one `rope_kv_write_*` block rotates and writes (`ROPE_HEADS`): the 8B shape's 48 q/k/v
/// heads in two blocks a token.
pub const ROPE_HEADS: usize = 32;
/// Threads of a `rope_kv_write_*` block (`ROPE_THREADS`): one (head, 8 pairs) item each at head
/// size 128.
pub const ROPE_THREADS: u32 = 256;
/// Rotated pairs (half the head dimension) `rope_kv_write_*` supports: its sin/cos table.
pub const ROPE_MAX_PAIRS: usize = ATTN_MAX_HEAD_DIM / 2;

/// Query-head rows of the tensor-core decode kernels' mma operand that hold queries: a KV head's
/// group, or the groups of up to `DECODE_MMA_ROWS / group` sequences sharing a split.
pub const DECODE_MMA_ROWS: usize = 8;
/// The second word of a decode attention item (its first is the sequence) is 0 or a share code:
/// the item is member `code & 15` of a group of `(code >> DECODE_SHARE_MEMBERS_SHIFT) & 15`
/// consecutive items whose first `code >> DECODE_SHARE_SPLITS_SHIFT` attention splits read the
/// same cache blocks, computed once for the group by [`DECODE_MMA_KERNEL`] and
/// [`DECODE_MMA_KV8_KERNEL`] (other decode kernels must not be given share codes).
pub const DECODE_SHARE_MEMBERS_SHIFT: usize = 4;
/// See [`DECODE_SHARE_MEMBERS_SHIFT`].
pub const DECODE_SHARE_SPLITS_SHIFT: usize = 8;

/// The share code of member `member` of `members` consecutive decode items sharing their first
/// `splits` attention splits ([`DECODE_SHARE_MEMBERS_SHIFT`]); `None` when a field does not fit
/// (`members` 2–15, `member < members`, `splits` 1 to 2^23 − 1).
pub fn decode_share_code(member: usize, members: usize, splits: usize) -> Option<i32> {
    let ok = (2..16).contains(&members)
        && member < members
        && (1..1 << (31 - DECODE_SHARE_SPLITS_SHIFT)).contains(&splits);
    ok.then_some(
        (splits << DECODE_SHARE_SPLITS_SHIFT | members << DECODE_SHARE_MEMBERS_SHIFT | member)
            as i32,
    )
}

/// The tensor-core prefill kernel over an FP8 cache (mma.sync on f16; same items, grid, block and
/// [`PREFILL_MMA_SMEM_BYTES`] as `attn_prefill_bf16_d128`).
pub const PREFILL_MMA_KV8_KERNEL: &str = "attn_prefill_kv8_d128";

/// Dynamic shared memory (bytes) of a decode attention block: its K/V ring of 32-key stages, as
/// many as fit up to 4 in 48 KiB for 2-byte elements (4 blocks an SM) or 64 KiB for f32
/// (`dec_stages` in `decode.cu`), for elements of `elem_bytes` bytes and head dimension `d`.
pub fn decode_smem_bytes(elem_bytes: usize, d: usize) -> usize {
    let stage = 2 * DECODE_KEY_TILE * d * elem_bytes;
    let budget = if elem_bytes == 2 {
        DECODE_RING_BYTES_2
    } else {
        DECODE_RING_BYTES_4
    };
    stage * (budget / stage).min(4)
}

/// Query tokens per block of the tensor-core prefill kernel (`attn_prefill_bf16_d128`, `PF_BM`).
pub const PREFILL_MMA_TOKENS: usize = 128;
/// Threads per block of the tensor-core prefill kernel (4 warps of 32 query rows).
pub const PREFILL_MMA_THREADS: u32 = 128;
/// Keys per K/V tile of the tensor-core prefill kernel (`PF_BN`).
pub const PREFILL_MMA_KEY_TILE: usize = 64;
/// Dynamic shared memory (bytes) of a tensor-core prefill block: its two-stage ring of 64-key K
/// and V tiles and its tile of `PREFILL_MMA_TOKENS` query rows (bf16, head size 128): 96 KiB.
pub const PREFILL_MMA_SMEM_BYTES: usize =
    2 * 2 * PREFILL_MMA_KEY_TILE * 128 * 2 + PREFILL_MMA_TOKENS * 128 * 2;
/// Threads per block of the Hopper prefill kernel (`attn_prefill_wgmma_bf16_d128`, sm_90a only;
/// same items of [`PREFILL_MMA_TOKENS`] tokens): 2 consumer warpgroups of 64 query rows and a
/// producer warpgroup (`PW_THREADS`).
pub const PREFILL_WGMMA_THREADS: u32 = 384;
/// Keys per K/V tile of the Hopper prefill kernel (`PW_BN`).
pub const PREFILL_WGMMA_KEY_TILE: usize = 128;
/// Stages of the Hopper prefill kernel's K and V rings (`PW_STAGES`).
pub const PREFILL_WGMMA_STAGES: usize = 2;
/// Dynamic shared memory (bytes) of a Hopper prefill block (`PW_SMEM_BYTES`, which the kernel
/// checks against this): the Q tile and two-stage rings of 128-key K and V tiles (32 KiB each),
/// 8 mbarriers, and 1 KiB of slack to align the base to the 1024-byte swizzle pattern: 161 KiB,
/// one block per SM.
pub const PREFILL_WGMMA_SMEM_BYTES: usize =
    (1 + 2 * PREFILL_WGMMA_STAGES) * PREFILL_WGMMA_KEY_TILE * 128 * 2
        + 4 * PREFILL_WGMMA_STAGES * 8
        + 1024;

/// Largest batch the GEMV kernel takes (`MAX_B`; the 8 rows of an mma operand).
pub const GEMV_MAX_BATCH: usize = 8;
/// Threads per GEMV block (`GEMV_THREADS`: 8 warps).
pub const GEMV_THREADS: u32 = 256;
/// Weight rows per block of the bf16 GEMV kernels `gemv_bf16*_r<R>`; `gemv_f32` takes 8 (one per
/// warp).
pub const GEMV_BF16_ROWS: &[usize] = &[16, 32];
/// Threads per block of `quant_fp8_rows_bf16` (one block per row).
pub const FP8_QUANT_THREADS: u32 = 256;
/// Threads per block of `silu_mul_quant_fp8_bf16_wide` (one block per row, for products of few
/// rows).
pub const FP8_QUANT_WIDE_THREADS: u32 = 1024;
/// Threads per block of `scale_fp8_out_bf16`.
pub const FP8_SCALE_THREADS: u32 = 256;
/// Threads per block of `dequant_int4_bf16` and `permute_cols_bf16`.
pub const INT4_DEQUANT_THREADS: u32 = 256;
/// Activation rows a block of the INT4 tensor-core products `gemm_int4_mma_*` and
/// `gemm_int4_mmas_*` takes (more rows: more blocks along y).
pub const INT4_MMA_BATCH: usize = 64;
/// Steps of 64 k in the shared-memory ring of `gemm_int4_mma_*` (activations) and
/// `gemm_int4_mmas_*` (activations, codes and scales).
pub const INT4_MMA_STAGES: usize = 4;
/// Dynamic shared memory of a `gemm_int4_mmas_*` kernel of `rows` weight rows a block: per stage
/// of its ring, [`INT4_MMA_BATCH`] activation rows of 64 bf16, `rows` rows of 32 bytes of codes
/// and their 4-byte scale | zero words.
pub const fn int4_mmas_smem_bytes(rows: usize) -> usize {
    INT4_MMA_STAGES * (INT4_MMA_BATCH * 128 + rows * 36)
}
/// The wgmma's n in the Hopper INT4 product `gemm_int4_wgmma_*` (sm_90a only): activation rows
/// of one accumulator set. A block takes one or two such sets (its `batch`: more rows, more
/// blocks along y); a block of `wgs` warpgroups (128 threads each) takes 64 `wgs` weight rows, the
/// wgmma's m each.
pub const INT4_WGMMA_BATCH: usize = 128;
/// Dynamic shared memory of a `gemm_int4_wgmma_*` kernel of `stages` stages, `wgs` warpgroups and
/// `batch` activation rows a block: a stage holds `batch` activation rows of 64 bf16 and 64 `wgs`
/// rows of 64 codes (32 bytes), and the stages' group constants (a 4-byte word a row) follow them,
/// the formula `int4_wgmma.cu` uses; + 1 KiB to align the base to the 1,024-byte swizzle atom.
pub const fn int4_wgmma_smem_bytes(stages: usize, wgs: usize, batch: usize) -> usize {
    stages * (batch * 128 + 64 * wgs * 32 + 64 * wgs * 4) + 1024
}
/// Most activation rows the CUDA backend gives the INT4 tensor-core products; larger products
/// dequantize the whole matrix to bf16 for cuBLAS. At the 8B shapes on an H100 (run 51a), the
/// scaled product (`gemm_int4_mmas_*`) on the shape `mma_kernel_for` picks takes a layer's four
/// products in 0.14 ms at 64 rows and 0.23 at 128 against 0.37 and 0.38 dequantized + cuBLAS; at
/// 256 rows its q/k/v and o are slower (0.054 / 0.039 against 0.048 / 0.032 ms).
pub const INT4_MMA_MAX_ROWS: usize = 128;
/// Most activation rows the CUDA backend gives the Hopper INT4 product (`gemm_int4_wgmma_*`) where
/// it applies; larger products dequantize for cuBLAS. At 256 rows on an H100 (run 56e) it takes a
/// layer's four 8B products in 0.26 ms against 0.40 dequantized + cuBLAS (gate/up 0.132 against
/// 0.209).
pub const INT4_WGMMA_MAX_ROWS: usize = 256;
/// Bytes one thread of `l2_prefetch_u8` asks for at a time (`PREFETCH_PIECE`).
pub const PREFETCH_PIECE: usize = 16384;

/// Threads per sampling block (`SAMPLE_THREADS`).
pub const SAMPLE_THREADS: u32 = 1024;
/// Logits a sampling block takes the max of (its row's slice; rows are split into at most
/// [`SAMPLE_MAX_SLICES`] slices).
pub const SAMPLE_SLICE: usize = 4096;
/// Most slices one row of logits is split into.
pub const SAMPLE_MAX_SLICES: usize = 64;
/// 32-bit words of one slice's result (`SlicePart`, which the kernel checks against this).
pub const SAMPLE_PART_WORDS: usize = 4;
/// 32-bit words of sampling scratch a row needs: its done-counter and [`SAMPLE_MAX_SLICES`]
/// 16-byte slice results (`SlicePart`).
pub const SAMPLE_SCRATCH_WORDS: usize = 4 + SAMPLE_PART_WORDS * SAMPLE_MAX_SLICES;

/// The launch constants the kernels are compiled with, each defined once above and given to
/// NVRTC as `-DNAME=VALUE`; the sources use these names (and check the derived sizes against
/// the `_BYTES` entries), so Rust and CUDA cannot disagree.
pub const LAUNCH_CONSTANTS: &[(&str, usize)] = &[
    ("ATTN_ROWS", ATTN_ROWS),
    ("ATTN_KEY_TILE", ATTN_KEY_TILE),
    ("ATTN_MAX_HEAD_DIM", ATTN_MAX_HEAD_DIM),
    ("ATTN_THREADS", ATTN_THREADS as usize),
    ("DECODE_THREADS", DECODE_THREADS as usize),
    ("DECODE_KEY_TILE", DECODE_KEY_TILE),
    ("DECODE_RING_BYTES_2", DECODE_RING_BYTES_2),
    ("DECODE_RING_BYTES_4", DECODE_RING_BYTES_4),
    ("DECODE_KV8_SMEM_BYTES", DECODE_KV8_SMEM_BYTES),
    ("DECODE_MMA_ROWS", DECODE_MMA_ROWS),
    ("ROPE_HEADS", ROPE_HEADS),
    ("ROPE_THREADS", ROPE_THREADS as usize),
    ("ROPE_MAX_PAIRS", ROPE_MAX_PAIRS),
    ("DECODE_SHARE_MEMBERS_SHIFT", DECODE_SHARE_MEMBERS_SHIFT),
    ("DECODE_SHARE_SPLITS_SHIFT", DECODE_SHARE_SPLITS_SHIFT),
    ("PREFILL_MMA_TOKENS", PREFILL_MMA_TOKENS),
    ("PREFILL_MMA_THREADS", PREFILL_MMA_THREADS as usize),
    ("PREFILL_MMA_KEY_TILE", PREFILL_MMA_KEY_TILE),
    ("PREFILL_MMA_SMEM_BYTES", PREFILL_MMA_SMEM_BYTES),
    ("PREFILL_WGMMA_THREADS", PREFILL_WGMMA_THREADS as usize),
    ("PREFILL_WGMMA_KEY_TILE", PREFILL_WGMMA_KEY_TILE),
    ("PREFILL_WGMMA_STAGES", PREFILL_WGMMA_STAGES),
    ("PREFILL_WGMMA_SMEM_BYTES", PREFILL_WGMMA_SMEM_BYTES),
    ("GEMV_MAX_BATCH", GEMV_MAX_BATCH),
    ("GEMV_THREADS", GEMV_THREADS as usize),
    ("FP8_QUANT_THREADS", FP8_QUANT_THREADS as usize),
    ("FP8_QUANT_WIDE_THREADS", FP8_QUANT_WIDE_THREADS as usize),
    ("FP8_SCALE_THREADS", FP8_SCALE_THREADS as usize),
    ("INT4_DEQUANT_THREADS", INT4_DEQUANT_THREADS as usize),
    ("INT4_MMA_BATCH", INT4_MMA_BATCH),
    ("INT4_MMA_STAGES", INT4_MMA_STAGES),
    ("INT4_WGMMA_BATCH", INT4_WGMMA_BATCH),
    ("PREFETCH_PIECE", PREFETCH_PIECE),
    ("SAMPLE_THREADS", SAMPLE_THREADS as usize),
    ("SAMPLE_PART_WORDS", SAMPLE_PART_WORDS),
];

/// Every `-D` option of a compile: the launch constants and the parameter structs' layouts.
pub fn defines() -> Vec<String> {
    LAUNCH_CONSTANTS
        .iter()
        .copied()
        .chain(params::layout_defines())
        .map(|(name, value)| format!("-D{name}={value}"))
        .collect()
}

/// Slices the sampling kernel splits a row of `vocab` logits into.
pub fn sample_slices(vocab: usize) -> usize {
    vocab.div_ceil(SAMPLE_SLICE).clamp(1, SAMPLE_MAX_SLICES)
}

/// Shared memory (bytes) one attention block needs for head dimension `d`.
pub fn attention_smem_bytes(d: usize) -> usize {
    4 * (ATTN_ROWS * d + ATTN_KEY_TILE * (d + 1) + ATTN_KEY_TILE * d)
}

/// A compilation failure.
#[derive(Debug, Error)]
pub enum KernelError {
    /// libnvrtc could not be loaded.
    #[error(
        "NVRTC (libnvrtc.so) was not found on the library path; install CUDA or the \
         `nvidia-cuda-nvrtc` wheel and add its lib directory to LD_LIBRARY_PATH"
    )]
    NvrtcMissing,
    /// NVRTC rejected the sources; `log` is its program log.
    #[error("NVRTC failed to compile the kernels for {arch}: {status}\n{log}")]
    Compile {
        arch: String,
        status: String,
        log: String,
    },
    /// `cuda_bf16.h` was not found in any include directory.
    #[error(
        "cuda_bf16.h not found (looked in {0}); set RINGSERVE_CUDA_INCLUDE to a CUDA include directory"
    )]
    HeadersMissing(String),
    /// Another NVRTC call failed.
    #[error("NVRTC: {0}")]
    Nvrtc(String),
}

/// How to compile.
#[derive(Debug, Clone)]
pub struct CompileOptions {
    /// The GPU architecture, e.g. `sm_90`.
    pub arch: String,
    /// Directories searched for `cuda_bf16.h` and the headers it includes.
    pub include_dirs: Vec<PathBuf>,
    /// Where compiled CUBINs are kept; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
}

impl CompileOptions {
    /// Options for `arch` with the default include directories and cache.
    pub fn for_arch(arch: &str) -> Self {
        Self {
            arch: arch.to_string(),
            include_dirs: default_include_dirs(),
            cache_dir: default_cache_dir(),
        }
    }
}

/// The CUDA include directories to try: `$RINGSERVE_CUDA_INCLUDE`, `$CUDA_HOME/include`,
/// `$CUDA_PATH/include`, `/usr/local/cuda/include`.
pub fn default_include_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(p) = std::env::var_os("RINGSERVE_CUDA_INCLUDE") {
        dirs.push(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(p) = std::env::var_os(var) {
            dirs.push(Path::new(&p).join("include"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    dirs
}

/// `$RINGSERVE_KERNEL_CACHE`, else `<user cache dir>/ringserve/kernels`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RINGSERVE_KERNEL_CACHE") {
        return Some(PathBuf::from(p));
    }
    dirs::cache_dir().map(|d| d.join("ringserve").join("kernels"))
}

/// A compiled module.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The CUBIN image.
    pub cubin: Vec<u8>,
    /// Whether it came from the disk cache.
    pub from_cache: bool,
    /// NVRTC's version, `(major, minor)`.
    pub nvrtc_version: (i32, i32),
    /// NVRTC's log of a fresh compile (ptxas register and spill counts); empty from the cache.
    pub log: String,
}

/// Whether libnvrtc can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library's candidate names; no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version.
pub fn nvrtc_version() -> Result<(i32, i32), KernelError> {
    if !nvrtc_available() {
        return Err(KernelError::NvrtcMissing);
    }
    let (mut major, mut minor) = (0 as c_int, 0 as c_int);
    // SAFETY: the library is present (checked above); both pointers are to live locals.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| KernelError::Nvrtc(format!("{e:?}")))?;
    Ok((major, minor))
}

/// Hex SHA-256 over the sources, the architecture and the NVRTC version.
fn cache_key(arch: &str, version: (i32, i32)) -> String {
    let mut h = Sha256::new();
    for (name, text) in SOURCES {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(text.as_bytes());
        h.update([0]);
    }
    for d in defines() {
        h.update(d.as_bytes());
        h.update([0]);
    }
    h.update(arch.as_bytes());
    h.update(format!("nvrtc-{}.{}", version.0, version.1).as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Compiles every kernel for `opts.arch`, or loads the cached CUBIN.
pub fn compile(opts: &CompileOptions) -> Result<Compiled, KernelError> {
    let version = nvrtc_version()?;
    let key = cache_key(&opts.arch, version);
    let cache_file = opts
        .cache_dir
        .as_ref()
        .map(|d| d.join(format!("{}-{key}.cubin", opts.arch)));
    if let Some(path) = &cache_file
        && let Ok(cubin) = std::fs::read(path)
        && !cubin.is_empty()
    {
        return Ok(Compiled {
            cubin,
            from_cache: true,
            nvrtc_version: version,
            log: String::new(),
        });
    }
    let include = opts
        .include_dirs
        .iter()
        .find(|d| d.join("cuda_bf16.h").is_file())
        .ok_or_else(|| {
            let tried: Vec<String> = opts
                .include_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect();
            KernelError::HeadersMissing(tried.join(", "))
        })?;
    let (cubin, log) = compile_uncached(&opts.arch, include, &main_source())?;
    if let Some(path) = &cache_file {
        // A cache that cannot be written only costs the next start a compile: ignore failures,
        // and write through a temporary name so a concurrent reader never sees half a file.
        if let Some(dir) = path.parent()
            && std::fs::create_dir_all(dir).is_ok()
        {
            // Private to this thread: two threads of one process (ranks sharing a process) may
            // compile at once, and must not write through one temporary file.
            let tmp = path.with_extension(format!(
                "tmp{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            if std::fs::write(&tmp, &cubin).is_ok() {
                let _ = std::fs::rename(&tmp, path);
            }
        }
    }
    Ok(Compiled {
        cubin,
        from_cache: false,
        nvrtc_version: version,
        log,
    })
}

/// An NVRTC program that is destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed only here.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

fn c_string(s: &str) -> Result<CString, KernelError> {
    CString::new(s).map_err(|_| KernelError::Nvrtc(format!("string with a NUL byte: {s:?}")))
}

/// The translation unit: includes every `.cu` file.
fn main_source() -> String {
    SOURCES
        .iter()
        .filter(|(name, _)| name.ends_with(".cu"))
        .map(|(name, _)| format!("#include \"{name}\"\n"))
        .collect()
}

/// Returns the CUBIN and NVRTC's log.
fn compile_uncached(
    arch: &str,
    include: &Path,
    main: &str,
) -> Result<(Vec<u8>, String), KernelError> {
    let nvrtc_err = |e: nvrtc::NvrtcError| KernelError::Nvrtc(format!("{e:?}"));
    let main = c_string(main)?;
    let name = c_string("ringserve_all.cu")?;
    let header_texts = SOURCES
        .iter()
        .map(|(_, t)| c_string(t))
        .collect::<Result<Vec<_>, _>>()?;
    let header_names = SOURCES
        .iter()
        .map(|(n, _)| c_string(n))
        .collect::<Result<Vec<_>, _>>()?;
    let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|s| s.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
    let mut raw = std::mem::MaybeUninit::<sys::nvrtcProgram>::uninit();
    // SAFETY: every pointer is to a NUL-terminated string alive for this call; the two arrays have
    // SOURCES.len() entries each, as the count says; NVRTC copies the sources.
    unsafe {
        sys::nvrtcCreateProgram(
            raw.as_mut_ptr(),
            main.as_ptr(),
            name.as_ptr(),
            SOURCES.len() as c_int,
            text_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
    }
    .result()
    .map_err(nvrtc_err)?;
    // SAFETY: nvrtcCreateProgram succeeded, so it wrote the handle.
    let prog = Program(unsafe { raw.assume_init() });
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        format!("--include-path={}", include.display()),
        "--std=c++17".to_string(),
        "-default-device".to_string(),
        "--ptxas-options=-v".to_string(),
    ];
    options.extend(defines());
    // SAFETY: prog is a live program (destroyed only by Program's drop).
    let status = unsafe { nvrtc::compile_program(prog.0, &options) };
    if let Err(e) = status {
        // SAFETY: as above.
        let log = unsafe { nvrtc::get_program_log(prog.0) }.map_err(nvrtc_err)?;
        return Err(KernelError::Compile {
            arch: arch.to_string(),
            status: format!("{e:?}"),
            log: c_chars_to_string(&log),
        });
    }
    let mut size = 0usize;
    // SAFETY: prog compiled successfully; `size` is a live local.
    unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(nvrtc_err)?;
    let mut cubin = vec![0u8; size];
    // SAFETY: the buffer holds exactly the `size` bytes NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }
        .result()
        .map_err(nvrtc_err)?;
    if cubin.is_empty() {
        return Err(KernelError::Nvrtc(format!(
            "NVRTC produced no CUBIN for {arch} (a virtual architecture like compute_90 gives PTX only)"
        )));
    }
    // SAFETY: prog is live.
    let log = unsafe { nvrtc::get_program_log(prog.0) }.map_err(nvrtc_err)?;
    Ok((cubin, c_chars_to_string(&log)))
}

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pdl_kernels_are_kernels() {
        for k in PDL_KERNELS {
            assert!(KERNELS.contains(k), "{k}");
        }
    }

    #[test]
    fn every_kernel_is_defined_in_the_sources() {
        let all: String = SOURCES.iter().map(|(_, t)| *t).collect();
        for k in KERNELS {
            let (op, dtype) = k.rsplit_once('_').expect("named <op>_<dtype>");
            // Defined by name, or named as a macro's first argument (INT4_T16(<name>, ...)).
            let direct = all.contains(&format!(" {k}("))
                || all.contains(&format!("\n{k}("))
                || all.contains(&format!("({k}, "));
            let by_macro =
                all.contains(&format!(" {op}_##S(")) && all.contains(&format!(", {dtype})"));
            // attn_decode_<dtype>_d<D>_g<G>, instantiated by DECODE_G(T, <dtype>, <D>).
            let decode = k
                .strip_prefix("attn_decode_")
                .and_then(|rest| rest.split_once("_d"))
                .and_then(|(s, dg)| Some((s, dg.split_once("_g")?)))
                .is_some_and(|(s, (d, g))| {
                    all.contains(&format!(", {s}, {d})")) && all.contains(&format!(", D, {g})"))
                });
            assert!(direct || by_macro || decode, "{k} not found");
        }
    }

    #[test]
    fn decode_smem_follows_its_constants() {
        assert_eq!(decode_smem_bytes(2, 64), 32768);
        assert_eq!(decode_smem_bytes(2, 128), 49152);
        assert_eq!(decode_smem_bytes(4, 64), 65536);
        assert_eq!(decode_smem_bytes(4, 128), 65536);
        assert_eq!(PREFILL_MMA_SMEM_BYTES, 96 << 10);
        assert_eq!(PREFILL_WGMMA_SMEM_BYTES, 5 * 128 * 128 * 2 + 64 + 1024);
    }

    #[test]
    fn every_launch_constant_is_used_and_defined_only_in_rust() {
        let all: String = SOURCES.iter().map(|(_, t)| *t).collect();
        for (name, _) in LAUNCH_CONSTANTS {
            let uses = all.matches(name).count();
            assert!(uses > 0, "{name} is not used by any kernel");
            assert!(
                !all.contains(&format!("#define {name} ")),
                "{name} is defined in CUDA too"
            );
        }
        let defines = defines();
        assert!(defines.contains(&format!("-DATTN_ROWS={ATTN_ROWS}")));
        assert!(defines.contains(&"-DRS_SIZEOF_AttnParams=112".to_string()));
        // The layout checks cover every field the Rust structs have.
        let header = SOURCES.iter().find(|(n, _)| *n == "params.cuh").unwrap().1;
        for (name, _) in params::layout_defines() {
            let check = match name.strip_prefix("RS_OFFSETOF_") {
                Some(rest) => {
                    let (s, f) = rest.split_once('_').unwrap();
                    format!("RS_CHECK_FIELD({s}, {f});")
                }
                None => format!("RS_CHECK_SIZE({});", &name["RS_SIZEOF_".len()..]),
            };
            assert!(header.contains(&check), "params.cuh lacks {check}");
        }
    }

    #[test]
    fn cache_key_depends_on_arch_and_version() {
        assert_ne!(cache_key("sm_90", (13, 0)), cache_key("sm_80", (13, 0)));
        assert_ne!(cache_key("sm_90", (13, 0)), cache_key("sm_90", (13, 1)));
        assert_eq!(cache_key("sm_90", (13, 0)), cache_key("sm_90", (13, 0)));
    }

    /// Compiles every kernel with NVRTC for `arch` (twice: the second from the cache) and returns
    /// the compile log, or `None` where NVRTC is missing and not required. `.ci/run` sets
    /// `RINGSERVE_REQUIRE_NVRTC=1` after installing NVRTC and the CUDA headers from PyPI, so there
    /// a missing NVRTC fails the tests; elsewhere (a laptop without CUDA) they only print that
    /// they could not run.
    fn compile_twice(arch: &str) -> Option<String> {
        let required = std::env::var("RINGSERVE_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        if !nvrtc_available() {
            assert!(
                !required,
                "RINGSERVE_REQUIRE_NVRTC=1 but libnvrtc was not found"
            );
            eprintln!("NVRTC not found; set RINGSERVE_REQUIRE_NVRTC=1 to make this a failure");
            return None;
        }
        let dir =
            std::env::temp_dir().join(format!("ringserve-kcache-{arch}-{}", std::process::id()));
        let mut opts = CompileOptions::for_arch(arch);
        opts.cache_dir = Some(dir.clone());
        let first = compile(&opts).unwrap_or_else(|e| panic!("{e}"));
        assert!(!first.from_cache);
        eprintln!("{}", first.log);
        assert!(first.cubin.starts_with(b"\x7fELF"), "CUBIN is an ELF image");
        let second = compile(&opts).unwrap_or_else(|e| panic!("{e}"));
        assert!(second.from_cache);
        assert_eq!(first.cubin, second.cubin);
        let _ = std::fs::remove_dir_all(dir);
        Some(first.log)
    }

    #[test]
    fn nvrtc_compiles_every_kernel() {
        compile_twice("sm_90");
    }

    /// An A100's module (sm_80): the instructions that exist only from sm_89 on (E4M3
    /// conversions, FP8 mma) are behind architecture guards, so every bf16 kernel still loads.
    #[test]
    fn nvrtc_compiles_every_kernel_for_sm80() {
        compile_twice("sm_80");
    }

    /// An L40S's or RTX 4090's module (sm_89): FP8 tensor cores, no wgmma.
    #[test]
    fn nvrtc_compiles_every_kernel_for_sm89() {
        compile_twice("sm_89");
    }

    /// sm_90a compiles the wgmma prefill kernel's body (ptxas checks its PTX and registers);
    /// it must not spill, nor have its wgmma chains serialised by ptxas.
    #[test]
    fn nvrtc_compiles_every_kernel_for_sm90a() {
        let Some(log) = compile_twice("sm_90a") else {
            return;
        };
        let wgmma = log
            .split("Compiling entry function")
            .find(|f| f.contains("'attn_prefill_wgmma_bf16_d128'"))
            .expect("ptxas reports on the wgmma prefill kernel");
        assert!(
            wgmma.contains(" 0 bytes spill stores") && wgmma.contains(" 0 bytes spill loads"),
            "{wgmma}"
        );
        assert!(!log.contains("serialized"), "{log}");
    }

    #[test]
    fn compile_errors_carry_nvrtc_log() {
        let required = std::env::var("RINGSERVE_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        if !nvrtc_available() {
            assert!(
                !required,
                "RINGSERVE_REQUIRE_NVRTC=1 but libnvrtc was not found"
            );
            return;
        }
        let dir = std::env::temp_dir();
        let broken = "extern \"C\" __global__ void f() { undeclared_name(); }\n";
        match compile_uncached("sm_90", &dir, broken) {
            Err(KernelError::Compile { log, .. }) => {
                assert!(log.contains("undeclared_name"), "{log}")
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
    }

    /// `fp8_div` (elementwise.cu) in Rust, operation for operation: `x * rcp` corrected by a fused
    /// multiply-add on the remainder, the zero's sign from the product, an overflowing product kept.
    fn fp8_div(x: f32, scale: f32, rcp: f32) -> f32 {
        let q = x * rcp;
        let r = (-q).mul_add(scale, x).mul_add(rcp, q).copysign(q);
        if q.is_infinite() { q } else { r }
    }

    /// The FP8 quantizers' division by the row's reciprocal gives IEEE `x / scale` for every finite
    /// bf16 `x` wherever the quotient can change an E4M3 code (2^-12 <= |q| < 10^6; the smallest
    /// E4M3 magnitude is 2^-9, and anything above 448 saturates), and the same sign: every 16th
    /// dynamic scale (amax / 448 of a bf16 amax, floored as the quantizer floors it) and scales
    /// from 2^-40 to 2^20.
    #[test]
    fn fp8_division_by_the_reciprocal_gives_the_quotient_where_codes_change() {
        let mut scales: Vec<f32> = (0u32..0x7f80)
            .step_by(16)
            .map(|b| (f32::from_bits(b << 16) / 448.0).max(1.0 / (448.0 * 512.0)))
            .collect();
        scales.extend((-40..=20).flat_map(|e| [1.0f32, 1.37, 1.9999].map(|m| m * 2f32.powi(e))));
        let xs: Vec<f32> = (0u32..0x10000)
            .map(|b| f32::from_bits(b << 16))
            .filter(|x| x.is_finite())
            .collect();
        for s in scales {
            let rcp = 1.0 / s;
            for &x in &xs {
                let (want, got) = (x / s, fp8_div(x, s, rcp));
                assert_eq!(
                    want.is_sign_negative(),
                    got.is_sign_negative(),
                    "{x:e} / {s:e}"
                );
                if (2f32.powi(-12)..1e6).contains(&want.abs()) {
                    assert_eq!(want.to_bits(), got.to_bits(), "{x:e} / {s:e}");
                }
            }
        }
    }
}
