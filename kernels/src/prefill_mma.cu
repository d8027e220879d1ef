// Paged causal attention for prefill chunks on tensor cores (bf16, head size 128): FlashAttention-2
// tiling with mma.sync.m16n8k16 (bf16 in, f32 accumulate).
//
// A block of 4 warps takes 128 query tokens of one sequence for one query head; each warp owns 32
// query rows as two m16 row groups and walks the context in 64-key tiles. Every K and V B fragment
// read from shared memory with ldmatrix feeds both row groups, which halves the shared-memory reads
// per mma and spreads the per-tile fixed costs (barrier, row-max shuffles, loop overhead) over
// twice the rows; the FP32 softmax work per mma is what was left in the way at 16 rows per warp.
// Holding Q for 32 rows in registers would not fit next to the two 16x128 f32 output accumulators
// (128 registers) and the 32x64 scores (64), so Q is staged once in shared memory (swizzled like
// K/V) and its A fragments are loaded with ldmatrix per k-step. Scores, the online softmax and P·V
// stay in registers; P is packed to bf16 straight from the score accumulators as the A operand of
// the second product.
//
// Softmax per tile: the row max is taken on the raw scores (scale_log2 > 0 commutes with max), the
// scale and the max subtraction are one FMA before ex2.approx, the row sums are kept as per-thread
// partials (the rescale factor is the same for the 4 threads of a row) and reduced across the quad
// only once at the end, and the output rescale is skipped when no row max of the warp grew.
//
// K/V tiles are gathered from the paged cache (block table looked up per key, so any block size
// works) by 16-byte cp.async copies into a two-stage ring in dynamic shared memory: tile t+1 is in
// flight while tile t is multiplied, and one barrier per tile both publishes tile t and frees the
// stage tile t+1 overwrites. Keys past the causal end and Q rows past the item's end are zero-filled
// (src-size 0). K, V and Q keep the row-major [row][dim] layout with the 16-byte chunks of each row
// XOR-swizzled by row & 7, so the ldmatrix.x4 reads (plain for Q and K, .trans for V: no transpose
// through registers) and the cp.async writes are free of bank conflicts. 96 KiB of shared memory
// (64 KiB K/V ring + 32 KiB Q) and 255 registers per thread (ptxas, sm_90: 56 bytes of spills,
// the four row-sum partials, one load and store each per tile) give 2 blocks (8 warps) per SM.
// The causal mask is applied only on tiles that reach past a warp's first row; a warp skips tiles
// wholly past its last row and warps without valid rows skip the math.
#include "common.cuh"

#define PF_BM PREFILL_MMA_TOKENS
#define PF_BN PREFILL_MMA_KEY_TILE
#define PF_D 128
#define PF_TILE (PF_BN * PF_D)          // bf16 elements of one K or V tile
#define PF_Q_OFF (2 * 2 * PF_TILE * 2)  // byte offset of the Q tile, after the two K/V stages
static_assert(PF_Q_OFF + PF_BM * PF_D * 2 == PREFILL_MMA_SMEM_BYTES, "PREFILL_MMA_SMEM_BYTES (lib.rs) differs");

__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(u32*)&v;
}

__device__ __forceinline__ void mma_bf16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The 16x8x16 product on bf16 operands, or on f16 ones (F16: the FP8-cache kernel).
template <bool F16> __device__ __forceinline__ void mma_16816(float* c, const u32* a, u32 b0, u32 b1) {
    if constexpr (F16)
        mma_f16(c, a, b0, b1);
    else
        mma_bf16(c, a, b0, b1);
}

// Four 8x8 b16 matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldsm_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void pf_cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ float pf_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Byte offset of 16-byte chunk c of row j in a tile (rows of 256 bytes, chunks swizzled). As
// c < 16, this is (j * 256 + ((j & 7) << 4)) ^ (c << 4): the ldmatrix addresses below keep the
// per-lane part and XOR in the chunk of each unrolled step.
__device__ __forceinline__ u32 pf_off(int j, int c) { return (u32)(j * (PF_D * 2) + ((c ^ (j & 7)) << 4)); }

// The FP8-cache variant (KV8): the E4M3 K/V tiles land in a two-stage ring of 128-byte rows
// (PF8_RING) and are converted, exactly, to one f16 K/V tile laid out and swizzled as a bf16
// stage (offset 0) between two barriers; Q is converted to f16 in place on the first tile; the
// products run on f16 operands, the K scale is in scale_log2 and the V scale applied to the output.
#define PF8_RING (2 * PF_TILE * 2) // byte offset of the E4M3 ring (after the one f16 tile)
#define PF8_STAGE (2 * PF_TILE)    // bytes of one E4M3 stage (K then V)
static_assert(PF8_RING + 2 * PF8_STAGE == PF_Q_OFF, "the kv8 layout fills the bf16 ring's space");

template <bool KV8> __device__ __forceinline__ void prefill_mma_impl(const AttnParams& p) {
    // [stage][K, V][64 keys][128 dims], then Q [128 rows][128 dims]; all bf16, swizzled.
    extern __shared__ __align__(128) unsigned char pf_smem[];
    // Items in reverse: a sequence's later query tiles see the longest contexts, so they start first
    // and the light ones fill the tail of the grid.
    const int item = gridDim.x - 1 - blockIdx.x, h = blockIdx.y;
    if (item >= p.num_items) return;
    const int group = p.hq / p.hkv, kvh = h / group;
    const QueryTile qt = query_tile(p.items, p.seqs, item, PF_BM);
    const int seq = qt.seq, q0 = qt.q0, q_start = qt.q_start, n_tok = qt.n_tok;
    const int first_pos = qt.first_pos;
    // The last row's position is first_pos + n_tok - 1 <= ctx - 1: no key at or past kv_end is
    // ever unmasked, so the causal test alone also masks the zero-filled keys.
    const int kv_end = first_pos + n_tok;
    const int n_tiles = (kv_end + PF_BN - 1) / PF_BN;
    const u32* table = p.block_tables + (size_t)seq * p.table_stride;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const u32 smem = (u32)__cvta_generic_to_shared(pf_smem);
    const u32 qs = smem + PF_Q_OFF;

    // Loaders: thread tid copies chunk tid % 16 of rows tid / 16 + 8 i.
    const int ld_c = tid & 15, ld_j = tid >> 4;
    const bf16* qb = (const bf16*)p.q;
#pragma unroll
    for (int i = 0; i < PF_BM / 8; i++) {
        const int r = ld_j + 8 * i;
        const bool valid = r < n_tok;
        size_t off = 0;
        if (valid) off = ((size_t)(q_start + q0 + r) * p.hq + h) * PF_D + ld_c * 8;
        pf_cp_async16(qs + pf_off(r, ld_c), qb + off, valid);
    }
    // (no commit: Q joins tile 0's group)
    const bf16* kc = (const bf16*)p.k_cache;
    const bf16* vc = (const bf16*)p.v_cache;
    const unsigned char* kc8 = (const unsigned char*)p.k_cache;
    const unsigned char* vc8 = (const unsigned char*)p.v_cache;
    // KV8 loaders: thread tid copies 16-code chunk tid % 8 of rows tid / 8 + 16 i.
    const int ld8_c = tid & 7, ld8_j = tid >> 3;
    auto load_tile8 = [&](int tile) {
        const u32 st = smem + (u32)(PF8_RING + (tile & 1) * PF8_STAGE);
#pragma unroll
        for (int i = 0; i < PF_BN / 16; i++) {
            const int j = ld8_j + 16 * i, pos = tile * PF_BN + j;
            const bool valid = pos < kv_end;
            size_t off = 0;
            if (valid)
                off = (((size_t)table[pos / p.block_size] * p.hkv + kvh) * p.block_size + pos % p.block_size) * PF_D +
                      ld8_c * 16;
            const u32 dst = st + (u32)(j * PF_D + ld8_c * 16);
            pf_cp_async16(dst, kc8 + off, valid);
            pf_cp_async16(dst + PF_TILE, vc8 + off, valid);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    auto load_tile = [&](int tile) {
        if constexpr (KV8) {
            load_tile8(tile);
            return;
        }
        const u32 st = smem + (u32)((tile & 1) * 2 * PF_TILE * 2);
#pragma unroll
        for (int i = 0; i < PF_BN / 8; i++) {
            const int j = ld_j + 8 * i, pos = tile * PF_BN + j;
            const bool valid = pos < kv_end;
            size_t off = 0;
            if (valid)
                off = (((size_t)table[pos / p.block_size] * p.hkv + kvh) * p.block_size + pos % p.block_size) * PF_D +
                      ld_c * 8;
            const u32 dst = st + pf_off(j, ld_c);
            pf_cp_async16(dst, kc + off, valid);
            pf_cp_async16(dst + PF_TILE * 2, vc + off, valid);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    load_tile(0);

    // Rows of this thread: wr + 16 rg + 8 hf + g (row group rg, half hf), positions clamped to
    // the last valid token (rows past it compute on zero Q and are never written).
    const int wr = warp * 32;
    const bool warp_idle = wr >= n_tok;
    const int warp_first = first_pos + min(wr, n_tok - 1);
    const int warp_last = first_pos + min(wr + 31, n_tok - 1);
    const int pos_g = first_pos + wr + g; // position of row wr + g (unclamped)

    float o[2][PF_D / 8][4];
#pragma unroll
    for (int rg = 0; rg < 2; rg++)
#pragma unroll
        for (int j = 0; j < PF_D / 8; j++) o[rg][j][0] = o[rg][j][1] = o[rg][j][2] = o[rg][j][3] = 0.f;
    float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
    float l[2][2] = {{0.f, 0.f}, {0.f, 0.f}}; // per-thread partial row sums
    const float sc = p.scale_log2;

    // ldmatrix row addresses of this lane (pf_off split into a lane part and a step part).
    // Q (plain): matrix i = lanes 8i.. gives rows 8 (i & 1) + (lane & 7) of row group rg, chunk
    //   2 kk + i / 2 -> a0..a3 of k-step kk; row group 1 is 16 rows (4096 bytes) further.
    // K (plain): keys 8 (2 n2 + i / 2) + (lane & 7), chunk 2 kk + (i & 1) -> b0/b1 of key tiles
    //   2 n2 and 2 n2 + 1 at k-step kk.
    // V (.trans): keys 16 kk + (lane & 15), chunk 2 j2 + lane / 16 -> b0/b1 of dim tiles 2 j2 and
    //   2 j2 + 1 at key step kk.
    const int l7 = lane & 7, l15 = lane & 15, l4 = lane >> 4, l3 = (lane >> 3) & 1;
    const u32 q_lane = (u32)((wr + l15) * (PF_D * 2) + ((l7 ^ l4) << 4));
    const u32 k_lane = (u32)((l4 * 8 + l7) * (PF_D * 2) + ((l7 ^ l3) << 4));
    const u32 v_lane = (u32)(l15 * (PF_D * 2) + ((l7 ^ l4) << 4));

    for (int tile = 0; tile < n_tiles; tile++) {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads(); // tile (and Q) visible to all; everyone is done with the stage tile+1 reuses
        if (tile + 1 < n_tiles) load_tile(tile + 1);
        if constexpr (KV8) {
            // Every thread converts the chunks it copied: 16 codes -> two f16 chunks of a row.
            const unsigned char* st = pf_smem + PF8_RING + (tile & 1) * PF8_STAGE;
#pragma unroll
            for (int i = 0; i < 2 * (PF_BN / 16); i++) {
                const int j = ld8_j + 16 * (i >> 1), kv = i & 1; // kv 1: V
                const uint4 codes = *(const uint4*)(st + kv * PF_TILE + j * PF_D + ld8_c * 16);
                uint4 a, b;
                e4m3x4_to_f16x4(codes.x, a.x, a.y);
                e4m3x4_to_f16x4(codes.y, a.z, a.w);
                e4m3x4_to_f16x4(codes.z, b.x, b.y);
                e4m3x4_to_f16x4(codes.w, b.z, b.w);
                unsigned char* dst = pf_smem + kv * PF_TILE * 2;
                *(uint4*)(dst + pf_off(j, 2 * ld8_c)) = a;
                *(uint4*)(dst + pf_off(j, 2 * ld8_c + 1)) = b;
            }
            if (tile == 0) {
                // Q to f16 in place: the chunks this thread copied.
#pragma unroll
                for (int i = 0; i < PF_BM / 8; i++) {
                    uint4* q = (uint4*)(pf_smem + PF_Q_OFF + pf_off(ld_j + 8 * i, ld_c));
                    uint4 v = *q;
                    v.x = bf16x2_to_f16x2(v.x);
                    v.y = bf16x2_to_f16x2(v.y);
                    v.z = bf16x2_to_f16x2(v.z);
                    v.w = bf16x2_to_f16x2(v.w);
                    *q = v;
                }
            }
            __syncthreads(); // the f16 tile (and Q) complete before any warp reads them
        }
        const int k0 = tile * PF_BN;
        if (warp_idle || k0 > warp_last) continue;
        const u32 ks = KV8 ? smem : smem + (u32)((tile & 1) * 2 * PF_TILE * 2), vs = ks + PF_TILE * 2;

        // S = Q K^T: 2 x 16 rows x 64 keys per warp; each K fragment feeds both row groups.
        float s[2][PF_BN / 8][4];
#pragma unroll
        for (int rg = 0; rg < 2; rg++)
#pragma unroll
            for (int n = 0; n < PF_BN / 8; n++) s[rg][n][0] = s[rg][n][1] = s[rg][n][2] = s[rg][n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < PF_D / 16; kk++) {
            u32 qa[2][4];
            const u32 qaddr = qs + (q_lane ^ (u32)(kk << 5));
            ldsm_x4(qa[0], qaddr);
            ldsm_x4(qa[1], qaddr + 16 * PF_D * 2);
            const u32 kaddr = ks + (k_lane ^ (u32)(kk << 5));
#pragma unroll
            for (int n2 = 0; n2 < PF_BN / 16; n2++) {
                u32 b[4];
                ldsm_x4(b, kaddr + n2 * 16 * PF_D * 2);
                mma_16816<KV8>(s[0][2 * n2], qa[0], b[0], b[1]);
                mma_16816<KV8>(s[1][2 * n2], qa[1], b[0], b[1]);
                mma_16816<KV8>(s[0][2 * n2 + 1], qa[0], b[2], b[3]);
                mma_16816<KV8>(s[1][2 * n2 + 1], qa[1], b[2], b[3]);
            }
        }
        // Causal mask only where the tile reaches past the warp's first row.
        if (k0 + PF_BN - 1 > warp_first) {
#pragma unroll
            for (int rg = 0; rg < 2; rg++)
#pragma unroll
                for (int n = 0; n < PF_BN / 8; n++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int key = k0 + n * 8 + 2 * t + e;
                        if (key > min(pos_g + 16 * rg, kv_end - 1)) s[rg][n][e] = -INFINITY;
                        if (key > min(pos_g + 16 * rg + 8, kv_end - 1)) s[rg][n][2 + e] = -INFINITY;
                    }
        }
        // Online softmax on the raw scores: row max over the 4 threads of a row, then
        // p = 2^(s * scale_log2 - m) in one FMA + ex2. Tile 0 holds key 0, which every row sees, so
        // m is finite from the first tile on (a row wholly masked in a later tile keeps its m and
        // gets p = 0, c = 1).
        float c[2][2];
#pragma unroll
        for (int rg = 0; rg < 2; rg++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float mx = -INFINITY;
#pragma unroll
                for (int n = 0; n < PF_BN / 8; n++) mx = fmaxf(mx, fmaxf(s[rg][n][2 * hf], s[rg][n][2 * hf + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mn = fmaxf(m[rg][hf], mx * sc);
                c[rg][hf] = pf_exp2(m[rg][hf] - mn); // 0 on the first tile (m = -inf)
                m[rg][hf] = mn;
                float sum = 0.f;
#pragma unroll
                for (int n = 0; n < PF_BN / 8; n++) {
                    s[rg][n][2 * hf] = pf_exp2(fmaf(s[rg][n][2 * hf], sc, -mn));
                    s[rg][n][2 * hf + 1] = pf_exp2(fmaf(s[rg][n][2 * hf + 1], sc, -mn));
                    sum += s[rg][n][2 * hf] + s[rg][n][2 * hf + 1];
                }
                l[rg][hf] = l[rg][hf] * c[rg][hf] + sum;
            }
        // Rescale the outputs unless no row max of the warp grew (c == 1 everywhere).
        const bool grew = c[0][0] != 1.f || c[0][1] != 1.f || c[1][0] != 1.f || c[1][1] != 1.f;
        if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
            for (int rg = 0; rg < 2; rg++)
#pragma unroll
                for (int j = 0; j < PF_D / 8; j++) {
                    o[rg][j][0] *= c[rg][0];
                    o[rg][j][1] *= c[rg][0];
                    o[rg][j][2] *= c[rg][1];
                    o[rg][j][3] *= c[rg][1];
                }
        }
        // O += P V, P packed to bf16 from the score accumulators; each V fragment feeds both row
        // groups.
        u32 pa[2][PF_BN / 16][4];
#pragma unroll
        for (int rg = 0; rg < 2; rg++)
#pragma unroll
            for (int kk = 0; kk < PF_BN / 16; kk++) {
                auto pk = [](float lo, float hi) { return KV8 ? pack_f16(lo, hi) : pack_bf16(lo, hi); };
                pa[rg][kk][0] = pk(s[rg][2 * kk][0], s[rg][2 * kk][1]);
                pa[rg][kk][1] = pk(s[rg][2 * kk][2], s[rg][2 * kk][3]);
                pa[rg][kk][2] = pk(s[rg][2 * kk + 1][0], s[rg][2 * kk + 1][1]);
                pa[rg][kk][3] = pk(s[rg][2 * kk + 1][2], s[rg][2 * kk + 1][3]);
            }
#pragma unroll
        for (int j2 = 0; j2 < PF_D / 16; j2++) {
            const u32 vaddr = vs + (v_lane ^ (u32)(j2 << 5));
#pragma unroll
            for (int kk = 0; kk < PF_BN / 16; kk++) {
                u32 b[4];
                ldsm_x4_t(b, vaddr + kk * 16 * PF_D * 2);
                mma_16816<KV8>(o[0][2 * j2], pa[0][kk], b[0], b[1]);
                mma_16816<KV8>(o[1][2 * j2], pa[1][kk], b[0], b[1]);
                mma_16816<KV8>(o[0][2 * j2 + 1], pa[0][kk], b[2], b[3]);
                mma_16816<KV8>(o[1][2 * j2 + 1], pa[1][kk], b[2], b[3]);
            }
        }
    }

    bf16* out = (bf16*)p.out;
#pragma unroll
    for (int rg = 0; rg < 2; rg++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float sum = l[rg][hf];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const float inv = (KV8 ? p.v_scale : 1.f) / sum;
            const int r = wr + 16 * rg + 8 * hf + g;
            if (r < n_tok) {
                bf16* dst = out + ((size_t)(q_start + q0 + r) * p.hq + h) * PF_D + 2 * t;
#pragma unroll
                for (int j = 0; j < PF_D / 8; j++)
                    *(__nv_bfloat162*)(dst + j * 8) =
                        __floats2bfloat162_rn(o[rg][j][2 * hf] * inv, o[rg][j][2 * hf + 1] * inv);
            }
        }
}

extern "C" __global__ void __launch_bounds__(PREFILL_MMA_THREADS, 2) attn_prefill_bf16_d128(AttnParams p) {
    prefill_mma_impl<false>(p);
}
// bf16 queries and outputs over an FP8 (E4M3) cache.
extern "C" __global__ void __launch_bounds__(PREFILL_MMA_THREADS, 2) attn_prefill_kv8_d128(AttnParams p) {
    prefill_mma_impl<true>(p);
}
