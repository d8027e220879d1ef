// Paged causal attention for prefill chunks on Hopper tensor cores (sm_90a only; bf16, head size
// 128): FlashAttention-3-style warp specialisation with wgmma. Same inputs, work items (128 query
// tokens of one sequence, one query head per block) and results as attn_prefill_bf16_d128; this
// file follows prefill_mma.cu in SOURCES and uses its AttnParams, pack_bf16, pf_exp2 and
// pf_cp_async16.
//
// A block is 2 consumer warpgroups of 64 query rows each plus 1 producer warpgroup, and walks the
// context in 128-key tiles. The producer gathers K and V tiles from the paged cache (block table
// looked up per key, so any block size works) with 16-byte cp.async copies into a two-stage ring
// per operand; mbarriers carry "tile landed" (cp.async.mbarrier.arrive: the copies themselves
// arrive when they complete) and "stage free" (one arrival per consumer warp) between them, so
// the producer runs up to two tiles ahead and the warpgroups never wait on each other for data.
// Keys past the causal end and Q rows past the item's end are zero-filled (src-size 0).
//
// Per warpgroup and tile: S = Q·Kᵀ is 8 wgmma.m64n128k16 with Q (staged once by the consumers)
// and K read from shared memory through matrix descriptors; the online softmax runs on the
// accumulators in registers (same scheme as prefill_mma.cu); P is packed to bf16 in registers as
// the A operand of O += P·V, 8 wgmma.m64n128k16 with V read through a transposed (N-major)
// descriptor, so V needs no transpose pass. The warpgroup overlaps its own work: S of tile j and
// P·V of tile j-1 are issued together, the softmax of tile j runs while P·V of tile j-1 is still
// in the tensor cores, and O is rescaled once that finishes. The two warpgroups also take turns
// issuing (two named barriers), so one's softmax tends to run under the other's products.
//
// Shared memory (1024-byte aligned for the swizzle atoms): Q [128 rows], K ring [2][128 keys],
// V ring [2][128 keys], each tile as two 64-dim halves of 128-byte rows in the 128-byte swizzle
// layout wgmma expects: row r of a half at r * 128, its 16-byte chunk c at ((c ^ (r & 7)) * 16).
// K and Q are K-major operands (8-row groups 1024 bytes apart: SBO; LBO unused); V is the
// N-major B operand (8-key groups 1024 bytes apart: SBO; the two 64-dim halves 16 KiB apart:
// LBO). The k-step offsets inside a 128-byte row (+32, +64, +96 bytes) go into the descriptor's
// start address; the hardware applies the XOR on the address bits, as the copies wrote them.
// 160 KiB + barriers: one block of 384 threads per SM. ptxas caps such a block at 168 registers
// per thread, too few for a consumer (64 + 64 accumulators and 32 registers of P live at once):
// setmaxnreg moves registers from the producer (40) to the consumers (232); ptxas (sm_90a, NVRTC
// 13.0): no spills, no serialised wgmma. On an H200, causal 8 x 32 heads x 2048 tokens: 0.659 ms,
// 417 TFLOP/s (attn_prefill_bf16_d128: 1.12 ms, 245 TFLOP/s); without the turn-taking 414, with
// a third K/V stage (224 KiB) 420.
//
// The causal mask is applied only on tiles that reach past a warpgroup's first row; both
// warpgroups walk the same tiles (the turn-taking needs equal counts), so a tile wholly past the
// first warpgroup's rows costs it one masked product.
#include "common.cuh"

#define PW_BM PREFILL_MMA_TOKENS // the same work items as prefill_mma.cu
#define PW_BN PREFILL_WGMMA_KEY_TILE
#define PW_D 128
#define PW_STAGES PREFILL_WGMMA_STAGES
#define PW_THREADS PREFILL_WGMMA_THREADS  // 2 consumer warpgroups + 1 producer warpgroup
#define PW_PRODUCER_REGS 40
#define PW_CONSUMER_REGS 232              // 128 x 40 + 256 x 232 <= 64 Ki registers
#define PW_TILE_BYTES (PW_BN * PW_D * 2)  // one K or V tile, and the Q tile (PW_BM == PW_BN)
#define PW_HALF_BYTES (PW_BN * 128)       // one 64-dim half of a tile
#define PW_K_OFF PW_TILE_BYTES
#define PW_V_OFF (PW_K_OFF + PW_STAGES * PW_TILE_BYTES)
#define PW_BAR_OFF (PW_V_OFF + PW_STAGES * PW_TILE_BYTES)
#define PW_BAR_BYTES (4 * PW_STAGES * 8)  // full/empty x K/V per stage
#define PW_SMEM_BYTES (PW_BAR_OFF + PW_BAR_BYTES + 1024) // + slack to align the base to 1024
#define PW_SCHED_BAR 3                    // named barriers 3 and 4: the warpgroups' issue turns
static_assert(PW_SMEM_BYTES == PREFILL_WGMMA_SMEM_BYTES, "PREFILL_WGMMA_SMEM_BYTES (lib.rs) differs");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void pw_bar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void pw_bar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives on `bar` once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void pw_bar_arrive_cp_async(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits for the completion of the barrier phase with this parity.
__device__ __forceinline__ void pw_bar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void pw_named_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void pw_named_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
// Orders this thread's view of shared memory (generic proxy: cp.async writes) before its later
// wgmma reads (async proxy).
__device__ __forceinline__ void pw_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void pw_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void pw_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void pw_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// After a wait: the compiler must not move reads of wgmma results above it (nor reuse the
// registers of an operand still being read before it).
__device__ __forceinline__ void pw_pin(float* r) {
#pragma unroll
    for (int i = 0; i < 64; i++) asm volatile("" : "+f"(r[i])::"memory");
}
__device__ __forceinline__ void pw_pin(u32* r) {
#pragma unroll
    for (int i = 0; i < 32; i++) asm volatile("" : "+r"(r[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte
// offsets, each >> 4 (bits 0-13, 16-29, 32-45), swizzle mode 1 in bits 62-63.
__device__ __forceinline__ u64 pw_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) | (1ull << 62);
}
// Descriptor start-address increment of k-step kk (16 dims) in a K-major tile.
__device__ __forceinline__ u64 pw_kstep(int kk) { return (u64)(((kk >> 2) * PW_HALF_BYTES + (kk & 3) * 32) >> 4); }

// Byte offset of 16-byte chunk c (dims 8c..8c+7) of row r in a tile.
__device__ __forceinline__ u32 pw_off(int r, int c) {
    return (u32)((c >> 3) * PW_HALF_BYTES + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

#define PW_ACC_STR                                                                                      \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "  \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "   \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "   \
    "%59, %60, %61, %62, %63}"
#define PW_ACC8(i)                                                                                      \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),        \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define PW_ACC PW_ACC8(0), PW_ACC8(8), PW_ACC8(16), PW_ACC8(24), PW_ACC8(32), PW_ACC8(40), PW_ACC8(48), PW_ACC8(56)

// d (64x128 f32, accumulated unless acc == 0) += A (64x16, K-major in shared memory) ·
// B (16x128, K-major in shared memory, i.e. [n][k]).
__device__ __forceinline__ void pw_mma_ss(float* d, u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " PW_ACC_STR ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : PW_ACC
                 : "l"(da), "l"(db), "r"(acc));
}
// d (64x128 f32) += A (64x16 bf16 in registers) · B (16x128 in shared memory: N-major, [k][n],
// with TRANS_B; else K-major, [n][k]).
template <bool TRANS_B> __device__ __forceinline__ void pw_mma_rs(float* d, const u32* a, u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " PW_ACC_STR
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                 : PW_ACC
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(TRANS_B ? 1 : 0));
}

// S = Q·Kᵀ over the 128 dims (issued, not waited for).
__device__ __forceinline__ void pw_qk(float* s, u64 dq, u64 dk) {
#pragma unroll
    for (int kk = 0; kk < PW_D / 16; kk++) pw_mma_ss(s, dq + pw_kstep(kk), dk + pw_kstep(kk), kk);
}
// O += P·V over the 128 keys (issued, not waited for).
__device__ __forceinline__ void pw_pv(float* o, const u32* pa, u64 dv) {
#pragma unroll
    for (int kk = 0; kk < PW_BN / 16; kk++) pw_mma_rs<true>(o, pa + 4 * kk, dv + (u64)(kk * 16 * 128 >> 4));
}

// Causal mask (when `mask`) and online softmax, in place, for one tile of scores. Accumulator
// layout: s[4i + 2hf + e] is row g + 8hf, key 8i + 2t + e of the tile. Row maxima on the raw
// scores, p = 2^(s * sc - m) in one FMA + ex2, per-thread partial row sums (reduced across the
// quad at the end); c gets the rescale factor of each row's output.
__device__ __forceinline__ void pw_softmax(float* s, float* m, float* l, float* c, bool mask, int key0, int lim0,
                                           int lim1, float sc) {
    if (mask) {
#pragma unroll
        for (int i = 0; i < PW_BN / 8; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = key0 + 8 * i + e;
                if (key > lim0) s[4 * i + e] = -INFINITY;
                if (key > lim1) s[4 * i + 2 + e] = -INFINITY;
            }
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < PW_BN / 8; i++) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * hf], s[4 * i + 2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // Tile 0 holds key 0, which every row sees, so m is finite from the first tile on.
        const float mn = fmaxf(m[hf], mx * sc);
        c[hf] = pf_exp2(m[hf] - mn);
        m[hf] = mn;
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int i = 0; i < PW_BN / 8; i++) {
            s[4 * i + 2 * hf] = pf_exp2(fmaf(s[4 * i + 2 * hf], sc, -mn));
            s[4 * i + 2 * hf + 1] = pf_exp2(fmaf(s[4 * i + 2 * hf + 1], sc, -mn));
            sum0 += s[4 * i + 2 * hf];
            sum1 += s[4 * i + 2 * hf + 1];
        }
        l[hf] = l[hf] * c[hf] + (sum0 + sum1);
    }
}

// P in bf16 as the A operand of P·V: k-step kk (16 keys) is pa[4kk..4kk+3], which holds the
// same rows and keys as accumulator values 8kk..8kk+7.
__device__ __forceinline__ void pw_pack(const float* s, u32* pa) {
#pragma unroll
    for (int i = 0; i < PW_BN / 4; i++) pa[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

extern "C" __global__ void __launch_bounds__(PW_THREADS, 1) attn_prefill_wgmma_bf16_d128(AttnParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char pw_smem[];
    // Items in reverse: a sequence's later query tiles see the longest contexts, so they start first
    // and the light ones fill the tail of the grid.
    const int item = gridDim.x - 1 - blockIdx.x, h = blockIdx.y;
    if (item >= p.num_items) return;
    const int group = p.hq / p.hkv, kvh = h / group;
    const QueryTile qt = query_tile(p.items, p.seqs, item, PW_BM);
    const int seq = qt.seq, q0 = qt.q0, q_start = qt.q_start, n_tok = qt.n_tok;
    const int first_pos = qt.first_pos;
    // The last row's position is first_pos + n_tok - 1 <= ctx - 1: no key at or past kv_end is
    // ever unmasked, so the causal test alone also masks the zero-filled keys.
    const int kv_end = first_pos + n_tok;
    const int n_tiles = (kv_end + PW_BN - 1) / PW_BN;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const u32 base = ((u32)__cvta_generic_to_shared(pw_smem) + 1023u) & ~1023u;
    const u32 qs = base, ks = base + PW_K_OFF, vs = base + PW_V_OFF, bars = base + PW_BAR_OFF;
    auto full_k = [&](int st) { return bars + 8 * st; };
    auto full_v = [&](int st) { return bars + 8 * (PW_STAGES + st); };
    auto empty_k = [&](int st) { return bars + 8 * (2 * PW_STAGES + st); };
    auto empty_v = [&](int st) { return bars + 8 * (3 * PW_STAGES + st); };
    if (tid == 0) {
        for (int st = 0; st < PW_STAGES; st++) {
            pw_bar_init(full_k(st), 128); // one cp.async arrival per producer thread
            pw_bar_init(full_v(st), 128);
            pw_bar_init(empty_k(st), 8); // one arrival per consumer warp
            pw_bar_init(empty_v(st), 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp >= 8) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PW_PRODUCER_REGS));
        // Producer. Warp pw copies keys 32 pw..32 pw + 31 of each tile: lane copies chunk
        // c = lane % 16 of keys 32 pw + 2 j2 + lane / 16, j2 = 0..15, the key's cache row coming by
        // shuffle from the lane that looked it up.
        const u32* table = p.block_tables + (size_t)seq * p.table_stride;
        const int pw = warp - 8, c = lane & 15, hi = lane >> 4;
        const u32 lane_off = (u32)((c >> 3) * PW_HALF_BYTES + (32 * pw + hi) * 128);
        const u32 x = (u32)((c & 7) ^ hi); // chunk swizzle of key 2 j2 + hi is x ^ (2 j2 & 7)
        auto copy_tile = [&](const bf16* cache, u32 stage, u32 row, int k0) {
#pragma unroll
            for (int j2 = 0; j2 < 16; j2++) {
                const u32 r = __shfl_sync(0xffffffffu, row, 2 * j2 + hi);
                const u32 dst = stage + lane_off + j2 * 256 + ((x ^ (u32)((2 * j2) & 7)) << 4);
                pf_cp_async16(dst, cache + (size_t)r * PW_D + c * 8, k0 + 32 * pw + 2 * j2 + hi < kv_end);
            }
        };
        for (int tile = 0; tile < n_tiles; tile++) {
            const int st = tile % PW_STAGES;
            const u32 free_parity = ((tile / PW_STAGES) & 1) ^ 1; // the first pass finds them free
            const int k0 = tile * PW_BN, pos = k0 + 32 * pw + lane;
            // Cache row of key `pos` (0 past the end: not read).
            const u32 row = pos < kv_end ? (table[pos / p.block_size] * (u32)p.hkv + (u32)kvh) * (u32)p.block_size +
                                               (u32)(pos % p.block_size)
                                         : 0u;
            pw_bar_wait(empty_k(st), free_parity);
            copy_tile((const bf16*)p.k_cache, ks + st * PW_TILE_BYTES, row, k0);
            pw_bar_arrive_cp_async(full_k(st));
            pw_bar_wait(empty_v(st), free_parity);
            copy_tile((const bf16*)p.v_cache, vs + st * PW_TILE_BYTES, row, k0);
            pw_bar_arrive_cp_async(full_v(st));
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(PW_CONSUMER_REGS));

    // Consumers: warpgroup wg owns rows 64 wg..64 wg + 63; warp wl of it rows 16 wl.. of those.
    const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, t4 = lane & 3, ct = tid & 127;
    {
        // This warpgroup's Q rows: thread ct copies chunk ct % 16 of rows ct / 16 + 8 i.
        const bf16* qb = (const bf16*)p.q;
        const int c = ct & 15;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int r = 64 * wg + (ct >> 4) + 8 * i;
            const bool valid = r < n_tok;
            size_t off = 0;
            if (valid) off = ((size_t)(q_start + q0 + r) * p.hq + h) * PW_D + c * 8;
            pf_cp_async16(qs + pw_off(r, c), qb + off, valid);
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
        pw_fence_proxy();
        pw_named_sync(1 + wg, 128);
    }
    // Positions: rows past the item's end are clamped to its last token (they compute on zero Q
    // and are never written).
    const int wg_first = first_pos + min(64 * wg, n_tok - 1);
    const int pos_r = first_pos + 64 * wg + 16 * wl + g;
    const int lim0 = min(pos_r, kv_end - 1), lim1 = min(pos_r + 8, kv_end - 1);
    const u64 dq = pw_desc(qs + 64 * wg * 128, 16, 1024);
    auto dk = [&](int st) { return pw_desc(ks + st * PW_TILE_BYTES, 16, 1024); };
    auto dv = [&](int st) { return pw_desc(vs + st * PW_TILE_BYTES, PW_HALF_BYTES, 1024); };
    // Issue turns: warpgroup wg waits on barrier PW_SCHED_BAR + wg before issuing its products and
    // hands the turn over after; warpgroup 1 gives warpgroup 0 the first turn and skips the
    // hand-over after its last issue, so every arrival meets a wait.
    auto my_turn = [&]() { pw_named_sync(PW_SCHED_BAR + wg, 256); };
    auto pass_turn = [&]() { pw_named_arrive(PW_SCHED_BAR + (wg ^ 1), 256); };
    if (wg == 1) pass_turn();

    float o[64], s[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, c[2];
    u32 pa[32];
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = s[i] = 0.f;
    const float sc = p.scale_log2;
    const bool warp_leader = lane == 0; // one arrival per warp on the empty barriers

    // Tile 0: S only.
    pw_bar_wait(full_k(0), 0);
    pw_fence_proxy();
    my_turn();
    pw_wgmma_fence();
    pw_qk(s, dq, dk(0));
    pw_wgmma_commit();
    pass_turn();
    pw_wgmma_wait<0>();
    pw_pin(s);
    if (warp_leader) pw_bar_arrive(empty_k(0));
    pw_softmax(s, m, l, c, PW_BN - 1 > wg_first, 2 * t4, lim0, lim1, sc);
    pw_pack(s, pa);

    for (int j = 1; j < n_tiles; j++) {
        const int sk = j % PW_STAGES, sv = (j - 1) % PW_STAGES;
        pw_bar_wait(full_k(sk), (j / PW_STAGES) & 1);
        pw_bar_wait(full_v(sv), ((j - 1) / PW_STAGES) & 1);
        pw_fence_proxy();
        my_turn();
        pw_wgmma_fence();
        pw_qk(s, dq, dk(sk));
        pw_wgmma_commit();
        pw_pv(o, pa, dv(sv));
        pw_wgmma_commit();
        pass_turn();
        pw_wgmma_wait<1>(); // S of tile j done; P·V of tile j-1 still running
        pw_pin(s);
        if (warp_leader) pw_bar_arrive(empty_k(sk));
        const int k0 = j * PW_BN;
        pw_softmax(s, m, l, c, k0 + PW_BN - 1 > wg_first, k0 + 2 * t4, lim0, lim1, sc);
        pw_pin(s); // the softmax runs before the wait, under P·V
        pw_wgmma_wait<0>();
        pw_pin(o);
        pw_pin(pa);
        if (warp_leader) pw_bar_arrive(empty_v(sv));
        // Rescale the outputs unless no row max of the warp grew (c == 1 everywhere).
        if (__any_sync(0xffffffffu, c[0] != 1.f || c[1] != 1.f)) {
#pragma unroll
            for (int i = 0; i < PW_D / 8; i++) {
                o[4 * i] *= c[0];
                o[4 * i + 1] *= c[0];
                o[4 * i + 2] *= c[1];
                o[4 * i + 3] *= c[1];
            }
        }
        // P is packed only now: writing pa while P·V of tile j-1 could still read it makes ptxas
        // serialise the wgmmas.
        pw_pack(s, pa);
    }

    // P·V of the last tile.
    const int sv = (n_tiles - 1) % PW_STAGES;
    pw_bar_wait(full_v(sv), ((n_tiles - 1) / PW_STAGES) & 1);
    pw_fence_proxy();
    my_turn();
    pw_wgmma_fence();
    pw_pv(o, pa, dv(sv));
    pw_wgmma_commit();
    if (wg == 0) pass_turn();
    pw_wgmma_wait<0>();
    pw_pin(o);

    bf16* out = (bf16*)p.out;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float sum = l[hf];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float inv = 1.f / sum;
        const int r = 64 * wg + 16 * wl + 8 * hf + g;
        if (r < n_tok) {
            bf16* dst = out + ((size_t)(q_start + q0 + r) * p.hq + h) * PW_D + 2 * t4;
#pragma unroll
            for (int i = 0; i < PW_D / 8; i++)
                *(__nv_bfloat162*)(dst + i * 8) = __floats2bfloat162_rn(o[4 * i + 2 * hf] * inv, o[4 * i + 2 * hf + 1] * inv);
        }
    }
#else
    // wgmma exists only on sm_90a; the host never launches this kernel elsewhere.
    __trap();
#endif
}
