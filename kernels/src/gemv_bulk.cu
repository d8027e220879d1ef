// Bulk-copy tile GEMVs (sm_90+) for batches of at most 8 rows: y[b, n] = sum_k x[b, k] w[n, k],
// w row-major [n, k] (HF Linear layout), with E4M3 operands (gemv_fp8_bulk_*, fp8.cu's
// GemvFp8Params: y = bf16(sum * xs[b] * ws[n])) or bf16 ones (gemv_bf16_bulk_*, GemvParams:
// y = bf16(sum)). Follows fp8.cu (its E4M3 mma) and prefill_mma.cu (its bf16 mma).
//
// The work is gemv_fp8_t16_impl's: a block loops over 16-row tiles blockIdx.x, + gridDim.x, ...;
// warp w takes the contiguous 64-byte k-steps [w span, (w + 1) span) of every tile; one step is
// one mma pair on 16 weight rows (A) and the batch's 8 x rows (B), lane (g = lane / 4,
// t = lane % 4) supplying 16 bytes of rows g and g + 8 and of x row g at byte 64 s + 16 t (words
// 0-1 feed the first mma, 2-3 the second: A and B map each logical k to one physical k). What
// differs is how the weights arrive: the copy engine brings them into a ring of S stages a warp
// in shared memory, a stage being J consecutive steps of the warp's span for the tile's 16 rows
// (16 cp.async.bulk copies of J * 64 contiguous bytes, one a row, issued by lanes 0-15 and counted
// on the stage's mbarrier). So up to S * J KiB of a warp's weights are in flight without a
// register each, and each copy is a contiguous run of a row rather than 64 bytes a lane quad. The
// ring runs on across the block's tiles (stage q of a warp's stream is stage q % spt of its
// tile q / spt). Rows sit BULK_ROW_BYTES(J) apart (J * 64 rounded to 64 mod 128), so the 8 lanes
// of a 16-byte shared-load phase (rows g, g + 1, 4 lanes each) hit 8 distinct 16-byte bank
// groups. The activations are read through L1 before each stage's wait.
//
// Sums: a warp adds its steps in increasing order on two f32 chains (each step's first and second
// mma), then chain 0 + chain 1; the warps' sums are added in warp order. For E4M3 these are
// gemv_fp8_t16_impl's mmas on the same operands in the same order, so the outputs are its bits;
// for bf16 they do not depend on the batch size or on J and S.
#define BULK_ROW_BYTES(j) ((j) * 64 + (((j) & 1) ? 0 : 64))
#define BULK_SMEM_BYTES(j, s) (GEMV_WARPS * (s) * 16 * BULK_ROW_BYTES(j))

// The operands' kind: the mma of one 16-byte word quad, and the output of a finished sum.
struct BulkFp8 {
    const GemvFp8Params& p;
    __device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) const {
#if __CUDA_ARCH__ >= 900
        mma_fp8_16832(c, a0, a1, a2, a3, b0, b1);
#endif
    }
    __device__ __forceinline__ void store(int bb, int row, float v) const {
        p.y[(size_t)bb * p.n + row] = __float2bfloat16(v * p.x_scales[bb] * p.w_scales[row]);
    }
};
struct BulkBf16 {
    const GemvParams& p;
    __device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) const {
        const u32 a[4] = {a0, a1, a2, a3};
        mma_bf16(c, a, b0, b1);
    }
    __device__ __forceinline__ void store(int bb, int row, float v) const {
        ((bf16*)p.y)[(size_t)bb * p.n + row] = __float2bfloat16(v);
    }
};

template <int J, int S, typename Kind>
__device__ __forceinline__ void gemv_bulk_impl(const Kind kind, const unsigned char* xp, const unsigned char* wp,
                                               int b, int n, int k_bytes) {
#if __CUDA_ARCH__ >= 900
    constexpr int RS = BULK_ROW_BYTES(J), STAGE = 16 * RS;
    extern __shared__ __align__(128) unsigned char bulk_ring[]; // [warp][stage][row 16][RS]
    __shared__ __align__(16) float red[2][GEMV_WARPS * 128];     // [tile parity][warp][row 16][batch 8]
    __shared__ __align__(8) unsigned long long bars[GEMV_WARPS][S];
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (u32)BULK_SMEM_BYTES(J, S)) __trap(); // the host sized the launch for another ring
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int ntiles = (n + 15) >> 4, nsteps = k_bytes >> 6;
    const int span = (nsteps + GEMV_WARPS - 1) / GEMV_WARPS;
    const int s_begin = min(nsteps, warp * span);
    const int cnt = min(nsteps, s_begin + span) - s_begin;
    const int spt = (span + J - 1) / J; // stages a tile, the same for every warp
    const int my_tiles = (ntiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    const int total = my_tiles * spt;   // stages in this warp's stream (the same for every warp)
    const u32 ring = (u32)__cvta_generic_to_shared(bulk_ring + warp * S * STAGE);
    const u32 bar0 = (u32)__cvta_generic_to_shared(&bars[warp][0]);
    if (lane == 0) {
#pragma unroll
        for (int s = 0; s < S; s++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar0 + 8 * s) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncwarp();
    // Stage q of the stream into slot q % S: lane 0 arms the barrier with the bytes to come (none
    // when the warp has no steps there: the phase then completes at the arrival), lanes 0-15
    // copy their row's run (rows past n read row n - 1: their sums are never stored).
    auto issue = [&](int q) {
        const int tile = (int)blockIdx.x + (q / spt) * (int)gridDim.x;
        const int j0 = (q % spt) * J;
        const int nj = max(0, min(J, cnt - j0));
        const u32 bar = bar0 + 8 * (q % S), bytes = 64u * (u32)nj;
        if (lane == 0)
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(16 * bytes)
                         : "memory");
        __syncwarp();
        if (lane < 16 && nj > 0) {
            const size_t row = (size_t)min(16 * tile + lane, n - 1);
            const unsigned char* src = wp + row * (size_t)k_bytes + 64 * (size_t)(s_begin + j0);
            const u32 dst = ring + (q % S) * STAGE + lane * RS;
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                "l"(src), "r"(bytes), "r"(bar)
                : "memory");
        }
    };
    // The weights, which no kernel writes, stream in before pdl_wait(); the activations after it.
    for (int q = 0; q < min(S, total); q++) issue(q);
    pdl_wait();
    pdl_trigger();
    const unsigned char* x = xp + (size_t)min(g, b - 1) * k_bytes + 64 * (size_t)s_begin + 16 * t;
    float acc[2][4];
#pragma unroll
    for (int c = 0; c < 4; c++) acc[0][c] = acc[1][c] = 0.f;
    for (int q = 0; q < total; q++) {
        const int c = q % spt, j0 = c * J;
        const int nj = max(0, min(J, cnt - j0)); // warp-uniform
        uint4 xv[J];
#pragma unroll
        for (int jj = 0; jj < J; jj++)
            if (jj < nj) xv[jj] = __ldg((const uint4*)(x + 64 * (j0 + jj)));
        const u32 bar = bar0 + 8 * (q % S), parity = (u32)(q / S) & 1u;
        u32 done;
        do {
            asm volatile(
                "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                : "=r"(done)
                : "r"(bar), "r"(parity)
                : "memory");
        } while (!done);
        const unsigned char* st = bulk_ring + (warp * S + q % S) * STAGE;
#pragma unroll
        for (int jj = 0; jj < J; jj++) {
            if (jj < nj) {
                const uint4 a0 = *(const uint4*)(st + g * RS + 64 * jj + 16 * t);
                const uint4 a1 = *(const uint4*)(st + (g + 8) * RS + 64 * jj + 16 * t);
                kind.mma(acc[0], a0.x, a1.x, a0.y, a1.y, xv[jj].x, xv[jj].y);
                kind.mma(acc[1], a0.z, a1.z, a0.w, a1.w, xv[jj].z, xv[jj].w);
            }
        }
        // Every lane's reads of the slot are done (their values fed the mmas) before the copy
        // engine writes it again.
        __syncwarp();
        if (q + S < total) {
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            issue(q + S);
        }
        if (c == spt - 1) {
            // The tile's last stage: c0, c1 = (row g, batch 2t, 2t + 1), c2, c3 = (row g + 8, the
            // same batches). One barrier a tile: red[parity] is written again two tiles on, after
            // the next barrier, which every thread reaches only once done reading it below.
            const int tile = (int)blockIdx.x + (q / spt) * (int)gridDim.x;
            float* rp = red[(q / spt) & 1];
            float* r = rp + warp * 128;
            *(float2*)&r[g * 8 + 2 * t] = make_float2(acc[0][0] + acc[1][0], acc[0][1] + acc[1][1]);
            *(float2*)&r[(g + 8) * 8 + 2 * t] = make_float2(acc[0][2] + acc[1][2], acc[0][3] + acc[1][3]);
            __syncthreads();
            for (int o = threadIdx.x; o < 128; o += blockDim.x) {
                // o = (batch bb, row rr) with the row fastest, so that y's stores are contiguous.
                const int bb = o >> 4, rr = o & 15;
                const int row = 16 * tile + rr;
                if (bb < b && row < n) {
                    float v = rp[rr * 8 + bb];
#pragma unroll
                    for (int w = 1; w < GEMV_WARPS; w++) v += rp[w * 128 + rr * 8 + bb];
                    kind.store(bb, row, v);
                }
            }
#pragma unroll
            for (int e = 0; e < 4; e++) acc[0][e] = acc[1][e] = 0.f;
        }
    }
#else
    __trap(); // bulk copies need sm_90; the backend runs these kernels only there
#endif
}

// gemv_{fp8,bf16}_bulk_j{J}_s{S}: J k-steps a stage, S stages a warp (lib.rs BULK_GEMVS, which
// sizes the launch's dynamic shared memory; the kernel traps on less). pdl_wait() comes after
// the first copies (PDL_KERNELS).
#define FP8_BULK(name, j, s)                                                                        \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 1) name(GemvFp8Params p) {               \
        gemv_bulk_impl<j, s>(BulkFp8{p}, p.x, p.w, p.b, p.n, p.k);                                      \
    }
#define BF16_BULK(name, j, s)                                                                       \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 1) name(GemvParams p) {                  \
        gemv_bulk_impl<j, s>(BulkBf16{p}, (const unsigned char*)p.x, (const unsigned char*)p.w, p.b, p.n, \
                             2 * p.k);                                                              \
    }
FP8_BULK(gemv_fp8_bulk_j4_s5, 4, 5)
FP8_BULK(gemv_fp8_bulk_j2_s8, 2, 8)
FP8_BULK(gemv_fp8_bulk_j8_s2, 8, 2)
FP8_BULK(gemv_fp8_bulk_j4_s2, 4, 2)
BF16_BULK(gemv_bf16_bulk_j4_s5, 4, 5)
BF16_BULK(gemv_bf16_bulk_j2_s8, 2, 8)
BF16_BULK(gemv_bf16_bulk_j8_s2, 8, 2)
BF16_BULK(gemv_bf16_bulk_j4_s2, 4, 2)
