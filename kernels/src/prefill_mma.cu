// Paged causal attention for prefill chunks on tensor cores (bf16, head size 128): FlashAttention-2
// tiling with mma.sync.m16n8k16 (bf16 in, f32 accumulate).
//
// A block of 4 warps takes 64 query tokens of one sequence for one query head; each warp owns 16
// query rows, keeps its Q fragments and its 16x128 output in registers, and walks the context in
// 64-key tiles. Scores, the online softmax (exp2, scale folded into scale_log2) and P·V stay in
// registers; P is reused straight from the score accumulators as the A operand of the second
// product.
//
// K/V tiles are gathered from the paged cache (block table looked up per key, so any block size
// works) by 16-byte cp.async copies into a two-stage ring in dynamic shared memory: tile t+1 is in
// flight while tile t is multiplied, and one barrier per tile both publishes tile t and frees the
// stage tile t+1 overwrites. Keys past the causal end are zero-filled (src-size 0). K and V keep the
// cache's row-major [key][dim] layout with the 16-byte chunks of each row XOR-swizzled by key & 7,
// so the ldmatrix.x4 reads of the B operands (plain for K, .trans for V: no transpose through
// registers) and the cp.async writes are free of bank conflicts. 64 KiB of shared memory and at
// most 168 registers per thread (ptxas spills three loop-invariant words) give 3 blocks (12 warps)
// per SM. The causal mask is applied only
// on tiles that reach past a warp's first row; a warp skips tiles wholly past its last row and
// warps without valid rows skip the math.
#include "common.cuh"

#define PF_BM 64
#define PF_BN 64
#define PF_D 128
#define PF_TILE (PF_BN * PF_D) // bf16 elements of one K or V tile

struct AttnParamsP {
    const void* q;
    const void* k_cache;
    const void* v_cache;
    void* out;
    float* part_o;
    float* part_ml;
    const int* seqs;
    const int* items;
    const u32* block_tables;
    int num_items, table_stride, hq, hkv, d, block_size, split_size, num_splits;
    float scale_log2;
};

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

// Byte offset of 16-byte chunk c of key row j in a tile (rows of 256 bytes, chunks swizzled).
__device__ __forceinline__ u32 pf_off(int j, int c) { return (u32)(j * (PF_D * 2) + ((c ^ (j & 7)) << 4)); }

extern "C" __global__ void __launch_bounds__(128, 3) attn_prefill_bf16_d128(AttnParamsP p) {
    extern __shared__ __align__(128) unsigned char pf_smem[]; // [stage][K, V][64 keys][128 dims]
    // Items in reverse: a sequence's later query tiles see the longest contexts, so they start first
    // and the light ones fill the tail of the grid.
    const int item = gridDim.x - 1 - blockIdx.x, h = blockIdx.y;
    if (item >= p.num_items) return;
    const int group = p.hq / p.hkv, kvh = h / group;
    const int seq = p.items[2 * item], q0 = p.items[2 * item + 1];
    const int q_start = p.seqs[4 * seq], q_len = p.seqs[4 * seq + 1], ctx = p.seqs[4 * seq + 2];
    const int n_tok = min(PF_BM, q_len - q0);
    const int first_pos = ctx - q_len + q0;
    // The last row's position is first_pos + n_tok - 1 <= ctx - 1: no key at or past kv_end is
    // ever unmasked, so the causal test alone also masks the zero-filled keys.
    const int kv_end = first_pos + n_tok;
    const int n_tiles = (kv_end + PF_BN - 1) / PF_BN;
    const u32* table = p.block_tables + (size_t)seq * p.table_stride;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const u32 smem = (u32)__cvta_generic_to_shared(pf_smem);

    // Tile loader: thread tid copies chunk tid % 16 of keys tid / 16 + 8 i (i < 8), of K and V.
    const bf16* kc = (const bf16*)p.k_cache;
    const bf16* vc = (const bf16*)p.v_cache;
    const int ld_c = tid & 15, ld_j = tid >> 4;
    auto load_tile = [&](int tile) {
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

    // Rows of this thread: r0 = warp*16 + g and r0 + 8 (clamped to the last valid token).
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    const int qr0 = min(r0, n_tok - 1), qr1 = min(r1, n_tok - 1);
    const int pos0 = first_pos + qr0, pos1 = first_pos + qr1;
    const int warp_first = first_pos + min(warp * 16, n_tok - 1);
    const int warp_last = first_pos + min(warp * 16 + 15, n_tok - 1);
    const bool warp_idle = warp * 16 >= n_tok;
    const bf16* qb = (const bf16*)p.q;
    const bf16* q_row0 = qb + ((size_t)(q_start + q0 + qr0) * p.hq + h) * PF_D;
    const bf16* q_row1 = qb + ((size_t)(q_start + q0 + qr1) * p.hq + h) * PF_D;
    u32 qa[PF_D / 16][4];
#pragma unroll
    for (int kk = 0; kk < PF_D / 16; kk++) {
        qa[kk][0] = *(const u32*)(q_row0 + kk * 16 + 2 * t);
        qa[kk][1] = *(const u32*)(q_row1 + kk * 16 + 2 * t);
        qa[kk][2] = *(const u32*)(q_row0 + kk * 16 + 2 * t + 8);
        qa[kk][3] = *(const u32*)(q_row1 + kk * 16 + 2 * t + 8);
    }
    float o[PF_D / 8][4];
#pragma unroll
    for (int j = 0; j < PF_D / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    // ldmatrix row addresses of this lane. K (plain): matrix i = lanes 8i.., keys n*8 + (lane & 7),
    // chunk 4*kk2 + i -> b0/b1 of k-steps 2*kk2 and 2*kk2+1. V (.trans): keys kk*16 + (lane & 15),
    // chunk 2*j2 + lane / 16 -> b0/b1 of dim tiles 2*j2 and 2*j2+1.
    const int kr = lane & 7, kq = lane >> 3, vr = lane & 15, vq = lane >> 4;

    for (int tile = 0; tile < n_tiles; tile++) {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads(); // tile is visible to all; everyone is done with the stage tile+1 reuses
        if (tile + 1 < n_tiles) load_tile(tile + 1);
        const int k0 = tile * PF_BN;
        if (warp_idle || k0 > warp_last) continue;
        const u32 ks = smem + (u32)((tile & 1) * 2 * PF_TILE * 2), vs = ks + PF_TILE * 2;

        // S = Q K^T: 16 rows x 64 keys per warp.
        float s[PF_BN / 8][4];
#pragma unroll
        for (int n = 0; n < PF_BN / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int kk2 = 0; kk2 < PF_D / 32; kk2++) {
                u32 b[4];
                ldsm_x4(b, ks + pf_off(n * 8 + kr, 4 * kk2 + kq));
                mma_bf16(s[n], qa[2 * kk2], b[0], b[1]);
                mma_bf16(s[n], qa[2 * kk2 + 1], b[2], b[3]);
            }
        }
        // Scale; causal mask only where the tile reaches past the warp's first row.
        if (k0 + PF_BN - 1 > warp_first) {
#pragma unroll
            for (int n = 0; n < PF_BN / 8; n++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = k0 + n * 8 + 2 * t + e;
                    s[n][e] = key <= pos0 ? s[n][e] * p.scale_log2 : -INFINITY;
                    s[n][2 + e] = key <= pos1 ? s[n][2 + e] * p.scale_log2 : -INFINITY;
                }
            }
        } else {
#pragma unroll
            for (int n = 0; n < PF_BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] *= p.scale_log2;
        }
        // Online softmax (row maxima over the 4 threads of a row). Tile 0 holds key 0, which every
        // row sees, so m is finite from the first tile on.
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < PF_BN / 8; n++) {
            mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
            mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float c0 = exp2f(m0 - mn0), c1 = exp2f(m1 - mn1);
        m0 = mn0;
        m1 = mn1;
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int n = 0; n < PF_BN / 8; n++) {
            s[n][0] = exp2f(s[n][0] - mn0);
            s[n][1] = exp2f(s[n][1] - mn0);
            s[n][2] = exp2f(s[n][2] - mn1);
            s[n][3] = exp2f(s[n][3] - mn1);
            sum0 += s[n][0] + s[n][1];
            sum1 += s[n][2] + s[n][3];
        }
        sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
        sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
        sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
        sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
        l0 = l0 * c0 + sum0;
        l1 = l1 * c1 + sum1;
#pragma unroll
        for (int j = 0; j < PF_D / 8; j++) {
            o[j][0] *= c0;
            o[j][1] *= c0;
            o[j][2] *= c1;
            o[j][3] *= c1;
        }
        // O += P V, P from the score accumulators (bf16).
#pragma unroll
        for (int kk = 0; kk < PF_BN / 16; kk++) {
            const u32 a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int j2 = 0; j2 < PF_D / 16; j2++) {
                u32 b[4];
                ldsm_x4_t(b, vs + pf_off(kk * 16 + vr, 2 * j2 + vq));
                mma_bf16(o[2 * j2], a, b[0], b[1]);
                mma_bf16(o[2 * j2 + 1], a, b[2], b[3]);
            }
        }
    }

    bf16* out = (bf16*)p.out;
#pragma unroll
    for (int j = 0; j < PF_D / 8; j++) {
        const int col = j * 8 + 2 * t;
        if (r0 < n_tok) {
            bf16* dst = out + ((size_t)(q_start + q0 + r0) * p.hq + h) * PF_D + col;
            *(__nv_bfloat162*)dst = __floats2bfloat162_rn(o[j][0] / l0, o[j][1] / l0);
        }
        if (r1 < n_tok) {
            bf16* dst = out + ((size_t)(q_start + q0 + r1) * p.hq + h) * PF_D + col;
            *(__nv_bfloat162*)dst = __floats2bfloat162_rn(o[j][2] / l1, o[j][3] / l1);
        }
    }
}
