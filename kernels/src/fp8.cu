// FP8 (E4M3) linear layers: activations quantized per row, and the small-batch product of E4M3
// activations with E4M3 weights on the FP8 tensor cores (sm_89 and later).
//
// Quantization is worker/src/quant/fp8.rs's, step for step, so a code computed here equals the CPU
// reference's for the same input: scale = max(amax / 448, 1 / (448 * 512)) (IEEE division: NVRTC
// compiles without fast math), code = cvt.rn.satfinite.e4m3(x / scale), i.e. nearest-even,
// saturated at +-448.
//
// gemv_fp8_r16 / _r32 are gemv.cu's bf16 GEMV with 8-bit operands: one mma.m16n8k32.e4m3 takes the
// activation codes as A (batch rows 0..7; rows 8..15 and rows >= b are zero) and 8 weight rows as
// B. A lane (g = lane / 4, t = lane % 4) loads 16 contiguous bytes, x[g, k0 + 16t ..] and
// w[row g of the tile, k0 + 16t ..], which feed two mmas: bytes 0-3 and 4-7 are the first mma's
// logical k 4t.. and 16 + 4t.., bytes 8-11 and 12-15 the second's (A and B map k the same way, so
// the 32 logical k of each mma are 32 distinct physical k). A warp's k-step is 64 wide; the block's
// warps split the k-steps as in gemv.cu and meet in shared memory (gemv_sum), and the epilogue
// multiplies by the activation row's and the weight row's scales: y = bf16(sum * xs[b] * ws[n]).
// As in gemv.cu, y[b, n] does not depend on the batch size or the variant.
#include <cuda_fp8.h>

// The nearest E4M3 code (ties to even), saturated at +-448 (declared, with FP8_MAX and
// FP8_MIN_SCALE, in elementwise.cu, whose add_rmsnorm_fp8_bf16 quantizes its output the same way).
__device__ __forceinline__ unsigned char fp8_code(float v) {
    return (unsigned char)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

// The largest magnitude of a block's values (every thread's m, THREADS of them), then the row's
// scale: `static_scale` when > 0, else max(amax / 448, FP8_MIN_SCALE). Every thread returns it.
template <int THREADS = FP8_QUANT_THREADS>
__device__ __forceinline__ float fp8_row_scale(float m, float static_scale, float* red) {
    if (static_scale > 0.f) return static_scale;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int w = 1; w < THREADS / 32; w++) m = fmaxf(m, red[w]);
    return fmaxf(m / FP8_MAX, FP8_MIN_SCALE);
}

// Two values' E4M3 codes as one 16-bit word, lo's in the low byte: the one cvt.rn.satfinite.e4m3x2
// that fp8_code issues for each value alone, here for both.
__device__ __forceinline__ u32 fp8_code2(float lo, float hi) {
    return (u32)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

// The largest magnitude of m and the 8 bf16 numbers of w (max.bf16x2 on their magnitudes: exact,
// and like fmaxf it keeps the other operand where one is NaN).
__device__ __forceinline__ __nv_bfloat162 bf16x8_amax(__nv_bfloat162 m, uint4 w) {
    const u32 a[4] = {w.x & 0x7fff7fffu, w.y & 0x7fff7fffu, w.z & 0x7fff7fffu, w.w & 0x7fff7fffu};
#pragma unroll
    for (int e = 0; e < 4; e++) m = __hmax2(m, *(const __nv_bfloat162*)&a[e]);
    return m;
}

// Quantizes one row of `nvec` 8-value vectors, vector i produced by load(i) as 8 bf16 numbers
// packed two to a word in memory order (a uint4, as 16 bytes of a bf16 row hold them), to
// q[8i .. 8i + 8) (8-byte aligned) and *scale_out, with a block of THREADS threads: the first
// CACHED vectors a thread takes stay in its registers between the two passes, the rest are
// produced again. The same codes and scale as the scalar path (and for any THREADS): max is exact
// in any order, and each code is cvt.rn.satfinite.e4m3 of x / scale (fp8_div) for the same x and
// scale. Kept packed, the values cost no instruction to cache, their magnitudes' max takes one
// max.bf16x2 a pair, and the codes one cvt a pair.
#define FP8_QUANT_CACHED 8
template <int THREADS = FP8_QUANT_THREADS, int CACHED = FP8_QUANT_CACHED, typename Load>
__device__ __forceinline__ void fp8_quant_row_vec(Load load, int nvec, unsigned char* q, float* scale_out,
                                                  float static_scale, float* red) {
    uint4 v[CACHED];
    __nv_bfloat162 m2 = __floats2bfloat162_rn(0.f, 0.f);
#pragma unroll
    for (int c = 0; c < CACHED; c++) {
        const int i = threadIdx.x + c * THREADS;
        if (i < nvec) {
            v[c] = load(i);
            m2 = bf16x8_amax(m2, v[c]);
        }
    }
    for (int i = threadIdx.x + CACHED * THREADS; i < nvec; i += THREADS) m2 = bf16x8_amax(m2, load(i));
    const float m = fmaxf(__low2float(m2), __high2float(m2));
    const float scale = fp8_row_scale<THREADS>(m, static_scale, red);
    const float rcp = 1.f / scale;
    if (threadIdx.x == 0) *scale_out = scale;
    auto put = [&](int i, const uint4& w) {
        const u32 x[4] = {w.x, w.y, w.z, w.w};
        u32 c[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            c[e] = fp8_code2(fp8_div(bf16_lo(x[e]), scale, rcp), fp8_div(bf16_hi(x[e]), scale, rcp));
        *(uint2*)(q + 8 * (size_t)i) = make_uint2(__byte_perm(c[0], c[1], 0x5410), __byte_perm(c[2], c[3], 0x5410));
    };
#pragma unroll
    for (int c = 0; c < CACHED; c++) {
        const int i = threadIdx.x + c * THREADS;
        if (i < nvec) put(i, v[c]);
    }
    for (int i = threadIdx.x + CACHED * THREADS; i < nvec; i += THREADS) put(i, load(i));
}

// One block per row: its largest magnitude (unless a static scale is given), its scale, its codes.
// Rows of a multiple of 8 values at 16-byte aligned addresses (every product's input) take 16-byte
// loads and 8-byte stores (fp8_quant_row_vec, CACHED vectors a thread kept in registers); others
// one value a thread at a time. quant_fp8_rows_bf16_c2 keeps 2 vectors a thread, not 8: rows of
// up to 2 * 8 * FP8_QUANT_THREADS values (o's input on the 8B shape, k = 4,096) stay whole in
// fewer registers, so more blocks fit an SM; the same codes either way.
template <int CACHED>
__device__ __forceinline__ void quant_fp8_rows_impl(const Fp8QuantParams& p) {
    __shared__ float red[FP8_QUANT_THREADS / 32];
    const int row = blockIdx.x;
    const bf16* x = p.x + (size_t)row * p.k;
    unsigned char* q = p.q + (size_t)row * p.k;
    if (p.k % 8 == 0 && ((size_t)p.x & 15) == 0 && ((size_t)p.q & 7) == 0) {
        fp8_quant_row_vec<FP8_QUANT_THREADS, CACHED>([&](int i) { return *(const uint4*)(x + 8 * i); }, p.k / 8, q,
                                                     p.scales + row, p.static_scale, red);
        return;
    }
    float m = 0.f;
    for (int i = threadIdx.x; i < p.k; i += FP8_QUANT_THREADS) m = fmaxf(m, fabsf(__bfloat162float(x[i])));
    const float scale = fp8_row_scale(m, p.static_scale, red);
    if (threadIdx.x == 0) p.scales[row] = scale;
    for (int i = threadIdx.x; i < p.k; i += FP8_QUANT_THREADS) q[i] = fp8_code(__bfloat162float(x[i]) / scale);
}
extern "C" __global__ void __launch_bounds__(FP8_QUANT_THREADS) quant_fp8_rows_bf16(Fp8QuantParams p) {
    PDL_ENTRY();
    quant_fp8_rows_impl<FP8_QUANT_CACHED>(p);
}
extern "C" __global__ void __launch_bounds__(FP8_QUANT_THREADS) quant_fp8_rows_bf16_c2(Fp8QuantParams p) {
    PDL_ENTRY();
    quant_fp8_rows_impl<2>(p);
}

// attn_combine_bf16 and quant_fp8_rows_bf16 of its output in one launch, for the FP8 o_proj of a
// step whose tokens are all decode items (one each): a block per item merges the splits of every
// head of the item's token — combine_impl's arithmetic in its order, rounded to bf16 as
// attn_combine stores it — and quantizes that row (fp8_quant_row_vec), so the o product reads
// codes the attention wrote and the row is never stored in bf16. d a multiple of 8 (a vector of
// 8 values lies in one head), q 8-byte aligned (the host checks).
extern "C" __global__ void __launch_bounds__(FP8_QUANT_WIDE_THREADS) attn_combine_quant_fp8_bf16(CombineFp8Params p) {
    PDL_ENTRY();
    __shared__ float red[FP8_QUANT_WIDE_THREADS / 32];
    const AttnParams& a = p.attn;
    const int item = blockIdx.x, k = a.hq * a.d;
    const int tok = a.seqs[4 * a.items[2 * item]];
    fp8_quant_row_vec<FP8_QUANT_WIDE_THREADS, 1>(
        [&](int i) {
            const int h = 8 * i / a.d, c0 = 8 * i % a.d;
            const size_t base = ((size_t)item * a.hq + h) * a.num_splits;
            float gm = -INFINITY;
            for (int s = 0; s < a.num_splits; s++) gm = fmaxf(gm, a.part_ml[2 * (base + s)]);
            float num[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, den = 0.f;
            for (int s = 0; s < a.num_splits; s++) {
                const float ms = a.part_ml[2 * (base + s)];
                if (ms == -INFINITY) continue;
                const float w = exp2f(ms - gm);
                den += w * a.part_ml[2 * (base + s) + 1];
                const float4* po = (const float4*)(a.part_o + (base + s) * a.d + c0);
                const float4 o0 = po[0], o1 = po[1];
                const float o[8] = {o0.x, o0.y, o0.z, o0.w, o1.x, o1.y, o1.z, o1.w};
#pragma unroll
                for (int e = 0; e < 8; e++) num[e] += w * o[e];
            }
            float t[8];
#pragma unroll
            for (int e = 0; e < 8; e++) t[e] = den > 0.f ? num[e] / den : 0.f;
            return pack16<bf16>(t);
        },
        k / 8, p.q + (size_t)tok * k, p.scales + tok, p.static_scale, red);
}

// silu_mul_bf16 and quant_fp8_rows_bf16 in one launch, for the FP8 down_proj: p.x is the gate/up
// product [m, 2k] ([gate | up] a row), and row r's codes are those quant_fp8_rows_bf16 gives for
// silu_mul_bf16's row r — silu(g) * u in f32, rounded to bf16 (as silu_mul stores it), then
// quantized. One block per row; k a multiple of 8, p.x 16-byte and p.q 8-byte aligned (the host
// checks; otherwise it runs the two kernels).
// With p.in_w_scales, p.x is the raw FP8 gate/up product and each value is first scaled as
// scale_fp8_out_bf16 scales it — bf16(x * in_x_scales[row] * in_w_scales[col]) — so the launch
// gives the bits of the scaling pass followed by this kernel, without the pass's write and read
// of the whole product (67 % of an FP8 layer's product outputs on the 8B shape).
// silu_mul_quant_fp8_bf16 takes FP8_QUANT_THREADS threads a row; _wide FP8_QUANT_WIDE_THREADS, for
// products of few rows, where one block a row leaves most SMs idle and the row's SiLU is the
// step's latency (run 41g: 9.6 us a layer at one row with 256 threads). The same codes either way.
template <int THREADS, int CACHED>
__device__ __forceinline__ void silu_mul_quant_impl(const Fp8QuantParams& p) {
    __shared__ float red[THREADS / 32];
    const int row = blockIdx.x;
    const bf16* gate = p.x + (size_t)row * 2 * p.k;
    const bf16* up = gate + p.k;
    const float* ws = p.in_w_scales;
    // Read before any thread of the block writes p.scales[row] (the two may be one buffer).
    const float xs = ws ? p.in_x_scales[row] : 1.f;
    fp8_quant_row_vec<THREADS, CACHED>(
        [&](int i) {
            const uint4 gw = *(const uint4*)(gate + 8 * i), uw = *(const uint4*)(up + 8 * i);
            u32 g[4] = {gw.x, gw.y, gw.z, gw.w}, u[4] = {uw.x, uw.y, uw.z, uw.w};
            if (ws) {
                const float4 g0 = *(const float4*)(ws + 8 * i), g1 = *(const float4*)(ws + 8 * i + 4);
                const float4 u0 = *(const float4*)(ws + p.k + 8 * i), u1 = *(const float4*)(ws + p.k + 8 * i + 4);
                const float wg[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
                const float wu[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    g[e] = bf16x2_bits(__fmul_rn(__fmul_rn(bf16_lo(g[e]), xs), wg[2 * e]),
                                       __fmul_rn(__fmul_rn(bf16_hi(g[e]), xs), wg[2 * e + 1]));
                    u[e] = bf16x2_bits(__fmul_rn(__fmul_rn(bf16_lo(u[e]), xs), wu[2 * e]),
                                       __fmul_rn(__fmul_rn(bf16_hi(u[e]), xs), wu[2 * e + 1]));
                }
            }
            uint4 h;
            h.x = bf16x2_bits(silu_f(bf16_lo(g[0])) * bf16_lo(u[0]), silu_f(bf16_hi(g[0])) * bf16_hi(u[0]));
            h.y = bf16x2_bits(silu_f(bf16_lo(g[1])) * bf16_lo(u[1]), silu_f(bf16_hi(g[1])) * bf16_hi(u[1]));
            h.z = bf16x2_bits(silu_f(bf16_lo(g[2])) * bf16_lo(u[2]), silu_f(bf16_hi(g[2])) * bf16_hi(u[2]));
            h.w = bf16x2_bits(silu_f(bf16_lo(g[3])) * bf16_lo(u[3]), silu_f(bf16_hi(g[3])) * bf16_hi(u[3]));
            return h;
        },
        p.k / 8, p.q + (size_t)row * p.k, p.scales + row, p.static_scale, red);
}
extern "C" __global__ void __launch_bounds__(FP8_QUANT_THREADS) silu_mul_quant_fp8_bf16(Fp8QuantParams p) {
    PDL_ENTRY();
    silu_mul_quant_impl<FP8_QUANT_THREADS, FP8_QUANT_CACHED>(p);
}
extern "C" __global__ void __launch_bounds__(FP8_QUANT_WIDE_THREADS) silu_mul_quant_fp8_bf16_wide(Fp8QuantParams p) {
    PDL_ENTRY();
    silu_mul_quant_impl<FP8_QUANT_WIDE_THREADS, 2>(p);
}

#if __CUDA_ARCH__ >= 890
// c += A * B for A = {a0, 0, a2, 0} (rows 8..15 zero), B = {b0, b1}, 8-bit E4M3 operands.
__device__ __forceinline__ void gemv_mma_fp8(float* c, u32 a0, u32 a2, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
#endif

// Block i takes weight rows [8 NT i, 8 NT (i + 1)); each warp U k-steps of 64 in flight.
template <int NT, int U>
__device__ __forceinline__ void gemv_fp8_impl(const GemvFp8Params& p) {
#if __CUDA_ARCH__ >= 890
    __shared__ __align__(16) float red[GEMV_WARPS * NT * 64]; // [warp][tile][batch 8][row 8]
    const int row0 = blockIdx.x * (8 * NT), n = p.n, k = p.k;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nsteps = (k + 63) >> 6; // the last one partial when k % 64 != 0
    const int nfull = k >> 6;         // steps where every lane's 16 k are in range
    const bool rows_full = row0 + 8 * NT <= n;
    const bool xrow = g < p.b;
    // Byte pointers at this lane's k offset 16t; invalid rows point at row 0 and are never read.
    const unsigned char* x = p.x + (size_t)(xrow ? g : 0) * k + 16 * t;
    const unsigned char* w[NT];
    bool wrow[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int r = row0 + 8 * j + g;
        wrow[j] = r < n;
        w[j] = p.w + (size_t)(wrow[j] ? r : 0) * k + 16 * t;
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int s0 = warp; s0 < nsteps; s0 += GEMV_WARPS * U) {
        uint4 wv[U][NT], xv[U];
        if (rows_full && s0 + (U - 1) * GEMV_WARPS < nfull) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int off = 64 * (s0 + u * GEMV_WARPS);
#pragma unroll
                for (int j = 0; j < NT; j++) wv[u][j] = ld_stream(w[j] + off);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int off = 64 * (s0 + u * GEMV_WARPS);
                xv[u] = xrow ? __ldg((const uint4*)(x + off)) : zero;
            }
        } else {
            // A lane's 16 k are in range iff 64 s + 16 t < k (k is a multiple of 16).
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int off = 64 * (s0 + u * GEMV_WARPS);
                const bool kok = off + 16 * t < k;
#pragma unroll
                for (int j = 0; j < NT; j++) wv[u][j] = kok && wrow[j] ? ld_stream(w[j] + off) : zero;
                xv[u] = kok && xrow ? __ldg((const uint4*)(x + off)) : zero;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int j = 0; j < NT; j++) {
                gemv_mma_fp8(acc[j], xv[u].x, xv[u].y, wv[u][j].x, wv[u][j].y);
                gemv_mma_fp8(acc[j], xv[u].z, xv[u].w, wv[u][j].z, wv[u][j].w);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
        *(float2*)&red[((warp * NT + j) * 8 + g) * 8 + 2 * t] = make_float2(acc[j][0], acc[j][1]);
    __syncthreads();
    for (int o = threadIdx.x; o < NT * 64; o += blockDim.x) {
        const int bb = o / (8 * NT), v = o % (8 * NT);
        const int row = row0 + v;
        if (bb < p.b && row < n)
            p.y[(size_t)bb * n + row] = __float2bfloat16(gemv_sum<NT>(red, bb, v) * p.x_scales[bb] * p.w_scales[row]);
    }
#else
    __trap(); // FP8 tensor cores need sm_89; the backend refuses FP8 below it
#endif
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_fp8_r16(GemvFp8Params p) {
    PDL_ENTRY();
    gemv_fp8_impl<2, 4>(p);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_fp8_r32(GemvFp8Params p) {
    PDL_ENTRY();
    gemv_fp8_impl<4, 2>(p);
}

// Predicated 16-byte loads (with ok false the destination keeps its value): a weight, streamed
// past L1, and an activation, cached (every block reads the same x).
__device__ __forceinline__ void ld_stream_if(uint4& r, const unsigned char* p, bool ok) {
    asm("{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n"
        "@q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
        : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w)
        : "l"(p), "r"((int)ok));
}
__device__ __forceinline__ void ld_cached_if(uint4& r, const unsigned char* p, bool ok) {
    asm("{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n"
        "@q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
        : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w)
        : "l"(p), "r"((int)ok));
}

#if __CUDA_ARCH__ >= 890
// c += A * B, a full 16 x 32 A of E4M3 codes and an 8-column B.
__device__ __forceinline__ void mma_fp8_16832(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif

// The tile GEMV: int4.cu's gemv_int4_t16 scheme on E4M3 codes, with no dequantization. One
// mma.m16n8k32.e4m3 takes 16 weight rows as A (every A row used: half the mmas of gemv_fp8_r16,
// whose A rows 8..15 are zero) and the batch's 8 x rows as B. Lane (g = lane / 4, t = lane % 4)
// reads, per 64-wide k-step s, 16 bytes of the tile's weight rows g and g + 8 and of x row g at
// byte 64 s + 16 t: words 0-1 feed the step's first mma (a0 / a2 row g, a1 / a3 row g + 8, b0 / b1
// x), words 2-3 the second, so A and B map each logical k to one physical k as gemv_fp8_r16 does.
// A block loops over the tiles blockIdx.x + i gridDim.x (the grid is at most the blocks that fit at
// once); warp w takes the contiguous steps [w span, (w + 1) span) of every tile, D of them in
// flight per lane in a register ring (weights, and x in the `x` variants) that runs on across the
// block's tiles. Rows past n are read as row n - 1 and x rows past b as row b - 1: their products
// land only in outputs never stored. k is a multiple of 64 (the host checks; others take
// gemv_fp8_r16).
// Sums: a warp adds its steps in increasing order on two f32 chains (each step's first and second
// mma), then chain 0 + chain 1; the warps' sums are added in warp order, then
// y = bf16(sum * xs[b] * ws[n]). y[b, n] does not depend on the batch size or on D.
// With ROPE (P = GemvFp8RopeParams: the fused q/k/v product, n = (hq + 2 hkv) d, d a multiple of
// 16) tile i takes head h = i / (d / 16) and its rotation pairs j0 .. j0 + 7, j0 = 8 (i % (d / 16)):
// row g of the tile is the head's dim j0 + g, row g + 8 the dim j0 + g + d/2 it rotates with, as in
// gemv.cu's gemv_rope_kv_bf16. Each output is rounded to bf16 as y would hold it and finished by
// rope_pair_store: the bits of the plain kernel followed by rope_kv_write_bf16, in one launch.
// With SILU (P = GemvFp8SiluParams: the gate/up product, n = 2 inter, gate rows then up rows) tile
// i takes gate rows 8i .. 8i + 7 as its rows 0..7 and the up rows inter + 8i .. as its rows 8..15,
// and the epilogue stores h = bf16(silu(gate) * up) from the two bf16 outputs y would hold —
// silu_mul_quant_fp8_bf16's h, bit for bit — and raises amax[b] to each row's largest |h|.
// With XQ (P = GemvFp8XqParams: the down product of that h) each warp first quantizes the bf16
// input of its own k span, every row, into shared memory with the row's scale from amax (or the
// static scale): the codes and scale silu_mul_quant_fp8_bf16 gives, so y is what the unfused
// kernels give, without their launch between the two products.
enum Fp8TileMode { FP8_TILE_PLAIN, FP8_TILE_ROPE, FP8_TILE_SILU, FP8_TILE_XQ };
__device__ __forceinline__ const GemvFp8Params& fp8_gemv_of(const GemvFp8Params& p) { return p; }
__device__ __forceinline__ const GemvFp8Params& fp8_gemv_of(const GemvFp8RopeParams& p) { return p.g; }
__device__ __forceinline__ const GemvFp8Params& fp8_gemv_of(const GemvFp8SiluParams& p) { return p.g; }
__device__ __forceinline__ const GemvFp8Params& fp8_gemv_of(const GemvFp8XqParams& p) { return p.g; }

// Row r's scale for the XQ kernels: silu_mul_quant's (fp8_row_scale) from the row's largest |h|.
__device__ __forceinline__ float fp8_xq_scale(const GemvFp8XqParams& p, int r) {
    return p.static_scale > 0.f ? p.static_scale : fmaxf(__uint_as_float(p.amax[r]) / FP8_MAX, FP8_MIN_SCALE);
}

template <int D, bool XR, int MODE = FP8_TILE_PLAIN, typename P = GemvFp8Params>
__device__ __forceinline__ void gemv_fp8_t16_impl(const P& pp) {
#if __CUDA_ARCH__ >= 890
    constexpr bool ROPE = MODE == FP8_TILE_ROPE, SILU = MODE == FP8_TILE_SILU, XQ = MODE == FP8_TILE_XQ;
    static_assert(!(XQ && XR), "XQ reads its activations from shared memory, not the ring");
    const GemvFp8Params& p = fp8_gemv_of(pp);
    // [tile parity][warp][row 16][batch 8]: the warps' sums of the last two tiles.
    __shared__ __align__(16) float red[2][GEMV_WARPS * 128];
    // XQ: the activation codes [b][k], each warp's span written and read by that warp only.
    extern __shared__ __align__(16) unsigned char xq[];
    const int n = p.n, k = p.k;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int ntiles = (n + 15) >> 4, nsteps = k >> 6;
    // Warp w's items j < per_warp (a multiple of D, so that item j of any tile lives in ring slot
    // j % D) are steps s_begin + j; items j >= cnt load nothing and add nothing (warp-uniform).
    const int span = (nsteps + GEMV_WARPS - 1) / GEMV_WARPS;
    const int per_warp = (span + D - 1) / D * D;
    const int s_begin = min(nsteps, warp * span);
    const int cnt = min(nsteps, s_begin + span) - s_begin;
    // Byte offsets (n k < 2^32: the host checks) of the lane's x row and of its two rows of a
    // tile, at its first step.
    const u32 xo = (u32)min(g, p.b - 1) * (u32)k + 64u * (u32)s_begin + 16u * (u32)t;
    // The tiles' weight rows (TileRows, gemv.cu); ROPE: a head's d / 16 tiles, SILU: half = inter.
    int rope_d = 0;
    if constexpr (ROPE) rope_d = pp.rope.d;
    const TileRows rows = tile_rows(ROPE, SILU, rope_d, n);
    const int half = rows.half, per_head = rows.per_head;
    auto tile_row = [&](int tile, int r) { return rows.row(tile, r); };
    auto rows_of = [&](int tile, u32(&wo)[2]) {
#pragma unroll
        for (int h = 0; h < 2; h++)
            wo[h] = (u32)tile_row(tile, g + 8 * h) * (u32)k + 64u * (u32)s_begin + 16u * (u32)t;
    };
    uint4 wv[D][2], xv[XR ? D : 1];
#pragma unroll
    for (int d = 0; d < D; d++) wv[d][0] = wv[d][1] = xv[XR ? d : 0] = make_uint4(0, 0, 0, 0);
    auto load = [&](const u32(&wo)[2], int j, bool tile_ok, int d) {
        const bool real = tile_ok && j < cnt;
        const u32 off = 64u * (u32)j;
        ld_stream_if(wv[d][0], p.w + (wo[0] + off), real);
        ld_stream_if(wv[d][1], p.w + (wo[1] + off), real);
        if (XR) ld_cached_if(xv[XR ? d : 0], p.x + (xo + off), real);
    };

    int tile = blockIdx.x;
    u32 wo[2], wn[2];
    rows_of(tile, wo);
    rows_of(min(tile + (int)gridDim.x, ntiles - 1), wn);
    // The ring's first weights are loaded before pdl_wait() (no kernel writes them), so that in a
    // decode graph they stream while the kernel before finishes; its activations after it.
#pragma unroll
    for (int d = 0; d < D; d++) {
        ld_stream_if(wv[d][0], p.w + (wo[0] + 64u * (u32)d), d < cnt);
        ld_stream_if(wv[d][1], p.w + (wo[1] + 64u * (u32)d), d < cnt);
    }
    pdl_wait();
    pdl_trigger();
#pragma unroll
    for (int d = 0; d < D; d++)
        if (XR) ld_cached_if(xv[XR ? d : 0], p.x + (xo + 64u * (u32)d), d < cnt);
    if constexpr (XQ) {
        // The warp's span of every row: 8 values a lane at a time, fp8_quant_row_vec's codes.
        for (int rr = 0; rr < p.b; rr++) {
            const float scale = fp8_xq_scale(pp, rr);
            const float rcp = 1.f / scale;
            const u32 base = (u32)rr * (u32)k + 64u * (u32)s_begin;
            for (int i = lane; i < 8 * cnt; i += 32) {
                const uint4 w = __ldg((const uint4*)(pp.h + (base + 8u * (u32)i)));
                const u32 x[4] = {w.x, w.y, w.z, w.w};
                u32 c[4];
#pragma unroll
                for (int e = 0; e < 4; e++)
                    c[e] = fp8_code2(fp8_div(bf16_lo(x[e]), scale, rcp), fp8_div(bf16_hi(x[e]), scale, rcp));
                *(uint2*)(xq + base + 8u * (u32)i) =
                    make_uint2(__byte_perm(c[0], c[1], 0x5410), __byte_perm(c[2], c[3], 0x5410));
            }
        }
        __syncwarp();
    }
    for (int parity = 0; tile < ntiles; tile += gridDim.x, parity ^= 1) { // block-uniform
        const bool next_ok = tile + (int)gridDim.x < ntiles;
        float acc[2][4];
#pragma unroll
        for (int c = 0; c < 4; c++) acc[0][c] = acc[1][c] = 0.f;
        for (int j0 = 0; j0 < per_warp; j0 += D) {
            // The group's refills come from the next tile when it is the tile's last.
            const bool last = j0 + D >= per_warp;
#pragma unroll
            for (int d = 0; d < D; d++) {
                const int j = j0 + d;
                if (j < cnt) { // warp-uniform: every lane of the warp takes the mma
                    const uint4 x = XR   ? xv[XR ? d : 0]
                                    : XQ ? *(const uint4*)(xq + (xo + 64u * (u32)j))
                                         : __ldg((const uint4*)(p.x + (xo + 64u * (u32)j)));
                    mma_fp8_16832(acc[0], wv[d][0].x, wv[d][1].x, wv[d][0].y, wv[d][1].y, x.x, x.y);
                    mma_fp8_16832(acc[1], wv[d][0].z, wv[d][1].z, wv[d][0].w, wv[d][1].w, x.z, x.w);
                }
                // Refill slot d with the item D ahead: this tile's, or the block's next tile's.
                if (last) {
                    load(wn, j + D - per_warp, next_ok, d);
                } else {
                    load(wo, j + D, true, d);
                }
            }
        }
        // c0, c1 = (row g, batch 2t, 2t + 1); c2, c3 = (row g + 8, the same batches).
        float* rp = red[parity];
        float* r = rp + warp * 128;
        *(float2*)&r[g * 8 + 2 * t] = make_float2(acc[0][0] + acc[1][0], acc[0][1] + acc[1][1]);
        *(float2*)&r[(g + 8) * 8 + 2 * t] = make_float2(acc[0][2] + acc[1][2], acc[0][3] + acc[1][3]);
        // One barrier a tile: red[parity] is written again two tiles on, after the next barrier,
        // which every thread reaches only once done reading it below.
        __syncthreads();
        // The warps' sums of the tile's row rr for batch row bb, scaled and rounded to bf16.
        auto out = [&](int bb, int rr, int row) {
            float v = rp[rr * 8 + bb];
#pragma unroll
            for (int w = 1; w < GEMV_WARPS; w++) v += rp[w * 128 + rr * 8 + bb];
            float xs;
            if constexpr (XQ) {
                xs = fp8_xq_scale(pp, bb);
            } else {
                xs = p.x_scales[bb];
            }
            return __float2bfloat16(v * xs * p.w_scales[row]);
        };
        if constexpr (ROPE) {
            // o = (batch bb, pair r): rows r and r + 8 of the tile, dims j0 + r and j0 + r + d/2.
            for (int o = threadIdx.x; o < 64; o += blockDim.x) {
                const int bb = o >> 3, r = o & 7;
                if (bb < p.b) {
                    const int row = tile_row(tile, r);
                    const float x1 = __bfloat162float(out(bb, r, row));
                    const float x2 = __bfloat162float(out(bb, r + 8, row + half));
                    rope_pair_store<bf16>(pp.rope, bb, tile / per_head, tile % per_head * 8 + r, x1, x2);
                }
            }
        } else if constexpr (SILU) {
            // o = (batch bb, row r): gate row 8 tile + r and its up row, by warps 0 and 1 whole,
            // whose lanes 8j .. 8j + 7 then share batch row bb's largest |h|. fmaxf drops NaN, as
            // silu_mul_quant's max does; |h| >= 0 orders as its bits, so atomicMax on the bits
            // keeps the row's largest.
            if (threadIdx.x < 64) {
                const int bb = threadIdx.x >> 3, r = threadIdx.x & 7;
                float m = 0.f;
                if (bb < p.b) {
                    const int row = 8 * tile + r;
                    const float gv = __bfloat162float(out(bb, r, row));
                    const float uv = __bfloat162float(out(bb, r + 8, row + half));
                    const bf16 h = __float2bfloat16(silu_f(gv) * uv);
                    pp.h[(size_t)bb * half + row] = h;
                    m = fabsf(__bfloat162float(h));
                }
#pragma unroll
                for (int o = 1; o < 8; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                if (r == 0 && m > 0.f) atomicMax(pp.amax + bb, __float_as_uint(m));
            }
        } else {
            for (int o = threadIdx.x; o < 128; o += blockDim.x) {
                // o = (batch bb, row rr) with the row fastest, so that y's stores are contiguous.
                const int bb = o >> 4, rr = o & 15;
                const int row = 16 * tile + rr;
                if (bb < p.b && row < n) p.y[(size_t)bb * n + row] = out(bb, rr, row);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) wo[h] = wn[h];
        rows_of(min(tile + 2 * (int)gridDim.x, ntiles - 1), wn);
    }
#else
    __trap(); // FP8 tensor cores need sm_89; the backend refuses FP8 below it
#endif
}

// gemv_fp8_t16_d{D}[x][_b{blocks}]: D k-steps in flight a lane (x: their activations in the ring
// too, else loaded at the mma), at least `blocks` blocks an SM (3 unless named); the grid is at
// most the blocks that fit. The backend runs d2x_b4 on products of at most 2^25 weights and d4x_b2
// on larger ones (fastest on the 8B shapes in run 41: q/k/v and o, gate/up and down); the others
// are timed beside them by `cuda_bench gemv`.
#define FP8_T16(name, d, xr, blocks)                                                                     \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, blocks) name(GemvFp8Params p) {           \
        gemv_fp8_t16_impl<d, xr>(p); /* pdl_wait() in the ring fill (PDL_KERNELS) */                     \
    }
FP8_T16(gemv_fp8_t16_d2x_b4, 2, true, 4)
FP8_T16(gemv_fp8_t16_d4x_b2, 4, true, 2)
FP8_T16(gemv_fp8_t16_d3x, 3, true, 3)
FP8_T16(gemv_fp8_t16_d4x, 4, true, 3)
FP8_T16(gemv_fp8_t16_d6x_b2, 6, true, 2)
FP8_T16(gemv_fp8_t16_d8x, 8, true, 2)
FP8_T16(gemv_fp8_t16_d4, 4, false, 3)

// gemv_fp8_rope_kv_<variant>: the q/k/v product of the backend's two tile variants with RoPE and
// the paged KV write in the epilogue (ROPE above).
#define FP8_ROPE_T16(name, d, xr, blocks)                                                                \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, blocks) name(GemvFp8RopeParams p) {       \
        gemv_fp8_t16_impl<d, xr, FP8_TILE_ROPE>(p); /* pdl_wait() in the ring fill (PDL_KERNELS) */      \
    }
FP8_ROPE_T16(gemv_fp8_rope_kv_t16_d2x_b4, 2, true, 4)
FP8_ROPE_T16(gemv_fp8_rope_kv_t16_d4x_b2, 4, true, 2)

// gemv_fp8_silu_<variant>: the gate/up product of the backend's two tile variants with SiLU·mul
// in its epilogue; gemv_fp8_xq_<variant>: the down product quantizing that output as it loads it
// (SILU and XQ above; its activations come from shared memory, not the ring, whatever the name).
#define FP8_SILU_T16(name, d, xr, blocks)                                                                \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, blocks) name(GemvFp8SiluParams p) {       \
        gemv_fp8_t16_impl<d, xr, FP8_TILE_SILU>(p); /* pdl_wait() in the ring fill (PDL_KERNELS) */      \
    }
#define FP8_XQ_T16(name, d, blocks)                                                                      \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, blocks) name(GemvFp8XqParams p) {         \
        gemv_fp8_t16_impl<d, false, FP8_TILE_XQ>(p); /* pdl_wait() in the ring fill (PDL_KERNELS) */     \
    }
FP8_SILU_T16(gemv_fp8_silu_t16_d2x_b4, 2, true, 4)
FP8_SILU_T16(gemv_fp8_silu_t16_d4x_b2, 4, true, 2)
FP8_XQ_T16(gemv_fp8_xq_t16_d2x_b4, 2, 4)
FP8_XQ_T16(gemv_fp8_xq_t16_d4x_b2, 4, 2)

// y[b, n] = bf16(y[b, n] * xs[b] * ws[n]) in place: the scales of a product cuBLASLt ran on raw
// E4M3 codes (Hopper's cuBLASLt scales FP8 operands by one value each, not per row). Takes
// GemvFp8Params; its x and w are unused. Two bf16 elements a thread per step when n is even.
extern "C" __global__ void __launch_bounds__(FP8_SCALE_THREADS) scale_fp8_out_bf16(GemvFp8Params p) {
    PDL_ENTRY();
    const size_t total = (size_t)p.b * p.n;
    const size_t step = (size_t)gridDim.x * FP8_SCALE_THREADS;
    if ((p.n & 1) == 0) {
        __nv_bfloat162* y = (__nv_bfloat162*)p.y;
        for (size_t i = (size_t)blockIdx.x * FP8_SCALE_THREADS + threadIdx.x; 2 * i < total; i += step) {
            const int b = (int)(2 * i / p.n), n = (int)(2 * i % p.n);
            const float2 v = __bfloat1622float2(y[i]);
            const float xs = p.x_scales[b];
            y[i] = __floats2bfloat162_rn(v.x * xs * p.w_scales[n], v.y * xs * p.w_scales[n + 1]);
        }
    } else {
        for (size_t i = (size_t)blockIdx.x * FP8_SCALE_THREADS + threadIdx.x; i < total; i += step) {
            const int b = (int)(i / p.n), n = (int)(i % p.n);
            p.y[i] = __float2bfloat16(__bfloat162float(p.y[i]) * p.x_scales[b] * p.w_scales[n]);
        }
    }
}
