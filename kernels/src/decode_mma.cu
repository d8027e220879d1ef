// Paged attention for single-token queries on tensor cores (bf16, head size 128, 1, 2, 4 or 8 query
// heads per KV head): decode.cu's kernel with the arithmetic moved from the CUDA cores to
// mma.sync, the default for that type and head size (RINGSERVE_CUDA_DECODE_MMA=0 keeps decode.cu's).
// The CUDA-core version spends about 16 instructions a thread per key and head (the q·k and p·v
// products, bf16 unpacking, shuffles); here a warp does 8 keys of a head group in about 100. On the
// H200 (run 15b) that makes batch 128's attention at 512 keys 5 % faster alone and the whole decode
// step 4 % faster.
// How the copies are laid out matters as much: a first version whose copy instructions each took a
// quarter of 8 rows ran 4–7 % slower than the CUDA-core kernel at batch 128 (run 15a); each now
// takes two whole 256-byte rows, as decode.cu's do.
//
// Same grid, block (128 threads), K/V ring (3 stages of 32 keys, 48 KiB: 4 blocks an SM),
// parameters, partials and combine as decode.cu. Warp w owns keys 8w..8w+7 of every 32-key tile
// and copies exactly those K and V rows itself (16-byte cp.async, chunks XOR-swizzled by row & 7
// as in prefill_mma.cu, so ldmatrix reads are free of bank conflicts), so a stage wait is the
// warp's own cp.async.wait_group plus __syncwarp: warps run independently until the final merge.
//
// Per tile a warp computes S = Q·Kᵀ for its 8 keys with m16n8k16 (A: the group's query heads as
// rows 0..G-1 of the 16, the rest zero; B: K rows by ldmatrix), updates an online softmax per head
// row (max over the quad of lanes that hold a row), and adds P·V with m16n8k8 (A: P packed to bf16
// straight from the score fragment; B: V rows by ldmatrix.trans). Rows 8..15 of every A operand are
// zero, so their accumulators are never kept: the mma wrappers below feed zeros and drop those
// outputs, which halves the registers holding O. The four warps' (max, sum, output) are merged
// through shared memory at the end in a fixed order, as decode.cu merges its key lanes, so a
// result depends only on its own context and split size.
//
// Shared prefixes: with fewer than 8 (DECODE_MMA_ROWS) query heads per KV head, rows G..7 of A
// are free, so a split whose cache blocks several sequences share (a prompt prefix held once by
// prefix caching) is computed by one block for up to 8 / G of them, each sequence's heads in its
// own rows: the split's K and V are read once for all of them instead of once each. The results
// are bit-identical to the unshared blocks' (see the share code below).
#define DM_KW 8 // keys per warp per tile (DEC_TK / 4 warps)

// m16n8k16 with A rows 8..15 and C rows 8..15 zero: c0, c1 (row lane / 4) accumulate; the
// outputs of rows 8..15 go to registers local to the asm block.
// F16: f16 operands (the FP8-cache kernel), else bf16.
template <bool F16>
__device__ __forceinline__ void mma_top_k16(float& c0, float& c1, u32 a0, u32 a2, u32 b0, u32 b1) {
    if constexpr (F16)
        asm volatile(
            "{\n.reg .f32 d2, d3;\n"
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,d2,d3}, {%2,%6,%3,%6}, {%4,%5}, "
            "{%0,%1,%7,%7};\n}\n"
            : "+f"(c0), "+f"(c1)
            : "r"(a0), "r"(a2), "r"(b0), "r"(b1), "r"(0u), "f"(0.f));
    else
        asm volatile(
            "{\n.reg .f32 d2, d3;\n"
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,d2,d3}, {%2,%6,%3,%6}, {%4,%5}, "
            "{%0,%1,%7,%7};\n}\n"
            : "+f"(c0), "+f"(c1)
            : "r"(a0), "r"(a2), "r"(b0), "r"(b1), "r"(0u), "f"(0.f));
}

// m16n8k8 with A rows 8..15 and C rows 8..15 zero.
template <bool F16>
__device__ __forceinline__ void mma_top_k8(float& c0, float& c1, u32 a0, u32 b0) {
    if constexpr (F16)
        asm volatile(
            "{\n.reg .f32 d2, d3;\n"
            "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,d2,d3}, {%2,%4}, {%3}, "
            "{%0,%1,%5,%5};\n}\n"
            : "+f"(c0), "+f"(c1)
            : "r"(a0), "r"(b0), "r"(0u), "f"(0.f));
    else
        asm volatile(
            "{\n.reg .f32 d2, d3;\n"
            "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,d2,d3}, {%2,%4}, {%3}, "
            "{%0,%1,%5,%5};\n}\n"
            : "+f"(c0), "+f"(c1)
            : "r"(a0), "r"(b0), "r"(0u), "f"(0.f));
}

// The FP8-cache variant's shared memory (DECODE_KV8_SMEM_BYTES, 4 blocks an SM): a ring of E4M3
// stages (per warp its 8 keys' K rows, then their V rows, 128 bytes a row, 16-byte chunks
// XOR-swizzled by the row): 6 stages, so an SM has 192 KiB of the cache in flight.
#define DM8_STAGE (2 * DEC_TK * 128)
#define DM8_NST (DECODE_KV8_SMEM_BYTES / DM8_STAGE)
static_assert(DM8_NST >= 2 && DM8_NST * DM8_STAGE == DECODE_KV8_SMEM_BYTES, "kv8 ring");

// KV8: the cache holds E4M3 codes (the K scale is in scale_log2, the V scale applied to the
// output), converted (exactly) to f16 in registers as the mmas take them. ldmatrix moves 16-bit
// elements, here pairs of codes: a K row's chunk (16 dims) read plainly gives lane (g, t) dims
// 4t .. 4t + 3 of key g, which feed one m16n8k16 as its logical k 2t, 2t + 1 (b0) and 2t + 8,
// 2t + 9 (b1) — Q's fragments are gathered with the same mapping, so S is unchanged. A V chunk
// read with .trans gives dims 2g, 2g + 1 of keys 2t and 2t + 1: one byte permute and two cvt
// make the m16n8k8 B operands of output dims 2g (one mma) and 2g + 1 (another), so the output
// tile of chunk j holds dims 16j + 4t, +2 in one accumulator pair and 16j + 4t + 1, +3 in the
// next (the merge writes them back in order). Q is converted from bf16 once, P packed to f16.
template <bool KV8> __device__ __forceinline__ void decode_mma_impl(const AttnParams& p) {
    constexpr int D = 128;
    constexpr int NST = KV8 ? DM8_NST : dec_stages(2, D);
    constexpr int STAGE_BYTES = KV8 ? DM8_STAGE : 2 * DEC_TK * D * 2; // K rows, then V rows
    constexpr int NW = DEC_THREADS / 32;
    static_assert(NW * DM_KW == DEC_TK && NST >= 2, "thread mapping");
    static_assert(DECODE_MMA_ROWS == 8, "A rows 0..7 hold queries (the mma wrappers drop rows 8..15)");
    static_assert(NW * 8 * D * 4 <= NST * STAGE_BYTES, "the merge buffer reuses the ring");
    extern __shared__ __align__(128) uint4 dm_ring[];
    __shared__ float m_s[NW][8], l_s[NW][8], mf_s[8], lf_s[8];

    if (blockIdx.x >= p.num_items) return;
    const int item = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const int G = p.hq / p.hkv;
    // A split whose cache blocks a group of consecutive decode items share (the item's second
    // word, DECODE_SHARE_*): the group's first item computes it for all, one member's query heads
    // after another in rows 0..7, and the others skip it. The host groups only items whose
    // contexts all cover the split and whose block tables agree over it, so each member's keys,
    // mask and results are exactly those of its own block: mma rows never mix, and the softmax,
    // merge and output of a row are the row's own.
    int members = 1;
    const int share = p.items[2 * item + 1];
    if (share != 0 && split < (share >> DECODE_SHARE_SPLITS_SHIFT)) {
        if (share & ((1 << DECODE_SHARE_MEMBERS_SHIFT) - 1)) return;
        members = max(1, min(min((share >> DECODE_SHARE_MEMBERS_SHIFT) & 15, p.num_items - item), DECODE_MMA_ROWS / G));
    }
    const int R = G * members; // A rows in use
    const DecodeSplit ds = decode_split(p, item, split);
    if (skip_empty_split(p, ds, item, kvh, split, G)) return;
    const int seq = ds.seq, kv_lo = ds.kv_lo, kv_hi = ds.kv_hi;
    const int tiles = (max(kv_hi - kv_lo, 0) + DEC_TK - 1) / DEC_TK;
    const u32* table = p.block_tables + (size_t)seq * p.table_stride;
    const bf16* kc = (const bf16*)p.k_cache;
    const bf16* vc = (const bf16*)p.v_cache;
    const unsigned char* kc8 = (const unsigned char*)p.k_cache;
    const unsigned char* vc8 = (const unsigned char*)p.v_cache;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const u32 smem = (u32)__cvta_generic_to_shared(dm_ring);
    // KV8: this warp's part of a stage (K rows 0..7, then V rows).
    const u32 wpart = (u32)(warp * 2 * DM_KW * D);

    // Cache rows of the warp's keys in tiles 4grp..4grp+3, one per lane (one table read and
    // division per lane every 4 tiles): lane L holds tile 4grp + L / 8, the warp's key L % 8 there;
    // 0 past the end.
    auto group_rows = [&](int grp) -> u32 {
        const int j = kv_lo + (4 * grp + lane / 8) * DEC_TK + DM_KW * warp + lane % 8;
        if (j >= kv_hi) return 0u;
        const int b = j / p.block_size;
        return (table[b] * p.hkv + kvh) * p.block_size + (j - b * p.block_size);
    };
    // Lane copies chunk lane & 15 of the K and V rows of the warp's keys lane / 16 + 2i (i < 4) in
    // tile tt into stage tt % NST (each copy instruction: two whole 256-byte rows), then commits
    // one group (empty past the last tile, which keeps the wait count uniform). rows:
    // group_rows(tt / 4).
    auto issue = [&](int tt, u32 rows) {
        if (KV8 && tt < tiles) {
            // Lane copies chunk lane & 7 (16 codes) of the K and V rows of keys lane / 8 + 4i,
            // to chunk c ^ key (ldmatrix reads 8 rows' same chunk: 8 different bank groups).
            const u32 st = smem + (u32)((tt % NST) * STAGE_BYTES) + wpart;
            const int c = lane & 7;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int kw = (lane >> 3) + 4 * i, jl = DM_KW * warp + kw;
                const bool valid = kv_lo + tt * DEC_TK + jl < kv_hi;
                const size_t row = (size_t)__shfl_sync(0xffffffffu, rows, tt % 4 * 8 + kw) * D;
                const u32 dst = st + (u32)(kw * D + ((c ^ kw) << 4));
                pf_cp_async16(dst, kc8 + row + c * 16, valid);
                pf_cp_async16(dst + DM_KW * D, vc8 + row + c * 16, valid);
            }
        } else if (!KV8 && tt < tiles) {
            const u32 st = smem + (u32)((tt % NST) * STAGE_BYTES);
            const int c = lane & 15;
#pragma unroll
            for (int i = 0; i < DM_KW / 2; i++) {
                const int kw = (lane >> 4) + 2 * i, jl = DM_KW * warp + kw;
                const bool valid = kv_lo + tt * DEC_TK + jl < kv_hi;
                const size_t row = (size_t)__shfl_sync(0xffffffffu, rows, tt % 4 * 8 + kw) * D;
                const u32 dst = st + (u32)(jl * D * 2 + ((c ^ kw) << 4)); // jl & 7 == kw
                pf_cp_async16(dst, kc + row + c * 8, valid);
                pf_cp_async16(dst + DEC_TK * D * 2, vc + row + c * 8, valid);
            }
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };

    // Q as A fragments: row g is head g % G of the group of member g / G (zero for g >= R); per
    // k-step kk of 16 dims, dims 16kk + 2t, +1 and 16kk + 8 + 2t, +1.
    u32 qa[D / 16][2];
    {
        const bool has = g < R;
        const int q_start = p.seqs[4 * p.items[2 * (item + (has ? g / G : 0))]];
        const u32* qp = (const u32*)((const bf16*)p.q + ((size_t)q_start * p.hq + kvh * G + (has ? g % G : 0)) * D);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            if constexpr (KV8) {
                // Dims 16kk + 4t, +1 and 16kk + 4t + 2, +3 (see the KV8 note above).
                qa[kk][0] = has ? bf16x2_to_f16x2(qp[8 * kk + 2 * t]) : 0u;
                qa[kk][1] = has ? bf16x2_to_f16x2(qp[8 * kk + 2 * t + 1]) : 0u;
            } else {
                qa[kk][0] = has ? qp[8 * kk + t] : 0u;
                qa[kk][1] = has ? qp[8 * kk + 4 + t] : 0u;
            }
        }
    }
    // The first NST tiles (more than one group of 4 with a deep ring).
    u32 rows = 0;
#pragma unroll
    for (int tt = 0; tt < NST; tt++) {
        if (tt % 4 == 0) rows = group_rows(tt / 4);
        issue(tt, rows);
    }

    // ldmatrix row address of this lane (K plain, V .trans alike): matrix lane / 8 is chunk
    // 4q + lane / 8 of the warp's key rows, row lane & 7; XOR in q << 6 per step. KV8: rows of
    // 128 bytes in the warp's part of the stage.
    const u32 ld_lane = KV8 ? (u32)((lane & 7) * D + (((lane >> 3) ^ (lane & 7)) << 4))
                            : (u32)((DM_KW * warp + (lane & 7)) * D * 2 + (((lane >> 3) ^ (lane & 7)) << 4));
    const float sc = p.scale_log2;
    float o[D / 8][2];
#pragma unroll
    for (int j = 0; j < D / 8; j++) o[j][0] = o[j][1] = 0.f;
    float m = -INFINITY, l = 0.f; // row g's running max (log2 domain) and this lane's partial sum

    for (int tt = 0; tt < tiles; tt++) {
        const int refill = tt + NST;
        // Used by this iteration's refill (after the math; KV8: right after the conversion).
        if (refill % 4 == 0 && refill < tiles) rows = group_rows(refill / 4);
        cp_async_wait<NST - 1>();
        __syncwarp(); // the warp's copies of this stage visible to all its lanes
        float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
        u32 vs;
        if constexpr (KV8) {
            const u32 ks = smem + (u32)((tt % NST) * STAGE_BYTES) + wpart;
            vs = ks + DM_KW * D;
            // S for keys 2t, 2t+1 of the warp's 8 (row g): chunk 4q + i is k-step 4q + i.
#pragma unroll
            for (int q = 0; q < 2; q++) {
                u32 b[4];
                ldsm_x4(b, ks + (ld_lane ^ (u32)(q << 6)));
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    u32 lo, hi;
                    e4m3x4_to_f16x4(b[i], lo, hi);
                    if (i & 1)
                        mma_top_k16<true>(s2, s3, qa[4 * q + i][0], qa[4 * q + i][1], lo, hi);
                    else
                        mma_top_k16<true>(s0, s1, qa[4 * q + i][0], qa[4 * q + i][1], lo, hi);
                }
            }
        } else {
            const u32 ks = smem + (u32)((tt % NST) * STAGE_BYTES);
            vs = ks + DEC_TK * D * 2;
            // S for keys 2t, 2t+1 of the warp's 8 (row g), even and odd k-steps in two chains.
#pragma unroll
            for (int q = 0; q < 4; q++) {
                u32 b[4];
                ldsm_x4(b, ks + (ld_lane ^ (u32)(q << 6)));
                mma_top_k16<false>(s0, s1, qa[2 * q][0], qa[2 * q][1], b[0], b[1]);
                mma_top_k16<false>(s2, s3, qa[2 * q + 1][0], qa[2 * q + 1][1], b[2], b[3]);
            }
        }
        s0 += s2;
        s1 += s3;
        const int key = kv_lo + tt * DEC_TK + DM_KW * warp + 2 * t;
        if (key >= kv_hi) s0 = -INFINITY;
        if (key + 1 >= kv_hi) s1 = -INFINITY;
        // Online softmax on the raw scores (scale_log2 > 0 commutes with max); mu = 0 while the row
        // has seen no key, so every exponent is -inf, not NaN.
        float mx = fmaxf(s0, s1);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m, mx * sc);
        const float mu = mn == -INFINITY ? 0.f : mn;
        const float corr = pf_exp2(m - mu);
        const float p0 = pf_exp2(fmaf(s0, sc, -mu)), p1 = pf_exp2(fmaf(s1, sc, -mu));
        l = l * corr + (p0 + p1);
        m = mn;
        if (__any_sync(0xffffffffu, corr != 1.f)) {
#pragma unroll
            for (int j = 0; j < D / 8; j++) {
                o[j][0] *= corr;
                o[j][1] *= corr;
            }
        }
        // O += P V: P (row g, keys 2t, 2t+1) is the A fragment as it stands.
        const u32 pa = KV8 ? pack_f16(p0, p1) : pack_bf16(p0, p1);
        if constexpr (KV8) {
            // Chunk j = 4q + i: codes {V[2t][2g], V[2t][2g+1], V[2t+1][2g], V[2t+1][2g+1]},
            // permuted to {V[2t][2g], V[2t+1][2g], V[2t][2g+1], V[2t+1][2g+1]}: dim 2g's and
            // dim 2g + 1's B operands, into o[2j] and o[2j + 1].
#pragma unroll
            for (int q = 0; q < 2; q++) {
                u32 b[4];
                ldsm_x4_t(b, vs + (ld_lane ^ (u32)(q << 6)));
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    u32 lo, hi;
                    e4m3x4_to_f16x4(__byte_perm(b[i], 0u, 0x3120), lo, hi);
                    const int j = 4 * q + i;
                    mma_top_k8<true>(o[2 * j][0], o[2 * j][1], pa, lo);
                    mma_top_k8<true>(o[2 * j + 1][0], o[2 * j + 1][1], pa, hi);
                }
            }
        } else {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                u32 b[4];
                ldsm_x4_t(b, vs + (ld_lane ^ (u32)(q << 6)));
#pragma unroll
                for (int i = 0; i < 4; i++) mma_top_k8<false>(o[4 * q + i][0], o[4 * q + i][1], pa, b[i]);
            }
        }
        __syncwarp(); // every lane has read the stage before it is refilled
        issue(refill, rows);
    }

    // Merge the warps: per head the top max and total sum, then the rescaled outputs summed
    // through shared memory (the ring, now idle), warps in order.
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    cp_async_wait<0>();
    __syncthreads();
    if (t == 0 && g < R) {
        m_s[warp][g] = m;
        l_s[warp][g] = l;
    }
    __syncthreads();
    merge_states(&m_s[0][0], &l_s[0][0], NW, 8, R, mf_s, lf_s);
    __syncthreads();
    float* accs = (float*)dm_ring; // [NW][R][D]
    if (g < R) {
        const float w = merge_weight(m, mf_s[g]) * (KV8 ? p.v_scale : 1.f);
        if constexpr (KV8) {
            // o[2j], o[2j + 1]: dims 16j + 4t, +2 and 16j + 4t + 1, +3.
#pragma unroll
            for (int j = 0; j < D / 16; j++)
                *(float4*)&accs[(warp * R + g) * D + 16 * j + 4 * t] =
                    make_float4(o[2 * j][0] * w, o[2 * j + 1][0] * w, o[2 * j][1] * w, o[2 * j + 1][1] * w);
        } else {
#pragma unroll
            for (int j = 0; j < D / 8; j++)
                *(float2*)&accs[(warp * R + g) * D + 8 * j + 2 * t] = make_float2(o[j][0] * w, o[j][1] * w);
        }
    }
    __syncthreads();
    write_decode_out<bf16, D>(p, accs, NW, G, members, item, kvh, split, mf_s, lf_s);
}

extern "C" __global__ void __launch_bounds__(DEC_THREADS, 4) attn_decode_mma_bf16_d128(AttnParams p) {
    PDL_ENTRY();
    decode_mma_impl<false>(p);
}
// bf16 queries and outputs over an FP8 (E4M3) cache.
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 4) attn_decode_mma_kv8_d128(AttnParams p) {
    PDL_ENTRY();
    decode_mma_impl<true>(p);
}
