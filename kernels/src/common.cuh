// Shared helpers for every ringserve kernel: element types, conversions, reductions.
// Kernels are templates over the storage type T (float or bf16); all arithmetic is in float.
#pragma once
#include <cuda_bf16.h>

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

typedef __nv_bfloat16 bf16;
typedef unsigned int u32;
typedef unsigned long long u64;

#include "params.cuh"

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
// Round to nearest even, as torch does.
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16(x); }

// Two floats rounded to bf16 as one word, lo in the low half (element order in memory): one
// cvt.rn.bf16x2.f32 (an ALU instruction) where two __float2bfloat16 take two conversions on the
// quarter-rate pipe; the same rounding, nearest even.
__device__ __forceinline__ u32 bf16x2_bits(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(const u32*)&h;
}
// The bf16 numbers of such a word, as floats (exactly).
__device__ __forceinline__ float bf16_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// silu(g) = g / (1 + e^-g) with the hardware's exp2 and reciprocal (ex2.approx, as __expf, and
// __fdividef): within a few f32 ulp of the IEEE expression for |g| < 20 (far below a bf16 ulp), 0
// where e^-g overflows. ex2.approx.ftz flushes an e^-g below 2^-126 to 0, where 1 + e^-g is 1
// either way; six instructions where expf and an IEEE division take about twenty and a branch.
// Every SiLU kernel (silu_mul, the FP8 SiLU·mul quantizers) computes it this way, so their bits
// agree.
__device__ __forceinline__ float silu_f(float g) {
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(g * -1.44269504088896341f));
    return __fdividef(g, 1.f + e);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block; `red` is 32 floats of shared memory. Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -INFINITY;
    return warp_max(v);
}

// One attention work item: a tile of up to `tile` consecutive query tokens of one sequence, from
// the kernels' items (int2: sequence, first query in it) and seqs (int4: query_start, query_len,
// context_len, unused) arrays.
struct QueryTile {
    int seq, q0;                // the sequence and the tile's first query index in it
    int q_start, q_len, ctx;    // the sequence's first token in the step, query count, context
    int n_tok;                  // query tokens in the tile
    int first_pos;              // absolute position of the tile's first query
};

__device__ __forceinline__ QueryTile query_tile(const int* items, const int* seqs, int item,
                                                int tile) {
    QueryTile q;
    q.seq = items[2 * item];
    q.q0 = items[2 * item + 1];
    q.q_start = seqs[4 * q.seq];
    q.q_len = seqs[4 * q.seq + 1];
    q.ctx = seqs[4 * q.seq + 2];
    q.n_tok = min(tile, q.q_len - q.q0);
    q.first_pos = q.ctx - q.q_len + q.q0;
    return q;
}

// Unpacks 16 bytes holding 16/sizeof(T) elements into floats.
__device__ __forceinline__ void unpack16(const uint4& u, float* out, float) {
    out[0] = __uint_as_float(u.x); out[1] = __uint_as_float(u.y);
    out[2] = __uint_as_float(u.z); out[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void unpack16(const uint4& u, float* out, bf16) {
    const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// E4M3 (FP8 KV cache) to f16, exactly: every E4M3 value is an f16 (sm_89+'s cvt). Four codes of a
// word (low byte first) as two f16x2 words, lo = codes 0, 1 and hi = codes 2, 3. Before sm_89
// the instruction does not exist and the host refuses an FP8 cache (`--kv-cache-dtype fp8` needs
// compute capability 8.9), so the kernels that call this never run there: it traps, and the
// module still compiles for sm_80 (A100), where every bf16 kernel runs.
__device__ __forceinline__ void e4m3x4_to_f16x4(u32 codes, u32& lo, u32& hi) {
#if __CUDA_ARCH__ >= 890
    asm("{\n.reg .b16 a, b;\nmov.b32 {a, b}, %2;\ncvt.rn.f16x2.e4m3x2 %0, a;\ncvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(codes));
#else
    __trap();
    lo = hi = codes;
#endif
}

// The value of one E4M3 code, as f32.
__device__ __forceinline__ float e4m3_to_f(unsigned char code) {
    u32 lo, hi;
    e4m3x4_to_f16x4(code, lo, hi);
    float f;
    asm("{\n.reg .b16 a, b;\nmov.b32 {a, b}, %1;\ncvt.f32.f16 %0, a;\n}\n" : "=f"(f) : "r"(lo));
    return f;
}

// f16x2 {lo, hi} from two floats, rounded to nearest even.
__device__ __forceinline__ u32 pack_f16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Programmatic dependent launch (sm_90+). In a decode graph a kernel of PDL_KERNELS (lib.rs) whose
// only dependency is another kernel may launch while that kernel finishes (worker's graph.rs). Such a
// kernel enters through PDL_ENTRY: pdl_wait() returns once every kernel before it has completed and
// its writes are visible (at once in an ordinary launch), so nothing before it may read what an
// earlier kernel wrote or write anything; pdl_trigger() then lets the kernel after it launch.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#define PDL_ENTRY() \
    do {            \
        pdl_wait();    \
        pdl_trigger(); \
    } while (0)

// A bf16x2 word as f16x2 (exact for |x| < 65504 and above f16's subnormal range; queries are).
__device__ __forceinline__ u32 bf16x2_to_f16x2(u32 b) {
    return pack_f16(__uint_as_float(b << 16), __uint_as_float(b & 0xffff0000u));
}
