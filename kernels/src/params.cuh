// The parameter structs the kernels take by value, each defined once for CUDA; kernels/src/params.rs
// defines each once for Rust. NVRTC gets the Rust structs' sizes and field offsets as -D options
// (RS_SIZEOF_<S>, RS_OFFSETOF_<S>_<field>), and the static_asserts below check every one: a struct
// that differs on either side does not compile. The launch constants (ATTN_ROWS, DECODE_THREADS, ...)
// come the same way from the one table in kernels/src/lib.rs (LAUNCH_CONSTANTS).
#pragma once

#if !defined(RS_SIZEOF_AttnParams) || !defined(ATTN_ROWS)
#error "compile through kernels::compile: struct layouts and launch constants come from kernels/src/lib.rs as -D options"
#endif

// NVRTC has no <cstddef> and no __builtin_offsetof; __INTADDR__ is its front end's own constant
// address arithmetic (what its offsetof expands to), usable in a static_assert.
#define RS_OFFSET(S, f) __INTADDR__(&(((S*)0)->f))
#define RS_CHECK_SIZE(S) static_assert(sizeof(S) == RS_SIZEOF_##S, #S ": size differs from kernels/src/params.rs")
#define RS_CHECK_FIELD(S, f) \
    static_assert(RS_OFFSET(S, f) == RS_OFFSETOF_##S##_##f, #S "." #f ": offset differs from kernels/src/params.rs")

struct AttnParams {
    const void* q;           // T[n, hq, d]
    const void* k_cache;     // T[blocks, hkv, block_size, d]
    const void* v_cache;
    void* out;               // T[n, hq, d] (num_splits == 1)
    float* part_o;           // f32[items, hq, num_splits, d], unnormalised (num_splits > 1)
    float* part_ml;          // f32[items, hq, num_splits, 2]: running max (log2 domain) and sum
    const int* seqs;         // int4 per sequence: query_start, query_len, context_len, unused
    const int* items;        // int2 per work item: sequence index, first query index in the sequence
    const u32* block_tables; // [num_seqs, table_stride]
    int num_items, table_stride, hq, hkv, d, block_size, split_size, num_splits;
    float scale_log2;        // softmax scale * log2(e) (* the K scale with an FP8 cache)
    float v_scale;           // the V scale of an FP8 cache (the *_kv8 kernels scale outputs by it)
};
RS_CHECK_SIZE(AttnParams);
RS_CHECK_FIELD(AttnParams, q);
RS_CHECK_FIELD(AttnParams, k_cache);
RS_CHECK_FIELD(AttnParams, v_cache);
RS_CHECK_FIELD(AttnParams, out);
RS_CHECK_FIELD(AttnParams, part_o);
RS_CHECK_FIELD(AttnParams, part_ml);
RS_CHECK_FIELD(AttnParams, seqs);
RS_CHECK_FIELD(AttnParams, items);
RS_CHECK_FIELD(AttnParams, block_tables);
RS_CHECK_FIELD(AttnParams, num_items);
RS_CHECK_FIELD(AttnParams, table_stride);
RS_CHECK_FIELD(AttnParams, hq);
RS_CHECK_FIELD(AttnParams, hkv);
RS_CHECK_FIELD(AttnParams, d);
RS_CHECK_FIELD(AttnParams, block_size);
RS_CHECK_FIELD(AttnParams, split_size);
RS_CHECK_FIELD(AttnParams, num_splits);
RS_CHECK_FIELD(AttnParams, scale_log2);
RS_CHECK_FIELD(AttnParams, v_scale);

struct RopeParams {
    const void* qkv;        // T[n, (hq + 2*hkv) * d], the fused projection
    const void* bias;       // T[(hq + 2*hkv) * d] or null (Qwen2)
    const u32* positions;   // [n]
    const float* inv_freq;  // [d / 2], scaling already applied
    const long long* slots; // [n], block * block_size + offset in the cache; < 0 skips the write
    void* q_out;            // T[n, hq, d]
    void* k_cache;          // T[blocks, hkv, block_size, d]
    void* v_cache;          // same layout
    int hq, hkv, d, block_size;
    float k_scale, v_scale; // kv_fp8: the caches hold E4M3 codes of x / k_scale, x / v_scale
    int kv_fp8;             // 1: u8 E4M3 caches; 0: T caches
    u32 pad;
    // Non-null: qkv is an FP8 product cuBLASLt left unscaled (bf16 only); each value is first
    // scaled as scale_fp8_out_bf16 scales it, bf16(x * x_scales[token] * w_scales[column]).
    // rope_kv_write only: the fused GEMVs' epilogues never see a raw product.
    const float* x_scales;  // [n]
    const float* w_scales;  // [(hq + 2*hkv) * d]
};
RS_CHECK_SIZE(RopeParams);
RS_CHECK_FIELD(RopeParams, qkv);
RS_CHECK_FIELD(RopeParams, bias);
RS_CHECK_FIELD(RopeParams, positions);
RS_CHECK_FIELD(RopeParams, inv_freq);
RS_CHECK_FIELD(RopeParams, slots);
RS_CHECK_FIELD(RopeParams, q_out);
RS_CHECK_FIELD(RopeParams, k_cache);
RS_CHECK_FIELD(RopeParams, v_cache);
RS_CHECK_FIELD(RopeParams, hq);
RS_CHECK_FIELD(RopeParams, hkv);
RS_CHECK_FIELD(RopeParams, d);
RS_CHECK_FIELD(RopeParams, block_size);
RS_CHECK_FIELD(RopeParams, k_scale);
RS_CHECK_FIELD(RopeParams, v_scale);
RS_CHECK_FIELD(RopeParams, kv_fp8);
RS_CHECK_FIELD(RopeParams, pad);
RS_CHECK_FIELD(RopeParams, x_scales);
RS_CHECK_FIELD(RopeParams, w_scales);

struct GemvParams {
    const void* x; // T[b, k]
    const void* w; // T[n, k], row-major (HF Linear layout)
    void* y;       // To[b, n]
    int b, n, k;   // k is a multiple of 16 / sizeof(T) and < 2^30; x and w are 16-byte aligned
    u32 pad;
};
RS_CHECK_SIZE(GemvParams);
RS_CHECK_FIELD(GemvParams, x);
RS_CHECK_FIELD(GemvParams, w);
RS_CHECK_FIELD(GemvParams, y);
RS_CHECK_FIELD(GemvParams, b);
RS_CHECK_FIELD(GemvParams, n);
RS_CHECK_FIELD(GemvParams, k);
RS_CHECK_FIELD(GemvParams, pad);

struct Fp8QuantParams {
    const bf16* x;      // [m, k]
    unsigned char* q;   // [m, k] E4M3 codes
    float* scales;      // [m]
    int m, k;
    float static_scale; // > 0: every row's scale; 0: each row's own max(amax / 448, 1 / (448 * 512))
    u32 pad;
    // silu_mul_quant_fp8_bf16 only, both null or both set: x is a raw FP8 product whose output
    // (r, c) is to be scaled by in_x_scales[r] * in_w_scales[c] first (as scale_fp8_out_bf16 would)
    const float* in_x_scales; // [m]; may be `scales` itself (each row's is read before it is written)
    const float* in_w_scales; // [2k]: gate columns, then up columns
};
RS_CHECK_SIZE(Fp8QuantParams);
RS_CHECK_FIELD(Fp8QuantParams, x);
RS_CHECK_FIELD(Fp8QuantParams, q);
RS_CHECK_FIELD(Fp8QuantParams, scales);
RS_CHECK_FIELD(Fp8QuantParams, m);
RS_CHECK_FIELD(Fp8QuantParams, k);
RS_CHECK_FIELD(Fp8QuantParams, static_scale);
RS_CHECK_FIELD(Fp8QuantParams, in_x_scales);
RS_CHECK_FIELD(Fp8QuantParams, in_w_scales);
RS_CHECK_FIELD(Fp8QuantParams, pad);

struct GemvFp8Params {
    const unsigned char* x; // [b, k] E4M3 activation codes
    const float* x_scales;  // [b]
    const unsigned char* w; // [n, k] E4M3 weight codes, row-major (HF Linear layout)
    const float* w_scales;  // [n]
    bf16* y;                // [b, n]
    int b, n, k;            // k is a multiple of 16 and < 2^30; x and w are 16-byte aligned
    u32 pad;
};
RS_CHECK_SIZE(GemvFp8Params);
RS_CHECK_FIELD(GemvFp8Params, x);
RS_CHECK_FIELD(GemvFp8Params, x_scales);
RS_CHECK_FIELD(GemvFp8Params, w);
RS_CHECK_FIELD(GemvFp8Params, w_scales);
RS_CHECK_FIELD(GemvFp8Params, y);
RS_CHECK_FIELD(GemvFp8Params, b);
RS_CHECK_FIELD(GemvFp8Params, n);
RS_CHECK_FIELD(GemvFp8Params, k);
RS_CHECK_FIELD(GemvFp8Params, pad);

struct GemvInt4Params {
    const bf16* x;          // [b, k] (gemv_int4_*), unused by dequant_int4_bf16
    const u32* w;           // [n, k / 8] packed codes (int4.cu's layout)
    const u32* sz;          // [n, groups] bf16 s_hi | s_lo << 16
    const unsigned char* z; // [n, groups] zero points
    const float* m;         // [n, groups] offsets (the *_min kernels: w = q * s + m), else null
    const u32* tsz;         // [ceil(n / 16), groups, 8, 2] the tile kernels' scales | zeros, else null
    bf16* y;                // [b, n] (gemv_int4_*), or [n, k] (dequant_int4_bf16)
    int b, n, k;            // k a multiple of 32 and < 2^30; x, w 16-byte aligned
    int groups, group_size; // group_size a multiple of 32; groups = ceil(k / group_size)
    u32 pad;
};
RS_CHECK_SIZE(GemvInt4Params);
RS_CHECK_FIELD(GemvInt4Params, x);
RS_CHECK_FIELD(GemvInt4Params, w);
RS_CHECK_FIELD(GemvInt4Params, sz);
RS_CHECK_FIELD(GemvInt4Params, z);
RS_CHECK_FIELD(GemvInt4Params, m);
RS_CHECK_FIELD(GemvInt4Params, tsz);
RS_CHECK_FIELD(GemvInt4Params, y);
RS_CHECK_FIELD(GemvInt4Params, b);
RS_CHECK_FIELD(GemvInt4Params, n);
RS_CHECK_FIELD(GemvInt4Params, k);
RS_CHECK_FIELD(GemvInt4Params, groups);
RS_CHECK_FIELD(GemvInt4Params, group_size);
RS_CHECK_FIELD(GemvInt4Params, pad);

// The INT4 q/k/v tile GEMV with RoPE and the KV write in its epilogue (gemv_int4_rope_kv_t16_*).
struct GemvInt4RopeParams {
    GemvInt4Params g; // its y is unused
    RopeParams rope;  // its qkv field is unused
};
RS_CHECK_SIZE(GemvInt4RopeParams);
RS_CHECK_FIELD(GemvInt4RopeParams, g);
RS_CHECK_FIELD(GemvInt4RopeParams, rope);

// The INT4 gate/up tile GEMV with SiLU·mul in its epilogue (gemv_int4_silu_t16_*): g.n = 2 inter,
// gate rows then up rows; g.y is unused.
struct GemvInt4SiluParams {
    GemvInt4Params g;
    bf16* h; // [b, inter] silu(gate) * up, rounded to bf16
};
RS_CHECK_SIZE(GemvInt4SiluParams);
RS_CHECK_FIELD(GemvInt4SiluParams, g);
RS_CHECK_FIELD(GemvInt4SiluParams, h);

// The INT4 product for batches past the GEMVs' (gemm_int4_mma_*) and the sum of its split-k
// partials (gemm_int4_reduce).
struct GemmInt4Params {
    GemvInt4Params g; // x, w, sz, z, y, b, n, k, groups, group_size (m and tsz unused)
    float* part;      // [splits, b, n] f32 partial sums when splits > 1, else unused
    int splits;       // gridDim.z: the k-steps of 64 split in ranges of `steps`
    int steps;        // k-steps of 64 a split takes (the last may take fewer)
};
RS_CHECK_SIZE(GemmInt4Params);
RS_CHECK_FIELD(GemmInt4Params, g);
RS_CHECK_FIELD(GemmInt4Params, part);
RS_CHECK_FIELD(GemmInt4Params, splits);
RS_CHECK_FIELD(GemmInt4Params, steps);

struct PermuteColsParams {
    const bf16* x;  // [m, k]
    const u32* perm; // [k], each < k
    bf16* y;        // [m, k]
    int m, k;
};
RS_CHECK_SIZE(PermuteColsParams);
RS_CHECK_FIELD(PermuteColsParams, x);
RS_CHECK_FIELD(PermuteColsParams, perm);
RS_CHECK_FIELD(PermuteColsParams, y);
RS_CHECK_FIELD(PermuteColsParams, m);
RS_CHECK_FIELD(PermuteColsParams, k);

struct GemvRopeParams {
    const void* x;   // bf16[b, k], the normed hidden states
    const void* w;   // bf16[(hq + 2 hkv) d, k], the fused q/k/v weights
    int b, k;
    RopeParams rope; // its qkv field is unused
};
RS_CHECK_SIZE(GemvRopeParams);
RS_CHECK_FIELD(GemvRopeParams, x);
RS_CHECK_FIELD(GemvRopeParams, w);
RS_CHECK_FIELD(GemvRopeParams, b);
RS_CHECK_FIELD(GemvRopeParams, k);
RS_CHECK_FIELD(GemvRopeParams, rope);

// The FP8 tile GEMV of q/k/v with RoPE and the KV write in its epilogue (gemv_fp8_rope_kv_*).
struct GemvFp8RopeParams {
    GemvFp8Params g; // its y is unused
    RopeParams rope; // its qkv field is unused
};
RS_CHECK_SIZE(GemvFp8RopeParams);
RS_CHECK_FIELD(GemvFp8RopeParams, g);
RS_CHECK_FIELD(GemvFp8RopeParams, rope);

// The FP8 gate/up tile GEMV with SiLU·mul in its epilogue (gemv_fp8_silu_*): g.n = 2 inter, gate
// rows then up rows; g.y is unused.
struct GemvFp8SiluParams {
    GemvFp8Params g;
    bf16* h;   // [b, inter] silu(gate) * up, rounded to bf16
    u32* amax; // [b] each row's largest |h| as float bits (atomicMax; zero before the launch)
};
RS_CHECK_SIZE(GemvFp8SiluParams);
RS_CHECK_FIELD(GemvFp8SiluParams, g);
RS_CHECK_FIELD(GemvFp8SiluParams, h);
RS_CHECK_FIELD(GemvFp8SiluParams, amax);

// The FP8 down tile GEMV quantizing its bf16 input as it loads it (gemv_fp8_xq_*): g.x and
// g.x_scales are unused.
struct GemvFp8XqParams {
    GemvFp8Params g;
    const bf16* h;      // [b, k] 16-byte aligned
    const u32* amax;    // [b] as GemvFp8SiluParams' (unread with a static scale)
    float static_scale; // as Fp8QuantParams'
    u32 pad;
};
RS_CHECK_SIZE(GemvFp8XqParams);
RS_CHECK_FIELD(GemvFp8XqParams, g);
RS_CHECK_FIELD(GemvFp8XqParams, h);
RS_CHECK_FIELD(GemvFp8XqParams, amax);
RS_CHECK_FIELD(GemvFp8XqParams, static_scale);
RS_CHECK_FIELD(GemvFp8XqParams, pad);

// The split combine of decode attention with the FP8 quantization of each item's output row
// (attn_combine_quant_fp8_bf16): the codes and scale quant_fp8_rows_bf16 gives for attn_combine's row.
struct CombineFp8Params {
    AttnParams attn;    // its out is unused
    unsigned char* q;   // [n, hq d] E4M3 codes, 8-byte aligned
    float* scales;      // [n]
    float static_scale; // as Fp8QuantParams'
    u32 pad;
};
RS_CHECK_SIZE(CombineFp8Params);
RS_CHECK_FIELD(CombineFp8Params, attn);
RS_CHECK_FIELD(CombineFp8Params, q);
RS_CHECK_FIELD(CombineFp8Params, scales);
RS_CHECK_FIELD(CombineFp8Params, static_scale);
RS_CHECK_FIELD(CombineFp8Params, pad);

struct SampleRow {
    float temperature; // 0: greedy
    u32 top_k;         // 0: off
    float top_p;       // 1: off
    float min_p;       // 0: off
    u64 seed;
    u64 step;
};
RS_CHECK_SIZE(SampleRow);
RS_CHECK_FIELD(SampleRow, temperature);
RS_CHECK_FIELD(SampleRow, top_k);
RS_CHECK_FIELD(SampleRow, top_p);
RS_CHECK_FIELD(SampleRow, min_p);
RS_CHECK_FIELD(SampleRow, seed);
RS_CHECK_FIELD(SampleRow, step);
