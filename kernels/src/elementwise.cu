// Row-wise kernels: embedding gather, fused residual add + RMSNorm, SiLU·mul.
#include "common.cuh"

// out[i, :] = table[ids[i], :]. Grid: one block per row. ids are checked on the host.
template <typename T>
__device__ void embedding_impl(T* out, const T* table, const u32* ids, int hidden) {
    const T* src = table + (size_t)ids[blockIdx.x] * hidden;
    T* dst = out + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

// residual[i] += delta[i] (rounded to T, as the model keeps its residual stream in T), then
// out[i] = rmsnorm(residual[i]) * weight. delta may be null (first layer). Grid: one block per row.
template <typename T>
__device__ void add_rmsnorm_impl(T* residual, const T* delta, const T* weight, T* out, int hidden,
                                 float eps) {
    __shared__ float red[32];
    T* res = residual + (size_t)blockIdx.x * hidden;
    const T* del = delta ? delta + (size_t)blockIdx.x * hidden : nullptr;
    T* o = out + (size_t)blockIdx.x * hidden;
    float ss = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = to_f(res[i]);
        if (del) {
            T r = from_f<T>(v + to_f(del[i]));
            res[i] = r;
            v = to_f(r);
        }
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float scale = rsqrtf(ss / (float)hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        o[i] = from_f<T>(to_f(res[i]) * scale * to_f(weight[i]));
}

// gate_up[i] = [gate | up] (2*inter wide); out[i] = silu(gate) * up. Grid: (rows, ceil(inter/block)).
template <typename T>
__device__ void silu_mul_impl(const T* gate_up, T* out, int inter) {
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= inter) return;
    const T* row = gate_up + (size_t)blockIdx.x * 2 * inter;
    const float g = to_f(row[j]);
    const float u = to_f(row[inter + j]);
    out[(size_t)blockIdx.x * inter + j] = from_f<T>(g / (1.f + expf(-g)) * u);
}

// out[i] = (To) in[i], for dtype conversions on the device.
template <typename Ti, typename To>
__device__ void cast_impl(const Ti* in, To* out, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        out[i] = from_f<To>(to_f(in[i]));
}

#define ELEMENTWISE(T, S)                                                                          \
    extern "C" __global__ void embedding_##S(T* out, const T* table, const u32* ids, int hidden) {   \
        embedding_impl<T>(out, table, ids, hidden);                                                \
    }                                                                                              \
    extern "C" __global__ void add_rmsnorm_##S(T* residual, const T* delta, const T* weight, T* out, \
                                               int hidden, float eps) {                            \
        add_rmsnorm_impl<T>(residual, delta, weight, out, hidden, eps);                            \
    }                                                                                              \
    extern "C" __global__ void silu_mul_##S(const T* gate_up, T* out, int inter) {                  \
        silu_mul_impl<T>(gate_up, out, inter);                                                     \
    }
ELEMENTWISE(float, f32)
ELEMENTWISE(bf16, bf16)

extern "C" __global__ void cast_f32_bf16(const float* in, bf16* out, u64 n) { cast_impl(in, out, n); }
extern "C" __global__ void cast_bf16_f32(const bf16* in, float* out, u64 n) { cast_impl(in, out, n); }
