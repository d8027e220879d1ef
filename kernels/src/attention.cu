// Paged attention over the KV cache, for prefill chunks and decodes alike (causal, GQA).
//
// Every new token's K and V are already in the cache (rope_kv_write), so one kernel serves a
// prefill from scratch, a chunk after earlier chunks, a prefix-cache hit and a decode: queries
// attend to cache positions 0..=their own position. A block of 4 warps takes one work item
// (a tile of up to ROWS / group consecutive query tokens of one sequence) for one KV head and all
// the query heads sharing it, streams 32-key tiles of K and V through shared memory and keeps an
// online softmax per row (FlashAttention-2 style). With num_splits > 1 the context is split
// across blocks (flash-decoding) and attn_combine merges the partial results; split launches take
// only single-token items (decodes), so partial results are indexed by item.
//
// A sequence's result depends only on its own context and split size, never on the rest of the
// batch: the direct path divides by the softmax sum exactly as the combine does for one split.
//
// attention_bf16_kv8 reads an FP8 cache (E4M3 codes; the K scale folded into scale_log2 by the
// caller, the V scale applied to the outputs and partials), for head sizes and groups without a
// tensor-core kv8 kernel.
#include "common.cuh"

#define ROWS ATTN_ROWS
#define ROWS_PER_WARP 4
#define KTILE ATTN_KEY_TILE
#define MAX_D ATTN_MAX_HEAD_DIM

template <typename T, bool KV8>
__device__ void attention_impl(const AttnParams& p) {
    extern __shared__ float smem[];
    const int d = p.d, group = p.hq / p.hkv;
    const int tile_tokens = ROWS / group > 0 ? ROWS / group : 1;
    const int item = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    if (item >= p.num_items) return;
    const QueryTile qt = query_tile(p.items, p.seqs, item, tile_tokens);
    const int seq = qt.seq, q0 = qt.q0, q_start = qt.q_start, n_tok = qt.n_tok;
    const int rows = n_tok * group;
    const int first_pos = qt.first_pos;
    const int last_pos = first_pos + n_tok - 1;
    const int kv_lo = split * p.split_size;
    const int kv_hi = min(last_pos + 1, kv_lo + p.split_size);

    float* q_s = smem;                 // [ROWS][d]
    float* k_s = q_s + ROWS * d;       // [KTILE][d + 1]
    float* v_s = k_s + KTILE * (d + 1); // [KTILE][d]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (int i = threadIdx.x; i < rows * d; i += blockDim.x) {
        const int r = i / d, c = i % d;
        const int tok = q_start + q0 + r / group, h = kvh * group + r % group;
        q_s[i] = to_f(((const T*)p.q)[((size_t)tok * p.hq + h) * d + c]);
    }

    float m[ROWS_PER_WARP], l[ROWS_PER_WARP], acc[ROWS_PER_WARP][MAX_D / 32];
#pragma unroll
    for (int i = 0; i < ROWS_PER_WARP; i++) {
        m[i] = -INFINITY;
        l[i] = 0.f;
#pragma unroll
        for (int c = 0; c < MAX_D / 32; c++) acc[i][c] = 0.f;
    }

    const u32* table = p.block_tables + (size_t)seq * p.table_stride;
    for (int k0 = kv_lo; k0 < kv_hi; k0 += KTILE) {
        __syncthreads();
        for (int i = threadIdx.x; i < KTILE * d; i += blockDim.x) {
            const int j = i / d, c = i % d, pos = k0 + j;
            float kv = 0.f, vv = 0.f;
            if (pos < kv_hi) {
                const size_t base =
                    (((size_t)table[pos / p.block_size] * p.hkv + kvh) * p.block_size + pos % p.block_size) * d + c;
                if constexpr (KV8) {
                    kv = e4m3_to_f(((const unsigned char*)p.k_cache)[base]);
                    vv = e4m3_to_f(((const unsigned char*)p.v_cache)[base]);
                } else {
                    kv = to_f(((const T*)p.k_cache)[base]);
                    vv = to_f(((const T*)p.v_cache)[base]);
                }
            }
            k_s[j * (d + 1) + c] = kv;
            v_s[j * d + c] = vv;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ROWS_PER_WARP; i++) {
            const int r = warp + 4 * i;
            if (r >= rows) break;
            const int qpos = first_pos + r / group;
            const int key = k0 + lane;
            float s = -INFINITY;
            if (key < kv_hi && key <= qpos) {
                float dot = 0.f;
                const float* qr = q_s + r * d;
                const float* kr = k_s + lane * (d + 1);
                for (int c = 0; c < d; c++) dot += qr[c] * kr[c];
                s = dot * p.scale_log2;
            }
            const float m_new = fmaxf(m[i], warp_max(s));
            if (m_new == -INFINITY) continue; // nothing visible yet for this row
            const float pr = exp2f(s - m_new);
            const float corr = exp2f(m[i] - m_new);
            l[i] = l[i] * corr + warp_sum(pr);
            m[i] = m_new;
#pragma unroll
            for (int c = 0; c < MAX_D / 32; c++) acc[i][c] *= corr;
            for (int j = 0; j < KTILE; j++) {
                const float pj = __shfl_sync(0xffffffffu, pr, j);
#pragma unroll
                for (int c = 0; c < MAX_D / 32; c++) {
                    const int col = lane + 32 * c;
                    if (col < d) acc[i][c] += pj * v_s[j * d + col];
                }
            }
        }
    }

    const float vs = KV8 ? p.v_scale : 1.f;
#pragma unroll
    for (int i = 0; i < ROWS_PER_WARP; i++) {
        const int r = warp + 4 * i;
        if (r >= rows) break;
        const int tok = q_start + q0 + r / group, h = kvh * group + r % group;
#pragma unroll
        for (int c = 0; c < MAX_D / 32; c++) acc[i][c] *= vs;
        if (p.num_splits == 1) {
#pragma unroll
            for (int c = 0; c < MAX_D / 32; c++) {
                const int col = lane + 32 * c;
                if (col < d)
                    ((T*)p.out)[((size_t)tok * p.hq + h) * d + col] = from_f<T>(l[i] > 0.f ? acc[i][c] / l[i] : 0.f);
            }
        } else {
            const size_t slot = ((size_t)item * p.hq + h) * p.num_splits + split;
#pragma unroll
            for (int c = 0; c < MAX_D / 32; c++) {
                const int col = lane + 32 * c;
                if (col < d) p.part_o[slot * d + col] = acc[i][c];
            }
            if (lane == 0) {
                p.part_ml[2 * slot] = m[i];
                p.part_ml[2 * slot + 1] = l[i];
            }
        }
    }
}

// Merges the splits of each (item, head). Grid: (num_items, hq); block: d threads (rounded up to 32).
template <typename T>
__device__ void combine_impl(const AttnParams& p) {
    const int item = blockIdx.x, h = blockIdx.y, c = threadIdx.x;
    // Split launches take only decodes (one query token), whose item's second word is not a query
    // offset but its split-sharing code (decode_mma.cu).
    const int tok = p.seqs[4 * p.items[2 * item]];
    const size_t base = ((size_t)item * p.hq + h) * p.num_splits;
    float gm = -INFINITY;
    for (int s = 0; s < p.num_splits; s++) gm = fmaxf(gm, p.part_ml[2 * (base + s)]);
    float num = 0.f, den = 0.f;
    for (int s = 0; s < p.num_splits; s++) {
        const float ms = p.part_ml[2 * (base + s)];
        if (ms == -INFINITY) continue;
        const float w = exp2f(ms - gm);
        den += w * p.part_ml[2 * (base + s) + 1];
        if (c < p.d) num += w * p.part_o[(base + s) * p.d + c];
    }
    if (c < p.d) ((T*)p.out)[((size_t)tok * p.hq + h) * p.d + c] = from_f<T>(den > 0.f ? num / den : 0.f);
}

// Splits without work still write an empty partial, so attn_combine never reads stale data.
template <typename T, bool KV8> __device__ __forceinline__ void attention_entry(const AttnParams& p) {
    const int group = p.hq / p.hkv, tile = ROWS / group > 0 ? ROWS / group : 1;
    if (p.num_splits > 1 && blockIdx.x < p.num_items) {
        const QueryTile qt = query_tile(p.items, p.seqs, blockIdx.x, tile);
        const int last = qt.first_pos + qt.n_tok - 1;
        if ((int)blockIdx.z * p.split_size > last) {
            const int w = threadIdx.x;
            if (w < qt.n_tok * group) {
                const int h = blockIdx.y * group + w % group;
                const size_t slot = ((size_t)blockIdx.x * p.hq + h) * p.num_splits + blockIdx.z;
                p.part_ml[2 * slot] = -INFINITY;
                p.part_ml[2 * slot + 1] = 0.f;
            }
            return;
        }
    }
    attention_impl<T, KV8>(p);
}

#define ATTENTION(T, S)                                                                            \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_##S(AttnParams p) {       \
        attention_entry<T, false>(p);                                                              \
    }                                                                                              \
    extern "C" __global__ void attn_combine_##S(AttnParams p) {                                    \
        PDL_ENTRY();                                                                               \
        combine_impl<T>(p);                                                                        \
    }
ATTENTION(float, f32)
ATTENTION(bf16, bf16)
// bf16 queries and outputs over an FP8 (E4M3) cache; its splits combine with attn_combine_bf16.
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attention_bf16_kv8(AttnParams p) {
    attention_entry<bf16, true>(p);
}
