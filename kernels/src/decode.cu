// Paged attention for single-token queries (decodes), tuned for bandwidth: the counterpart of
// attention.cu's general kernel for head sizes 64 and 128 and 1, 2, 4 or 8 query heads per KV head.
//
// A block of 128 threads takes one (decode item, KV head, context split) and streams 32-key tiles
// (small tiles keep registers at 128 a thread, so 4 blocks fit on an SM: ncu showed the 64-key
// version at 168 registers and 3 blocks, latency-bound at 41% of DRAM bandwidth):
//  1. q·k: each key is handled by D/8 threads, each holding 8 of its dimensions (one 16-byte bf16
//     load) and the matching slice of every query head of the group; a few shuffles finish the dots.
//     The same threads' V rows for step 3 are loaded here too, so K and V stream together;
//  2. one warp per query head updates the online softmax over the tile;
//  3. p·v: threads own 8 dimensions for every head and a stride of the tile's keys.
// The per-thread partial outputs are summed through shared memory at the end. Results and the split
// partials use the same layout and the same final division as attention.cu, so the combine kernel
// (attn_combine_*) is shared.
#include "common.cuh"

#define DEC_TK 32
#define DEC_THREADS 128
static_assert(DEC_TK == 32, "the softmax step maps one score of the tile to each lane");

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

// 8 elements of T as raw 16-byte words.
template <typename T> struct Raw8 { uint4 w[sizeof(T) / 2]; };

template <typename T> __device__ __forceinline__ Raw8<T> ld8(const T* p) {
    Raw8<T> r;
#pragma unroll
    for (int i = 0; i < (int)(sizeof(T) / 2); i++) r.w[i] = __ldg((const uint4*)p + i);
    return r;
}
template <typename T> __device__ __forceinline__ Raw8<T> zero8() {
    Raw8<T> r;
#pragma unroll
    for (int i = 0; i < (int)(sizeof(T) / 2); i++) r.w[i] = make_uint4(0, 0, 0, 0);
    return r;
}
__device__ __forceinline__ void un8(const Raw8<float>& r, float* o) {
    unpack16(r.w[0], o, 0.f);
    unpack16(r.w[1], o + 4, 0.f);
}
__device__ __forceinline__ void un8(const Raw8<bf16>& r, float* o) { unpack16(r.w[0], o, bf16()); }

// Sums v[h] (one partial per head) over the TPK aligned lanes that share a key, as a
// reduce-scatter: each halving step exchanges half of the heads still held, so G heads cost
// G - 1 + log2(TPK / G) shuffles instead of G log2(TPK). Returns the full sum of head `head`;
// every lane ends with one head (lanes whose low log2(TPK / G) bits differ hold the same head).
template <int G, int TPK>
__device__ __forceinline__ float reduce_scatter(const float (&v)[G], int lane, int& head) {
    float w[G];
#pragma unroll
    for (int i = 0; i < G; i++) w[i] = v[i];
    int base = 0;
#pragma unroll
    for (int c = G, o = TPK / 2; c > 1; c >>= 1, o >>= 1) {
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < c / 2; i++) {
            const float keep = up ? w[i + c / 2] : w[i];
            const float send = up ? w[i] : w[i + c / 2];
            w[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
        if (up) base += c / 2;
    }
    float s = w[0];
#pragma unroll
    for (int o = TPK / (2 * G); o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    head = base;
    return s;
}

template <typename T, int D, int G>
__device__ void decode_impl(const AttnParamsD& p) {
    constexpr int TPK = D / 8;             // threads per key (q·k)
    constexpr int KPP = DEC_THREADS / TPK; // keys per pass
    constexpr int SLICES = D / 8;          // 8-dim slices (p·v)
    constexpr int KLANES = DEC_THREADS / SLICES;
    constexpr int VKEYS = DEC_TK / KLANES; // V rows per thread per tile
    constexpr int HB = G < 4 ? G : 4;      // heads per pass of the final reduction
    __shared__ float sc[G][DEC_TK];
    __shared__ float m_s[G], l_s[G], corr_s[G];
    __shared__ float accs[KLANES * HB * D];
    const int item = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const int seq = p.items[2 * item];
    const int q_start = p.seqs[4 * seq], ctx = p.seqs[4 * seq + 2];
    const int kv_lo = split * p.split_size;
    const int kv_hi = min(ctx, kv_lo + p.split_size);
    const u32* table = p.block_tables + (size_t)seq * p.table_stride;
    const T* kc = (const T*)p.k_cache;
    const T* vc = (const T*)p.v_cache;
    auto row = [&](int j) {
        return (((size_t)table[j / p.block_size] * p.hkv + kvh) * p.block_size + j % p.block_size) * D;
    };

    float q[G][8];
    const int qs = (tid % TPK) * 8;
#pragma unroll
    for (int h = 0; h < G; h++) un8(ld8((const T*)p.q + ((size_t)q_start * p.hq + kvh * G + h) * D + qs), q[h]);
    if (tid < G) { m_s[tid] = -INFINITY; l_s[tid] = 0.f; }

    const int vs = (tid % SLICES) * 8, kl = tid / SLICES;
    float acc[G][8];
#pragma unroll
    for (int h = 0; h < G; h++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[h][e] = 0.f;

    for (int k0 = kv_lo; k0 < kv_hi; k0 += DEC_TK) {
        // Issue this tile's V loads first; they are consumed after the softmax.
        Raw8<T> vraw[VKEYS];
#pragma unroll
        for (int i = 0; i < VKEYS; i++) {
            const int j = k0 + kl + i * KLANES;
            vraw[i] = j < kv_hi ? ld8(vc + row(j) + vs) : zero8<T>();
        }
        // 1. scores
        Raw8<T> kraw[DEC_TK / KPP];
#pragma unroll
        for (int pass = 0; pass < DEC_TK / KPP; pass++) {
            const int j = k0 + pass * KPP + tid / TPK;
            kraw[pass] = j < kv_hi ? ld8(kc + row(j) + qs) : zero8<T>();
        }
#pragma unroll
        for (int pass = 0; pass < DEC_TK / KPP; pass++) {
            const int jl = pass * KPP + tid / TPK;
            float kf[8];
            un8(kraw[pass], kf);
            float part[G];
#pragma unroll
            for (int h = 0; h < G; h++) {
                part[h] = 0.f;
#pragma unroll
                for (int e = 0; e < 8; e++) part[h] += q[h][e] * kf[e];
            }
            int h;
            const float s = reduce_scatter<G, TPK>(part, tid, h);
            if ((tid & (TPK / G - 1)) == 0) sc[h][jl] = k0 + jl < kv_hi ? s * p.scale_log2 : -INFINITY;
        }
        __syncthreads();
        // 2. online softmax, one warp per head
        const int lane = tid & 31, warp = tid >> 5;
        for (int h = warp; h < G; h += DEC_THREADS / 32) {
            const float a = sc[h][lane];
            const float m_old = m_s[h];
            const float m_new = fmaxf(m_old, warp_max(a));
            const float pa = exp2f(a - m_new);
            sc[h][lane] = pa;
            const float sum = warp_sum(pa);
            if (lane == 0) {
                const float c = exp2f(m_old - m_new);
                corr_s[h] = c;
                l_s[h] = l_s[h] * c + sum;
                m_s[h] = m_new;
            }
        }
        __syncthreads();
        // 3. p·v (keys past the end have p = 0 and zeroed V)
#pragma unroll
        for (int h = 0; h < G; h++) {
            const float c = corr_s[h];
#pragma unroll
            for (int e = 0; e < 8; e++) acc[h][e] *= c;
        }
#pragma unroll
        for (int i = 0; i < VKEYS; i++) {
            const int jl = kl + i * KLANES;
            float vf[8];
            un8(vraw[i], vf);
#pragma unroll
            for (int h = 0; h < G; h++) {
                const float pj = sc[h][jl];
#pragma unroll
                for (int e = 0; e < 8; e++) acc[h][e] += pj * vf[e];
            }
        }
        __syncthreads();
    }

    // Sum the KLANES partial outputs, HB heads at a time through shared memory.
#pragma unroll
    for (int h0 = 0; h0 < G; h0 += HB) {
#pragma unroll
        for (int hh = 0; hh < HB; hh++)
#pragma unroll
            for (int e = 0; e < 8; e++) accs[(kl * HB + hh) * D + vs + e] = acc[h0 + hh][e];
        __syncthreads();
        for (int i = tid; i < HB * D; i += DEC_THREADS) {
            const int hh = i / D, c = i % D, h = h0 + hh;
            float s = 0.f;
            for (int k = 0; k < KLANES; k++) s += accs[(k * HB + hh) * D + c];
            const int qh = kvh * G + h;
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

#define DECODE(T, S, D, G)                                                                         \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS, 4)                                   \
        attn_decode_##S##_d##D##_g##G(AttnParamsD p) {                                             \
        if (blockIdx.x < p.num_items) decode_impl<T, D, G>(p);                                     \
    }
#define DECODE_G(T, S, D) DECODE(T, S, D, 1) DECODE(T, S, D, 2) DECODE(T, S, D, 4) DECODE(T, S, D, 8)
DECODE_G(float, f32, 64)
DECODE_G(float, f32, 128)
DECODE_G(bf16, bf16, 64)
DECODE_G(bf16, bf16, 128)
