// Rotary embedding of q and k (HF "rotate_half" layout) fused with the paged KV-cache write.
#include "common.cuh"

// The fused q/k/v projection output, rotated and scattered.
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
};

// Grid: one block per token.
template <typename T>
__device__ void rope_kv_impl(const RopeParams& p) {
    const int t = blockIdx.x, d = p.d, half = d / 2, width = (p.hq + 2 * p.hkv) * d;
    const T* row = (const T*)p.qkv + (size_t)t * width;
    const T* bias = (const T*)p.bias;
    const float pos = (float)p.positions[t];
    const long long slot = p.slots[t];
    const long long blk = slot / p.block_size, off = slot % p.block_size;
    for (int i = threadIdx.x; i < (p.hq + p.hkv) * half; i += blockDim.x) {
        const int h = i / half, j = i % half;
        float s, c;
        sincosf(pos * p.inv_freq[j], &s, &c);
        float x1 = to_f(row[h * d + j]), x2 = to_f(row[h * d + j + half]);
        if (bias) {
            // The projection output is rounded to T before the bias, as a separate add would be.
            x1 = to_f(from_f<T>(x1 + to_f(bias[h * d + j])));
            x2 = to_f(from_f<T>(x2 + to_f(bias[h * d + j + half])));
        }
        const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
        T* dst;
        if (h < p.hq) {
            dst = (T*)p.q_out + ((size_t)t * p.hq + h) * d;
        } else {
            if (slot < 0) continue;
            dst = (T*)p.k_cache + (((size_t)blk * p.hkv + (h - p.hq)) * p.block_size + off) * d;
        }
        dst[j] = from_f<T>(y1);
        dst[j + half] = from_f<T>(y2);
    }
    if (slot < 0) return;
    for (int i = threadIdx.x; i < p.hkv * d; i += blockDim.x) {
        const int h = i / d, j = i % d, col = (p.hq + p.hkv) * d + i;
        float v = to_f(row[col]);
        if (bias) v += to_f(bias[col]);
        T* dst = (T*)p.v_cache + (((size_t)blk * p.hkv + h) * p.block_size + off) * d;
        dst[j] = from_f<T>(v);
    }
}

extern "C" __global__ void rope_kv_write_f32(RopeParams p) { rope_kv_impl<float>(p); }
extern "C" __global__ void rope_kv_write_bf16(RopeParams p) { rope_kv_impl<bf16>(p); }
