// INT4 linear layers (AWQ / GPTQ weights, bf16 activations): the small-batch product on the bf16
// tensor cores with the weights dequantized in registers, the dequantization of a whole matrix to
// bf16 for larger batches (then cuBLAS), and the column permutation of activations that GPTQ's act
// order (desc_act) needs.
//
// Layout (written by worker/src/backend/cuda/int4.rs): w is u32[n, k / 8], word c of row r holding
// the codes of input columns 8c .. 8c + 7, code 8c + ORDER[p] in bits 4p .. 4p + 3 with ORDER =
// {0, 2, 4, 6, 1, 3, 5, 7}, so that (word >> 4i) & 0x000F000F holds codes 2i and 2i + 1 in its two
// halves. sz is u32[n, groups]: bf16 s_hi in the low half, bf16 s_lo in the high half, where the
// checkpoint's (f16) scale s = s_hi + s_lo exactly; z is u8[n, groups], zero points 0..16. Columns
// of one group are contiguous (act-order layers are permuted at load), group_size a multiple of 32.
//
// The *_min kernels take GGUF's Q4_1 instead: w = q * s + m with a per-group f32 offset m (m in
// the parameters; zero points unused). A pair is unpacked to f32 (128 + q less 128, exact),
// w = fma(q, s, m) in f32 with s = s_hi + s_lo (exact), and the pair rounded to bf16 once: every
// weight is the f32 weight GGUF's definition gives (q * d exact, one rounding of + m), rounded to
// bf16.
//
// Dequantization: 0x4300 | q is the bf16 128 + q, so u = (0x4300 | q) - (0x4300 + z) = q - z
// exactly; t = u * s_lo is exact too (u has at most 5 significant bits, s_lo at most 4), and
// fma(u, s_hi, t) rounds u * s once: every weight is bf16(q - z) * s rounded to nearest even, the
// value the dequantized twin's f32 weight takes in bf16.
//
// gemv_int4_r16 / _r32 follow gemv.cu's tensor-core GEMV (y[b, n] for b <= 8, activations as the
// mma's A rows 0..7, 8 weight rows as B) with 4-bit weights: a lane (g = lane / 4, t = lane % 4)
// loads 16 bytes, 32 codes of weight row g of the tile at k0 + 32t .. +32, and the 64 bytes of
// x[g, k0 + 32t ..], which feed eight mmas: mma m takes physical k 32t + 4m .. +4 as its logical
// k 2t, 2t + 1, 2t + 8, 2t + 9 (A and B alike). A warp's k-step is 128 wide (inside one group per
// lane, as group_size is a multiple of 32); the block's warps split the k-steps and meet in shared
// memory (gemv_sum). y[b, n] does not depend on the batch size or the variant.
#include "common.cuh"

__device__ __forceinline__ u32 int4_pair(u32 word, int i) { return ((word >> (4 * i)) & 0x000F000Fu) | 0x43004300u; }

// Pair i of a packed word as bf16x2 {code 2i - 8, code 2i + 1 - 8}, exact.
__device__ __forceinline__ u32 int4_centred(u32 word, int i) {
    const u32 v = int4_pair(word, i), c = 0x43084308u; // bf16x2 {136, 136}
    const __nv_bfloat162 r = __hsub2(*(const __nv_bfloat162*)&v, *(const __nv_bfloat162*)&c);
    return *(const u32*)&r;
}

// Pair i of a packed word, dequantized: {w(code 2i), w(code 2i + 1)} as bf16x2.
__device__ __forceinline__ u32 int4_dequant(u32 word, int i, __nv_bfloat162 zz, __nv_bfloat162 s_hi,
                                            __nv_bfloat162 s_lo) {
    const u32 v = int4_pair(word, i);
    const __nv_bfloat162 u = __hsub2(*(const __nv_bfloat162*)&v, zz);
    const __nv_bfloat162 r = __hfma2(u, s_hi, __hmul2(u, s_lo));
    return *(const u32*)&r;
}

// Pair i of a packed word with offsets: {fma(q, s, m) for codes 2i, 2i + 1} rounded to bf16x2.
__device__ __forceinline__ u32 int4_dequant_min(u32 word, int i, float s, float m) {
    const u32 v = int4_pair(word, i); // bf16x2 {128 + q0, 128 + q1}
    const float q0 = __uint_as_float(v << 16) - 128.f, q1 = __uint_as_float(v & 0xffff0000u) - 128.f;
    const __nv_bfloat162 r = __floats2bfloat162_rn(fmaf(q0, s, m), fmaf(q1, s, m));
    return *(const u32*)&r;
}

// The group constants of a (row, group): zz = {128 + z, 128 + z}, s_hi, s_lo broadcast; with
// MINS, s = s_hi + s_lo and the offset m in f32 instead.
template <bool MINS> struct Int4Group {
    __nv_bfloat162 zz, s_hi, s_lo;
};
template <> struct Int4Group<true> {
    float s, m;
};

template <bool MINS>
__device__ __forceinline__ Int4Group<MINS> int4_group(const GemvInt4Params& p, int row, int grp) {
    const size_t o = (size_t)row * p.groups + grp;
    const u32 sz = __ldg(p.sz + o);
    Int4Group<MINS> gr;
    if constexpr (MINS) {
        gr.s = __uint_as_float(sz << 16) + __uint_as_float(sz & 0xffff0000u);
        gr.m = __ldg(p.m + o);
    } else {
        const u32 z = 0x4300u + __ldg(p.z + o);
        const u32 zz = z | (z << 16), hi = (sz & 0xffffu) * 0x10001u, lo = (sz >> 16) * 0x10001u;
        gr.zz = *(const __nv_bfloat162*)&zz;
        gr.s_hi = *(const __nv_bfloat162*)&hi;
        gr.s_lo = *(const __nv_bfloat162*)&lo;
    }
    return gr;
}

// Pair i of a packed word dequantized with its group's constants, either way.
__device__ __forceinline__ u32 int4_pair_of(u32 word, int i, const Int4Group<false>& g) {
    return int4_dequant(word, i, g.zz, g.s_hi, g.s_lo);
}
__device__ __forceinline__ u32 int4_pair_of(u32 word, int i, const Int4Group<true>& g) {
    return int4_dequant_min(word, i, g.s, g.m);
}

// The loads of a warp's k-steps s0 + u GEMV_WARPS (u < U), all issued before any is used: per tile
// the lane's 16 bytes (32 codes) of its weight row, and its 64 bytes of x. kok[u]: whether the
// lane's 32 k are in range, 128 s + 32 t < k (k is a multiple of 32); lanes out of range or past
// n / b load zeros.
template <int NT, int U>
__device__ __forceinline__ void int4_load_steps(const u32* const (&w)[NT], const bool (&wrow)[NT],
                                                const bf16* x, bool xrow, int k, int t, int s0,
                                                uint4 (&wv)[U][NT], uint4 (&xv)[U][4], bool (&kok)[U]) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int s = s0 + u * GEMV_WARPS;
        kok[u] = 128 * s + 32 * t < k;
#pragma unroll
        for (int j = 0; j < NT; j++) wv[u][j] = kok[u] && wrow[j] ? ld_stream(w[j] + 16 * s) : zero;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int s = s0 + u * GEMV_WARPS;
#pragma unroll
        for (int q = 0; q < 4; q++) xv[u][q] = kok[u] && xrow ? __ldg((const uint4*)(x + 128 * s) + q) : zero;
    }
}

// Block i takes weight rows [8 NT i, 8 NT (i + 1)); each warp U k-steps of 128 in flight.
template <int NT, int U, bool MINS>
__device__ __forceinline__ void gemv_int4_impl(const GemvInt4Params& p) {
    __shared__ __align__(16) float red[GEMV_WARPS * NT * 64]; // [warp][tile][batch 8][row 8]
    const int row0 = blockIdx.x * (8 * NT), n = p.n, k = p.k;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nsteps = (k + 127) >> 7; // the last one partial when k % 128 != 0
    const bool xrow = g < p.b;
    const bf16* x = p.x + (size_t)(xrow ? g : 0) * k + 32 * t;
    const u32* w[NT];
    int wr[NT];
    bool wrow[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int r = row0 + 8 * j + g;
        wrow[j] = r < n;
        wr[j] = wrow[j] ? r : 0;
        w[j] = p.w + (size_t)wr[j] * (k >> 3) + 4 * t;
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int s0 = warp; s0 < nsteps; s0 += GEMV_WARPS * U) {
        uint4 wv[U][NT], xv[U][4];
        bool kok[U];
        int4_load_steps<NT, U>(w, wrow, x, xrow, k, t, s0, wv, xv, kok);
#pragma unroll
        for (int u = 0; u < U; u++) {
            // Warp-uniform skip of steps past k (mma.sync needs every lane); in a partial step the
            // lanes past k hold zero activations, so their (finite) weights add nothing.
            if (128 * (s0 + u * GEMV_WARPS) >= k) continue;
            const int grp = kok[u] ? (128 * (s0 + u * GEMV_WARPS) + 32 * t) / p.group_size : 0;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const Int4Group<MINS> gr = int4_group<MINS>(p, wr[j], grp);
                const u32 words[4] = {wv[u][j].x, wv[u][j].y, wv[u][j].z, wv[u][j].w};
#pragma unroll
                for (int m = 0; m < 8; m++) {
                    const u32 word = words[m >> 1];
                    const int i = 2 * (m & 1);
                    const u32 b0 = int4_pair_of(word, i, gr);
                    const u32 b1 = int4_pair_of(word, i + 1, gr);
                    const uint4 xq = xv[u][m >> 1];
                    gemv_mma(acc[j], (m & 1) ? xq.z : xq.x, (m & 1) ? xq.w : xq.y, b0, b1);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
        *(float2*)&red[((warp * NT + j) * 8 + g) * 8 + 2 * t] = make_float2(acc[j][0], acc[j][1]);
    __syncthreads();
    for (int o = threadIdx.x; o < NT * 64; o += blockDim.x) {
        const int bb = o / (8 * NT), v = o % (8 * NT);
        const int row = row0 + v;
        if (bb < p.b && row < n) p.y[(size_t)bb * n + row] = __float2bfloat16(gemv_sum<NT>(red, bb, v));
    }
}

// The same product for group sizes that are multiples of 128, where a warp's 128-wide k-step lies
// in one group of every row: the mmas take the bf16 values q - 8 (128 + q from the packed bits,
// less 136: exact), and the step's group is applied to the f32 sums afterwards,
// sum_k x (q - z) s = s (sum_k x (q - 8) - (z - 8) sum_k x), with sum_k x from one more mma
// against ones, shared by the warp's tiles. Centring the codes on 0 keeps the sums small (with
// 128 + q the common-mode term 135 sum_k x would dominate them, and the tensor cores' f32
// accumulation truncates). The weights are never rounded to bf16 here, so the result is the
// product with the exact (q - z) s, not the bf16-rounded weights the other variant multiplies.
template <int NT, int U>
__device__ __forceinline__ void gemv_int4_g128_impl(const GemvInt4Params& p) {
    __shared__ __align__(16) float red[GEMV_WARPS * NT * 64]; // [warp][tile][batch 8][row 8]
    const int row0 = blockIdx.x * (8 * NT), n = p.n, k = p.k;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nsteps = (k + 127) >> 7;
    const bool xrow = g < p.b;
    const bf16* x = p.x + (size_t)(xrow ? g : 0) * k + 32 * t;
    const u32* w[NT];
    bool wrow[NT];
    int er[NT][2]; // the rows of this lane's outputs c0, c1 in tile j (clamped into range)
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int r = row0 + 8 * j + g;
        wrow[j] = r < n;
        w[j] = p.w + (size_t)(wrow[j] ? r : 0) * (k >> 3) + 4 * t;
        er[j][0] = min(row0 + 8 * j + 2 * t, n - 1);
        er[j][1] = min(row0 + 8 * j + 2 * t + 1, n - 1);
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    const u32 ones = 0x3f803f80u; // bf16x2 {1, 1}
    for (int s0 = warp; s0 < nsteps; s0 += GEMV_WARPS * U) {
        uint4 wv[U][NT], xv[U][4];
        bool kok[U];
        int4_load_steps<NT, U>(w, wrow, x, xrow, k, t, s0, wv, xv, kok);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int s = s0 + u * GEMV_WARPS;
            if (128 * s >= k) continue; // warp-uniform: mma.sync needs every lane
            const int grp = (128 * s) / p.group_size;
            float xs[4] = {0.f, 0.f, 0.f, 0.f}; // xs[0] = sum of batch row g's x over the step
#pragma unroll
            for (int m = 0; m < 8; m++) {
                const uint4 xq = xv[u][m >> 1];
                gemv_mma(xs, (m & 1) ? xq.z : xq.x, (m & 1) ? xq.w : xq.y, ones, ones);
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                float st[4] = {0.f, 0.f, 0.f, 0.f};
                const u32 words[4] = {wv[u][j].x, wv[u][j].y, wv[u][j].z, wv[u][j].w};
#pragma unroll
                for (int m = 0; m < 8; m++) {
                    const u32 word = words[m >> 1];
                    const int i = 2 * (m & 1);
                    const uint4 xq = xv[u][m >> 1];
                    gemv_mma(st, (m & 1) ? xq.z : xq.x, (m & 1) ? xq.w : xq.y, int4_centred(word, i),
                             int4_centred(word, i + 1));
                }
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const size_t o = (size_t)er[j][c] * p.groups + grp;
                    const u32 sz = __ldg(p.sz + o);
                    const float sc = __uint_as_float(sz << 16) + __uint_as_float(sz & 0xffff0000u);
                    const float zz = (float)__ldg(p.z + o) - 8.f;
                    acc[j][c] = fmaf(sc, st[c] - zz * xs[0], acc[j][c]);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
        *(float2*)&red[((warp * NT + j) * 8 + g) * 8 + 2 * t] = make_float2(acc[j][0], acc[j][1]);
    __syncthreads();
    for (int o = threadIdx.x; o < NT * 64; o += blockDim.x) {
        const int bb = o / (8 * NT), v = o % (8 * NT);
        const int row = row0 + v;
        if (bb < p.b && row < n) p.y[(size_t)bb * n + row] = __float2bfloat16(gemv_sum<NT>(red, bb, v));
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_int4_g128_r16(GemvInt4Params p) {
    gemv_int4_g128_impl<2, 2>(p);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2) gemv_int4_g128_r32(GemvInt4Params p) {
    gemv_int4_g128_impl<4, 2>(p);
}

// 16 weight rows per block.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_int4_r16(GemvInt4Params p) {
    gemv_int4_impl<2, 2, false>(p);
}
// 32 weight rows per block.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2) gemv_int4_r32(GemvInt4Params p) {
    gemv_int4_impl<4, 2, false>(p);
}
// The same with offsets (GGUF Q4_1).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_int4_min_r16(GemvInt4Params p) {
    gemv_int4_impl<2, 2, true>(p);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 2) gemv_int4_min_r32(GemvInt4Params p) {
    gemv_int4_impl<4, 2, true>(p);
}

// y = the bf16 matrix [n, k] of w (x and b unused): one packed word (8 weights, 16 bytes out) a
// thread, in the packed column order.
template <bool MINS> __device__ __forceinline__ void dequant_int4_impl(const GemvInt4Params& p) {
    const size_t words = (size_t)p.n * (p.k >> 3);
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < words;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(idx / (p.k >> 3)), c = (int)(idx % (p.k >> 3));
        const Int4Group<MINS> gr = int4_group<MINS>(p, r, (8 * c) / p.group_size);
        const u32 word = __ldg(p.w + idx);
        uint4 out;
        out.x = int4_pair_of(word, 0, gr);
        out.y = int4_pair_of(word, 1, gr);
        out.z = int4_pair_of(word, 2, gr);
        out.w = int4_pair_of(word, 3, gr);
        ((uint4*)p.y)[idx] = out;
    }
}
extern "C" __global__ void __launch_bounds__(INT4_DEQUANT_THREADS) dequant_int4_bf16(GemvInt4Params p) {
    dequant_int4_impl<false>(p);
}
extern "C" __global__ void __launch_bounds__(INT4_DEQUANT_THREADS) dequant_int4_min_bf16(GemvInt4Params p) {
    dequant_int4_impl<true>(p);
}

// y[r, j] = x[r, perm[j]] for r < m, j < k (bf16): the activations of an act-order layer, in the
// column order its weights were permuted into.
extern "C" __global__ void __launch_bounds__(INT4_DEQUANT_THREADS) permute_cols_bf16(PermuteColsParams p) {
    const size_t total = (size_t)p.m * p.k;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t r = idx / p.k;
        const int j = (int)(idx % p.k);
        p.y[idx] = p.x[r * p.k + __ldg(p.perm + j)];
    }
}
