// Rotary embedding of q and k (HF "rotate_half" layout) fused with the paged KV-cache write.
#include "common.cuh"

// The fused q/k/v projection output, rotated and scattered.
// Rotated pair (j, j + d/2) of head h from the projection's two outputs x1, x2 (already rounded
// to T, as the projection stores them): the bias added, q and k heads rotated by (s, c) =
// sincos(position * inv_freq[j]), v heads unchanged. The products and the difference are rounded
// one at a time (no fused multiply-add), as the CPU reference computes them.
template <typename T>
__device__ __forceinline__ float2 rope_finish(const RopeParams& p, int h, int j, float x1, float x2,
                                              float s, float c) {
    const T* bias = (const T*)p.bias;
    if (bias) {
        // The projection output is rounded to T before the bias, as a separate add would be.
        const int col = h * p.d + j;
        x1 = to_f(from_f<T>(x1 + to_f(bias[col])));
        x2 = to_f(from_f<T>(x2 + to_f(bias[col + p.d / 2])));
    }
    if (h < p.hq + p.hkv)
        return make_float2(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)),
                           __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
    return make_float2(x1, x2);
}

// Where element j of head h of token t goes: q_out's row for q heads, else the cache row of the
// token's slot (k or v); kv: whether it is a cache row.
template <typename T>
__device__ __forceinline__ size_t rope_dst(const RopeParams& p, int t, int h, long long slot, bool& kv,
                                           bool& is_k) {
    kv = h >= p.hq;
    is_k = h < p.hq + p.hkv;
    if (!kv) return ((size_t)t * p.hq + h) * p.d;
    const long long blk = slot / p.block_size, off = slot % p.block_size;
    return (((size_t)blk * p.hkv + (h - p.hq - (is_k ? 0 : p.hkv))) * p.block_size + off) * p.d;
}

// Stores finished value v as element j of its destination: T, or with kv_fp8 in a cache row the
// E4M3 code of its T value divided by the layer's scale.
template <typename T>
__device__ __forceinline__ void rope_store1(const RopeParams& p, bool kv, bool is_k, size_t row, int j,
                                            float v) {
    if (!kv) {
        ((T*)p.q_out)[row + j] = from_f<T>(v);
    } else if (p.kv_fp8) {
        ((unsigned char*)(is_k ? p.k_cache : p.v_cache))[row + j] =
            fp8_code(to_f(from_f<T>(v)) / (is_k ? p.k_scale : p.v_scale));
    } else {
        ((T*)(is_k ? p.k_cache : p.v_cache))[row + j] = from_f<T>(v);
    }
}

// Finishes and stores rotated pair j of head h of token t (skipped for k and v when the token's
// slot is negative). Shared by rope_kv_write (two pairs at a time) and the fused q/k/v product
// (gemv.cu), so both give the same bits.
template <typename T>
__device__ __forceinline__ void rope_pair_store(const RopeParams& p, int t, int h, int j, float x1,
                                                float x2) {
    const long long slot = p.slots[t];
    if (h >= p.hq && slot < 0) return;
    float s, c;
    sincosf((float)p.positions[t] * p.inv_freq[j], &s, &c);
    const float2 y = rope_finish<T>(p, h, j, x1, x2, s, c);
    bool kv, is_k;
    const size_t row = rope_dst<T>(p, t, h, slot, kv, is_k);
    rope_store1<T>(p, kv, is_k, row, j, y.x);
    rope_store1<T>(p, kv, is_k, row, j + p.d / 2, y.y);
}

// Two adjacent elements of T (4- or 8-byte aligned) as floats, and back.
__device__ __forceinline__ float2 ld2(const float* p) { return *(const float2*)p; }
__device__ __forceinline__ float2 ld2(const bf16* p) { return __bfloat1622float2(*(const __nv_bfloat162*)p); }
template <typename T> __device__ __forceinline__ void st2(T* p, float a, float b);
template <> __device__ __forceinline__ void st2<float>(float* p, float a, float b) { *(float2*)p = make_float2(a, b); }
template <> __device__ __forceinline__ void st2<bf16>(bf16* p, float a, float b) {
    *(__nv_bfloat162*)p = __floats2bfloat162_rn(a, b);
}

// Stores finished values a, b as elements j, j + 1 of their destination (j even): one store.
template <typename T>
__device__ __forceinline__ void rope_store2(const RopeParams& p, bool kv, bool is_k, size_t row, int j,
                                            float a, float b) {
    if (!kv) {
        st2<T>((T*)p.q_out + row + j, a, b);
    } else if (p.kv_fp8) {
        const float sc = is_k ? p.k_scale : p.v_scale;
        const unsigned short codes = (unsigned short)(fp8_code(to_f(from_f<T>(a)) / sc) |
                                                      (unsigned)fp8_code(to_f(from_f<T>(b)) / sc) << 8);
        *(unsigned short*)((unsigned char*)(is_k ? p.k_cache : p.v_cache) + row + j) = codes;
    } else {
        st2<T>((T*)(is_k ? p.k_cache : p.v_cache) + row + j, a, b);
    }
}

// Grid: (tokens, ceil((hq + 2 hkv) / ROPE_HEADS)); block: ROPE_HEADS warps. The block's token's
// sin and cos of every pair are computed once into shared memory (the old kernel, a block per
// head and one pair a thread, computed them for every head and moved 2 bytes an access: 0.8 TB/s
// on a prefill chunk). Warp w takes head blockIdx.y * ROPE_HEADS + w, lane l the pairs j, j + 1
// for j = 2l, 2l + 64, ... below d/2: each half of the pair is one 2-element load and store (when
// d/2 is even; else one pair at a time). Heads [0, hq) are q (rotated into q_out), [hq, hq + hkv)
// k (rotated into the cache), the rest v (copied into the cache); a token whose slot is negative
// writes only q.
template <typename T>
__device__ void rope_kv_impl(const RopeParams& p) {
    __shared__ float sin_s[ROPE_MAX_PAIRS], cos_s[ROPE_MAX_PAIRS];
    const int t = blockIdx.x, half = p.d / 2, heads = p.hq + 2 * p.hkv;
    const float pos = (float)p.positions[t];
    for (int j = threadIdx.x; j < half; j += ROPE_HEADS * 32) sincosf(pos * p.inv_freq[j], &sin_s[j], &cos_s[j]);
    __syncthreads();
    const int h = blockIdx.y * ROPE_HEADS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const long long slot = p.slots[t];
    if (h >= heads || (h >= p.hq && slot < 0)) return;
    const T* x = (const T*)p.qkv + ((size_t)t * heads + h) * p.d;
    bool kv, is_k;
    const size_t row = rope_dst<T>(p, t, h, slot, kv, is_k);
    if (half % 2 == 0) {
        for (int j = 2 * lane; j < half; j += 64) {
            const float2 a = ld2(x + j), b = ld2(x + j + half);
            const float2 y0 = rope_finish<T>(p, h, j, a.x, b.x, sin_s[j], cos_s[j]);
            const float2 y1 = rope_finish<T>(p, h, j + 1, a.y, b.y, sin_s[j + 1], cos_s[j + 1]);
            rope_store2<T>(p, kv, is_k, row, j, y0.x, y1.x);
            rope_store2<T>(p, kv, is_k, row, j + half, y0.y, y1.y);
        }
    } else {
        for (int j = lane; j < half; j += 32) {
            const float2 y = rope_finish<T>(p, h, j, to_f(x[j]), to_f(x[j + half]), sin_s[j], cos_s[j]);
            rope_store1<T>(p, kv, is_k, row, j, y.x);
            rope_store1<T>(p, kv, is_k, row, j + half, y.y);
        }
    }
}

extern "C" __global__ void __launch_bounds__(ROPE_HEADS * 32) rope_kv_write_f32(RopeParams p) { rope_kv_impl<float>(p); }
extern "C" __global__ void __launch_bounds__(ROPE_HEADS * 32) rope_kv_write_bf16(RopeParams p) {
    PDL_ENTRY();
    rope_kv_impl<bf16>(p);
}
