// Paged causal attention for prefill chunks on tensor cores (bf16, head size 128): FlashAttention-2
// tiling with mma.sync.m16n8k16 (bf16 in, f32 accumulate).
//
// A block of 4 warps takes 64 query tokens of one sequence for one query head; each warp owns 16
// query rows, keeps its Q fragments and its 16x128 output in registers, and walks the context in
// 64-key tiles gathered from the paged cache into shared memory (K row-major, V transposed, both
// padded against bank conflicts). Scores, the online softmax and P·V stay in registers; P is reused
// straight from the score accumulators as the A operand of the second product.
#include "common.cuh"

#define PF_BM 64
#define PF_BN 64
#define PF_D 128
#define PF_KP (PF_D + 8)  // padded K row (bf16 elements)
#define PF_VP (PF_BN + 8) // padded V^T row

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

__device__ __forceinline__ void mma_bf16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(128) attn_prefill_bf16_d128(AttnParamsP p) {
    __shared__ __align__(16) bf16 ks[PF_BN * PF_KP];
    __shared__ __align__(16) bf16 vt[PF_D * PF_VP];
    const int item = blockIdx.x, h = blockIdx.y;
    if (item >= p.num_items) return;
    const int group = p.hq / p.hkv, kvh = h / group;
    const int seq = p.items[2 * item], q0 = p.items[2 * item + 1];
    const int q_start = p.seqs[4 * seq], q_len = p.seqs[4 * seq + 1], ctx = p.seqs[4 * seq + 2];
    const int n_tok = min(PF_BM, q_len - q0);
    const int first_pos = ctx - q_len + q0;
    const int kv_end = min(ctx, first_pos + n_tok);
    const u32* table = p.block_tables + (size_t)seq * p.table_stride;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

    // Rows of this thread: r0 = warp*16 + g and r0 + 8 (clamped to the last valid token).
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    const int qr0 = min(r0, n_tok - 1), qr1 = min(r1, n_tok - 1);
    const int pos0 = first_pos + qr0, pos1 = first_pos + qr1;
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

    for (int k0 = 0; k0 < kv_end; k0 += PF_BN) {
        __syncthreads();
        // Gather the tile: 64 keys x 128 dims of K and V, 16 bytes per load. K: a warp reads whole
        // rows (coalesced); V: a warp takes 32 keys of one 8-dim slice, so its transposed 2-byte
        // stores hit consecutive shared-memory words.
        for (int i = tid; i < PF_BN * (PF_D / 8); i += 128) {
            const int j = i / (PF_D / 8), c = (i % (PF_D / 8)) * 8, pos = k0 + j;
            uint4 kv = make_uint4(0, 0, 0, 0);
            if (pos < kv_end) {
                const size_t base =
                    (((size_t)table[pos / p.block_size] * p.hkv + kvh) * p.block_size + pos % p.block_size) * PF_D + c;
                kv = *(const uint4*)((const bf16*)p.k_cache + base);
            }
            *(uint4*)(ks + j * PF_KP + c) = kv;
            const int jv = i % PF_BN, cv = (i / PF_BN) * 8, posv = k0 + jv;
            uint4 vv = make_uint4(0, 0, 0, 0);
            if (posv < kv_end) {
                const size_t base =
                    (((size_t)table[posv / p.block_size] * p.hkv + kvh) * p.block_size + posv % p.block_size) * PF_D + cv;
                vv = *(const uint4*)((const bf16*)p.v_cache + base);
            }
            const bf16* ve = (const bf16*)&vv;
#pragma unroll
            for (int e = 0; e < 8; e++) vt[(cv + e) * PF_VP + jv] = ve[e];
        }
        __syncthreads();

        // S = Q K^T: 16 rows x 64 keys per warp.
        float s[PF_BN / 8][4];
#pragma unroll
        for (int n = 0; n < PF_BN / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
            const bf16* krow = ks + (n * 8 + g) * PF_KP;
#pragma unroll
            for (int kk = 0; kk < PF_D / 16; kk++) {
                const u32 b0 = *(const u32*)(krow + kk * 16 + 2 * t);
                const u32 b1 = *(const u32*)(krow + kk * 16 + 2 * t + 8);
                mma_bf16(s[n], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b0, b1);
            }
        }
        // Mask (causal and context end), scale, online softmax.
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < PF_BN / 8; n++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = k0 + n * 8 + 2 * t + e;
                s[n][e] = key <= pos0 && key < kv_end ? s[n][e] * p.scale_log2 : -INFINITY;
                s[n][2 + e] = key <= pos1 && key < kv_end ? s[n][2 + e] * p.scale_log2 : -INFINITY;
                mx0 = fmaxf(mx0, s[n][e]);
                mx1 = fmaxf(mx1, s[n][2 + e]);
            }
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
        // O += P V, P from the score accumulators (bf16), V^T rows from shared memory.
#pragma unroll
        for (int kk = 0; kk < PF_BN / 16; kk++) {
            const u32 a0 = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
            const u32 a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
            const u32 a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            const u32 a3 = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int j = 0; j < PF_D / 8; j++) {
                const bf16* vrow = vt + (j * 8 + g) * PF_VP + kk * 16;
                const u32 b0 = *(const u32*)(vrow + 2 * t);
                const u32 b1 = *(const u32*)(vrow + 2 * t + 8);
                mma_bf16(o[j], a0, a1, a2, a3, b0, b1);
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
