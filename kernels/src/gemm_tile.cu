// gemm_bf16_tile_b{B}_s{S}: y[b, n] = x[b, k] . w[n, k]^T in bf16 for the skinny products of decode
// steps past the GEMV's rows (9 to 64), where cuBLAS streams the weights at 2.2-3.4 TB/s on the 8B
// shapes (run 42a: o, q/k/v, down at 32 rows). int4.cu's gemm_int4_mma scheme with bf16 weights,
// so no dequantization: a block of GEMM_TILE_WARPS warps takes weight rows
// [GEMM_TILE_ROWS bx, +GEMM_TILE_ROWS), x rows [B by, +B) and, with S > 1, the k-steps of 64 of
// split bz (a cluster of the S blocks of one tile, 1 x 1 x S); warp w takes 16 GT_TA weight rows as
// GT_TA 16-row mma A tiles against all the block's x rows as 8-column B tiles.
//
// Lane (g = lane / 4, t = lane % 4) loads, per step s, 32 bytes of each of its weight rows
// g + 8q (q < 2 GT_TA) at element 64 s + 16 t straight into registers, two steps ahead: bf16
// pairs P0..P7 of elements 16 t + 2j, +1. The step's mma m (m < 4) takes pairs P(2m) and P(2m + 1)
// as a0 / a2 (row g) and a1 / a3 (row g + 8) and, as b0 / b1, x's elements 16 t + 4m .. +4 of
// x row 8 nb + g: A and B map each logical k of the mma to the same physical k, so the product is
// the matrix product with its k summed in another order. x goes through shared memory in a ring
// of 3-4 steps (int4.cu's x_step_to_smem: 16-byte chunk c of x row r stored at chunk c ^ (r & 7),
// so that a quarter-warp's 16-byte reads hit 32 banks).
//
// Rows past n read row n - 1 and x rows past b read row b - 1: their products land only in outputs
// never stored. k is a multiple of 16 (the host checks): a lane's 16 elements of a step are all
// inside k or all past it; past it the weights are zeros and x is zero-filled.
//
// Sums: each block adds its steps in increasing order (per output, one f32 chain of mmas). With
// S == 1 the block writes y. With S > 1 every block of the cluster stores its sums in its shared
// memory, the cluster synchronises, and block r adds up rows [r R / S, (r + 1) R / S) of the tile
// over the S blocks in rank order (distributed shared memory), then writes y; a second cluster
// barrier keeps every block's shared memory alive until the others have read it. y[bb, n] does
// not depend on how many x rows the product has.

#define GT_TA 2
#define GT_ROWS (16 * GT_TA * GEMM_TILE_WARPS)

#if GT_ROWS != GEMM_TILE_ROWS
#error "gemm_tile: GEMM_TILE_ROWS must be 16 * GT_TA * GEMM_TILE_WARPS"
#endif

// Thread-block clusters (sm_90+; elsewhere the split kernels trap and the host never launches
// them: the tile product needs compute capability 9.0).
#if __CUDA_ARCH__ >= 900
#define GT_CLUSTER(s) __cluster_dims__(1, 1, s)
__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// Every thread of every block of the cluster arrives; shared-memory writes before it are visible
// to the cluster's blocks after it.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The f32 at `p` (this block's shared memory) in the shared memory of cluster block `rank`.
__device__ __forceinline__ float ld_cluster_f32(const float* p, u32 rank) {
    const u32 local = (u32)__cvta_generic_to_shared(p);
    u32 remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}
#else
#define GT_CLUSTER(s)
__device__ __forceinline__ u32 cluster_rank() { __trap(); return 0; }
__device__ __forceinline__ void cluster_sync() { __trap(); }
__device__ __forceinline__ float ld_cluster_f32(const float*, u32) { __trap(); return 0.f; }
#endif

// Predicated streamed 16-byte load (ok false: r keeps its value).
__device__ __forceinline__ void gt_ld_if(uint4& r, const bf16* p, bool ok) {
    asm("{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n"
        "@q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
        : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w)
        : "l"(p), "r"((int)ok));
}

// Word j (0..7) of a lane's 32 bytes of a weight row.
__device__ __forceinline__ u32 gt_word(const uint4 (&v)[2], int j) {
    const uint4& h = v[j >> 2];
    const int i = j & 3;
    return i == 0 ? h.x : i == 1 ? h.y : i == 2 ? h.z : h.w;
}

// The reduction buffer's index of tile row `row` (< GT_ROWS), x column `col` (< B): column-major,
// rows XOR-swizzled in groups of 32 so that a warp's fragment stores (rows g + 8 i, columns 2t + e)
// and the reduction's reads (consecutive rows) each hit 32 banks.
__device__ __forceinline__ int gt_red(int row, int col) { return col * GT_ROWS + (row ^ (((col >> 1) & 3) << 3)); }

template <int B, int S> __device__ __forceinline__ void gemm_bf16_tile_impl(const GemmTileParams& p) {
    constexpr int Q = 2 * GT_TA;       // weight rows a lane holds
    constexpr int NB = B / 8;          // 8-column B tiles
    constexpr int STAGES = B == 64 ? 3 : 4;
    constexpr int THREADS = 32 * GEMM_TILE_WARPS;
    static_assert(S == 1 || GT_ROWS % S == 0, "gemm_tile: rows split evenly over the cluster");
    constexpr int XS_WORDS = STAGES * B * 8;             // uint4
    constexpr int RED_WORDS = S > 1 ? GT_ROWS * B / 4 : 0; // uint4 of floats
    constexpr int SMEM_WORDS = XS_WORDS > RED_WORDS ? XS_WORDS : RED_WORDS;
    static_assert(SMEM_WORDS * 16 <= 48 * 1024, "gemm_tile: static shared memory past 48 KiB");
    __shared__ __align__(128) uint4 smem[SMEM_WORDS];
    uint4 (*xs)[B * 8] = reinterpret_cast<uint4 (*)[B * 8]>(smem); // [stage][row][chunk]

    const int n = p.n, k = p.k, b = p.b;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int tile0 = blockIdx.x * GT_ROWS, row0 = tile0 + warp * 16 * GT_TA, b0 = blockIdx.y * B;
    const int total = (k + 63) >> 6;
    const int s_begin = min(total, (int)blockIdx.z * p.steps);
    const int steps = min(total, s_begin + p.steps) - s_begin;

    // The lane's weight rows, clamped below n.
    const bf16* wr[Q];
#pragma unroll
    for (int q = 0; q < Q; q++) wr[q] = p.w + (size_t)min(row0 + g + 8 * q, n - 1) * k + 16 * t;

    auto load_x = [&](int j, int slot) {
        x_step_to_smem<B, THREADS>(xs[slot], p.x, b, k, b0, s_begin + j, j < steps);
    };
    auto load_w = [&](int j, uint4 (&wv)[Q][2]) {
        const int s = s_begin + j;
        const bool valid = j < steps && 64 * s + 16 * t < k;
#pragma unroll
        for (int q = 0; q < Q; q++) {
            wv[q][0] = wv[q][1] = make_uint4(0u, 0u, 0u, 0u);
            gt_ld_if(wv[q][0], wr[q] + 64 * s, valid);
            gt_ld_if(wv[q][1], wr[q] + 64 * s + 8, valid);
        }
    };

    float acc[GT_TA][NB][4];
#pragma unroll
    for (int a = 0; a < GT_TA; a++)
#pragma unroll
        for (int j = 0; j < NB; j++) acc[a][j][0] = acc[a][j][1] = acc[a][j][2] = acc[a][j][3] = 0.f;

#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        load_x(st, st);
        cp_async_commit();
    }
    uint4 wv[2][Q][2];
    load_w(0, wv[0]);
    load_w(1, wv[1]);

    for (int j0 = 0; j0 < steps; j0 += 2) { // block-uniform
#pragma unroll
        for (int d = 0; d < 2; d++) {
            const int j = j0 + d;
            if (j >= steps) break; // block-uniform
            cp_async_wait<STAGES - 2>();
            __syncthreads(); // step j's x is in; every warp is done with step j - 1's slot
            load_x(j + STAGES - 1, (j + STAGES - 1) % STAGES);
            cp_async_commit();
            uint4 w[Q][2];
#pragma unroll
            for (int q = 0; q < Q; q++) {
                w[q][0] = wv[d][q][0];
                w[q][1] = wv[d][q][1];
            }
            // Refill this ring slot with step j + 2's weights while the mmas run.
            load_w(j + 2, wv[d]);
            const uint4* xt = xs[j % STAGES];
#pragma unroll
            for (int nb = 0; nb < NB; nb++) {
                const int r = 8 * nb + g;
                const uint4 xlo = xt[r * 8 + ((2 * t) ^ g)], xhi = xt[r * 8 + ((2 * t + 1) ^ g)];
                const u32 xb[8] = {xlo.x, xlo.y, xlo.z, xlo.w, xhi.x, xhi.y, xhi.z, xhi.w};
#pragma unroll
                for (int m = 0; m < 4; m++)
#pragma unroll
                    for (int a = 0; a < GT_TA; a++)
                        mma_bf16_16816(acc[a][nb], gt_word(w[2 * a], 2 * m), gt_word(w[2 * a + 1], 2 * m),
                                       gt_word(w[2 * a], 2 * m + 1), gt_word(w[2 * a + 1], 2 * m + 1), xb[2 * m],
                                       xb[2 * m + 1]);
            }
        }
    }
    cp_async_wait<0>();

    // c0, c1 = (row 16a + g, x row 8 nb + 2t, +1); c2, c3 = (row 16a + g + 8, the same).
    if constexpr (S == 1) {
#pragma unroll
        for (int a = 0; a < GT_TA; a++)
#pragma unroll
            for (int nb = 0; nb < NB; nb++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int row = row0 + 16 * a + g + 8 * (c >> 1), bb = b0 + 8 * nb + 2 * t + (c & 1);
                    if (row < n && bb < b) p.y[(size_t)bb * n + row] = __float2bfloat16(acc[a][nb][c]);
                }
    } else {
        float* red = reinterpret_cast<float*>(smem);
        __syncthreads(); // every warp is done with the x ring
#pragma unroll
        for (int a = 0; a < GT_TA; a++)
#pragma unroll
            for (int nb = 0; nb < NB; nb++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int row = warp * 16 * GT_TA + 16 * a + g + 8 * (c >> 1), col = 8 * nb + 2 * t + (c & 1);
                    red[gt_red(row, col)] = acc[a][nb][c];
                }
        cluster_sync();
        constexpr int MINE = GT_ROWS / S; // tile rows this block adds up
        const u32 rank = cluster_rank();
        for (int e = threadIdx.x; e < MINE * B; e += THREADS) {
            const int row = (int)rank * MINE + e % MINE, col = e / MINE;
            const float* at = red + gt_red(row, col);
            float v = ld_cluster_f32(at, 0);
#pragma unroll
            for (int q = 1; q < S; q++) v += ld_cluster_f32(at, (u32)q);
            const int grow = tile0 + row, bb = b0 + col;
            if (grow < n && bb < b) p.y[(size_t)bb * n + grow] = __float2bfloat16(v);
        }
        cluster_sync(); // the other blocks' reads of this block's sums are done
    }
}

// gemm_bf16_tile_b{B}_s{S}: B activation rows a block, at least 2 blocks an SM; with S > 1, S
// blocks (k ranges) a cluster along z.
#define GEMM_TILE_1(name, bsz)                                                                             \
    extern "C" __global__ void __launch_bounds__(32 * GEMM_TILE_WARPS, 2) name(GemmTileParams p) {      \
        gemm_bf16_tile_impl<bsz, 1>(p);                                                                   \
    }
#define GEMM_TILE(name, bsz, s)                                                                            \
    extern "C" __global__ void GT_CLUSTER(s) __launch_bounds__(32 * GEMM_TILE_WARPS, 2)      \
        name(GemmTileParams p) {                                                                         \
        gemm_bf16_tile_impl<bsz, s>(p);                                                                   \
    }
GEMM_TILE_1(gemm_bf16_tile_b16_s1, 16)
GEMM_TILE(gemm_bf16_tile_b16_s2, 16, 2)
GEMM_TILE(gemm_bf16_tile_b16_s4, 16, 4)
GEMM_TILE(gemm_bf16_tile_b16_s8, 16, 8)
GEMM_TILE_1(gemm_bf16_tile_b32_s1, 32)
GEMM_TILE(gemm_bf16_tile_b32_s2, 32, 2)
GEMM_TILE(gemm_bf16_tile_b32_s4, 32, 4)
GEMM_TILE(gemm_bf16_tile_b32_s8, 32, 8)
GEMM_TILE_1(gemm_bf16_tile_b64_s1, 64)
GEMM_TILE(gemm_bf16_tile_b64_s2, 64, 2)
GEMM_TILE(gemm_bf16_tile_b64_s4, 64, 4)
GEMM_TILE(gemm_bf16_tile_b64_s8, 64, 8)
