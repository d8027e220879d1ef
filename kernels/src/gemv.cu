// Bandwidth-bound matrix-vector products for small batches: y[b, n] = sum_k x[b, k] * w[n, k],
// b <= 8, w in HF Linear layout [n, k] row-major, f32 accumulation. The weight matrix is read
// exactly once per call, which is what bounds small-batch decoding.
//
// bf16 (gemv_bf16_r16/_r32, gemv_bf16_f32out_r16/_r32): tensor cores. One mma.sync.m16n8k16 takes
// the activations as A (batch rows 0..7 of its 16; rows 8..15 and rows >= b are zero) and 8 weight
// rows as B (the "col" operand is exactly w's [n, k] row-major layout). The 16 k of an mma may be
// any 16 physical k as long as A and B agree, so every lane loads 16 contiguous bytes: lane
// (g = lane / 4, t = lane % 4) reads x[g, k0 + 8t .. +8] and w[row g of the tile, k0 + 8t .. +8],
// which feed two mmas (elements 0-3, then 4-7) covering the 32 k from k0: in PTX's fragment
// layout, logical k 2t, 2t+1 / 2t+8, 2t+9 of the first mma are physical k0+8t+0,1 / +2,3, of the
// second k0+8t+4,5 / +6,7, the same map for A and B (the lane's t). The product lands in the
// lane's c0, c1 = y[batch g, tile rows 2t, 2t+1].
//
// A block is GEMV_WARPS warps over the same 8 * NT weight rows (NT tiles of 8), splitting K
// between them: warp w takes the 32-wide k-steps w, w + GEMV_WARPS, w + 2 GEMV_WARPS, ... and
// issues U of them at once, i.e. U * NT 16-byte weight loads (8 for both variants) plus U x loads
// per lane before the first is used. Weights stream past L1 (ld.global.nc.L1::no_allocate); the
// activations are read through L1 (__ldg) and reused by the NT tiles of the warp. The warps' partial
// sums meet in shared memory. r16 (NT 2, U 4) gives 4096-row matrices 256 blocks, all resident at
// once; r32 (NT 4, U 2) halves the activation traffic per weight byte for the tall matrices.
//
// Batch invariance: the value of y[b, n] is bit-identical for every batch size and for both
// variants. Its sum is, per warp, one chain of mmas over that warp's k-steps in increasing order
// (the same for any U and NT), then the warps' partials added in warp order 0..GEMV_WARPS-1; an
// mma's D[m][n] depends only on A row m, B column n and C[m][n], so the other batch rows (zeros or
// not) never enter it. Only GEMV_WARPS (fixed) and k shape the order.
//
// f32 (gemv_f32, tests and small models only): one warp per output row on the FMA units, UNROLL
// 16-byte weight loads in flight per lane, explicit fmaf in a per-row order that does not depend on
// the batch size either.
#include "common.cuh"

#define MAX_B GEMV_MAX_BATCH
#define GEMV_WARPS (GEMV_THREADS / 32)
#define UNROLL 4

// A streamed 16-byte load: read-only, not kept in L1 (each weight is used once).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// c += A * B for A = {a0, 0, a2, 0} (rows 8..15 zero), B = {b0, b1}.
__device__ __forceinline__ void gemv_mma(float* c, u32 a0, u32 a2, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// The block's partial sums: NT tiles of 8 weight rows, U k-steps of 32 in flight per warp. Tile
// row v (0 <= v < 8 NT) is weight row rows(v), or none when rows(v) < 0 (its sums are zeros).
// On return (after a block barrier) red[((warp * NT + j) * 8 + bb) * 8 + r] holds warp `warp`'s
// share of batch row bb's product with tile row 8j + r; gemv_sum adds the warps up.
template <int NT, int U, typename RowMap>
__device__ __forceinline__ void gemv_mma_partials(const void* xp, const void* wp, int b, int k,
                                                  RowMap rows, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nsteps = (k + 31) >> 5; // the last one partial when k % 32 != 0
    const int nfull = k >> 5;         // steps where every lane's 8 k are in range
    bool rows_full = true;
#pragma unroll
    for (int v = 0; v < 8 * NT; v++) rows_full = rows_full && rows(v) >= 0;
    const bool xrow = g < b;
    // Element pointers at this lane's k offset 8t; invalid rows point at row 0 and are never read.
    const bf16* x = (const bf16*)xp + (size_t)(xrow ? g : 0) * k + 8 * t;
    const bf16* w[NT];
    bool wrow[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int r = rows(8 * j + g);
        wrow[j] = r >= 0;
        w[j] = (const bf16*)wp + (size_t)(wrow[j] ? r : 0) * k + 8 * t;
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    const uint4 zero = make_uint4(0, 0, 0, 0);

    for (int s0 = warp; s0 < nsteps; s0 += GEMV_WARPS * U) {
        uint4 wv[U][NT], xv[U];
        if (rows_full && s0 + (U - 1) * GEMV_WARPS < nfull) {
            // Every load of this round in range (warp-uniform test): no per-lane predicates.
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int off = 32 * (s0 + u * GEMV_WARPS);
#pragma unroll
                for (int j = 0; j < NT; j++) wv[u][j] = ld_stream(w[j] + off);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int off = 32 * (s0 + u * GEMV_WARPS);
                xv[u] = xrow ? __ldg((const uint4*)(x + off)) : zero;
            }
        } else {
            // Last rounds / last block: a lane's 8 k are in range iff 32 s + 8 t < k (k is a
            // multiple of 8); out-of-range k and rows contribute exact zeros.
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int off = 32 * (s0 + u * GEMV_WARPS);
                const bool kok = off + 8 * t < k;
#pragma unroll
                for (int j = 0; j < NT; j++) wv[u][j] = kok && wrow[j] ? ld_stream(w[j] + off) : zero;
                xv[u] = kok && xrow ? __ldg((const uint4*)(x + off)) : zero;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int j = 0; j < NT; j++) {
                gemv_mma(acc[j], xv[u].x, xv[u].y, wv[u][j].x, wv[u][j].y);
                gemv_mma(acc[j], xv[u].z, xv[u].w, wv[u][j].z, wv[u][j].w);
            }
        }
    }

    // c0, c1 of tile j = y[batch g, tile rows 8j + 2t, +1]; c2, c3 are batch rows 8..15 (zero).
#pragma unroll
    for (int j = 0; j < NT; j++)
        *(float2*)&red[((warp * NT + j) * 8 + g) * 8 + 2 * t] = make_float2(acc[j][0], acc[j][1]);
    __syncthreads();
}

// Batch row bb's product with tile row v, from gemv_mma_partials' red: the warps' partials added
// in warp order.
template <int NT>
__device__ __forceinline__ float gemv_sum(const float* red, int bb, int v) {
    const int o = ((v >> 3) * 8 + bb) * 8 + (v & 7);
    float s = red[o];
#pragma unroll
    for (int w = 1; w < GEMV_WARPS; w++) s += red[w * NT * 64 + o];
    return s;
}

// Plain products: block i takes weight rows [8 NT i, 8 NT (i + 1)) and stores y.
template <int NT, int U, typename To>
__device__ __forceinline__ void gemv_mma_impl(const GemvParams& p) {
    __shared__ __align__(16) float red[GEMV_WARPS * NT * 64]; // [warp][tile][batch 8][row 8]
    const int row0 = blockIdx.x * (8 * NT), n = p.n;
    const auto rows = [=](int v) { return row0 + v < n ? row0 + v : -1; };
    gemv_mma_partials<NT, U>(p.x, p.w, p.b, p.k, rows, red);
    for (int o = threadIdx.x; o < NT * 64; o += blockDim.x) {
        const int bb = o / (8 * NT), v = o % (8 * NT);
        const int row = row0 + v;
        if (bb < p.b && row < p.n)
            ((To*)p.y)[(size_t)bb * p.n + row] = from_f<To>(gemv_sum<NT>(red, bb, v));
    }
}

// f32: one warp per row, 8 rows per block of GEMV_THREADS.
__device__ __forceinline__ void gemv_f32_impl(const GemvParams& p) {
    constexpr int VEC = 4;
    constexpr int STRIDE = 32 * VEC;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (row >= p.n) return;
    const float* w = (const float*)p.w + (size_t)row * p.k;
    const float* x = (const float*)p.x;
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
            unpack16(wv[u], wf, float());
#pragma unroll
            for (int b = 0; b < MAX_B; b++) {
                if (b < p.b) {
                    float xf[VEC];
                    unpack16(__ldg((const uint4*)(x + (size_t)b * p.k + k)), xf, float());
#pragma unroll
                    for (int v = 0; v < VEC; v++) acc[b] = fmaf(wf[v], xf[v], acc[b]);
                }
            }
        }
    }
#pragma unroll
    for (int b = 0; b < MAX_B; b++) {
        if (b < p.b) {
            const float s = warp_sum(acc[b]);
            if (lane == 0) ((float*)p.y)[(size_t)b * p.n + row] = s;
        }
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_f32(GemvParams p) { gemv_f32_impl(p); }
// 16 weight rows per block.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_bf16_r16(GemvParams p) {
    PDL_ENTRY();
    gemv_mma_impl<2, 4, bf16>(p);
}
// 32 weight rows per block.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_bf16_r32(GemvParams p) {
    PDL_ENTRY();
    gemv_mma_impl<4, 2, bf16>(p);
}
// For logits: bf16 weights, f32 output.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_bf16_f32out_r16(GemvParams p) {
    PDL_ENTRY();
    gemv_mma_impl<2, 4, float>(p);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_bf16_f32out_r32(GemvParams p) {
    PDL_ENTRY();
    gemv_mma_impl<4, 2, float>(p);
}

// The weight rows of the FP8 and INT4 tile GEMVs' 16-row tiles (fp8.cu, int4.cu). Plain tiles:
// rows 16 i + r, clamped below n. With RoPE in the epilogue (the fused q/k/v product, head size d a
// multiple of 16), tile i takes head i / (d / 16)'s rotation pairs j0 .. j0 + 7, j0 = 8 (i % (d /
// 16)): row r < 8 the head's dim j0 + r, row r + 8 the dim j0 + r + d/2 it rotates with. With
// SiLU·mul (gate/up, n = 2 inter) tile i takes gate rows 8i .. 8i + 7 and their up rows.
struct TileRows {
    int n, d, half, per_head; // half: d / 2 (RoPE), inter (SiLU·mul), else 0; per_head: d / 16
    __device__ __forceinline__ int row(int tile, int r) const {
        if (d > 0) return tile / per_head * d + tile % per_head * 8 + (r & 7) + (r >> 3) * half;
        if (half > 0) return 8 * tile + (r & 7) + (r >> 3) * half;
        return min(16 * tile + r, n - 1);
    }
};
__device__ __forceinline__ TileRows tile_rows(bool rope, bool silu, int rope_d, int n) {
    if (rope) return TileRows{n, rope_d, rope_d / 2, rope_d / 16};
    if (silu) return TileRows{n, 0, n / 2, 1};
    return TileRows{n, 0, 0, 1};
}

// The q/k/v product fused with RoPE and the paged KV write (bf16, 16 tile rows a block, head size
// a multiple of 16). Block i takes head h = i / (d / 16) and the rotation pairs j0 .. j0 + 7,
// j0 = 8 (i % (d / 16)): tile rows 0-7 are the head's dims j0 + r, rows 8-15 the dims j0 + r + d/2
// they rotate with, so a thread holds both halves of its pair. Each output is rounded to bf16 (as
// the q/k/v buffer would hold it) and finished by rope_pair_store: the bits of gemv_bf16_r16
// followed by rope_kv_write_bf16, in one launch. Batch row t is token t of the step.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_rope_kv_bf16(GemvRopeParams p) {
    PDL_ENTRY();
    __shared__ __align__(16) float red[GEMV_WARPS * 2 * 64];
    const int half = p.rope.d / 2, per_head = half / 8;
    const int h = blockIdx.x / per_head, j0 = (blockIdx.x % per_head) * 8;
    const int base = h * p.rope.d + j0;
    const auto rows = [=](int v) { return base + (v < 8 ? v : half + v - 8); };
    gemv_mma_partials<2, 4>(p.x, p.w, p.b, p.k, rows, red);
    const int bb = threadIdx.x >> 3, r = threadIdx.x & 7;
    if (bb < p.b) {
        const float x1 = to_f(from_f<bf16>(gemv_sum<2>(red, bb, r)));
        const float x2 = to_f(from_f<bf16>(gemv_sum<2>(red, bb, 8 + r)));
        rope_pair_store<bf16>(p.rope, bb, h, j0 + r, x1, x2);
    }
}
