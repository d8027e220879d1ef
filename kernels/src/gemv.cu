// Bandwidth-bound matrix-vector products for small batches: y[b, n] = sum_k x[b, k] * w[n, k].
//
// One warp per output row. Every lane streams its share of the weight row with 16-byte loads,
// UNROLL of them issued back to back before any is used (one load in flight per lane leaves the
// H200's memory system idle between round trips), bypassing L1 so the small activation rows stay
// cached there; each weight vector is multiplied against up to MAX_B activation rows, then the
// warp reduces. The weight matrix is read exactly once per call, which is what bounds
// small-batch decoding. The per-row summation order does not depend on the batch size.
// Measured on the H200 (docs/benchmarks.md, run 8) it is still slower than cuBLAS end to end, so
// the model uses it only when RINGSERVE_CUDA_GEMV=1.
#include "common.cuh"

#define MAX_B 8
#define UNROLL 4

struct GemvParams {
    const void* x; // T[b, k]
    const void* w; // T[n, k], row-major (HF Linear layout)
    void* y;       // To[b, n]
    int b, n, k;   // k is a multiple of 16 / sizeof(T); x and w are 16-byte aligned
};

// A streamed 16-byte load: read-only, not kept in L1 (each weight is used once).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

template <typename T, typename To>
__device__ void gemv_impl(const GemvParams& p) {
    constexpr int VEC = 16 / sizeof(T);
    constexpr int STRIDE = 32 * VEC;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= p.n) return;
    const T* w = (const T*)p.w + (size_t)row * p.k;
    const T* x = (const T*)p.x;
    float acc[MAX_B];
#pragma unroll
    for (int b = 0; b < MAX_B; b++) acc[b] = 0.f;
    for (int k0 = lane * VEC; k0 < p.k; k0 += UNROLL * STRIDE) {
        uint4 wv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int k = k0 + u * STRIDE;
            wv[u] = k < p.k ? ld_stream(w + k) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int k = k0 + u * STRIDE;
            if (k >= p.k) break;
            float wf[VEC];
            unpack16(wv[u], wf, T());
#pragma unroll
            for (int b = 0; b < MAX_B; b++) {
                if (b < p.b) {
                    float xf[VEC];
                    unpack16(__ldg((const uint4*)(x + (size_t)b * p.k + k)), xf, T());
#pragma unroll
                    for (int v = 0; v < VEC; v++) acc[b] += wf[v] * xf[v];
                }
            }
        }
    }
#pragma unroll
    for (int b = 0; b < MAX_B; b++) {
        if (b < p.b) {
            const float s = warp_sum(acc[b]);
            if (lane == 0) ((To*)p.y)[(size_t)b * p.n + row] = from_f<To>(s);
        }
    }
}

extern "C" __global__ void gemv_f32(GemvParams p) { gemv_impl<float, float>(p); }
extern "C" __global__ void gemv_bf16(GemvParams p) { gemv_impl<bf16, bf16>(p); }
// For logits: bf16 weights, f32 output.
extern "C" __global__ void gemv_bf16_f32out(GemvParams p) { gemv_impl<bf16, float>(p); }
