// Paged attention for single-token queries (decodes), tuned for bandwidth: the counterpart of
// attention.cu's general kernel for head sizes 64 and 128 and 1, 2, 4 or 8 query heads per KV head.
// bf16 at head size 128 runs on decode_mma.cu's tensor-core version of it by default.
//
// A block of 128 threads takes one (decode item, KV head, context split). K and V stream through a
// ring of 32-key shared-memory stages (dynamic shared memory: up to 4 stages within 48 KiB for
// 2-byte elements, 3 at D 128, so 4 blocks fit an SM; within 64 KiB for f32, 2 at D 128) filled by
// 16-byte cp.async copies issued a whole ring ahead, so many loads are in flight per SM without
// registers holding them (the register-load version was latency-bound at 42% of DRAM bandwidth,
// 127 registers). With 64 KiB bf16 rings only 3 blocks fit an SM: batch 128's 1,024 blocks then
// ran in 2.6 waves, the last one 60 % full.
//
// Each key is handled by D/8 threads (a key lane), each owning 8 of its dimensions and that slice
// of every query head of the group. A thread copies exactly the K/V chunks it later reads, so a
// stage wait is its own cp.async.wait_group and the main loop has no block barrier: warps run
// independently. Per tile, a key lane
//  1. computes q·k for its keys (a reduce-scatter leaves each lane one head's scores),
//  2. updates its own online softmax (max, sum) per head, once for its keys of the tile,
//  3. accumulates p·v into per-head 8-dimension partial outputs (p and the rescale broadcast
//     from the lanes holding each head).
// The key lanes' (max, sum, output) are merged through shared memory at the end in a fixed order,
// so a result depends only on its own context and split size. Results and split partials use the
// same layout and final division as attention.cu, so the combine kernel (attn_combine_*) is shared.
#include "common.cuh"

#define DEC_THREADS DECODE_THREADS
#define DEC_TK DECODE_KEY_TILE // keys per stage
// K/V ring budget per block (dynamic shared memory) for elements of `elem_bytes`.
constexpr int dec_ring_bytes(int elem_bytes) { return elem_bytes == 2 ? DECODE_RING_BYTES_2 : DECODE_RING_BYTES_4; }

// Stages of the ring for rows of `d` elements of `elem_bytes` (decode_smem_bytes in lib.rs
// mirrors this).
constexpr int dec_stages(int elem_bytes, int d) {
    return dec_ring_bytes(elem_bytes) / (2 * DEC_TK * d * elem_bytes) < 4
               ? dec_ring_bytes(elem_bytes) / (2 * DEC_TK * d * elem_bytes)
               : 4;
}

// Copies 16 bytes global -> shared without registers; zero-fills the destination if !valid.
__device__ __forceinline__ void cp_async16(uint4* dst, const uint4* src, bool valid) {
    const u32 s = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's copy groups are pending.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The 8 elements of a row that a thread owns: 16-byte chunks sub + c * TPK (one chunk for bf16,
// two for f32, so each quarter-warp reads 128 contiguous bytes).
template <typename T, int TPK> __device__ __forceinline__ void slice8(const uint4* row, int sub, float* out) {
    constexpr int EPC = 16 / sizeof(T);
#pragma unroll
    for (int c = 0; c < 8 / EPC; c++) unpack16(row[sub + c * TPK], out + c * EPC, T());
}
// Dimension of a thread's element e (0..7) in slice8's layout.
template <typename T, int TPK> __device__ __forceinline__ int slice_dim(int sub, int e) {
    constexpr int EPC = 16 / sizeof(T);
    return (sub + e / EPC * TPK) * EPC + e % EPC;
}

// Sums v[h] (one partial per head) over the TPK aligned lanes that share a key, as a
// reduce-scatter: each halving step exchanges half of the heads still held, so G heads cost
// G - 1 + log2(TPK / G) shuffles instead of G log2(TPK). Returns the full sum of head
// (lane % TPK) / (TPK / G); the TPK / G lanes holding a head get bitwise-equal sums.
template <int G, int TPK> __device__ __forceinline__ float reduce_scatter(const float (&v)[G], int lane) {
    float w[G];
#pragma unroll
    for (int i = 0; i < G; i++) w[i] = v[i];
#pragma unroll
    for (int c = G, o = TPK / 2; c > 1; c >>= 1, o >>= 1) {
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < c / 2; i++) {
            const float keep = up ? w[i + c / 2] : w[i];
            const float send = up ? w[i] : w[i + c / 2];
            w[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
    float s = w[0];
#pragma unroll
    for (int o = TPK / (2 * G); o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

// Head h's value of v within the key lane (v as held by the lanes of head h, see reduce_scatter).
template <int G, int TPK> __device__ __forceinline__ float from_head(float v, int h) {
    return G == 1 ? v : __shfl_sync(0xffffffffu, v, h * (TPK / G), TPK);
}

// exp2(m - top) as a merge weight; 0 for a part that saw no keys.
__device__ __forceinline__ float merge_weight(float m, float top) { return m == -INFINITY ? 0.f : exp2f(m - top); }

// The keys [kv_lo, kv_hi) of its sequence's context that a decode block (item, split) takes.
struct DecodeSplit {
    int seq, q_start, kv_lo, kv_hi;
};
__device__ __forceinline__ DecodeSplit decode_split(const AttnParams& p, int item, int split) {
    DecodeSplit s;
    s.seq = p.items[2 * item];
    s.q_start = p.seqs[4 * s.seq];
    const int ctx = p.seqs[4 * s.seq + 2];
    s.kv_lo = split * p.split_size;
    s.kv_hi = min(ctx, s.kv_lo + p.split_size);
    return s;
}

// Whether the block's split of a split launch has no keys; such a split only marks its G
// partials empty (attn_combine then skips their part_o).
__device__ __forceinline__ bool skip_empty_split(const AttnParams& p, const DecodeSplit& s, int item,
                                                 int kvh, int split, int G) {
    if (s.kv_lo < s.kv_hi || p.num_splits == 1) return false;
    if ((int)threadIdx.x < G) {
        const size_t slot = ((size_t)item * p.hq + kvh * G + threadIdx.x) * p.num_splits + split;
        p.part_ml[2 * slot] = -INFINITY;
        p.part_ml[2 * slot + 1] = 0.f;
    }
    return true;
}

// Threads < G: the top max and the total sum of head tid over the block's `parts` online-softmax
// states (m and l of part k at [k * stride + head]), into mf[tid] and lf[tid].
__device__ __forceinline__ void merge_states(const float* m, const float* l, int parts, int stride,
                                             int G, float* mf, float* lf) {
    const int h = threadIdx.x;
    if (h < G) {
        float top = -INFINITY, tot = 0.f;
        for (int k = 0; k < parts; k++) top = fmaxf(top, m[k * stride + h]);
        for (int k = 0; k < parts; k++) tot += merge_weight(m[k * stride + h], top) * l[k * stride + h];
        mf[h] = top;
        lf[h] = tot;
    }
}

// Sums the block's `parts` rescaled partial outputs (accs: [parts][R][D], R = G * members rows: row
// r is query head r % G of decode item item + r / G, the members of a shared split being
// consecutive items) in order and writes the result: normalised into out for a single split, else
// as the split's partial (part_o, and part_ml from mf, lf) for attn_combine.
template <typename T, int D>
__device__ __forceinline__ void write_decode_out(const AttnParams& p, const float* accs, int parts, int G,
                                                 int members, int item, int kvh, int split,
                                                 const float* mf, const float* lf) {
    const int R = G * members;
    for (int i = threadIdx.x; i < R * D; i += DEC_THREADS) {
        const int r = i / D, c = i % D, it = item + r / G, qh = kvh * G + r % G;
        float o = 0.f;
        for (int k = 0; k < parts; k++) o += accs[(k * R + r) * D + c];
        if (p.num_splits == 1) {
            const int q_start = p.seqs[4 * p.items[2 * it]];
            const float tot = lf[r];
            ((T*)p.out)[((size_t)q_start * p.hq + qh) * D + c] = from_f<T>(tot > 0.f ? o / tot : 0.f);
        } else {
            const size_t slot = ((size_t)it * p.hq + qh) * p.num_splits + split;
            p.part_o[slot * D + c] = o;
            if (c == 0) {
                p.part_ml[2 * slot] = mf[r];
                p.part_ml[2 * slot + 1] = lf[r];
            }
        }
    }
}

template <typename T, int D, int G>
__device__ void decode_impl(const AttnParams& p) {
    constexpr int EPC = 16 / sizeof(T);    // elements per 16-byte chunk
    constexpr int CPR = D / EPC;           // chunks per row
    constexpr int TPK = D / 8;             // threads per key
    constexpr int KPP = DEC_THREADS / TPK; // key lanes = keys per pass
    constexpr int NI = DEC_TK / KPP;       // keys per thread and tile
    constexpr int KLW = 32 / TPK;          // key lanes per warp
    constexpr int NST = dec_stages(sizeof(T), D);
    constexpr int STAGE = 2 * DEC_TK * CPR; // chunks per stage: K rows, then V rows
    static_assert(G <= TPK && KLW * NI == 8 && NST >= 1 && NST <= 4, "thread mapping");
    static_assert(KPP * G * D * 4 <= NST * STAGE * 16, "the merge buffer reuses the ring");
    extern __shared__ uint4 ring[]; // [NST][STAGE]
    __shared__ float m_s[KPP][G], l_s[KPP][G], mf_s[G], lf_s[G];

    const int item = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const DecodeSplit ds = decode_split(p, item, split);
    if (skip_empty_split(p, ds, item, kvh, split, G)) return;
    const int seq = ds.seq, q_start = ds.q_start, kv_lo = ds.kv_lo, kv_hi = ds.kv_hi;
    const int tiles = (max(kv_hi - kv_lo, 0) + DEC_TK - 1) / DEC_TK;
    const u32* table = p.block_tables + (size_t)seq * p.table_stride;
    const uint4* kc = (const uint4*)p.k_cache;
    const uint4* vc = (const uint4*)p.v_cache;
    const int sub = tid % TPK, kl = tid / TPK, head = sub / (TPK / G), lane = tid % 32;
    const int kl0 = tid / 32 * KLW; // the warp's first key lane

    // Cache rows of the warp's keys in tiles 4g..4g+3, one per lane (one table read and division
    // per lane every 4 tiles): lane L holds tile 4g + L / 8, the warp's key L % 8 there; 0 past
    // the end. The warp's key x of a tile is key lane kl0 + x % KLW, key x / KLW of that lane.
    auto group_rows = [&](int g) -> u32 {
        const int x = lane % 8;
        const int j = kv_lo + (4 * g + lane / 8) * DEC_TK + kl0 + x % KLW + x / KLW * KPP;
        if (j >= kv_hi) return 0u;
        const int b = j / p.block_size;
        return (table[b] * p.hkv + kvh) * p.block_size + (j - b * p.block_size);
    };
    // Copies this thread's chunks of tile t into stage t % NST and commits them as one group
    // (an empty group past the last tile keeps the wait count uniform). rows: group_rows(t / 4).
    auto issue = [&](int t, u32 rows) {
        if (t < tiles) {
            uint4* st = ring + (t % NST) * STAGE;
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const int jl = kl + i * KPP;
                const bool valid = kv_lo + t * DEC_TK + jl < kv_hi;
                const size_t row = (size_t)__shfl_sync(0xffffffffu, rows, t % 4 * 8 + kl - kl0 + KLW * i) * CPR;
#pragma unroll
                for (int c = 0; c < 8 / EPC; c++) {
                    const int ch = sub + c * TPK;
                    cp_async16(st + jl * CPR + ch, kc + row + ch, valid);
                    cp_async16(st + (DEC_TK + jl) * CPR + ch, vc + row + ch, valid);
                }
            }
        }
        cp_async_commit();
    };

    float q[G][8];
#pragma unroll
    for (int h = 0; h < G; h++)
        slice8<T, TPK>((const uint4*)p.q + ((size_t)q_start * p.hq + kvh * G + h) * CPR, sub, q[h]);
    u32 rows = group_rows(0);
#pragma unroll
    for (int t = 0; t < NST; t++) issue(t, rows);

    // Online softmax state of this key lane: (m, l) of head `head`, outputs of every head.
    float m = -INFINITY, l = 0.f, acc[G][8];
#pragma unroll
    for (int h = 0; h < G; h++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[h][e] = 0.f;

    for (int t = 0; t < tiles; t++) {
        const int refill = t + NST;
        if (refill % 4 == 0 && refill < tiles) rows = group_rows(refill / 4); // used after the math
        cp_async_wait<NST - 1>();
        const uint4* st = ring + (t % NST) * STAGE;
        const int k0 = kv_lo + t * DEC_TK;
        // 1. scores (log2 domain) of head `head` for this thread's keys; -inf past the end
        float s[NI];
#pragma unroll
        for (int i = 0; i < NI; i++) {
            const int jl = kl + i * KPP;
            float kf[8];
            slice8<T, TPK>(st + jl * CPR, sub, kf);
            float part[G];
#pragma unroll
            for (int h = 0; h < G; h++) {
                part[h] = 0.f;
#pragma unroll
                for (int e = 0; e < 8; e++) part[h] += q[h][e] * kf[e];
            }
            const float dot = reduce_scatter<G, TPK>(part, tid);
            s[i] = k0 + jl < kv_hi ? dot * p.scale_log2 : -INFINITY;
        }
        // 2. online softmax (mu = 0 while no key is seen, so every exponent is -inf, not NaN)
        float m_new = m;
#pragma unroll
        for (int i = 0; i < NI; i++) m_new = fmaxf(m_new, s[i]);
        const float mu = m_new == -INFINITY ? 0.f : m_new;
        const float corr = exp2f(m - mu);
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < NI; i++) {
            s[i] = exp2f(s[i] - mu);
            sum += s[i];
        }
        l = l * corr + sum;
        m = m_new;
        // 3. p·v (keys past the end have p = 0 and zero-filled V)
#pragma unroll
        for (int h = 0; h < G; h++) {
            const float c = from_head<G, TPK>(corr, h);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[h][e] *= c;
        }
#pragma unroll
        for (int i = 0; i < NI; i++) {
            float vf[8];
            slice8<T, TPK>(st + (DEC_TK + kl + i * KPP) * CPR, sub, vf);
#pragma unroll
            for (int h = 0; h < G; h++) {
                const float pj = from_head<G, TPK>(s[i], h);
#pragma unroll
                for (int e = 0; e < 8; e++) acc[h][e] += pj * vf[e];
            }
        }
        // This thread has read its chunks of the stage, and only it writes them: refill now.
        issue(refill, rows);
    }

    // Merge the key lanes: per head the top max and total sum, then the rescaled outputs summed
    // through shared memory (the ring, now idle), key lanes in order.
    cp_async_wait<0>();
    if (sub % (TPK / G) == 0) {
        m_s[kl][head] = m;
        l_s[kl][head] = l;
    }
    __syncthreads();
    merge_states(&m_s[0][0], &l_s[0][0], KPP, G, G, mf_s, lf_s);
    __syncthreads();
    float* accs = (float*)ring; // [KPP][G][D]
#pragma unroll
    for (int h = 0; h < G; h++) {
        const float w = merge_weight(m_s[kl][h], mf_s[h]);
#pragma unroll
        for (int e = 0; e < 8; e += 4)
            *(float4*)&accs[(kl * G + h) * D + slice_dim<T, TPK>(sub, e)] =
                make_float4(acc[h][e] * w, acc[h][e + 1] * w, acc[h][e + 2] * w, acc[h][e + 3] * w);
    }
    __syncthreads();
    write_decode_out<T, D>(p, accs, KPP, G, 1, item, kvh, split, mf_s, lf_s);
}

#define DECODE(T, S, D, G)                                                                         \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS, G == 8 ? 3 : 4)                      \
        attn_decode_##S##_d##D##_g##G(AttnParams p) {                                             \
        if (blockIdx.x < p.num_items) decode_impl<T, D, G>(p);                                     \
    }
#define DECODE_G(T, S, D) DECODE(T, S, D, 1) DECODE(T, S, D, 2) DECODE(T, S, D, 4) DECODE(T, S, D, 8)
DECODE_G(float, f32, 64)
DECODE_G(float, f32, 128)
DECODE_G(bf16, bf16, 64)
DECODE_G(bf16, bf16, 128)
