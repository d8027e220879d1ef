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
