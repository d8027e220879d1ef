// gemm_int4_wgmma_*: the INT4 product of gemm_int4_mma (int4.cu) on Hopper's wgmma (sm_90a only):
// every weight dequantized in registers exactly as dequant_int4_bf16 writes it (bf16 of (q - z) s,
// int4_dequant), so y is the dequantize-then-GEMM product up to the order of the f32 sums. This
// file follows int4.cu and prefill_wgmma.cu in SOURCES and uses their dequantization, store and
// wgmma helpers.
//
// A block is WGS warpgroups and takes weight rows [64 WGS bx, +64 WGS) (64 a warpgroup, 16 a warp:
// the wgmma's A operand, dequantized into registers), activation rows [128 by, +128) (its B
// operand, in shared memory, read by every warpgroup) and k-steps of 64 [steps bz, +steps). Each
// step, a warpgroup issues four wgmma.m64n128k16 (A from registers, B through a matrix descriptor)
// into 64 f32 accumulators a thread. Activations and codes go through one ring of STAGES steps by
// cp.async: a stage is x [128 rows][64 bf16] in the 128-byte swizzle layout wgmma reads (row r at
// r * 128, its 16-byte chunk c at (c ^ (r & 7)) * 16; 8-row groups 1024 bytes apart: SBO), then
// the codes [64 WGS rows][32 bytes] (row r's words 8 s .. 8 s + 7, its two 16-byte halves swapped
// on rows r with bit 2 set, so that a warp's reads of 8 rows hit 32 banks).
//
// A's k order is wgmma's own (register a0 of k-step kk holds k 16 kk + 2t, +1 of row g), so lane t
// of a quad needs codes 2t, 2t + 1 of every packed word of its rows: it reads all eight words of
// the step (the four lanes of a quad read the same bytes) and takes pair t of each, (word >> 4t)
// & 0x000F000F, in the same single lop3 as the other kernels. Group constants (s_hi, s_lo, z) come
// from sz / z one step ahead; a step lies in one group (group_size a multiple of 64, or one group
// a row).
//
// Without PIPE a warpgroup dequantizes a whole step, issues its four wgmmas as one group and waits
// for them before the next step; the tensor cores stay busy with the SM's other warpgroups (WGS = 2:
// two blocks an SM for rings of up to 4 stages; WGS = 1, four blocks an SM, each warpgroup on its
// own and reading x from L2 itself; WGS = 4, one block each stage of x read by four warpgroups,
// measured slower in runs 52–54 and built no more). A ring slot is refilled one step
// after its last read. With PIPE each k-step's wgmma is its own group and the next k-step's A is
// dequantized into other registers while it runs (ptxas serialises wgmmas only when a register
// operand is written by another instruction within their group); at a step's end, a wait for all
// but the last three groups frees the registers of its first k-step and the ring slot of the step
// before, which is refilled then (the ring keeps one step of slack).
//
// With ROT a block takes its steps rotated, from step bx mod steps on (wrapping), so that the
// blocks of a product read different k-steps of x at any one time rather than all the same 16
// KiB from the same L2 slices; the sums come in another order (y is the same product up to it).
//
// Rows past n read row n - 1 and x rows past b read row b - 1: their products land only in outputs
// never stored. With splits > 1 block bz writes its f32 sums to part[bz] and gemm_int4_reduce adds
// them up; otherwise it writes y (i4m_store, as gemm_int4_mma does).
#include "common.cuh"

#define I4W_BATCH INT4_WGMMA_BATCH
#define I4W_X_BYTES (I4W_BATCH * 128)
static_assert(I4W_BATCH == 128, "gemm_int4_wgmma: wgmma's n is 128");

template <int STAGES, int WGS, bool PIPE, bool ROT>
__device__ __forceinline__ void gemm_int4_wgmma_impl(const GemmInt4Params& prm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BLOCK_ROWS = 64 * WGS, BLOCK_THREADS = 128 * WGS;
    // A stage (int4_wgmma_smem_bytes in lib.rs: the same formula), x 1024-byte aligned in each.
    constexpr int STAGE_BYTES = I4W_X_BYTES + BLOCK_ROWS * 32;
    static_assert(STAGE_BYTES % 1024 == 0, "gemm_int4_wgmma: x must stay 1024-byte aligned");
    constexpr int XC = I4W_BATCH * 8 / BLOCK_THREADS; // x chunks a thread copies a step
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
    const int brow = blockIdx.x * BLOCK_ROWS, b0 = blockIdx.y * I4W_BATCH;
    const int total = k >> 6;
    const int s_begin = min(total, (int)blockIdx.z * prm.steps);
    const int steps = min(total, s_begin + prm.steps) - s_begin;
    const u32 kw = (u32)(k >> 3);
    // The block's j-th step, relative to s_begin (ROT: rotated by bx mod steps).
    const int rot = ROT && steps > 0 ? (int)(blockIdx.x % (unsigned)steps) : 0;
    auto kstep = [&](int j) { return j + rot < steps ? j + rot : j + rot - steps; };

    // Copies: x chunks (row xr + BLOCK_THREADS / 8 i, chunk xc), i < XC, all with the swizzle of
    // row xr; one codes chunk (row tid / 2, half tid % 2).
    const int xr = tid >> 3, xc = tid & 7;
    const u32 xdst = (u32)(xr * 128 + ((xc ^ (xr & 7)) << 4));
    // x element offsets (32-bit: the host checks b k fits), half the registers of pointers.
    u32 xsrc[XC];
#pragma unroll
    for (int i = 0; i < XC; i++)
        xsrc[i] = (u32)min(b0 + xr + BLOCK_THREADS / 8 * i, b - 1) * (u32)k + (u32)(64 * s_begin + 8 * xc);
    const int wr = tid >> 1, wh = tid & 1;
    const u32 wdst = (u32)(I4W_X_BYTES + wr * 32 + ((wh ^ ((wr >> 2) & 1)) << 4));
    const u32* wsrc = p.w + (size_t)min(brow + wr, n - 1) * kw + 8 * s_begin + 4 * wh;
    auto load = [&](int j, int slot) { // step s_begin + kstep(j) into ring slot `slot`; j < steps
        const u32 st = base + (u32)(slot * STAGE_BYTES);
        const int q = kstep(j);
#pragma unroll
        for (int i = 0; i < XC; i++)
            pf_cp_async16(st + xdst + BLOCK_THREADS / 8 * 128 * i, p.x + (xsrc[i] + 64u * (u32)q), true);
        pf_cp_async16(st + wdst, wsrc + 8 * q, true);
    };

    // The thread's A rows: R and R + 8 of the block (warpgroup warp / 4, warp warp % 4), their
    // codes' offsets in a stage and their group constants' offsets.
    const int wg = warp >> 2, wl = warp & 3;
    const int r0 = 64 * wg + 16 * wl + g;
    const u32 sw = (u32)(((g >> 2) & 1) << 4);
    const u32 woff[2] = {(u32)(I4W_X_BYTES + r0 * 32), (u32)(I4W_X_BYTES + (r0 + 8) * 32)};
    u32 go[2];
#pragma unroll
    for (int h = 0; h < 2; h++) go[h] = (u32)min(brow + r0 + 8 * h, n - 1) * (u32)p.groups;
    auto load_raw = [&](int j, I4mRaw (&raw)[2]) {
        const u32 grp = (u32)((64 * (s_begin + kstep(j))) / p.group_size);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            raw[h].sz = __ldg(p.sz + go[h] + grp);
            raw[h].z = __ldg(p.z + go[h] + grp);
        }
    };

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;
#pragma unroll
    for (int st = 0; st < AHEAD; st++) {
        if (st < steps) load(st, st);
        cp_async_commit();
    }
    I4mRaw raw[2] = {{0u, 0u}, {0u, 0u}};
    if (steps > 0) load_raw(0, raw);
    // The thread's codes of step j: pair t of each of its rows' eight words, shifted down.
    auto read_codes = [&](int j, u32 (&wv)[2][8]) {
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
    };
    // A of k-step kk: a0..a3 = (row g, k 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8).
    auto dequant = [&](int kk, const u32 (&wv)[2][8], const Int4Group<false> (&gr)[2], u32* a) {
#pragma unroll
        for (int e = 0; e < 4; e++) a[e] = int4_pair_of(wv[e & 1][2 * kk + (e >> 1)], 0, gr[e & 1]);
    };
    // Step j's x and codes are in its slot for everyone: this thread's copies waited for and
    // fenced for the async proxy, then the block's barrier; then the slot read last at step
    // j - 1 (PIPE: j - 2) is refilled.
    auto arrive = [&](int j) {
        cp_async_wait<AHEAD - 1>();
        pw_fence_proxy();
        __syncthreads();
        if (j + AHEAD < steps) load(j + AHEAD, (j + AHEAD) % STAGES);
        cp_async_commit();
    };
    u32 wv[2][8], a[16];
    if constexpr (!PIPE) {
        for (int j = 0; j < steps; j++) { // block-uniform
            arrive(j);
            const Int4Group<false> gr[2] = {i4m_group(raw[0]), i4m_group(raw[1])};
            if (j + 1 < steps) load_raw(j + 1, raw);
            read_codes(j, wv);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) dequant(kk, wv, gr, a + 4 * kk);
            pw_wgmma_fence();
            const u64 dx = pw_desc(base + (u32)((j % STAGES) * STAGE_BYTES), 16, 1024);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) pw_mma_rs<false>(acc, a + 4 * kk, dx + (u64)(2 * kk));
            pw_wgmma_commit();
            pw_wgmma_wait<0>();
            pw_pin(acc);
        }
    } else if (steps > 0) {
        // Each k-step's wgmma is its own group; k-step kk + 1's A is dequantized while kk's runs
        // (other registers), and k-step 0 of step j + 1 once step j's k-step 0 has finished
        // (wait for all but the last three groups), which also retires step j - 1 entirely.
        arrive(0);
        Int4Group<false> gr[2] = {i4m_group(raw[0]), i4m_group(raw[1])};
        if (1 < steps) load_raw(1, raw);
        read_codes(0, wv);
        dequant(0, wv, gr, a);
        for (int j = 0; j < steps; j++) { // block-uniform
            const u64 dx = pw_desc(base + (u32)((j % STAGES) * STAGE_BYTES), 16, 1024);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                pw_wgmma_fence();
                pw_mma_rs<false>(acc, a + 4 * kk, dx + (u64)(2 * kk));
                pw_wgmma_commit();
                if (kk < 3) dequant(kk + 1, wv, gr, a + 4 * (kk + 1));
            }
            if (j + 1 < steps) {
                pw_wgmma_wait<3>();
                arrive(j + 1);
                gr[0] = i4m_group(raw[0]);
                gr[1] = i4m_group(raw[1]);
                if (j + 2 < steps) load_raw(j + 2, raw);
                read_codes(j + 1, wv);
                dequant(0, wv, gr, a);
            }
        }
        pw_wgmma_wait<0>();
        pw_pin(acc);
    }
    cp_async_wait<0>();
    // Accumulator i = 4 nb + c is (row r0 + 8 (c >> 1), x row 8 nb + 2t + (c & 1)): i4m_store's
    // [1][16][4] layout.
    i4m_store<1, 16>(prm, *reinterpret_cast<const float(*)[1][16][4]>(acc), brow + 64 * wg + 16 * wl, b0, g, t);
#endif
}

// gemm_int4_wgmma_{s,p}{STAGES}[_w{WGS}][r]: at least `blocks` blocks an SM; `p`: pipelined (PIPE);
// `r`: steps rotated (ROT). wgmma exists only on sm_90a; the host never launches these elsewhere.
#define INT4_WGMMA(name, stages, wgs, pipe, rot, blocks)                                                 \
    extern "C" __global__ void __launch_bounds__(128 * wgs, blocks) name(GemmInt4Params p) {             \
        gemm_int4_wgmma_impl<stages, wgs, pipe, rot>(p);                                                 \
    }
INT4_WGMMA(gemm_int4_wgmma_s3, 3, 2, false, false, 2)
INT4_WGMMA(gemm_int4_wgmma_p3, 3, 2, true, false, 2)
INT4_WGMMA(gemm_int4_wgmma_p4, 4, 2, true, false, 2)
INT4_WGMMA(gemm_int4_wgmma_p3r, 3, 2, true, true, 2)
INT4_WGMMA(gemm_int4_wgmma_p4r, 4, 2, true, true, 2)
// One warpgroup a block, four an SM: no barrier between warpgroups, each reads x from L2 itself.
INT4_WGMMA(gemm_int4_wgmma_p3_w1, 3, 1, true, false, 4)
