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

// rope_pair_store with token t's slot and the pair's rotation (s, c) = sincosf(position *
// inv_freq[j]) already computed (the INT4 tile product does so before its k-loop, so that its
// epilogue waits on neither the loads nor the sine).
template <typename T>
__device__ __forceinline__ void rope_pair_store_sc(const RopeParams& p, int t, int h, int j, float x1,
                                                   float x2, long long slot, float s, float c) {
    if (h >= p.hq && slot < 0) return;
    const float2 y = rope_finish<T>(p, h, j, x1, x2, s, c);
    bool kv, is_k;
    const size_t row = rope_dst<T>(p, t, h, slot, kv, is_k);
    rope_store1<T>(p, kv, is_k, row, j, y.x);
    rope_store1<T>(p, kv, is_k, row, j + p.d / 2, y.y);
}

// Finishes and stores rotated pair j of head h of token t (skipped for k and v when the token's
// slot is negative). Shared by rope_kv_write (two pairs at a time) and the fused q/k/v products
// (gemv.cu, fp8.cu, int4.cu), so all give the same bits.
template <typename T>
__device__ __forceinline__ void rope_pair_store(const RopeParams& p, int t, int h, int j, float x1,
                                                float x2) {
    const long long slot = p.slots[t];
    if (h >= p.hq && slot < 0) return;
    float s, c;
    sincosf((float)p.positions[t] * p.inv_freq[j], &s, &c);
    rope_pair_store_sc<T>(p, t, h, j, x1, x2, slot, s, c);
}

// Stores finished values v[0..8) as elements j .. j + 7 of their destination (j a multiple of 8,
// the destination 16-byte aligned: rope_kv_impl's vector path): 16-byte stores of T, or with
// kv_fp8 in a cache row the 8 E4M3 codes in one 8-byte store. The same bits as rope_store1.
template <typename T>
__device__ __forceinline__ void rope_store8(const RopeParams& p, bool kv, bool is_k, size_t row, int j,
                                            const float* v) {
    if (kv && p.kv_fp8) {
        const float sc = is_k ? p.k_scale : p.v_scale;
        u32 w[2] = {0u, 0u};
#pragma unroll
        for (int e = 0; e < 8; e++) w[e / 4] |= (u32)fp8_code(to_f(from_f<T>(v[e])) / sc) << (8 * (e % 4));
        *(uint2*)((unsigned char*)(is_k ? p.k_cache : p.v_cache) + row + j) = make_uint2(w[0], w[1]);
        return;
    }
    T* dst = (kv ? (T*)(is_k ? p.k_cache : p.v_cache) : (T*)p.q_out) + row + j;
#pragma unroll
    for (int c = 0; c < 8; c += vec16<T>()) store16<T>(dst + c, v + c);
}

// Grid: (tokens, ceil((hq + 2 hkv) / ROPE_HEADS)); block: ROPE_THREADS threads. The block's
// token's sin and cos of every pair are computed once into shared memory, then its threads take
// (head, 8 consecutive pairs) items in turn: head h of the block's ROPE_HEADS, pairs j .. j + 7
// for j = 8i < d/2, each half one 16-byte load and store (two for f32; 8 codes for an FP8
// cache). Consecutive threads take consecutive 16 bytes of a head's half, so a warp moves whole
// 128-byte lines. (Run 46 measured the kernel before this one — a warp a head, 4-byte accesses,
// 8 heads a block, so sin/cos six times a token on the 8B shape — at 1.06 TB/s on a prefill
// chunk of 8,176 tokens, 175 us a layer on an H100.) Heads whose d/2 is not a multiple of 8, or
// buffers not 16-byte aligned, take one pair an item. Heads [0, hq) are q (rotated into q_out),
// [hq, hq + hkv) k (rotated into the cache), the rest v (copied into the cache); a token whose
// slot is negative writes only q. Every value is rope_finish's, stored as rope_store1 stores it;
// with p.w_scales the input is a raw FP8 product, scaled first as scale_fp8_out_bf16 scales it
// (that pass's launch, write and read of the product saved).
template <typename T>
__device__ void rope_kv_impl(const RopeParams& p) {
    __shared__ float sin_s[ROPE_MAX_PAIRS], cos_s[ROPE_MAX_PAIRS];
    const int t = blockIdx.x, half = p.d / 2, heads = p.hq + 2 * p.hkv;
    const int h0 = blockIdx.y * ROPE_HEADS, nh = min(ROPE_HEADS, heads - h0);
    const float pos = (float)p.positions[t];
    for (int j = threadIdx.x; j < half; j += ROPE_THREADS) sincosf(pos * p.inv_freq[j], &sin_s[j], &cos_s[j]);
    __syncthreads();
    const long long slot = p.slots[t];
    // The block's heads this token writes: all, or with no cache slot only its q heads (first).
    const int live = slot < 0 ? max(min(nh, p.hq - h0), 0) : nh;
    const T* xt = (const T*)p.qkv + (size_t)t * heads * p.d;
    // A raw FP8 product: value x of column c becomes T(x * xs * w_scales[c]), scale_fp8_out's bits.
    const float* ws = p.w_scales;
    const float xs = ws ? p.x_scales[t] : 1.f;
    const bool vec = half % 8 == 0 &&
                     (((size_t)p.qkv | (size_t)p.q_out | (size_t)p.k_cache | (size_t)p.v_cache) & 15) == 0;
    if (vec) {
        const int vh = half / 8;
        for (int it = threadIdx.x; it < live * vh; it += ROPE_THREADS) {
            const int h = h0 + it / vh, j = 8 * (it % vh);
            const T* x = xt + (size_t)h * p.d;
            float a[8], b[8], y0[8], y1[8];
#pragma unroll
            for (int c = 0; c < 8; c += vec16<T>()) {
                load16(x + j + c, a + c);
                load16(x + j + half + c, b + c);
            }
            if (ws) {
                const float* wa = ws + (size_t)h * p.d + j;
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    a[e] = a[e] * xs * wa[e];
                    b[e] = b[e] * xs * wa[e + half];
                }
                round_to<T, 8>(a); // as the scaling pass stores them
                round_to<T, 8>(b);
            }
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float2 y = rope_finish<T>(p, h, j + e, a[e], b[e], sin_s[j + e], cos_s[j + e]);
                y0[e] = y.x;
                y1[e] = y.y;
            }
            bool kv, is_k;
            const size_t row = rope_dst<T>(p, t, h, slot, kv, is_k);
            rope_store8<T>(p, kv, is_k, row, j, y0);
            rope_store8<T>(p, kv, is_k, row, j + half, y1);
        }
    } else {
        for (int it = threadIdx.x; it < live * half; it += ROPE_THREADS) {
            const int h = h0 + it / half, j = it % half;
            const T* x = xt + (size_t)h * p.d;
            float a = to_f(x[j]), b = to_f(x[j + half]);
            if (ws) {
                a = to_f(from_f<T>(a * xs * ws[(size_t)h * p.d + j]));
                b = to_f(from_f<T>(b * xs * ws[(size_t)h * p.d + j + half]));
            }
            const float2 y = rope_finish<T>(p, h, j, a, b, sin_s[j], cos_s[j]);
            bool kv, is_k;
            const size_t row = rope_dst<T>(p, t, h, slot, kv, is_k);
            rope_store1<T>(p, kv, is_k, row, j, y.x);
            rope_store1<T>(p, kv, is_k, row, j + half, y.y);
        }
    }
}

extern "C" __global__ void __launch_bounds__(ROPE_THREADS) rope_kv_write_f32(RopeParams p) { rope_kv_impl<float>(p); }
extern "C" __global__ void __launch_bounds__(ROPE_THREADS) rope_kv_write_bf16(RopeParams p) {
    PDL_ENTRY();
    rope_kv_impl<bf16>(p);
}
