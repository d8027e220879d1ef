// Row-wise kernels: embedding gather, fused residual add + RMSNorm, SiLU·mul.
#include "common.cuh"

// out[i, :] = table[ids[i], :]. Grid: one block per row. ids are checked on the host.
template <typename T>
__device__ void embedding_impl(T* out, const T* table, const u32* ids, int hidden) {
    const T* src = table + (size_t)ids[blockIdx.x] * hidden;
    T* dst = out + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

// Elements of T in 16 bytes.
template <typename T> __device__ __forceinline__ constexpr int vec16() { return 16 / sizeof(T); }

// Loads / stores 16 bytes of T as floats.
template <typename T> __device__ __forceinline__ void load16(const T* p, float* out) {
    unpack16(*(const uint4*)p, out, T());
}
// 16 bytes of T from floats, each rounded to T (bf16 two at a time, bf16x2_bits).
__device__ __forceinline__ uint4 pack16(const float* in, float) {
    return make_uint4(__float_as_uint(in[0]), __float_as_uint(in[1]), __float_as_uint(in[2]), __float_as_uint(in[3]));
}
__device__ __forceinline__ uint4 pack16(const float* in, bf16) {
    return make_uint4(bf16x2_bits(in[0], in[1]), bf16x2_bits(in[2], in[3]), bf16x2_bits(in[4], in[5]),
                      bf16x2_bits(in[6], in[7]));
}
template <typename T> __device__ __forceinline__ uint4 pack16(const float* in) { return pack16(in, T()); }
// v[0 .. N) (N a multiple of 16 bytes of T) rounded to T in place, as a store and a load would.
template <typename T, int N> __device__ __forceinline__ void round_to(float* v) {
#pragma unroll
    for (int c = 0; c < N; c += vec16<T>()) unpack16(pack16<T>(v + c), v + c, T());
}
template <typename T> __device__ __forceinline__ void store16(T* p, const float* in) {
    *(uint4*)p = pack16<T>(in);
}

// 16-byte chunks of a row one thread keeps in registers in add_rmsnorm's vector path.
#define NORM_CHUNKS 4

// residual[i] += delta[i] (rounded to T, as the model keeps its residual stream in T), then
// out[i] = rmsnorm(residual[i]) * weight. delta may be null (first layer). Grid: one block per row.
// With q (bf16, vector path only; the host wrapper checks), out's row is also quantized to E4M3 as
// quant_fp8_rows_bf16 quantizes it (fp8.cu): the same scale from the same bf16 values (or
// static_scale when positive) into scales[row], the same codes into q.
// Where a row is whole 16-byte chunks and at most NORM_CHUNKS of them per thread (hidden 4096 in
// bf16: 512 threads, one chunk each), every load of the row, the delta and the weight is issued
// before any store (one memory round trip before the reduction, none after it) and the row stays
// in registers; else a scalar loop (whose stores to the residual serialise its loads).
__device__ __forceinline__ unsigned char fp8_code(float v);
__device__ __forceinline__ u32 fp8_code2(float lo, float hi);
#define FP8_MAX 448.0f
#define FP8_MIN_SCALE (1.0f / (448.0f * 512.0f))

// x / scale, IEEE-rounded, for a bf16 number x wherever the quotient can change an E4M3 code,
// from the row's rcp = 1 / scale (IEEE): the product x * rcp corrected by one fused multiply-add
// on the exact remainder (Markstein), four instructions where the division takes a dozen and a
// branch. Checked off the device against x / scale for every finite bf16 x and 21,535 scales
// (every dynamic scale amax / 448 of a bf16 amax, and 4,000 others from 2^-40 to 2^20): the same
// float wherever 2^-12 <= |x / scale| < 10^6; below 2^-12 both are codes 0 (the smallest E4M3
// magnitude is 2^-9), above 448 both saturate, and an overflowing product keeps its infinity
// (the remainder would make it NaN). The sign of a zero quotient is the dividend's, as division's.
// The kernels crate's test fp8_division_by_the_reciprocal_gives_the_quotient_where_codes_change
// checks the same in Rust, operation for operation, over a sixteenth of the dynamic scales.
__device__ __forceinline__ float fp8_div(float x, float scale, float rcp) {
    const float q = x * rcp;
    const float r = copysignf(__fmaf_rn(__fmaf_rn(-q, scale, x), rcp, q), q);
    return isinf(q) ? q : r;
}

template <typename T>
__device__ void add_rmsnorm_impl(T* __restrict__ residual, const T* __restrict__ delta,
                                 const T* __restrict__ weight, T* __restrict__ out, int hidden,
                                 float eps, unsigned char* __restrict__ q = nullptr,
                                 float* __restrict__ qscales = nullptr, float static_scale = 0.f,
                                 const float* __restrict__ dxs = nullptr, const float* __restrict__ dws = nullptr) {
    __shared__ float red[32];
    // With dws, delta is a raw FP8 product: each value is first scaled as scale_fp8_out_bf16
    // scales it, T(delta * dxs[row] * dws[col]), so the launch gives the bits of that pass followed
    // by this kernel. dxs[row] is read here, before any barrier: it may be qscales[row], which
    // thread 0 writes only after the block's reductions.
    const float dx = dws ? dxs[blockIdx.x] : 1.f;
    constexpr int V = vec16<T>();
    T* res = residual + (size_t)blockIdx.x * hidden;
    const T* del = delta ? delta + (size_t)blockIdx.x * hidden : nullptr;
    // out null (the FP8 kernel only): the codes are the output, the bf16 row is not stored.
    T* o = out ? out + (size_t)blockIdx.x * hidden : nullptr;
    float ss = 0.f;
    if (hidden % V == 0 && hidden <= NORM_CHUNKS * V * (int)blockDim.x) {
        // The row (already rounded to T) and the weight stay packed: 8 registers a chunk.
        uint4 row[NORM_CHUNKS], wt[NORM_CHUNKS];
#pragma unroll
        for (int c = 0; c < NORM_CHUNKS; c++) {
            const int i = (c * blockDim.x + threadIdx.x) * V;
            if (i >= hidden) break;
            row[c] = *(const uint4*)(res + i);
            wt[c] = *(const uint4*)(weight + i);
            if (del) {
                float v[V], dv[V];
                unpack16(row[c], v, T());
                load16(del + i, dv);
                if (dws) {
                    // 16-byte loads: i is a multiple of V >= 4 and dws a whole allocation.
                    float wv[V];
#pragma unroll
                    for (int e = 0; e < V; e += 4) {
                        const float4 w4 = *(const float4*)(dws + i + e);
                        wv[e] = w4.x, wv[e + 1] = w4.y, wv[e + 2] = w4.z, wv[e + 3] = w4.w;
                    }
#pragma unroll
                    for (int e = 0; e < V; e++) dv[e] = dv[e] * dx * wv[e];
                    round_to<T, V>(dv); // as the pass stores it
                }
#pragma unroll
                for (int e = 0; e < V; e++) v[e] += dv[e];
                row[c] = pack16<T>(v);
            }
        }
#pragma unroll
        for (int c = 0; c < NORM_CHUNKS; c++) {
            const int i = (c * blockDim.x + threadIdx.x) * V;
            if (i >= hidden) break;
            if (del) *(uint4*)(res + i) = row[c];
            float v[V];
            unpack16(row[c], v, T());
#pragma unroll
            for (int e = 0; e < V; e++) ss += v[e] * v[e];
        }
        ss = block_sum(ss, red);
        const float scale = rsqrtf(ss / (float)hidden + eps);
        float amax = 0.f;
#pragma unroll
        for (int c = 0; c < NORM_CHUNKS; c++) {
            const int i = (c * blockDim.x + threadIdx.x) * V;
            if (i >= hidden) break;
            float v[V], w[V];
            unpack16(row[c], v, T());
            unpack16(wt[c], w, T());
#pragma unroll
            for (int e = 0; e < V; e++) v[e] = v[e] * scale * w[e];
            row[c] = pack16<T>(v); // the row is not needed again: keep the stored values
            if (o) *(uint4*)(o + i) = row[c];
            if (q) {
                unpack16(row[c], v, T());
#pragma unroll
                for (int e = 0; e < V; e++) amax = fmaxf(amax, fabsf(v[e]));
            }
        }
        if (q) {
            float s = static_scale;
            if (!(s > 0.f)) s = fmaxf(block_max(amax, red) / FP8_MAX, FP8_MIN_SCALE);
            if (threadIdx.x == 0) qscales[blockIdx.x] = s;
            const float rcp = 1.f / s;
            unsigned char* qr = q + (size_t)blockIdx.x * hidden;
            // A row's 8 codes in one store where the row starts 8-byte aligned.
            const bool q8 = ((size_t)qr & 7) == 0;
#pragma unroll
            for (int c = 0; c < NORM_CHUNKS; c++) {
                const int i = (c * blockDim.x + threadIdx.x) * V;
                if (i >= hidden) break;
                float v[V];
                unpack16(row[c], v, T());
                if constexpr (V == 8) {
                    if (q8) {
                        u32 w[4];
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            w[e] = fp8_code2(fp8_div(v[2 * e], s, rcp), fp8_div(v[2 * e + 1], s, rcp));
                        *(uint2*)(qr + i) = make_uint2(__byte_perm(w[0], w[1], 0x5410), __byte_perm(w[2], w[3], 0x5410));
                        continue;
                    }
                }
                {
                    unsigned char b[V];
#pragma unroll
                    for (int e = 0; e < V; e++) b[e] = fp8_code(fp8_div(v[e], s, rcp));
#pragma unroll
                    for (int e = 0; e < V; e++) qr[i + e] = b[e];
                }
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = to_f(res[i]);
        if (del) {
            const float d = dws ? to_f(from_f<T>(to_f(del[i]) * dx * dws[i])) : to_f(del[i]);
            T r = from_f<T>(v + d);
            res[i] = r;
            v = to_f(r);
        }
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float scale = rsqrtf(ss / (float)hidden + eps);
    if (o)
        for (int i = threadIdx.x; i < hidden; i += blockDim.x)
            o[i] = from_f<T>(to_f(res[i]) * scale * to_f(weight[i]));
}

// gate_up[i] = [gate | up] (2*inter wide); out[i] = silu(gate) * up. Grid: (rows, ceil(inter /
// (block * V))) with V = 16 bytes of T when inter is a multiple of it (16-byte loads), else 1.
template <typename T>
__device__ void silu_mul_impl(const T* __restrict__ gate_up, T* __restrict__ out, int inter) {
    constexpr int V = vec16<T>();
    const T* row = gate_up + (size_t)blockIdx.x * 2 * inter;
    T* dst = out + (size_t)blockIdx.x * inter;
    if (inter % V == 0) {
        const int j = (blockIdx.y * blockDim.x + threadIdx.x) * V;
        if (j >= inter) return;
        float g[V], u[V];
        load16(row + j, g);
        load16(row + inter + j, u);
#pragma unroll
        for (int e = 0; e < V; e++) g[e] = silu_f(g[e]) * u[e];
        store16(dst + j, g);
        return;
    }
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= inter) return;
    const float g = to_f(row[j]);
    const float u = to_f(row[inter + j]);
    dst[j] = from_f<T>(silu_f(g) * u);
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
                                               int hidden, float eps, const float* dxs,            \
                                               const float* dws) {                                 \
        PDL_ENTRY();                                                                               \
        add_rmsnorm_impl<T>(residual, delta, weight, out, hidden, eps, nullptr, nullptr, 0.f, dxs, dws); \
    }                                                                                              \
    extern "C" __global__ void silu_mul_##S(const T* gate_up, T* out, int inter) {                  \
        PDL_ENTRY();                                                                               \
        silu_mul_impl<T>(gate_up, out, inter);                                                     \
    }
ELEMENTWISE(float, f32)
ELEMENTWISE(bf16, bf16)

// out may be null: the codes are then the only output (the backend's FP8 layers). amax_reset,
// unless null, gets 0 at [row]: the row maxima the next product but one raises (fp8.cu's SILU
// tile GEMV, which runs right after this norm's product input is ready, and XQ reads them).
extern "C" __global__ void add_rmsnorm_fp8_bf16(bf16* residual, const bf16* delta, const bf16* weight,
                                                 bf16* out, unsigned char* q, float* scales, int hidden,
                                                 float eps, float static_scale, const float* dxs,
                                                 const float* dws, u32* amax_reset) {
    PDL_ENTRY();
    if (amax_reset && threadIdx.x == 0) amax_reset[blockIdx.x] = 0u;
    add_rmsnorm_impl<bf16>(residual, delta, weight, out, hidden, eps, q, scales, static_scale, dxs, dws);
}

extern "C" __global__ void cast_f32_bf16(const float* in, bf16* out, u64 n) { cast_impl(in, out, n); }
extern "C" __global__ void cast_bf16_f32(const bf16* in, float* out, u64 n) { cast_impl(in, out, n); }
