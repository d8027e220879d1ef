//! The parameter structs the kernels take by value, each defined once here; `params.cuh` defines
//! each once for CUDA. Their sizes and field offsets reach NVRTC as `-D` options
//! ([`layout_defines`]) and `params.cuh` `static_assert`s every one, so a struct that drifts on
//! either side fails to compile — in CI too, which compiles every kernel. Device pointers are
//! `u64` (`CUdeviceptr`); the CUDA side has typed pointers of the same size.

use bytemuck::{Pod, Zeroable};
use cudarc::driver::DeviceRepr;

/// `AttnParams`: every attention kernel's (general, combine, decode, tensor-core decode and both
/// prefill kernels).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct AttnParams {
    /// `T[n, hq, d]` queries.
    pub q: u64,
    /// `T[blocks, hkv, block_size, d]`.
    pub k_cache: u64,
    pub v_cache: u64,
    /// `T[n, hq, d]` (one split).
    pub out: u64,
    /// `f32[items, hq, splits, d]` unnormalised partial outputs (several splits).
    pub part_o: u64,
    /// `f32[items, hq, splits, 2]` running max (log2 domain) and sum.
    pub part_ml: u64,
    /// `int4` per sequence: query start, query length, context length, unused.
    pub seqs: u64,
    /// `int2` per work item: sequence index, first query index in the sequence.
    pub items: u64,
    /// `u32[seqs, table_stride]`.
    pub block_tables: u64,
    pub num_items: i32,
    pub table_stride: i32,
    pub hq: i32,
    pub hkv: i32,
    pub d: i32,
    pub block_size: i32,
    pub split_size: i32,
    pub num_splits: i32,
    /// Softmax scale × log2(e) (× the K scale with an FP8 cache).
    pub scale_log2: f32,
    /// The V scale of an FP8 cache (the `*_kv8` kernels multiply their outputs by it); 1 otherwise.
    pub v_scale: f32,
}

/// `RopeParams`: RoPE with the paged KV write (`rope_kv_write_*`, and the epilogue of the fused
/// q/k/v GEMV).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct RopeParams {
    /// `T[n, (hq + 2 hkv) d]`, the fused projection.
    pub qkv: u64,
    /// `T[(hq + 2 hkv) d]` or 0.
    pub bias: u64,
    /// `u32[n]`.
    pub positions: u64,
    /// `f32[d / 2]`, scaling applied.
    pub inv_freq: u64,
    /// `i64[n]` cache slots; negative skips the write.
    pub slots: u64,
    /// `T[n, hq, d]`.
    pub q_out: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub hq: i32,
    pub hkv: i32,
    pub d: i32,
    pub block_size: i32,
    /// With `kv_fp8`: the caches hold E4M3 codes of `x / k_scale` and `x / v_scale`.
    pub k_scale: f32,
    pub v_scale: f32,
    /// 1: an FP8 cache (u8 codes); 0: the compute type.
    pub kv_fp8: i32,
    /// Padding made explicit.
    pub pad: u32,
    /// `f32[n]` or 0: with `w_scales`, `qkv` is a raw FP8 product (bf16), each value scaled
    /// first as `scale_fp8_out_bf16` scales it (`rope_kv_write` only).
    pub x_scales: u64,
    /// `f32[(hq + 2 hkv) d]` or 0.
    pub w_scales: u64,
}

/// `GemvParams`: the small-batch matrix-vector kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct GemvParams {
    /// `T[b, k]`.
    pub x: u64,
    /// `T[n, k]` (HF `Linear` layout).
    pub w: u64,
    /// `To[b, n]`.
    pub y: u64,
    pub b: i32,
    pub n: i32,
    pub k: i32,
    /// Tail padding made explicit.
    pub pad: u32,
}

/// `Fp8QuantParams`: activations to E4M3 codes with one scale per row (`quant_fp8_rows_bf16`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct Fp8QuantParams {
    /// `bf16[m, k]`.
    pub x: u64,
    /// `u8[m, k]` E4M3 codes out.
    pub q: u64,
    /// `f32[m]` scales out (`x ≈ code · scale`).
    pub scales: u64,
    pub m: i32,
    pub k: i32,
    /// `> 0`: this one scale for every row (static activations); `0`: each row's own
    /// `max(amax / 448, 1 / (448 · 512))`.
    pub static_scale: f32,
    /// Padding made explicit.
    pub pad: u32,
    /// `silu_mul_quant_fp8_bf16` only, both 0 or both set: `x` is a raw FP8 product whose output
    /// `(r, c)` is first scaled by `in_x_scales[r] · in_w_scales[c]`, as `scale_fp8_out_bf16`
    /// would (`f32[m]`; may be `scales` itself: a row's is read before it is written).
    pub in_x_scales: u64,
    /// `f32[2k]`: the gate columns' scales, then the up columns'.
    pub in_w_scales: u64,
}

/// `GemvFp8Params`: the small-batch product of E4M3 activations and E4M3 weights, each with its
/// scales (`gemv_fp8_r16`, `gemv_fp8_r32`), and the scaling of a raw FP8 product's output
/// (`scale_fp8_out_bf16`, which leaves `x` and `w` unused).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct GemvFp8Params {
    /// `u8[b, k]` activation codes.
    pub x: u64,
    /// `f32[b]` activation scales.
    pub x_scales: u64,
    /// `u8[n, k]` weight codes (HF `Linear` layout).
    pub w: u64,
    /// `f32[n]` weight scales (one per output channel).
    pub w_scales: u64,
    /// `bf16[b, n]`.
    pub y: u64,
    pub b: i32,
    pub n: i32,
    pub k: i32,
    /// Tail padding made explicit.
    pub pad: u32,
}

/// `GemvInt4Params`: the small-batch product of bf16 activations with packed INT4 weights
/// (`gemv_int4_r16`, `gemv_int4_r32`, `gemv_int4_t16*`), and a matrix's dequantization to bf16
/// (`dequant_int4_bf16`, which leaves `x` and `b` unused and writes `[n, k]` to `y`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct GemvInt4Params {
    /// `bf16[b, k]`.
    pub x: u64,
    /// `u32[n, k / 8]` packed codes.
    pub w: u64,
    /// `u32[n, groups]`: bf16 `s_hi` low, `s_lo` high.
    pub sz: u64,
    /// `u8[n, groups]` zero points.
    pub z: u64,
    /// `f32[n, groups]` offsets for the `*_min` kernels (`w = q · s + m`); 0 for the others.
    pub m: u64,
    /// `u32[ceil(n / 16), groups, 8, 2]` for the tile kernels (`gemv_int4_t16*`): entry (tile,
    /// group, g, h) is row 16 tile + g + 8 h's scale as f32 bits with its zero point in the low
    /// 8 bits (zeros past n); 0 for the others.
    pub tsz: u64,
    /// `bf16[b, n]`, or `bf16[n, k]` for the dequantization.
    pub y: u64,
    pub b: i32,
    pub n: i32,
    pub k: i32,
    pub groups: i32,
    pub group_size: i32,
    /// Tail padding made explicit.
    pub pad: u32,
}

/// `GemvInt4RopeParams`: the INT4 q/k/v tile GEMV with RoPE and the KV write in its epilogue.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct GemvInt4RopeParams {
    /// Its `y` is unused.
    pub g: GemvInt4Params,
    /// Its `qkv` field is unused.
    pub rope: RopeParams,
}

/// `GemvInt4SiluParams`: the INT4 gate/up tile GEMV with SiLU·mul in its epilogue.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct GemvInt4SiluParams {
    /// `n` = 2 inter (gate rows, then up rows); its `y` is unused.
    pub g: GemvInt4Params,
    /// `bf16[b, inter]`: silu(gate) · up, rounded to bf16.
    pub h: u64,
}

/// `GemmInt4Params`: the INT4 product for batches past the GEMVs' (`gemm_int4_mma_*`) and the sum
/// of its split-k partials (`gemm_int4_reduce`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct GemmInt4Params {
    /// `x`, `w`, `sz`, `z`, `y`, `b`, `n`, `k`, `groups`, `group_size` (`m`, `tsz` unused).
    pub g: GemvInt4Params,
    /// `f32[splits, b, n]` partial sums when `splits > 1`.
    pub part: u64,
    /// Ranges the k-steps of 64 are split into (`gridDim.z`).
    pub splits: i32,
    /// k-steps of 64 a split takes (the last may take fewer).
    pub steps: i32,
}

/// `PermuteColsParams`: `y[r, j] = x[r, perm[j]]` (`permute_cols_bf16`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct PermuteColsParams {
    /// `bf16[m, k]`.
    pub x: u64,
    /// `u32[k]`.
    pub perm: u64,
    /// `bf16[m, k]`.
    pub y: u64,
    pub m: i32,
    pub k: i32,
}

/// `GemvRopeParams`: the q/k/v GEMV with RoPE and the KV write in its epilogue.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct GemvRopeParams {
    /// `bf16[b, k]`.
    pub x: u64,
    /// `bf16[(hq + 2 hkv) d, k]`.
    pub w: u64,
    pub b: i32,
    pub k: i32,
    /// Its `qkv` field is unused.
    pub rope: RopeParams,
}

/// `GemvFp8RopeParams`: the FP8 tile GEMV of q/k/v with RoPE and the KV write in its epilogue.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct GemvFp8RopeParams {
    /// Its `y` is unused.
    pub g: GemvFp8Params,
    /// Its `qkv` field is unused.
    pub rope: RopeParams,
}

/// `GemvFp8SiluParams`: the FP8 gate/up tile GEMV with SiLU·mul in its epilogue.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct GemvFp8SiluParams {
    /// `n` = 2 inter (gate rows, then up rows); its `y` is unused.
    pub g: GemvFp8Params,
    /// `bf16[b, inter]`: silu(gate) · up, rounded to bf16.
    pub h: u64,
    /// `u32[b]`: each row's largest |h| as f32 bits, raised by `atomicMax` (zero before the launch).
    pub amax: u64,
}

/// `GemvFp8XqParams`: the FP8 down tile GEMV quantizing its bf16 input as it loads it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct GemvFp8XqParams {
    /// Its `x` and `x_scales` are unused.
    pub g: GemvFp8Params,
    /// `bf16[b, k]`, 16-byte aligned.
    pub h: u64,
    /// `u32[b]`, as [`GemvFp8SiluParams::amax`] left it (unread with a static scale).
    pub amax: u64,
    /// > 0: every row's scale; 0: each row's own, from `amax`.
    pub static_scale: f32,
    pub pad: u32,
}

/// `CombineFp8Params`: decode attention's split combine with each item's output row quantized
/// to E4M3 (the codes and scale `quant_fp8_rows_bf16` gives for `attn_combine_bf16`'s row).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct CombineFp8Params {
    /// Its `out` is unused.
    pub attn: AttnParams,
    /// `u8[n, hq d]` codes, 8-byte aligned.
    pub q: u64,
    /// `f32[n]`.
    pub scales: u64,
    /// As [`Fp8QuantParams::static_scale`].
    pub static_scale: f32,
    pub pad: u32,
}

/// `SampleRow`: one row's sampling settings, uploaded as an array (`sample_f32`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct SampleRow {
    /// 0: greedy.
    pub temperature: f32,
    /// 0: off.
    pub top_k: u32,
    /// 1: off.
    pub top_p: f32,
    /// 0: off.
    pub min_p: f32,
    pub seed: u64,
    /// The request's output index being sampled (the random stream's position).
    pub step: u64,
}

// Why the impls below are sound: each struct is #[repr(C)] and Pod — integers and floats
// only, no padding, any bit pattern valid — and its size and every field offset equal the CUDA
// struct's in params.cuh, which static_asserts them against `layout_defines` when the kernels
// compile; so passing one by value as a kernel argument gives the kernel exactly its struct.
//
// SAFETY: see above.
unsafe impl DeviceRepr for AttnParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for RopeParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for GemvParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for GemvRopeParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for SampleRow {}
// SAFETY: as above.
unsafe impl DeviceRepr for Fp8QuantParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for GemvFp8Params {}
// SAFETY: as above.
unsafe impl DeviceRepr for GemvFp8RopeParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for GemvFp8SiluParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for GemvFp8XqParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for CombineFp8Params {}
// SAFETY: as above.
unsafe impl DeviceRepr for GemvInt4Params {}
// SAFETY: as above.
unsafe impl DeviceRepr for GemvInt4RopeParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for GemvInt4SiluParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for PermuteColsParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for GemmInt4Params {}

/// Pushes `RS_SIZEOF_<S>` and `RS_OFFSETOF_<S>_<field>` for every field of `S`; the pattern
/// names every field without `..`, so a field added to the struct and not listed here does not
/// compile.
macro_rules! layout {
    ($out:ident, $s:ident { $($f:ident),* $(,)? }) => {{
        let $s { $($f: _),* } = $s::default();
        $out.push((concat!("RS_SIZEOF_", stringify!($s)), size_of::<$s>()));
        $($out.push((
            concat!("RS_OFFSETOF_", stringify!($s), "_", stringify!($f)),
            std::mem::offset_of!($s, $f),
        ));)*
    }};
}

/// The `-D` definitions `params.cuh` checks: every struct's size and every field's offset.
pub fn layout_defines() -> Vec<(&'static str, usize)> {
    let mut out = Vec::new();
    layout!(
        out,
        AttnParams {
            q,
            k_cache,
            v_cache,
            out,
            part_o,
            part_ml,
            seqs,
            items,
            block_tables,
            num_items,
            table_stride,
            hq,
            hkv,
            d,
            block_size,
            split_size,
            num_splits,
            scale_log2,
            v_scale,
        }
    );
    layout!(
        out,
        RopeParams {
            qkv,
            bias,
            positions,
            inv_freq,
            slots,
            q_out,
            k_cache,
            v_cache,
            hq,
            hkv,
            d,
            block_size,
            k_scale,
            v_scale,
            kv_fp8,
            pad,
            x_scales,
            w_scales
        }
    );
    layout!(
        out,
        GemvParams {
            x,
            w,
            y,
            b,
            n,
            k,
            pad
        }
    );
    layout!(out, GemvRopeParams { x, w, b, k, rope });
    layout!(out, GemvFp8RopeParams { g, rope });
    layout!(out, GemvFp8SiluParams { g, h, amax });
    layout!(
        out,
        GemvFp8XqParams {
            g,
            h,
            amax,
            static_scale,
            pad
        }
    );
    layout!(
        out,
        CombineFp8Params {
            attn,
            q,
            scales,
            static_scale,
            pad
        }
    );
    layout!(
        out,
        Fp8QuantParams {
            x,
            q,
            scales,
            m,
            k,
            static_scale,
            pad,
            in_x_scales,
            in_w_scales
        }
    );
    layout!(
        out,
        GemvFp8Params {
            x,
            x_scales,
            w,
            w_scales,
            y,
            b,
            n,
            k,
            pad
        }
    );
    layout!(
        out,
        GemvInt4Params {
            x,
            sz,
            w,
            z,
            m,
            tsz,
            y,
            b,
            n,
            k,
            groups,
            group_size,
            pad
        }
    );
    layout!(out, GemvInt4RopeParams { g, rope });
    layout!(out, GemvInt4SiluParams { g, h });
    layout!(out, PermuteColsParams { x, perm, y, m, k });
    layout!(
        out,
        GemmInt4Params {
            g,
            part,
            splits,
            steps
        }
    );
    layout!(
        out,
        SampleRow {
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
            step
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_has_its_offset() {
        let defines = layout_defines();
        assert_eq!(
            defines.len(),
            // + 2: RopeParams' raw-product scales (run 46); + 4 + 6: the fused SiLU·mul pair;
            // + 3 + 3: the INT4 tile GEMV's RoPE and SiLU·mul epilogues
            5 + 19 + 12 + 7 + 5 + 6 + 10 + 10 + 14 + 6 + 4 + 5 + 3 + 6 + 2 + 4 + 6 + 3 + 3
        );
        let get = |n: &str| defines.iter().find(|(k, _)| *k == n).unwrap().1;
        assert_eq!(get("RS_SIZEOF_AttnParams"), 112);
        assert_eq!(get("RS_OFFSETOF_AttnParams_scale_log2"), 104);
        assert_eq!(get("RS_SIZEOF_RopeParams"), 112);
        assert_eq!(get("RS_OFFSETOF_RopeParams_w_scales"), 104);
        assert_eq!(get("RS_OFFSETOF_RopeParams_kv_fp8"), 88);
        assert_eq!(get("RS_OFFSETOF_AttnParams_v_scale"), 108);
        assert_eq!(get("RS_SIZEOF_GemvParams"), 40);
        assert_eq!(get("RS_SIZEOF_GemvRopeParams"), 136);
        assert_eq!(get("RS_OFFSETOF_GemvRopeParams_rope"), 24);
        assert_eq!(get("RS_SIZEOF_SampleRow"), 32);
        assert_eq!(get("RS_SIZEOF_Fp8QuantParams"), 56);
        assert_eq!(get("RS_OFFSETOF_Fp8QuantParams_in_w_scales"), 48);
        assert_eq!(get("RS_OFFSETOF_Fp8QuantParams_static_scale"), 32);
        assert_eq!(get("RS_SIZEOF_GemvFp8Params"), 56);
        assert_eq!(get("RS_OFFSETOF_GemvFp8Params_b"), 40);
        assert_eq!(get("RS_SIZEOF_GemvFp8RopeParams"), 168);
        assert_eq!(get("RS_OFFSETOF_GemvFp8RopeParams_rope"), 56);
        assert_eq!(get("RS_SIZEOF_GemvFp8SiluParams"), 72);
        assert_eq!(get("RS_OFFSETOF_GemvFp8SiluParams_amax"), 64);
        assert_eq!(get("RS_SIZEOF_GemvFp8XqParams"), 80);
        assert_eq!(get("RS_OFFSETOF_GemvFp8XqParams_static_scale"), 72);
        assert_eq!(get("RS_SIZEOF_CombineFp8Params"), 136);
        assert_eq!(get("RS_OFFSETOF_CombineFp8Params_static_scale"), 128);
        assert_eq!(get("RS_SIZEOF_GemvInt4Params"), 80);
        assert_eq!(get("RS_OFFSETOF_GemvInt4Params_m"), 32);
        assert_eq!(get("RS_OFFSETOF_GemvInt4Params_group_size"), 72);
        assert_eq!(get("RS_SIZEOF_GemvInt4RopeParams"), 192);
        assert_eq!(get("RS_OFFSETOF_GemvInt4RopeParams_rope"), 80);
        assert_eq!(get("RS_SIZEOF_GemvInt4SiluParams"), 88);
        assert_eq!(get("RS_OFFSETOF_GemvInt4SiluParams_h"), 80);
        assert_eq!(get("RS_SIZEOF_PermuteColsParams"), 32);
        assert_eq!(get("RS_SIZEOF_GemmInt4Params"), 96);
        assert_eq!(get("RS_OFFSETOF_GemmInt4Params_steps"), 92);
    }
}
