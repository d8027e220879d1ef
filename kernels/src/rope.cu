// Rotary embedding of q and k (HF "rotate_half" layout) fused with the paged KV-cache write.
#include "common.cuh"

// The fused q/k/v projection output, rotated and scattered.
// Finishes rotated pair (j, j + d/2) of head h of token t from the projection's two outputs
// x1, x2 (already rounded to T, as the projection stores them): adds the bias, rotates q and k
// heads, and stores q into q_out, k and v into the cache (unless the token's slot is negative):
// as T, or with kv_fp8 as the E4M3 codes of their T values divided by the layer's scale.
// Shared by rope_kv_write and the fused q/k/v product (gemv.cu), so both give the same bits.
template <typename T>
__device__ __forceinline__ void rope_pair_store(const RopeParams& p, int t, int h, int j, float x1,
                                                float x2) {
    const int d = p.d, half = d / 2;
    const long long slot = p.slots[t];
    if (h >= p.hq && slot < 0) return;
    const long long blk = slot / p.block_size, off = slot % p.block_size;
    const int col = h * d + j;
    const T* bias = (const T*)p.bias;
    if (bias) {
        // The projection output is rounded to T before the bias, as a separate add would be.
        x1 = to_f(from_f<T>(x1 + to_f(bias[col])));
        x2 = to_f(from_f<T>(x2 + to_f(bias[col + half])));
    }
    if (h < p.hq + p.hkv) {
        float s, c;
        sincosf((float)p.positions[t] * p.inv_freq[j], &s, &c);
        const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
        x1 = y1;
        x2 = y2;
    }
    if (h < p.hq) {
        T* dst = (T*)p.q_out + ((size_t)t * p.hq + h) * d;
        dst[j] = from_f<T>(x1);
        dst[j + half] = from_f<T>(x2);
        return;
    }
    const bool is_k = h < p.hq + p.hkv;
    const size_t row = (((size_t)blk * p.hkv + (h - p.hq - (is_k ? 0 : p.hkv))) * p.block_size + off) * d;
    void* cache = is_k ? p.k_cache : p.v_cache;
    if (p.kv_fp8) {
        // The E4M3 code of the value rounded to T (what the cache would hold unquantized), / scale.
        const float sc = is_k ? p.k_scale : p.v_scale;
        unsigned char* dst = (unsigned char*)cache + row;
        dst[j] = fp8_code(to_f(from_f<T>(x1)) / sc);
        dst[j + half] = fp8_code(to_f(from_f<T>(x2)) / sc);
    } else {
        T* dst = (T*)cache + row;
        dst[j] = from_f<T>(x1);
        dst[j + half] = from_f<T>(x2);
    }
}

// Grid: (tokens, hq + 2*hkv heads), block: one thread per rotated pair (d/2 of them, rounded up
// to a warp). Heads [0, hq) are q (rotated into q_out), [hq, hq+hkv) k (rotated into the cache),
// the rest v (copied into the cache). One block per head keeps a decode step's rotation one
// memory round trip deep.
template <typename T>
__device__ void rope_kv_impl(const RopeParams& p) {
    const int t = blockIdx.x, h = blockIdx.y, j = threadIdx.x, d = p.d, half = d / 2;
    if (j >= half) return;
    if (h >= p.hq && p.slots[t] < 0) return;
    const T* row = (const T*)p.qkv + (size_t)t * (p.hq + 2 * p.hkv) * d;
    const int col = h * d + j;
    rope_pair_store<T>(p, t, h, j, to_f(row[col]), to_f(row[col + half]));
}

extern "C" __global__ void rope_kv_write_f32(RopeParams p) { rope_kv_impl<float>(p); }
extern "C" __global__ void rope_kv_write_bf16(RopeParams p) { rope_kv_impl<bf16>(p); }
