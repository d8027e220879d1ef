// gemm_int4_wgmma_*: the INT4 product of gemm_int4_mma (int4.cu) on Hopper's wgmma (sm_90a only):
// every weight dequantized in registers exactly as dequant_int4_bf16 writes it (bf16 of (q - z) s,
// int4_dequant), so y is the dequantize-then-GEMM product up to the order of the f32 sums. This
// file follows int4.cu and prefill_wgmma.cu in SOURCES and uses their dequantization, store and
// wgmma helpers.
//
// A block is WGS warpgroups and takes weight rows [64 WGS bx, +64 WGS) (64 a warpgroup, 16 a warp:
// the wgmma's A operand, dequantized into registers), activation rows [BATCH by, +BATCH) (its B
// operand, in shared memory, read by every warpgroup) and k-steps of 64 [steps bz, +steps). Each
// step, a warpgroup issues four wgmma.m64n128k16 (A from registers, B through a matrix descriptor)
// into 64 f32 accumulators a thread for each 128 activation rows: with BATCH 256 (`_b256`, one
// block an SM, 209 registers a thread) each weight is dequantized once for two wgmmas, where
// two blocks along the activations dequantized it twice (run 58: 256-row steps 3 % faster, the
// 8B gate/up product 138 → 123 µs). Activations, codes and group constants go through one ring
// of STAGES steps by cp.async: a stage is x [BATCH rows][64 bf16] in the 128-byte swizzle layout
// wgmma reads (row r at r * 128, its 16-byte chunk c at (c ^ (r & 7)) * 16; 8-row groups 1024
// bytes apart: SBO), then the codes [64 WGS rows][32 bytes] (row r's words 8 s .. 8 s + 7, its two
// 16-byte halves swapped on rows r with bit 2 set, so that a warp's reads of 8 rows hit 32 banks);
// the stages' group constants follow the last stage, [STAGES][4 WGS tiles][16 rows] words of the
// tile kernels' array tsz (a row's scale as f32 bits, its zero point in the low 8 bits; a tile's
// 16 words of one group are 64 contiguous bytes there). Loaded with the codes, they are in shared
// memory when the step starts: read from global memory one step ahead into registers instead, a
// thread waited for them at the end of every step (ncu, run 55: a tenth of the stall samples),
// and a group index divided out per step took another fifteenth; the loader counts groups.
//
// A's k order is wgmma's own (register a0 of k-step kk holds k 16 kk + 2t, +1 of row g), so lane t
// of a quad needs codes 2t, 2t + 1 of every packed word of its rows: it reads all eight words of
// the step (the four lanes of a quad read the same bytes) and takes pair t of each, (word >> 4t)
// & 0x000F000F, in the same single lop3 as the other kernels. The scale's bf16 pair (s_hi, s_lo)
// is split from the f32 scale as the host splits it for sz (split_scale), so each weight is
// dequant_int4_bf16's bf16. A step lies in one group (group_size a multiple of 64, or one group a
// row).
//
// Without PIPE a warpgroup dequantizes a whole step, issues its four wgmmas as one group and waits
// for them before the next step; the tensor cores stay busy with the SM's other warpgroups (two
// blocks of two warpgroups an SM; one warpgroup a block, four an SM, reading x from L2 each, and
// four warpgroups a block reading each stage of x once, were slower in runs 52–55 and are built
// no more). A ring slot is refilled one step after its last read. With PIPE each k-step's wgmma is
// its own group and the next k-step's A is dequantized into other registers while it runs (ptxas
// serialises wgmmas only when a register operand is written by another instruction within their
// group); at a step's end, a wait for all but the last three groups frees the registers of its
// first k-step and the ring slot of the step before, which is refilled then (the ring keeps one
// step of slack). (Blocks taking their k-steps rotated by block index, so that they read
// different k-steps of x at any one time, were slower too: run 55.)
//
// Rows past n read row n - 1 (tiles past the last read the last) and x rows past b read row
// b - 1: their products land only in outputs never stored. With splits > 1 block bz writes its
// f32 sums to part[bz] and gemm_int4_reduce adds them up; otherwise it writes y (i4m_store, as
// gemm_int4_mma does).
#include "common.cuh"

// A wgmma's n: the activation rows of one accumulator set (a block takes one or two).
#define I4W_N INT4_WGMMA_BATCH
static_assert(I4W_N == 128, "gemm_int4_wgmma: wgmma's n is 128");

// A row's group constants from its tsz word (f32 scale bits, zero point in the low 8 bits): the
// pair i4m_group makes of sz (s_hi, s_lo: split_scale's split) and z.
__device__ __forceinline__ Int4Group<false> i4w_group(u32 word) {
    const float s = __uint_as_float(word & 0xffffff00u);
    const __nv_bfloat16 hi = __float2bfloat16_rn(s);
    const __nv_bfloat16 lo = __float2bfloat16_rn(s - __bfloat162float(hi));
    const u32 z = 0x4300u + (word & 0xffu), zz = z | (z << 16);
    Int4Group<false> g;
    g.zz = *(const __nv_bfloat162*)&zz;
    g.s_hi = __bfloat162bfloat162(hi);
    g.s_lo = __bfloat162bfloat162(lo);
    return g;
}

// A thread's view of the ring (warp w of the block's warpgroups, lane (g, t)): its A
// rows R = 16 w + g and R + 8 of the block, their codes' offsets in a stage and their group
// constants' offset in a stage's (tile R / 16, words 2g, 2g + 1).
template <int STAGES, int WGS, int BATCH> struct I4wThread {
    static constexpr int X_BYTES = BATCH * 128;
    static constexpr int STAGE_BYTES = X_BYTES + 64 * WGS * 32, GC_BYTES = 64 * WGS * 4;
    u32 woff[2], goff, sw;
    int t;
    __device__ __forceinline__ I4wThread(int warp, int g, int t_) : t(t_) {
        const int r0 = 16 * warp + g;
        woff[0] = (u32)(X_BYTES + r0 * 32);
        woff[1] = (u32)(X_BYTES + (r0 + 8) * 32);
        goff = (u32)(STAGES * STAGE_BYTES + warp * 64 + 8 * g);
        sw = (u32)(((g >> 2) & 1) << 4);
    }
    // The group constants of step j's rows.
    __device__ __forceinline__ void groups(const unsigned char* sbase, int j, Int4Group<false> (&gr)[2]) const {
        const uint2 v = *(const uint2*)(sbase + goff + (u32)((j % STAGES) * GC_BYTES));
        gr[0] = i4w_group(v.x);
        gr[1] = i4w_group(v.y);
    }
    // The codes of step j: pair t of each of its rows' eight words, shifted down.
    __device__ __forceinline__ void codes(const unsigned char* sbase, int j, u32 (&wv)[2][8]) const {
        const u32 slot = (u32)((j % STAGES) * STAGE_BYTES);
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const uint4 v = *(const uint4*)(sbase + slot + woff[h] + (((u32)c << 4) ^ sw));
                wv[h][4 * c] = v.x >> (4 * t);
                wv[h][4 * c + 1] = v.y >> (4 * t);
                wv[h][4 * c + 2] = v.z >> (4 * t);
                wv[h][4 * c + 3] = v.w >> (4 * t);
            }
    }
};

// A of k-step kk: a0..a3 = (row g, k 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8).
__device__ __forceinline__ void i4w_dequant(int kk, const u32 (&wv)[2][8], const Int4Group<false> (&gr)[2], u32* a) {
#pragma unroll
    for (int e = 0; e < 4; e++) a[e] = int4_pair_of(wv[e & 1][2 * kk + (e >> 1)], 0, gr[e & 1]);
}

template <int STAGES, int WGS, bool PIPE, int BATCH>
__device__ __forceinline__ void gemm_int4_wgmma_impl(const GemmInt4Params& prm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BLOCK_ROWS = 64 * WGS, BLOCK_THREADS = 128 * WGS;
    // A stage of x and codes, then the stages' group constants (int4_wgmma_smem_bytes in lib.rs:
    // the same formula), x 1024-byte aligned in each stage.
    using Th = I4wThread<STAGES, WGS, BATCH>;
    constexpr int X_BYTES = Th::X_BYTES, STAGE_BYTES = Th::STAGE_BYTES, GC_BYTES = Th::GC_BYTES;
    constexpr int NH = BATCH / I4W_N; // accumulator sets: x rows [128 h, 128 h + 128) of the block's
    static_assert(BATCH % I4W_N == 0, "gemm_int4_wgmma: whole wgmma widths");
    static_assert(STAGE_BYTES % 1024 == 0, "gemm_int4_wgmma: x must stay 1024-byte aligned");
    constexpr int XC = BATCH * 8 / BLOCK_THREADS; // x chunks a thread copies a step
    constexpr int AHEAD = PIPE ? STAGES - 2 : STAGES - 1; // steps in flight in the ring
    static_assert(AHEAD >= 1, "gemm_int4_wgmma: too few stages");
    const GemvInt4Params& p = prm.g;
    extern __shared__ __align__(1024) unsigned char i4w_smem[];
    const u32 raw_base = (u32)__cvta_generic_to_shared(i4w_smem);
    const u32 base = (raw_base + 1023u) & ~1023u;
    const unsigned char* sbase = i4w_smem + (base - raw_base);
    const int n = p.n, k = p.k, b = p.b;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int brow = blockIdx.x * BLOCK_ROWS, b0 = blockIdx.y * BATCH;
    const int total = k >> 6;
    const int s_begin = min(total, (int)blockIdx.z * prm.steps);
    const int steps = min(total, s_begin + prm.steps) - s_begin;
    const u32 kw = (u32)(k >> 3);

    // Copies: x chunks (row xr + BLOCK_THREADS / 8 i, chunk xc), i < XC, all with the swizzle of
    // row xr; one codes chunk (row tid / 2, half tid % 2); threads tid < BLOCK_ROWS / 4 one
    // 16-byte chunk of the group constants (tile tid / 4, chunk tid % 4: 16 tid in the stage's).
    const int xr = tid >> 3, xc = tid & 7;
    const u32 xdst = (u32)(xr * 128 + ((xc ^ (xr & 7)) << 4));
    // x element offsets (32-bit: the host checks b k fits), half the registers of pointers.
    u32 xsrc[XC];
#pragma unroll
    for (int i = 0; i < XC; i++)
        xsrc[i] = (u32)min(b0 + xr + BLOCK_THREADS / 8 * i, b - 1) * (u32)k + (u32)(64 * s_begin + 8 * xc);
    const int wr = tid >> 1, wh = tid & 1;
    const u32 wdst = (u32)(X_BYTES + wr * 32 + ((wh ^ ((wr >> 2) & 1)) << 4));
    const u32* wsrc = p.w + (size_t)min(brow + wr, n - 1) * kw + 8 * s_begin + 4 * wh;
    const u32 gring = base + (u32)(STAGES * STAGE_BYTES);
    const bool gcopy = tid < BLOCK_ROWS / 4;
    const u32* gsrc = p.tsz + (size_t)min(brow / 16 + (tid >> 2), (n + 15) / 16 - 1) * (u32)p.groups * 16u + 4 * (tid & 3);
    // The group of the next step load() copies and its steps left there (load takes steps in
    // order); a group is group_size / 64 steps (one group a row: at least the row's steps).
    const int spg = max(1, p.group_size >> 6);
    int lgrp = s_begin / spg, lleft = spg - s_begin % spg;
    auto load = [&](int j, int slot) { // step s_begin + j into ring slot `slot`; j < steps, in order
        const u32 st = base + (u32)(slot * STAGE_BYTES);
#pragma unroll
        for (int i = 0; i < XC; i++)
            pf_cp_async16(st + xdst + BLOCK_THREADS / 8 * 128 * i, p.x + (xsrc[i] + 64u * (u32)j), true);
        pf_cp_async16(st + wdst, wsrc + 8 * j, true);
        if (gcopy) pf_cp_async16(gring + (u32)(slot * GC_BYTES + 16 * tid), gsrc + 16u * (u32)lgrp, true);
        if (--lleft == 0) {
            lgrp++;
            lleft = spg;
        }
    };

    // The thread's A rows (warpgroup warp / 4, warp warp % 4) and where their codes and group
    // constants lie in the ring.
    const int wg = warp >> 2, wl = warp & 3;
    const Th th(warp, g, t);

    u32 wv[2][8], a[16];
    float acc[NH][64];
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int i = 0; i < 64; i++) acc[h][i] = 0.f;
    // k-step kk of step j on accumulator set h: the wgmma's B is x rows 128 h .. of the slot (16
    // KiB on: 16 of its 1,024-byte 8-row groups).
    auto mma = [&](int j, int kk) {
        const u64 dx = pw_desc(base + (u32)((j % STAGES) * STAGE_BYTES), 16, 1024);
#pragma unroll
        for (int h = 0; h < NH; h++) pw_mma_rs<false>(acc[h], a + 4 * kk, dx + (u64)(2 * kk + h * (I4W_N * 128 >> 4)));
    };
    auto pin = [&]() {
#pragma unroll
        for (int h = 0; h < NH; h++) pw_pin(acc[h]);
    };
#pragma unroll
    for (int st = 0; st < AHEAD; st++) {
        if (st < steps) load(st, st);
        cp_async_commit();
    }
    // Step j's x, codes and group constants are in its slot for everyone: this thread's copies
    // waited for and fenced for the async proxy, then the block's barrier; then the slot read
    // last at step j - 1 (PIPE: j - 2) is refilled.
    auto arrive = [&](int j) {
        cp_async_wait<AHEAD - 1>();
        pw_fence_proxy();
        __syncthreads();
        if (j + AHEAD < steps) load(j + AHEAD, (j + AHEAD) % STAGES);
        cp_async_commit();
    };
    if constexpr (!PIPE) {
        for (int j = 0; j < steps; j++) { // block-uniform
            arrive(j);
            Int4Group<false> gr[2];
            th.groups(sbase, j, gr);
            th.codes(sbase, j, wv);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) i4w_dequant(kk, wv, gr, a + 4 * kk);
            pw_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) mma(j, kk);
            pw_wgmma_commit();
            pw_wgmma_wait<0>();
            pin();
        }
    } else if (steps > 0) {
        // Each k-step's wgmma is its own group; k-step kk + 1's A is dequantized while kk's runs
        // (other registers), and k-step 0 of step j + 1 once step j's k-step 0 has finished
        // (wait for all but the last three groups), which also retires step j - 1 entirely.
        arrive(0);
        Int4Group<false> gr[2];
        th.groups(sbase, 0, gr);
        th.codes(sbase, 0, wv);
        i4w_dequant(0, wv, gr, a);
        for (int j = 0; j < steps; j++) { // block-uniform
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                pw_wgmma_fence();
                mma(j, kk);
                pw_wgmma_commit();
                if (kk < 3) i4w_dequant(kk + 1, wv, gr, a + 4 * (kk + 1));
            }
            if (j + 1 < steps) {
                pw_wgmma_wait<3>();
                arrive(j + 1);
                th.groups(sbase, j + 1, gr);
                th.codes(sbase, j + 1, wv);
                i4w_dequant(0, wv, gr, a);
            }
        }
        pw_wgmma_wait<0>();
        pin();
    }
    cp_async_wait<0>();
    // Accumulator i = 4 nb + c is (row r0 + 8 (c >> 1), x row 8 nb + 2t + (c & 1)): i4m_store's
    // [1][16][4] layout, for x rows b0 + 128 h.
#pragma unroll
    for (int h = 0; h < NH; h++)
        i4m_store<1, 16>(prm, *reinterpret_cast<const float(*)[1][16][4]>(acc[h]), brow + 64 * wg + 16 * wl,
                         b0 + I4W_N * h, g, t);
#endif
}

// gemm_int4_wgmma_{s,p}{STAGES}[_b256]: two warpgroups a block of 128 activation rows, two
// blocks an SM; `p`: pipelined (PIPE); `_b256`: 256 activation rows a block (two accumulator sets,
// each weight dequantized once for both), one block an SM. wgmma exists only on sm_90a; the host
// never launches these elsewhere.
#define INT4_WGMMA(name, stages, pipe, batch, blocks)                                                   \
    extern "C" __global__ void __launch_bounds__(256, blocks) name(GemmInt4Params p) {                \
        gemm_int4_wgmma_impl<stages, 2, pipe, batch>(p);                                                \
    }
INT4_WGMMA(gemm_int4_wgmma_s3, 3, false, 128, 2)
INT4_WGMMA(gemm_int4_wgmma_p3, 3, true, 128, 2)
INT4_WGMMA(gemm_int4_wgmma_p4, 4, true, 128, 2)
INT4_WGMMA(gemm_int4_wgmma_p4_b256, 4, true, 256, 1)
INT4_WGMMA(gemm_int4_wgmma_p6_b256, 6, true, 256, 1)
