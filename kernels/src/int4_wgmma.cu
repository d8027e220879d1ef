// INT4 products of a few hundred activation rows on Hopper's wgmma (sm_90a only; elsewhere the
// body is compiled out and traps): gemm_int4_mma's scheme with the tensor-core work moved from
// mma.sync to wgmma.m64n128k16, the dequantized weights as its register operand A and 128
// activation rows as its shared-memory operand B, so one dequantized fragment feeds 128 rows
// where gemm_int4_mma's fed 64 through eight separate mmas, and the activations' shared-memory
// reads are the tensor cores' own. This file follows int4.cu (its dequantization, weight loads
// and GemmInt4Params) and prefill_wgmma.cu (its descriptors and wgmma fences) in SOURCES.
//
// A block is W warpgroups; warpgroup v takes weight rows [64 (W bx + v), +64): warp w of it rows
// 16 w + g and 16 w + g + 8 (g = lane / 4, t = lane % 4), exactly the rows and words a warp of
// gemm_int4_mma_t1 holds, dequantized as it dequantizes them (int4_pair_of: every weight the bf16
// dequantize_int4_bf16 writes). Per 64-wide k-step a lane's words 2t and 2t + 1 give the A
// fragments of the step's four k16 chunks: chunk 2i + h takes pairs 2h, 2h + 1 of word i, i.e.
// physical k 16t + 8i + 4h + {0, 1} as the fragment's logical k 2t, 2t + 1 and + {2, 3} as
// 2t + 8, 2t + 9 (gemm_int4_mma's mapping). The tensor cores read B in logical order, so the block
// stages x with that permutation: in units of two values, physical unit 8t + 4i + 2h + e of a
// step goes to logical unit 16i + 8h + 4e + t. A 16-byte chunk of x (units 4 (2t + i) .. +4, one
// t and i) thus spreads over word t of the four logical chunks 4i .. 4i + 3: a thread loads the
// four physical chunks of one (row, i) and stores their 4 x 4 transpose, so every A element meets
// the x value of its own physical k.
//
// Shared memory: a ring of INT4_WGMMA_STAGES steps of x, each 128 rows of 128 bytes (64 k) in the
// 128-byte swizzle layout wgmma expects (row r's chunk c at r * 128 + ((c ^ (r & 7)) * 16); 8-row
// groups 1024 bytes apart: SBO), K-major, so chunk c's descriptor is the step's base + 32 c bytes.
// x is staged through registers (loaded one step before it is stored), the weights two steps
// ahead as gemm_int4_mma loads them. Per step each warpgroup dequantizes, issues its four wgmmas
// and waits for them (ptxas serializes a wgmma whose register operand a plain instruction defines
// while an earlier one is in flight, so waiting later would buy nothing); the two or three
// warpgroups an SM holds overlap one another's dequantization and tensor work. A step's slot is
// refilled two steps after its use, behind a barrier every thread reaches past that wait.
// Rows past n read row n - 1, x rows past b read row b - 1 (their outputs are never stored); x
// chunks past k are zeros against the zero codes' finite weights. With splits > 1 block bz writes
// its f32 sums to part[bz] for gemm_int4_reduce; otherwise it writes y.
#include "common.cuh"

#define I4W_BATCH INT4_WGMMA_BATCH
#define I4W_STAGES INT4_WGMMA_STAGES
#define I4W_STEP_BYTES (I4W_BATCH * 128)
static_assert(I4W_BATCH == 128, "int4_wgmma: the wgmma shape is m64n128k16");
static_assert(I4W_STAGES >= 3, "int4_wgmma: a slot is refilled two steps after its use");
static_assert(I4W_STAGES * I4W_STEP_BYTES + 1024 == INT4_WGMMA_SMEM_BYTES,
              "INT4_WGMMA_SMEM_BYTES (lib.rs) differs");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d (64 x 128 f32) += A (64 x 16 bf16 in registers: each warp's 16 rows as mma.m16n8k16's A
// fragment) · B (16 x 128, K-major in shared memory: [n][k]).
__device__ __forceinline__ void i4w_mma(float* d, const u32 (&a)[4], u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " PW_ACC_STR
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : PW_ACC
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
#endif

template <int W> __device__ __forceinline__ void gemm_int4_wgmma_impl(const GemmInt4Params& prm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int THREADS = 128 * W;
    static_assert(I4W_BATCH * 2 % THREADS == 0, "int4_wgmma: whole (row, i) items a thread");
    extern __shared__ __align__(1024) unsigned char i4w_smem[];
    const u32 smem = ((u32)__cvta_generic_to_shared(i4w_smem) + 1023u) & ~1023u;
    const GemvInt4Params& p = prm.g;
    const int n = p.n, k = p.k, b = p.b;
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = (blockIdx.x * W + wg) * 64 + 16 * warp, b0 = blockIdx.y * I4W_BATCH;
    const int total = (k + 63) >> 6;
    const int s_begin = min(total, (int)blockIdx.z * prm.steps);
    const int steps = min(total, s_begin + prm.steps) - s_begin;
    const u32 kw = (u32)(k >> 3);

    // The lane's weight rows g, g + 8 (clamped below n) and their word / group offsets.
    u32 wo[2], go[2];
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const u32 r = (u32)min(row0 + g + 8 * q, n - 1);
        wo[q] = r * kw + 2 * t;
        go[q] = r * (u32)p.groups;
    }
    // x: item it (< 2 I4W_BATCH) is (row it / 2, i = it % 2): the four physical chunks 2 t' + i.
    constexpr int ITEMS = I4W_BATCH * 2 / THREADS;
    uint4 xr[ITEMS][4];
    auto load_x = [&](int j) {
        const int s = s_begin + j;
        const bool in = j < steps;
#pragma unroll
        for (int u = 0; u < ITEMS; u++) {
            const int it = threadIdx.x + u * THREADS, r = it >> 1, i = it & 1;
            const bf16* row = p.x + (size_t)min(b0 + r, b - 1) * k;
#pragma unroll
            for (int tp = 0; tp < 4; tp++) {
                const int col = 64 * s + 8 * (2 * tp + i);
                xr[u][tp] = make_uint4(0, 0, 0, 0);
                ld_cached_if(xr[u][tp], (const unsigned char*)(row + (in && col < k ? col : 0)), in && col < k);
            }
        }
    };
    // The transpose: logical chunk 4i + he (he = 2h + e) holds word he of physical chunk 2t' + i
    // as its word t'.
    auto store_x = [&](int slot) {
        const u32 st = smem + (u32)(slot * I4W_STEP_BYTES);
#pragma unroll
        for (int u = 0; u < ITEMS; u++) {
            const int it = threadIdx.x + u * THREADS, r = it >> 1, i = it & 1;
            const u32 w[4][4] = {{xr[u][0].x, xr[u][0].y, xr[u][0].z, xr[u][0].w},
                                 {xr[u][1].x, xr[u][1].y, xr[u][1].z, xr[u][1].w},
                                 {xr[u][2].x, xr[u][2].y, xr[u][2].z, xr[u][2].w},
                                 {xr[u][3].x, xr[u][3].y, xr[u][3].z, xr[u][3].w}};
#pragma unroll
            for (int he = 0; he < 4; he++) {
                const u32 a = st + (u32)(r * 128 + (((4 * i + he) ^ (r & 7)) << 4));
                asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(w[0][he]), "r"(w[1][he]),
                             "r"(w[2][he]), "r"(w[3][he])
                             : "memory");
            }
        }
    };
    // Weights of step j: words 2t, 2t + 1 of the lane's two rows, and their group constants.
    auto load_w = [&](int j, uint2 (&wv)[2], I4mRaw (&raw)[2]) {
        const int s = s_begin + j;
        const int col = 64 * s + 16 * t;
        const bool valid = j < steps && col < k;
        const u32 grp = valid ? (u32)(col / p.group_size) : 0u;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            u32 v[2] = {0u, 0u};
            ld_u32x2_if(v, p.w + wo[q] + 8u * (u32)s, valid);
            wv[q] = make_uint2(v[0], v[1]);
            raw[q].sz = __ldg(p.sz + go[q] + grp);
            raw[q].z = __ldg(p.z + go[q] + grp);
        }
    };

    float acc[64];
#pragma unroll
    for (int e = 0; e < 64; e++) acc[e] = 0.f;

    // Steps 0 .. STAGES - 3 in their slots, step STAGES - 2 in registers.
#pragma unroll
    for (int st = 0; st < I4W_STAGES - 2; st++) {
        load_x(st);
        store_x(st);
    }
    load_x(I4W_STAGES - 2);
    pw_fence_proxy();
    uint2 wv[2][2];
    I4mRaw raw[2][2];
    load_w(0, wv[0], raw[0]);
    load_w(1, wv[1], raw[1]);
    u32 af[4][4]; // [chunk][a0..a3]

    for (int j0 = 0; j0 < steps; j0 += 2) { // block-uniform
#pragma unroll
        for (int d = 0; d < 2; d++) {
            const int j = j0 + d;
            if (j >= steps) break; // block-uniform
            // Every thread is past the wait that finished step j - 2, and step j's x is stored.
            __syncthreads();
            store_x((j + I4W_STAGES - 2) % I4W_STAGES);
            pw_fence_proxy();
            load_x(j + I4W_STAGES - 1);
            const Int4Group<false> gl = i4m_group(raw[d][0]), gh = i4m_group(raw[d][1]);
            const uint2 wl = wv[d][0], wh = wv[d][1];
            // Refill this ring slot with step j + 2's weights while the wgmmas run.
            load_w(j + 2, wv[d], raw[d]);
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const u32 lo = i ? wl.y : wl.x, hi = i ? wh.y : wh.x;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    u32* f = af[2 * i + h];
                    f[0] = int4_pair_of(lo, 2 * h, gl);
                    f[1] = int4_pair_of(hi, 2 * h, gh);
                    f[2] = int4_pair_of(lo, 2 * h + 1, gl);
                    f[3] = int4_pair_of(hi, 2 * h + 1, gh);
                }
            }
            const u32 slot = smem + (u32)((j % I4W_STAGES) * I4W_STEP_BYTES);
            pw_wgmma_fence();
#pragma unroll
            for (int c = 0; c < 4; c++) i4w_mma(acc, af[c], pw_desc(slot + 32u * (u32)c, 16, 1024));
            pw_wgmma_commit();
            pw_wgmma_wait<0>();
        }
    }
    pw_pin(acc);
    // acc[4 nb + c]: weight row 16 w + g + 8 (c >> 1) of the warpgroup, x row 8 nb + 2t + (c & 1).
    const bool split = prm.splits > 1;
#pragma unroll
    for (int nb = 0; nb < 16; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int row = row0 + g + 8 * (c >> 1), bb = b0 + 8 * nb + 2 * t + (c & 1);
            if (row < n && bb < b) {
                const size_t o = (size_t)bb * n + row;
                if (split) {
                    prm.part[(size_t)blockIdx.z * b * n + o] = acc[4 * nb + c];
                } else {
                    p.y[o] = __float2bfloat16(acc[4 * nb + c]);
                }
            }
        }
#else
    __trap(); // wgmma exists on sm_90a only; the backend launches this kernel nowhere else
#endif
}

// gemm_int4_wgmma_w{W}: W warpgroups (64 weight rows each) a block, 128 activation rows a block.
#define INT4_WGMMA(name, nw, blocks)                                                                     \
    extern "C" __global__ void __launch_bounds__(128 * nw, blocks) name(GemmInt4Params p) {              \
        gemm_int4_wgmma_impl<nw>(p);                                                                     \
    }
INT4_WGMMA(gemm_int4_wgmma_w1, 1, 3)
INT4_WGMMA(gemm_int4_wgmma_w2, 2, 2)
