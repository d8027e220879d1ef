// Paged attention for single-token queries (decodes), tuned for bandwidth: the counterpart of
// attention.cu's general kernel for head sizes 64 and 128 and up to 8 query heads per KV head.
//
// A block of 128 threads takes one (decode item, KV head, context split) and streams 64-key tiles:
//  1. q·k: each key is handled by D/8 threads, each holding 8 of its dimensions (one 16-byte bf16
//     load) and the matching slice of every query head of the group; a few shuffles finish the dots;
//  2. one warp per query head updates the online softmax over the tile;
//  3. p·v: threads own 8 dimensions for every head and a stride of the tile's keys (16-byte loads).
// The per-thread partial outputs are summed through shared memory at the end. Results and the split
// partials use the same layout and the same final division as attention.cu, so the combine kernel
// (attn_combine_*) is shared.
#include "common.cuh"

#define DEC_TK 64
#define DEC_MAXG 8
#define DEC_THREADS 128

struct AttnParamsD {
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

__device__ __forceinline__ void load8(const float* p, float* o) {
    unpack16(*(const uint4*)p, o, 0.f);
    unpack16(*(const uint4*)(p + 4), o + 4, 0.f);
}
__device__ __forceinline__ void load8(const bf16* p, float* o) { unpack16(*(const uint4*)p, o, bf16()); }

template <typename T, int D>
__device__ void decode_impl(const AttnParamsD& p) {
    constexpr int TPK = D / 8;                 // threads per key (q·k)
    constexpr int KPP = DEC_THREADS / TPK;     // keys per pass
    constexpr int SLICES = D / 8;              // 8-dim slices (p·v)
    constexpr int KLANES = DEC_THREADS / SLICES;
    __shared__ float sc[DEC_MAXG][DEC_TK];
    __shared__ float m_s[DEC_MAXG], l_s[DEC_MAXG], corr_s[DEC_MAXG];
    __shared__ float accs[KLANES * 4 * D]; // partial outputs of four heads at a time
    const int item = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const int group = p.hq / p.hkv;
    const int seq = p.items[2 * item];
    const int q_start = p.seqs[4 * seq], ctx = p.seqs[4 * seq + 2];
    const int kv_lo = split * p.split_size;
    const int kv_hi = min(ctx, kv_lo + p.split_size);
    const u32* table = p.block_tables + (size_t)seq * p.table_stride;

    // This thread's q slices: dims [ (tid % TPK) * 8, +8 ) of every head of the group.
    float q[DEC_MAXG][8];
    const int qs = (tid % TPK) * 8;
#pragma unroll
    for (int h = 0; h < DEC_MAXG; h++) {
        if (h < group) {
            load8((const T*)p.q + ((size_t)q_start * p.hq + kvh * group + h) * D + qs, q[h]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) q[h][e] = 0.f;
        }
    }
    if (tid < DEC_MAXG) { m_s[tid] = -INFINITY; l_s[tid] = 0.f; }

    const int vs = (tid % SLICES) * 8, kl = tid / SLICES;
    float acc[DEC_MAXG][8];
#pragma unroll
    for (int h = 0; h < DEC_MAXG; h++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[h][e] = 0.f;

    for (int k0 = kv_lo; k0 < kv_hi; k0 += DEC_TK) {
        // 1. scores
#pragma unroll
        for (int pass = 0; pass < DEC_TK / KPP; pass++) {
            const int jl = pass * KPP + tid / TPK, j = k0 + jl;
            float kf[8];
            const bool ok = j < kv_hi;
            if (ok) {
                const size_t base = (((size_t)table[j / p.block_size] * p.hkv + kvh) * p.block_size + j % p.block_size) * D;
                load8((const T*)p.k_cache + base + qs, kf);
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) kf[e] = 0.f;
            }
#pragma unroll
            for (int h = 0; h < DEC_MAXG; h++) {
                if (h < group) {
                    float s = 0.f;
#pragma unroll
                    for (int e = 0; e < 8; e++) s += q[h][e] * kf[e];
#pragma unroll
                    for (int o = TPK / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                    if (tid % TPK == 0) sc[h][jl] = ok ? s * p.scale_log2 : -INFINITY;
                }
            }
        }
        __syncthreads();
        // 2. online softmax, one warp per head
        const int lane = tid & 31, warp = tid >> 5;
        for (int h = warp; h < group; h += DEC_THREADS / 32) {
            const float a = sc[h][lane], b = sc[h][lane + 32];
            const float m_old = m_s[h];
            const float m_new = fmaxf(m_old, warp_max(fmaxf(a, b)));
            const float pa = exp2f(a - m_new), pb = exp2f(b - m_new);
            sc[h][lane] = pa;
            sc[h][lane + 32] = pb;
            const float sum = warp_sum(pa + pb);
            if (lane == 0) {
                const float c = exp2f(m_old - m_new);
                corr_s[h] = c;
                l_s[h] = l_s[h] * c + sum;
                m_s[h] = m_new;
            }
        }
        __syncthreads();
        // 3. p·v
#pragma unroll
        for (int h = 0; h < DEC_MAXG; h++) {
            if (h < group) {
                const float c = corr_s[h];
#pragma unroll
                for (int e = 0; e < 8; e++) acc[h][e] *= c;
            }
        }
        for (int jl = kl; jl < DEC_TK; jl += KLANES) {
            const int j = k0 + jl;
            if (j >= kv_hi) break;
            float vf[8];
            const size_t base = (((size_t)table[j / p.block_size] * p.hkv + kvh) * p.block_size + j % p.block_size) * D;
            load8((const T*)p.v_cache + base + vs, vf);
#pragma unroll
            for (int h = 0; h < DEC_MAXG; h++) {
                if (h < group) {
                    const float pj = sc[h][jl];
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[h][e] += pj * vf[e];
                }
            }
        }
        __syncthreads();
    }

    // Sum the KLANES partial outputs, four heads at a time through shared memory.
#pragma unroll
    for (int h0 = 0; h0 < DEC_MAXG; h0 += 4) {
        if (h0 >= group) break;
#pragma unroll
        for (int hh = 0; hh < 4; hh++) {
            const int h = h0 + hh;
            if (h < group) {
#pragma unroll
                for (int e = 0; e < 8; e++) accs[(kl * 4 + hh) * D + vs + e] = acc[h][e];
            }
        }
        __syncthreads();
        for (int i = tid; i < 4 * D; i += DEC_THREADS) {
            const int hh = i / D, c = i % D, h = h0 + hh;
            if (h >= group) continue;
            float s = 0.f;
            for (int k = 0; k < KLANES; k++) s += accs[(k * 4 + hh) * D + c];
            const int qh = kvh * group + h;
            if (p.num_splits == 1) {
                const float l = l_s[h];
                ((T*)p.out)[((size_t)q_start * p.hq + qh) * D + c] = from_f<T>(l > 0.f ? s / l : 0.f);
            } else {
                const size_t slot = ((size_t)item * p.hq + qh) * p.num_splits + split;
                p.part_o[slot * D + c] = s;
                if (c == 0) {
                    p.part_ml[2 * slot] = kv_lo < kv_hi ? m_s[h] : -INFINITY;
                    p.part_ml[2 * slot + 1] = l_s[h];
                }
            }
        }
        __syncthreads();
    }
}

#define DECODE(T, S, D)                                                                            \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS) attn_decode_##S##_d##D(AttnParamsD p) { \
        if (blockIdx.x < p.num_items) decode_impl<T, D>(p);                                         \
    }
DECODE(float, f32, 64)
DECODE(float, f32, 128)
DECODE(bf16, bf16, 64)
DECODE(bf16, bf16, 128)
