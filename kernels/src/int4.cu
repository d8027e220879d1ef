// INT4 linear layers (AWQ / GPTQ weights, bf16 activations): the small-batch products on the bf16
// tensor cores with the weights dequantized in registers, the same for batches of up to a few
// hundred rows with the activations staged in shared memory (gemm_int4_mma; gemm_int4_mmas with
// the scales applied to f32 sums and the codes staged too), the dequantization of
// a whole matrix to bf16 for larger ones (then cuBLAS), and the column permutation of activations
// that GPTQ's act order (desc_act) needs.
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

// Codes 2i, 2i + 1 of a packed word as the bf16x2 {128 + q(2i), 128 + q(2i + 1)}: one lop3,
// (w >> 4i) & 0x000F000F | 0x43004300 (written out, so that the and and the or are not two).
__device__ __forceinline__ u32 int4_pair(u32 word, int i) {
    u32 r;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(word >> (4 * i)), "n"(0x000F000F), "r"(0x43004300u));
    return r;
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

// gemv_int4_t16_k128_b8 .. _k64_b32: the small-batch product for k and groups that are multiples
// of the k-step KS (128, else 64), groups of a power-of-two number of steps or one group a row
// (AWQ's and GPTQ's usual 128, also 64, 256, -1), with the weights as the mma's A operand: one
// mma.m16n8k16 takes 16 weight rows x 16 k (every A row used, half the mmas of the kernels above)
// and 8 batch rows of x as B, so a batch of up to 8 costs what a batch of 1 does. A block works on
// 16-row tiles; its warps split each tile's k-steps into contiguous ranges. Lane (g = lane / 4,
// t = lane % 4) reads, per step, KS / 32 words (KS / 4 codes: 16 or 8 bytes) of weight rows g and
// g + 8 at column KS s + (KS / 4) t, and x[batch 8 nb + g] at the same columns; word i, pairs 2h
// and 2h + 1 (codes 8i + 4h .. +4) feed mma 2i + h as a0/a2 (row g) and a1/a3 (row g + 8),
// against x's pairs at the same columns as b0/b1, so A and B map each logical k to one physical k.
// The pairs dequantize to q - z exactly ((0x4300 | q) - (0x4300 + z) in bf16); a step's f32 sums
// are multiplied by the row's scale s and added up: the product with the exact weights (q - z) s,
// never rounded to bf16. Scales and zeros come from p.tsz, where a lane's two rows of a group are
// one 8-byte word pair and a tile's 16 rows 64 contiguous bytes (the scale, an f16 or bf16 value,
// as f32 bits, whose low 8 bits are free for the zero point). The codes and scales of D steps are
// in flight per lane (a register ring refilled as each step is consumed). The warps' sums meet in
// shared memory in warp order, so y[b, n] does not depend on the batch size or on NB.
// With ROPE (P = GemvInt4RopeParams: the fused q/k/v product, n = (hq + 2 hkv) d, d a multiple of
// 16) tile i takes head i / (d / 16) and its rotation pairs j0 .. j0 + 7, j0 = 8 (i % (d / 16)) —
// row g the head's dim j0 + g, row g + 8 the dim j0 + g + d/2 it rotates with — and the epilogue
// finishes each pair as rope_kv_write_bf16 does (rope_pair_store_sc) from the two bf16 values y
// would hold: that kernel's bits without its launch. With SILU (P = GemvInt4SiluParams: gate/up,
// n = 2 inter, gate rows then up rows) tile i takes gate rows 8i .. 8i + 7 and up rows inter + 8i ..
// + 7, and the epilogue stores silu_mul_bf16's h = bf16(silu(gate) * up) from the two bf16 values.
// Either way a lane's two rows lie in different 16-row tiles of p.tsz: two 4-byte scale loads.
enum Int4TileMode { INT4_TILE_PLAIN, INT4_TILE_ROPE, INT4_TILE_SILU };
__device__ __forceinline__ const GemvInt4Params& int4_gemv_of(const GemvInt4Params& p) { return p; }
__device__ __forceinline__ const GemvInt4Params& int4_gemv_of(const GemvInt4RopeParams& p) { return p.g; }
__device__ __forceinline__ const GemvInt4Params& int4_gemv_of(const GemvInt4SiluParams& p) { return p.g; }

template <int WPL> struct Int4Words {
    u32 v[WPL];
};

// The ring loads of the tile kernels, predicated without branches: with ok false the destination
// keeps its value (a ring slot's earlier, finite contents: see gemv_int4_t16_impl). Read-only
// (ld.global.nc); the weights stream past L1.
__device__ __forceinline__ void ld_words_if(Int4Words<4>& r, const u32* p, bool ok) {
    asm("{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n"
        "@q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
        : "+r"(r.v[0]), "+r"(r.v[1]), "+r"(r.v[2]), "+r"(r.v[3])
        : "l"(p), "r"((int)ok));
}
__device__ __forceinline__ void ld_words_if(Int4Words<2>& r, const u32* p, bool ok) {
    asm("{\n.reg .pred q;\nsetp.ne.b32 q, %3, 0;\n@q ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n}\n"
        : "+r"(r.v[0]), "+r"(r.v[1])
        : "l"(p), "r"((int)ok));
}
__device__ __forceinline__ void ld_u32_if(u32& r, const u32* p, bool ok) {
    asm("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n@q ld.global.nc.u32 %0, [%1];\n}\n" : "+r"(r) : "l"(p), "r"((int)ok));
}
__device__ __forceinline__ void ld_u32x2_if(u32 (&r)[2], const u32* p, bool ok) {
    asm("{\n.reg .pred q;\nsetp.ne.b32 q, %3, 0;\n@q ld.global.nc.v2.u32 {%0, %1}, [%2];\n}\n"
        : "+r"(r[0]), "+r"(r[1])
        : "l"(p), "r"((int)ok));
}

// c += A * B, a full 16 x 16 A (four registers) and an 8-column B.
__device__ __forceinline__ void mma_bf16_16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c = A * B (no accumulator to read).
__device__ __forceinline__ void mma_bf16_16816_first(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
}

// Pair i of a packed word less its bf16x2 {128 + z, 128 + z}: {q(2i) - z, q(2i + 1) - z}, exact.
__device__ __forceinline__ u32 int4_less_zero(u32 word, int i, u32 zz) {
    const u32 v = int4_pair(word, i);
    const __nv_bfloat162 r = __hsub2(*(const __nv_bfloat162*)&v, *(const __nv_bfloat162*)&zz);
    return *(const u32*)&r;
}

// A block loops over the 16-row tiles blockIdx.x + i gridDim.x (the grid is at most the blocks
// that fit at once), and its ring runs on across them: the last items of a tile refill their
// slots with the next tile's first. Rows past n are read as row n - 1 (clamped) and x rows past b
// as row b - 1: their products land only in outputs never stored (an mma's D[row][col] depends
// on A's row and B's column alone). k is a multiple of KS, so every step is whole.
template <int KS, int NB, int D, int MODE = INT4_TILE_PLAIN, typename P = GemvInt4Params>
__device__ __forceinline__ void gemv_int4_t16_impl(const P& pp) {
    constexpr bool ROPE = MODE == INT4_TILE_ROPE, SILU = MODE == INT4_TILE_SILU;
    const GemvInt4Params& p = int4_gemv_of(pp);
    constexpr int WPL = KS / 32; // words a lane reads of each of its two rows per step
    // [tile parity][warp][nb][row 16][batch 8]: the warps' sums of the last two tiles.
    __shared__ __align__(16) float red[2][GEMV_WARPS * NB * 128];
    const int n = p.n, k = p.k;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    // ROPE and SILU: n is a multiple of 16 (the host checks), every tile whole.
    const int ntiles = (n + 15) >> 4, nsteps = (k + KS - 1) / KS;
    // Warp w takes steps [s_begin, s_begin + cnt) of every tile as its items j < per_warp (a
    // multiple of D, so that item j of any tile lives in ring slot j % D). Items j >= cnt are
    // computed on the slot's earlier (finite) codes and scales and x of a step in range, and
    // scaled by 0: they add exact zeros.
    const int span = (nsteps + GEMV_WARPS - 1) / GEMV_WARPS;
    const int per_warp = (span + D - 1) / D * D;
    const int s_begin = min(nsteps, warp * span);
    const int cnt = min(nsteps, s_begin + span) - s_begin;
    // A step's group, s >> sh: group_size / KS is a power of two, or one group spans k.
    const int sh = p.group_size >= k ? 31 : __ffs(p.group_size / KS) - 1;
    const u32 kw = (u32)(k >> 3);
    // The tiles' weight rows (TileRows, gemv.cu); ROPE: a head's d / 16 tiles, SILU: half = inter.
    int rope_d = 0;
    if constexpr (ROPE) rope_d = pp.rope.d;
    const TileRows rows = tile_rows(ROPE, SILU, rope_d, n);
    const int half = rows.half, per_head = rows.per_head;
    auto tile_row = [&](int tile, int r) { return rows.row(tile, r); };
    // Word offsets of the lane's two rows in a tile, and of their scale | zero words in group 0
    // (p.tsz: [16-row tile][group][g][h], row 16 T + 8 h + g at ((T groups) 8 + g) 2 + h). A
    // plain tile's two rows are one 8-byte pair (so[1] = so[0] + 1; rows past n, clamped for
    // their codes, read their own tile's padding words: finite, and never stored).
    auto rows_of = [&](int tile, u32(&wo)[2], u32(&so)[2]) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const u32 row = (u32)tile_row(tile, g + 8 * h);
            wo[h] = row * kw + WPL * t;
            if constexpr (ROPE || SILU) {
                so[h] = ((row >> 4) * (u32)p.groups * 8u + (row & 7u)) * 2u + ((row >> 3) & 1u);
            } else {
                so[h] = ((u32)tile * (u32)p.groups * 8u + g) * 2u + h;
            }
        }
    };
    const bf16* xp[NB];
#pragma unroll
    for (int nb = 0; nb < NB; nb++) xp[nb] = p.x + (size_t)min(8 * nb + g, p.b - 1) * k + (KS / 4) * t;

    // The ring: slot d holds an item's words and its two rows' scale | zero words.
    Int4Words<WPL> wv[D][2];
    u32 sz[D][2];
#pragma unroll
    for (int d = 0; d < D; d++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int i = 0; i < WPL; i++) wv[d][h].v[i] = 0u;
            sz[d][h] = 0u;
        }
    auto load = [&](const u32(&wo)[2], const u32(&so)[2], int j, bool tile_ok, int d) {
        const int s = s_begin + j;
        const bool real = tile_ok && j < cnt;
        const u32 grp = (u32)s >> sh;
#pragma unroll
        for (int h = 0; h < 2; h++) ld_words_if(wv[d][h], p.w + (wo[h] + (KS / 8) * s), real);
        if constexpr (ROPE || SILU) {
#pragma unroll
            for (int h = 0; h < 2; h++) ld_u32_if(sz[d][h], p.tsz + (so[h] + 16u * grp), real);
        } else {
            ld_u32x2_if(sz[d], p.tsz + (so[0] + 16u * grp), real);
        }
    };

    int tile = blockIdx.x;
    u32 wo[2], so[2], wn[2], sn[2];
    rows_of(tile, wo, so);
    rows_of(min(tile + (int)gridDim.x, ntiles - 1), wn, sn);
    // The ring's first codes and scales are loaded before pdl_wait() (no kernel writes them), so
    // that in a decode graph they stream while the kernel before finishes; x is read after it.
#pragma unroll
    for (int d = 0; d < D; d++) load(wo, so, d, true, d);
    pdl_wait();
    pdl_trigger();
    // ROPE: epilogue thread o < NB * 64 finishes pair (o & 7) of batch row o >> 3; its token's
    // cache slot and position are loaded here, and each tile's rotation computed before its
    // k-loop, so that the epilogue waits on neither.
    const bool rope_thread = ROPE && (int)threadIdx.x < NB * 64 && ((int)threadIdx.x >> 3) < p.b;
    long long rope_slot = -1;
    u32 rope_pos = 0u;
    if constexpr (ROPE) {
        if (rope_thread) {
            rope_slot = pp.rope.slots[threadIdx.x >> 3];
            rope_pos = pp.rope.positions[threadIdx.x >> 3];
        }
    }
    for (int parity = 0; tile < ntiles; tile += gridDim.x, parity ^= 1) { // block-uniform
        const bool next_ok = tile + (int)gridDim.x < ntiles;
        float rope_s = 0.f, rope_c = 1.f;
        if constexpr (ROPE) {
            if (rope_thread)
                sincosf((float)rope_pos * pp.rope.inv_freq[tile % per_head * 8 + (threadIdx.x & 7)], &rope_s, &rope_c);
        }
        float acc[NB][4];
#pragma unroll
        for (int nb = 0; nb < NB; nb++) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;
        for (int j0 = 0; j0 < per_warp; j0 += D) {
            // The group's refills come from the next tile when it is the tile's last.
            const bool last = j0 + D >= per_warp;
#pragma unroll
            for (int d = 0; d < D; d++) {
                const int j = j0 + d, real = j < cnt;
                // x of the item: the lane's KS / 4 bf16 of batch rows 8 nb + g, 8 a uint4
                // (uint4 i holds the columns of word i's codes).
                const int s = real ? s_begin + j : s_begin;
                uint4 xv[NB][WPL];
#pragma unroll
                for (int nb = 0; nb < NB; nb++)
#pragma unroll
                    for (int i = 0; i < WPL; i++) xv[nb][i] = __ldg((const uint4*)(xp[nb] + KS * s) + i);
                u32 zz[2];
                float sc[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    zz[h] = (0x4300u + (sz[d][h] & 0xffu)) * 0x10001u;
                    sc[h] = real ? __uint_as_float(sz[d][h] & 0xffffff00u) : 0.f;
                }
                // Two independent mma chains (even and odd halves) a step.
                float st[2][NB][4];
#pragma unroll
                for (int i = 0; i < WPL; i++) {
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const u32 a0 = int4_less_zero(wv[d][0].v[i], 2 * hh, zz[0]);
                        const u32 a1 = int4_less_zero(wv[d][1].v[i], 2 * hh, zz[1]);
                        const u32 a2 = int4_less_zero(wv[d][0].v[i], 2 * hh + 1, zz[0]);
                        const u32 a3 = int4_less_zero(wv[d][1].v[i], 2 * hh + 1, zz[1]);
#pragma unroll
                        for (int nb = 0; nb < NB; nb++) {
                            const uint4 xq = xv[nb][i]; // x at codes 8i + 4hh .. +4: half hh
                            const u32 b0 = hh ? xq.z : xq.x, b1 = hh ? xq.w : xq.y;
                            if (i == 0) {
                                mma_bf16_16816_first(st[hh][nb], a0, a1, a2, a3, b0, b1);
                            } else {
                                mma_bf16_16816(st[hh][nb], a0, a1, a2, a3, b0, b1);
                            }
                        }
                    }
                }
#pragma unroll
                for (int nb = 0; nb < NB; nb++)
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        acc[nb][c] = fmaf(sc[c >> 1], st[1][nb][c], fmaf(sc[c >> 1], st[0][nb][c], acc[nb][c]));
                // Refill slot d with the item D ahead: this tile's, or the block's next tile's.
                if (last) {
                    load(wn, sn, j + D - per_warp, next_ok, d);
                } else {
                    load(wo, so, j + D, true, d);
                }
            }
        }
        // c0, c1 = (row g, batch 8 nb + 2t, +1); c2, c3 = (row g + 8, the same batches).
        float* rp = red[parity];
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            float* r = rp + (warp * NB + nb) * 128;
            *(float2*)&r[g * 8 + 2 * t] = make_float2(acc[nb][0], acc[nb][1]);
            *(float2*)&r[(g + 8) * 8 + 2 * t] = make_float2(acc[nb][2], acc[nb][3]);
        }
        // One barrier a tile: red[parity] is written again two tiles on, after the next
        // barrier, which every thread reaches only once done reading it below.
        __syncthreads();
        // The warps' sums of tile row rr for batch row 8 nb + bb, in warp order.
        auto sum = [&](int nb, int bb, int rr) {
            float v = rp[nb * 128 + rr * 8 + bb];
#pragma unroll
            for (int w = 1; w < GEMV_WARPS; w++) v += rp[(w * NB + nb) * 128 + rr * 8 + bb];
            return v;
        };
        if constexpr (ROPE || SILU) {
            // o = (batch row b, pair r): tile rows r and r + 8, rounded to bf16 as y would hold
            // them. NB * 64 <= GEMV_THREADS: one item a thread at most.
            const int o = threadIdx.x, b = o >> 3, r = o & 7;
            if (o < NB * 64 && b < p.b) {
                const float x1 = __bfloat162float(__float2bfloat16(sum(b >> 3, b & 7, r)));
                const float x2 = __bfloat162float(__float2bfloat16(sum(b >> 3, b & 7, r + 8)));
                if constexpr (ROPE) {
                    rope_pair_store_sc<bf16>(pp.rope, b, tile / per_head, tile % per_head * 8 + r, x1, x2,
                                             rope_slot, rope_s, rope_c);
                } else {
                    pp.h[(size_t)b * half + 8 * tile + r] = __float2bfloat16(silu_f(x1) * x2);
                }
            }
        } else {
            for (int o = threadIdx.x; o < NB * 128; o += blockDim.x) {
                // o = (nb, batch bb, row rr) with the row fastest, so that y's stores are contiguous.
                const int nb = o >> 7, bb = (o >> 4) & 7, rr = o & 15;
                const int b = 8 * nb + bb, row = 16 * tile + rr;
                if (b < p.b && row < n) p.y[(size_t)b * n + row] = __float2bfloat16(sum(nb, bb, rr));
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) wo[h] = wn[h], so[h] = sn[h];
        rows_of(min(tile + 2 * (int)gridDim.x, ntiles - 1), wn, sn);
    }
}

// gemv_int4_t16_k{KS}_b{8 NB}: D items in flight, at least `blocks` blocks an SM; the grid is at
// most the blocks that fit at once (each block loops over tiles blockIdx.x + i gridDim.x).
#define INT4_T16(name, ks, nb, d, blocks)                                                                \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, blocks) name(GemvInt4Params p) {          \
        gemv_int4_t16_impl<ks, nb, d>(p); /* pdl_wait() after the ring fill (PDL_KERNELS) */             \
    }
INT4_T16(gemv_int4_t16_k128_b8, 128, 1, 2, 3)
INT4_T16(gemv_int4_t16_k128_b16, 128, 2, 2, 2)
INT4_T16(gemv_int4_t16_k128_b32, 128, 4, 2, 1)
INT4_T16(gemv_int4_t16_k64_b8, 64, 1, 4, 3)
INT4_T16(gemv_int4_t16_k64_b16, 64, 2, 4, 2)
INT4_T16(gemv_int4_t16_k64_b32, 64, 4, 4, 1)
// gemv_int4_rope_kv_t16_* / gemv_int4_silu_t16_*: the same six with RoPE and the KV write, or
// SiLU·mul, in the epilogue (ROPE and SILU above).
#define INT4_T16_MODE(name, ks, nb, d, blocks, mode, P)                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, blocks) name(P p) {                       \
        gemv_int4_t16_impl<ks, nb, d, mode>(p); /* pdl_wait() after the ring fill (PDL_KERNELS) */       \
    }
INT4_T16_MODE(gemv_int4_rope_kv_t16_k128_b8, 128, 1, 2, 3, INT4_TILE_ROPE, GemvInt4RopeParams)
INT4_T16_MODE(gemv_int4_rope_kv_t16_k128_b16, 128, 2, 2, 2, INT4_TILE_ROPE, GemvInt4RopeParams)
INT4_T16_MODE(gemv_int4_rope_kv_t16_k128_b32, 128, 4, 2, 1, INT4_TILE_ROPE, GemvInt4RopeParams)
INT4_T16_MODE(gemv_int4_rope_kv_t16_k64_b8, 64, 1, 4, 3, INT4_TILE_ROPE, GemvInt4RopeParams)
INT4_T16_MODE(gemv_int4_rope_kv_t16_k64_b16, 64, 2, 4, 2, INT4_TILE_ROPE, GemvInt4RopeParams)
INT4_T16_MODE(gemv_int4_rope_kv_t16_k64_b32, 64, 4, 4, 1, INT4_TILE_ROPE, GemvInt4RopeParams)
INT4_T16_MODE(gemv_int4_silu_t16_k128_b8, 128, 1, 2, 3, INT4_TILE_SILU, GemvInt4SiluParams)
INT4_T16_MODE(gemv_int4_silu_t16_k128_b16, 128, 2, 2, 2, INT4_TILE_SILU, GemvInt4SiluParams)
INT4_T16_MODE(gemv_int4_silu_t16_k128_b32, 128, 4, 2, 1, INT4_TILE_SILU, GemvInt4SiluParams)
INT4_T16_MODE(gemv_int4_silu_t16_k64_b8, 64, 1, 4, 3, INT4_TILE_SILU, GemvInt4SiluParams)
INT4_T16_MODE(gemv_int4_silu_t16_k64_b16, 64, 2, 4, 2, INT4_TILE_SILU, GemvInt4SiluParams)
INT4_T16_MODE(gemv_int4_silu_t16_k64_b32, 64, 4, 4, 1, INT4_TILE_SILU, GemvInt4SiluParams)
// A variant timed by `cuda_bench int4` (the same contract as gemv_int4_t16_k128_b8): a ring of 4.
INT4_T16(gemv_int4_t16x_d4_k128_b8, 128, 1, 4, 2)

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

// gemm_int4_mma_t{TA}w{W}: y[b, n] = x[b, k] . w[n, k]^T for batches past the GEMVs' (b > 32)
// and up to a few hundred rows, where dequantizing the whole matrix to bf16 for cuBLAS costs more
// than the product. Every weight is dequantized in registers exactly as dequant_int4_bf16 writes
// it (bf16 of (q - z) s, int4_dequant), so y is the dequantize-then-GEMM product up to the order
// of the f32 sums. A block of W warps takes weight rows [16 TA W bx, +16 TA W), x rows
// [INT4_MMA_BATCH by, +INT4_MMA_BATCH) and k-steps of 64 [steps bz, +steps); warp w takes 16 TA
// weight rows as TA 16-row mma A tiles against all the block's x rows as 8-column B tiles. x
// goes through shared memory in a ring of INT4_MMA_STAGES steps (cp.async, 16-byte chunk c of x
// row r stored at chunk c ^ (r & 7), so that a warp's reads hit 32 banks); the weights go
// straight to registers, two steps ahead. Word and group offsets are 32-bit (n k / 8 < 2^32,
// checked). Lane (g = lane / 4, t = lane % 4) holds, per step, words 2t and 2t + 1 of the step
// (codes 16t .. 16t + 16) of its warp's rows g + 8q (q < 2 TA) and reads the same 16 k of x:
// word i, pairs 2h and 2h + 1 feed mma 2i + h as a0/a2 (row 16a + g) and a1/a3 (row 16a + g + 8)
// against x's codes 16t + 8i + 4h .. +4 as b0/b1, so A and B map each logical k to one physical
// k (the tile GEMV's mapping). Rows past n read row n - 1 and x rows past b read row b - 1: their
// products land only in outputs never stored. k-chunks past k (k is a multiple of 32) are zero
// codes against zero-filled x. With splits > 1 block bz writes its f32 sums to part[bz] and
// gemm_int4_reduce adds them up; otherwise it writes y.
// The raw group constants of a lane's row for a step, and the bf16x2 forms int4_dequant takes.
struct I4mRaw {
    u32 sz, z;
};
__device__ __forceinline__ Int4Group<false> i4m_group(I4mRaw r) {
    const u32 z = 0x4300u + r.z;
    const u32 zz = z | (z << 16), hi = (r.sz & 0xffffu) * 0x10001u, lo = (r.sz >> 16) * 0x10001u;
    Int4Group<false> g;
    g.zz = *(const __nv_bfloat162*)&zz;
    g.s_hi = *(const __nv_bfloat162*)&hi;
    g.s_lo = *(const __nv_bfloat162*)&lo;
    return g;
}

// A warp's accumulators out, [tile a][B tile nb][c]: c0, c1 = (weight row row0 + 16 a + g, x rows
// b0 + 8 nb + 2t, +1), c2, c3 = (row row0 + 16 a + g + 8, the same); to y in bf16, or with
// splits > 1 to the f32 part[blockIdx.z]. Only rows < n and x rows < b are stored.
template <int TA, int NB>
__device__ __forceinline__ void i4m_store(const GemmInt4Params& prm, const float (&acc)[TA][NB][4], int row0,
                                          int b0, int g, int t) {
    const int n = prm.g.n, b = prm.g.b;
    const bool split = prm.splits > 1;
#pragma unroll
    for (int a = 0; a < TA; a++)
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int row = row0 + 16 * a + g + 8 * (c >> 1), bb = b0 + 8 * nb + 2 * t + (c & 1);
                if (row < n && bb < b) {
                    const size_t o = (size_t)bb * n + row;
                    if (split) {
                        prm.part[(size_t)blockIdx.z * b * n + o] = acc[a][nb][c];
                    } else {
                        prm.g.y[o] = __float2bfloat16(acc[a][nb][c]);
                    }
                }
            }
}

template <int TA, int W> __device__ __forceinline__ void gemm_int4_mma_impl(const GemmInt4Params& prm) {
    constexpr int Q = 2 * TA;         // weight rows a lane holds
    constexpr int BATCH = INT4_MMA_BATCH, STAGES = INT4_MMA_STAGES;
    constexpr int I4M_NB = BATCH / 8; // 8-column B tiles a warp
    static_assert(BATCH * 8 % (32 * W) == 0, "gemm_int4_mma: whole x chunks a thread");
    static_assert(STAGES * BATCH * 128 <= 48 * 1024, "gemm_int4_mma: static shared memory past 48 KiB");
    const GemvInt4Params& p = prm.g;
    __shared__ __align__(128) uint4 xs[STAGES][BATCH * 8]; // [stage][row][chunk]
    const int n = p.n, k = p.k, b = p.b;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = (blockIdx.x * W + warp) * 16 * TA, b0 = blockIdx.y * BATCH;
    const int total = (k + 63) >> 6;
    const int s_begin = min(total, (int)blockIdx.z * prm.steps);
    const int steps = min(total, s_begin + prm.steps) - s_begin;
    const u32 kw = (u32)(k >> 3);

    // The lane's weight rows (clamped below n) and their word / group offsets.
    u32 wo[Q], go[Q];
#pragma unroll
    for (int q = 0; q < Q; q++) {
        const u32 r = (u32)min(row0 + g + 8 * q, n - 1);
        wo[q] = r * kw + 2 * t;
        go[q] = r * (u32)p.groups;
    }
    // x: the thread's chunks of a step, rows clamped below b.
    auto load_x = [&](int j, int slot) {
        const int s = s_begin + j;
        const bool in = j < steps;
#pragma unroll
        for (int i = 0; i < BATCH * 8 / (32 * W); i++) {
            const int idx = threadIdx.x + i * 32 * W, r = idx >> 3, c = idx & 7;
            const int col = 64 * s + 8 * c;
            const bool valid = in && col < k;
            const bf16* src = p.x + (size_t)min(b0 + r, b - 1) * k + (valid ? col : 0);
            cp_async16(&xs[slot][r * 8 + (c ^ (r & 7))], (const uint4*)src, valid);
        }
    };
    // Weights of step j: words 2t, 2t + 1 of the lane's rows, and their group constants.
    auto load_w = [&](int j, uint2 (&wv)[Q], I4mRaw (&raw)[Q]) {
        const int s = s_begin + j;
        const int col = 64 * s + 16 * t;
        const bool valid = j < steps && col < k;
        const u32 grp = valid ? (u32)(col / p.group_size) : 0u;
#pragma unroll
        for (int q = 0; q < Q; q++) {
            u32 v[2] = {0u, 0u};
            ld_u32x2_if(v, p.w + wo[q] + 8u * (u32)s, valid);
            wv[q] = make_uint2(v[0], v[1]);
            raw[q].sz = __ldg(p.sz + go[q] + grp);
            raw[q].z = __ldg(p.z + go[q] + grp);
        }
    };

    float acc[TA][I4M_NB][4];
#pragma unroll
    for (int a = 0; a < TA; a++)
#pragma unroll
        for (int j = 0; j < I4M_NB; j++) acc[a][j][0] = acc[a][j][1] = acc[a][j][2] = acc[a][j][3] = 0.f;

#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        load_x(st, st);
        cp_async_commit();
    }
    uint2 wv[2][Q];
    I4mRaw raw[2][Q];
    load_w(0, wv[0], raw[0]);
    load_w(1, wv[1], raw[1]);

    for (int j0 = 0; j0 < steps; j0 += 2) { // block-uniform
#pragma unroll
        for (int d = 0; d < 2; d++) {
            const int j = j0 + d;
            if (j >= steps) break; // block-uniform
            cp_async_wait<STAGES - 2>();
            __syncthreads(); // step j's x is in; every warp is done with step j - 1's slot
            load_x(j + STAGES - 1, (j + STAGES - 1) % STAGES);
            cp_async_commit();
            Int4Group<false> gr[Q];
            uint2 w4[Q];
#pragma unroll
            for (int q = 0; q < Q; q++) {
                gr[q] = i4m_group(raw[d][q]);
                w4[q] = wv[d][q];
            }
            // Refill this ring slot with step j + 2's weights while the mmas run.
            load_w(j + 2, wv[d], raw[d]);
            const uint4* xt = xs[j % STAGES];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                // Word i's A fragments, [tile][half][a0..a3], and x at codes 16t + 8i .. +8 of
                // every B tile; then 2 TA I4M_NB mmas, TA I4M_NB apart on one accumulator.
                u32 af[TA][2][4];
#pragma unroll
                for (int a = 0; a < TA; a++) {
                    const u32 wl = i ? w4[2 * a].y : w4[2 * a].x, wh = i ? w4[2 * a + 1].y : w4[2 * a + 1].x;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        af[a][h][0] = int4_pair_of(wl, 2 * h, gr[2 * a]);
                        af[a][h][1] = int4_pair_of(wh, 2 * h, gr[2 * a + 1]);
                        af[a][h][2] = int4_pair_of(wl, 2 * h + 1, gr[2 * a]);
                        af[a][h][3] = int4_pair_of(wh, 2 * h + 1, gr[2 * a + 1]);
                    }
                }
                uint4 xq[I4M_NB];
#pragma unroll
                for (int nb = 0; nb < I4M_NB; nb++) xq[nb] = xt[(8 * nb + g) * 8 + ((2 * t + i) ^ g)];
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int a = 0; a < TA; a++)
#pragma unroll
                        for (int nb = 0; nb < I4M_NB; nb++) {
                            const u32* f = af[a][h];
                            mma_bf16_16816(acc[a][nb], f[0], f[1], f[2], f[3], h ? xq[nb].z : xq[nb].x,
                                           h ? xq[nb].w : xq[nb].y);
                        }
            }
        }
    }
    cp_async_wait<0>();
    i4m_store<TA, I4M_NB>(prm, acc, row0, b0, g, t);
}

// gemm_int4_mma_t{TA}w{W}: TA A tiles a warp, W warps a block, at least `blocks` blocks an SM
// (blocks of 128 x rows measured no faster, run 36e).
#define INT4_MMA(name, ta, nw, blocks)                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * nw, blocks) name(GemmInt4Params p) {              \
        gemm_int4_mma_impl<ta, nw>(p);                                                                   \
    }
INT4_MMA(gemm_int4_mma_t2w4, 2, 4, 2)
INT4_MMA(gemm_int4_mma_t1w4, 1, 4, 4)
INT4_MMA(gemm_int4_mma_t1w8, 1, 8, 2)
INT4_MMA(gemm_int4_mma_t2w8, 2, 8, 1)

// gemm_int4_mmas_t{TA}w{W}: the same product for weights whose groups hold whole 64-wide k-steps
// (the tile scales, p.tsz; k a multiple of 64), with the tile GEMV's arithmetic: the mma
// operands are the exact codes less their zero point, bf16 {q - z} (one subtract a pair,
// int4_less_zero), and each step's f32 sums are scaled by their row's group scale into the
// accumulators. So y is the product of the unrounded weights (q - z) s up to the order of the
// f32 sums, as the tile GEMV's is. Block, warp and lane roles are gemm_int4_mma's; x, the
// weights and the scales all go through one shared-memory ring of INT4_MMA_STAGES steps by
// cp.async, so a step's loads are STAGES - 1 steps ahead and no register holds them in flight.
// A stage (dynamic shared memory, int4_mmas_smem_bytes): x [BATCH rows][8 chunks] (chunk c of
// row r at c ^ (r & 7)), the block's weight rows [16 TA W][2 chunks] (row r's 32 bytes of the
// step: words 8 s .. 8 s + 7), and their scale | zero words [16 TA W / 16 tiles][8 g][2 h] as
// p.tsz holds them. Rows past n read row n - 1's weights (tile ceil(n / 16) - 1's scales) and x
// rows past b read row b - 1: their products land only in outputs never stored.
template <int TA, int W> __device__ __forceinline__ void gemm_int4_mmas_impl(const GemmInt4Params& prm) {
    constexpr int Q = 2 * TA;
    constexpr int BATCH = INT4_MMA_BATCH, STAGES = INT4_MMA_STAGES, NB = BATCH / 8;
    constexpr int BROWS = 16 * TA * W;          // weight rows a block
    constexpr int XC = BATCH * 8 / (32 * W);   // x chunks a thread copies a step
    constexpr int WC = BROWS * 2 / (32 * W);    // weight chunks a thread copies a step (TA)
    constexpr int SC = BROWS / 4;               // scale chunks a block copies a step
    constexpr int XS = BATCH * 8, WS = BROWS * 2, SS = BROWS / 4; // uint4s a stage holds of each
    static_assert(XC * 32 * W == BATCH * 8 && WC * 32 * W == BROWS * 2 && SC <= 32 * W,
                  "gemm_int4_mmas: whole chunks a thread");
    const GemvInt4Params& p = prm.g;
    extern __shared__ __align__(128) uint4 ring[]; // [stage][x XS | weights WS | scales SS]
    const int n = p.n, k = p.k, b = p.b;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int brow = blockIdx.x * BROWS, b0 = blockIdx.y * BATCH;
    const int total = k >> 6;
    const int s_begin = min(total, (int)blockIdx.z * prm.steps);
    const int steps = min(total, s_begin + prm.steps) - s_begin;
    // A step's group, s >> sh: group_size / 64 is a power of two, or one group spans k.
    const int sh = p.group_size >= k ? 31 : __ffs(p.group_size >> 6) - 1;
    const int last_tile = (n + 15) / 16 - 1;

    // Each thread's copy sources at step s_begin (x and weights advance 128 / 32 bytes a step,
    // the scales 64 bytes a group), and their places in a stage.
    // Thread chunk i of x is row xr + 4 W i (all of them xr mod 8), chunk xc.
    const uint4* xsrc[XC];
    const int xr = threadIdx.x >> 3, xc = threadIdx.x & 7, xdst = xr * 8 + (xc ^ (xr & 7));
#pragma unroll
    for (int i = 0; i < XC; i++)
        xsrc[i] = (const uint4*)(p.x + (size_t)min(b0 + xr + 4 * W * i, b - 1) * k + 64 * s_begin + 8 * xc);
    const uint4* wsrc[WC];
#pragma unroll
    for (int i = 0; i < WC; i++) {
        const int idx = threadIdx.x + i * 32 * W, r = idx >> 1;
        wsrc[i] = (const uint4*)(p.w + (size_t)min(brow + r, n - 1) * (k >> 3) + 8 * s_begin + 4 * (idx & 1));
    }
    const bool copies_scales = threadIdx.x < SC;
    const uint4* ssrc = (const uint4*)(p.tsz + (size_t)min(brow / 16 + (int)(threadIdx.x >> 2), last_tile) *
                                                   p.groups * 16 + 4 * (threadIdx.x & 3));
    auto load = [&](int j, int slot) { // step s_begin + j into ring slot `slot`; j < steps
        uint4* st = ring + slot * (XS + WS + SS);
#pragma unroll
        for (int i = 0; i < XC; i++) cp_async16(st + xdst + 32 * W * i, xsrc[i] + 8 * j, true);
#pragma unroll
        for (int i = 0; i < WC; i++) cp_async16(st + XS + threadIdx.x + i * 32 * W, wsrc[i] + 2 * j, true);
        if (copies_scales)
            cp_async16(st + XS + WS + threadIdx.x, ssrc + 4 * ((s_begin + j) >> sh), true);
    };

    float acc[TA][NB][4];
#pragma unroll
    for (int a = 0; a < TA; a++)
#pragma unroll
        for (int j = 0; j < NB; j++) acc[a][j][0] = acc[a][j][1] = acc[a][j][2] = acc[a][j][3] = 0.f;
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < steps) load(st, st);
        cp_async_commit();
    }
    for (int j0 = 0; j0 < steps; j0 += STAGES) { // block-uniform
#pragma unroll
        for (int d = 0; d < STAGES; d++) {
            const int j = j0 + d;
            if (j >= steps) break; // block-uniform
            cp_async_wait<STAGES - 2>();
            __syncthreads(); // step j is in; every warp is done with step j - 1's slot
            if (j + STAGES - 1 < steps) load(j + STAGES - 1, (d + STAGES - 1) % STAGES);
            cp_async_commit();
            const uint4* st = ring + d * (XS + WS + SS);
            const uint2* wt = (const uint2*)(st + XS) + warp * 16 * TA * 4;
            const u32* sct = (const u32*)(st + XS + WS) + warp * TA * 16;
            // The lane's rows 16 a + g + 8 h: their words 2t, 2t + 1, zero points and scales.
            uint2 w4[Q];
            u32 zz[Q];
            float sc[Q];
#pragma unroll
            for (int a = 0; a < TA; a++) {
                const uint2 v = *(const uint2*)(sct + a * 16 + 2 * g);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const u32 e = h ? v.y : v.x;
                    w4[2 * a + h] = wt[(16 * a + g + 8 * h) * 4 + t];
                    zz[2 * a + h] = (0x4300u + (e & 0xffu)) * 0x10001u;
                    sc[2 * a + h] = __uint_as_float(e & 0xffffff00u);
                }
            }
            // The step's A fragments, [tile][word i][half h][a0..a3] (codes 16t + 8i + 4h .. +4),
            // then per B tile its x (chunks 2t, 2t + 1 of row 8 nb + g), four mmas into a fresh
            // f32 sum and that sum scaled into the accumulators.
            u32 af[TA][2][2][4];
#pragma unroll
            for (int a = 0; a < TA; a++)
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const u32 wl = i ? w4[2 * a].y : w4[2 * a].x, wh = i ? w4[2 * a + 1].y : w4[2 * a + 1].x;
                        af[a][i][h][0] = int4_less_zero(wl, 2 * h, zz[2 * a]);
                        af[a][i][h][1] = int4_less_zero(wh, 2 * h, zz[2 * a + 1]);
                        af[a][i][h][2] = int4_less_zero(wl, 2 * h + 1, zz[2 * a]);
                        af[a][i][h][3] = int4_less_zero(wh, 2 * h + 1, zz[2 * a + 1]);
                    }
#pragma unroll
            for (int nb = 0; nb < NB; nb++) {
                const uint4 x0 = st[(8 * nb + g) * 8 + ((2 * t) ^ g)], x1 = st[(8 * nb + g) * 8 + ((2 * t + 1) ^ g)];
#pragma unroll
                for (int a = 0; a < TA; a++) {
                    float part[4];
                    const u32(&f)[2][2][4] = af[a];
                    mma_bf16_16816_first(part, f[0][0][0], f[0][0][1], f[0][0][2], f[0][0][3], x0.x, x0.y);
                    mma_bf16_16816(part, f[0][1][0], f[0][1][1], f[0][1][2], f[0][1][3], x0.z, x0.w);
                    mma_bf16_16816(part, f[1][0][0], f[1][0][1], f[1][0][2], f[1][0][3], x1.x, x1.y);
                    mma_bf16_16816(part, f[1][1][0], f[1][1][1], f[1][1][2], f[1][1][3], x1.z, x1.w);
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[a][nb][c] = fmaf(sc[2 * a + (c >> 1)], part[c], acc[a][nb][c]);
                }
            }
        }
    }
    cp_async_wait<0>();
    i4m_store<TA, NB>(prm, acc, brow + warp * 16 * TA, b0, g, t);
}

#define INT4_MMAS(name, ta, nw, blocks)                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * nw, blocks) name(GemmInt4Params p) {              \
        gemm_int4_mmas_impl<ta, nw>(p);                                                                  \
    }
INT4_MMAS(gemm_int4_mmas_t2w4, 2, 4, 2)
INT4_MMAS(gemm_int4_mmas_t1w4, 1, 4, 4)
INT4_MMAS(gemm_int4_mmas_t1w8, 1, 8, 2)
INT4_MMAS(gemm_int4_mmas_t2w8, 2, 8, 1)

// y[i] = bf16(sum over splits s of part[s, i]) for i < b n, the splits in order.
extern "C" __global__ void __launch_bounds__(INT4_DEQUANT_THREADS) gemm_int4_reduce(GemmInt4Params prm) {
    const size_t total = (size_t)prm.g.b * prm.g.n;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        float v = 0.f;
        for (int s = 0; s < prm.splits; s++) v += prm.part[(size_t)s * total + i];
        prm.g.y[i] = __float2bfloat16(v);
    }
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
