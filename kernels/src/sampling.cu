// Sampling on the device; only token ids go back to the host.
//
// Grid: (slices, rows). Each block takes the max, min and argmax of one slice of its row and
// publishes them; the row's last block to finish (a counter per row, reset by that block for the
// next launch or graph replay) combines them. Greedy is then the argmax (lowest index on ties), so
// a greedy row reads its logits once, spread over many SMs. Otherwise that last block goes on
// alone: the kept set is every token whose logit is at least a threshold: min-p gives it in closed
// form, top-k and top-p by bisection on the logit value (count of tokens above, or their
// probability mass). A uniform draw from a counter-based generator keyed by (seed, step) then
// walks the kept tokens' CDF in vocabulary order.
#include "common.cuh"


// SplitMix64's finalizer. The draw for output token `step` of a request seeded `seed` is
// u = (mix64(seed ^ mix64(step + 1)) >> 40) / 2^24, bit for bit the host's `sampler::uniform`, so
// the device and the host sampler pick the same token from the same distribution.
__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Count (or probability mass) of tokens with logit >= thr.
__device__ float mass_above(const float* lg, int vocab, float thr, float mx, float inv_t, bool count,
                            float* red) {
    float s = 0.f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (lg[i] >= thr) s += count ? 1.f : expf((lg[i] - mx) * inv_t);
    return block_sum(s, red);
}

// Largest threshold t in [lo, hi] with f(t) >= goal (f decreasing in t), by bisection.
__device__ float bisect(const float* lg, int vocab, float lo, float hi, float goal, float mx, float inv_t,
                        bool count, float* red) {
    for (int it = 0; it < 40 && lo < hi; it++) {
        const float mid = 0.5f * (lo + hi);
        if (mid <= lo || mid >= hi) break;
        if (mass_above(lg, vocab, mid, mx, inv_t, count, red) >= goal) lo = mid; else hi = mid;
    }
    return lo;
}

// A masked logit (-inf) does not count towards a row's minimum, the lower bound of the top-k and
// top-p bisections: the kept set is then found among the tokens the mask allows.
__device__ __forceinline__ float finite_or_inf(float v) { return v == -INFINITY ? INFINITY : v; }

// Structured output: logits[rows[r] * vocab + t] becomes -inf for every token t whose bit in row
// r's mask (masks[r * words ...], bit t % 32 of word t / 32) is clear. Grid: (ceil(vocab /
// blockDim), masked rows); one thread per token, so the row is written in order.
extern "C" __global__ void mask_logits(float* logits, const u32* masks, const u32* rows, int vocab,
                                       int words) {
    const int r = blockIdx.y;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= vocab) return;
    const u32 word = masks[(size_t)r * words + (t >> 5)];
    if (!((word >> (t & 31)) & 1u)) logits[(size_t)rows[r] * vocab + t] = -INFINITY;
}

// What a slice's block publishes: max, index of the max, min.
struct __align__(16) SlicePart {
    float max;
    int idx;
    float min;
    int pad;
};
static_assert(sizeof(SlicePart) == 4 * SAMPLE_PART_WORDS, "SAMPLE_PART_WORDS (lib.rs) differs");

// (value, index) pairs: the larger value wins, the lower index on ties.
__device__ __forceinline__ void argmax_merge(float& bv, int& bi, float ov, int oi) {
    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
}

// The block's best (value, index) pair by argmax_merge: every thread passes its own, warp 0 gets
// the result (thread 0 among them). sv and si hold a value and an index per warp; the barrier
// first lets them be reused after an earlier call.
__device__ __forceinline__ void block_argmax(float& bv, int& bi, float* sv, int* si) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        argmax_merge(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    __syncthreads();
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        bv = lane < warps ? sv[lane] : -INFINITY;
        bi = lane < warps ? si[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1)
            argmax_merge(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    }
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_f32(const float* logits, const SampleRow* params, u32* out, int vocab, SlicePart* parts,
           u32* done) {
    __shared__ float red[32];
    __shared__ float sv[SAMPLE_THREADS / 32];
    __shared__ int si[SAMPLE_THREADS / 32];
    __shared__ float scan[SAMPLE_THREADS];
    __shared__ bool last;
    const int row = blockIdx.y, slices = gridDim.x;
    const float* lg = logits + (size_t)row * vocab;

    // This slice's max (lowest index on ties) and min. Where rows are whole float4s the slices
    // are too (a last one may come out short or empty) and each thread reads 16 bytes at a time:
    // a 128,256-logit row's slices of 4,008 take one load a thread, not four dependent ones.
    const bool vec = (vocab & 3) == 0;
    const int per = vec ? ((vocab + slices - 1) / slices + 3) & ~3 : (vocab + slices - 1) / slices;
    const int from = min(vocab, (int)blockIdx.x * per), to = min(vocab, from + per);
    float bv = -INFINITY, mn = INFINITY;
    int bi = 0x7fffffff;
    if (vec) {
        const float4* lg4 = (const float4*)(lg + from); // 16-byte aligned: vocab and from % 4 == 0
        for (int j = threadIdx.x; j < (to - from) / 4; j += blockDim.x) {
            const float4 v = lg4[j];
            const int i = from + 4 * j;
            if (v.x > bv) { bv = v.x; bi = i; }
            if (v.y > bv) { bv = v.y; bi = i + 1; }
            if (v.z > bv) { bv = v.z; bi = i + 2; }
            if (v.w > bv) { bv = v.w; bi = i + 3; }
            mn = fminf(mn, fminf(fminf(finite_or_inf(v.x), finite_or_inf(v.y)),
                                 fminf(finite_or_inf(v.z), finite_or_inf(v.w))));
        }
    } else {
        for (int i = from + threadIdx.x; i < to; i += blockDim.x) {
            const float v = lg[i];
            if (v > bv) { bv = v; bi = i; }
            mn = fminf(mn, finite_or_inf(v));
        }
    }
    block_argmax(bv, bi, sv, si);
    mn = block_max(-mn, red); // every thread: minus this slice's min
    if (threadIdx.x == 0) {
        parts[(size_t)row * slices + blockIdx.x] = SlicePart{bv, bi, -mn, 0};
        __threadfence(); // the part is visible before the count says so
        last = atomicAdd(&done[row], 1u) == (u32)slices - 1;
    }
    __syncthreads();
    if (!last) return;

    // The row's last block: combine the slices (in order, so ties keep the lowest index).
    __threadfence();
    if (threadIdx.x == 0) done[row] = 0; // ready for the next launch
    bv = -INFINITY;
    bi = 0x7fffffff;
    mn = INFINITY;
    for (int b = threadIdx.x; b < slices; b += blockDim.x) {
        // From L2 (ld.global.cg): another block wrote it, this SM's L1 may hold nothing newer.
        const float4 sp = __ldcg((const float4*)&parts[(size_t)row * slices + b]);
        argmax_merge(bv, bi, sp.x, __float_as_int(sp.y));
        mn = fminf(mn, sp.z);
    }
    block_argmax(bv, bi, sv, si);
    if (threadIdx.x == 0) { sv[0] = bv; si[0] = bi; }
    mn = -block_max(-mn, red);
    __syncthreads();
    const float mx = sv[0];
    const int amax = si[0];
    const SampleRow sp = params[row];
    if (sp.temperature <= 0.f || sp.top_k == 1) {
        if (threadIdx.x == 0) out[row] = (u32)amax;
        return;
    }
    const float inv_t = 1.f / sp.temperature;

    // As the host sampler (and HF's warpers): top-k, then top-p over the top-k set's mass, then
    // min-p relative to the most likely token (which no filter drops). Each keeps a prefix of the
    // descending order, so the kept set is everything at or above the largest threshold.
    float thr = -INFINITY;
    if (sp.top_k > 0 && (int)sp.top_k < vocab)
        thr = bisect(lg, vocab, mn, mx, (float)sp.top_k, mx, inv_t, true, red);
    if (sp.top_p < 1.f) {
        const float z = mass_above(lg, vocab, thr, mx, inv_t, false, red);
        thr = fmaxf(thr, bisect(lg, vocab, fmaxf(thr, mn), mx, sp.top_p * z, mx, inv_t, false, red));
    }
    if (sp.min_p > 0.f) thr = fmaxf(thr, mx + sp.temperature * logf(sp.min_p));

    // Inverse CDF over the kept tokens: each thread owns a contiguous chunk.
    const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    const int lo = threadIdx.x * chunk, hi = min(vocab, lo + chunk);
    float own = 0.f;
    for (int i = lo; i < hi; i++)
        if (lg[i] >= thr) own += expf((lg[i] - mx) * inv_t);
    scan[threadIdx.x] = own;
    __syncthreads();
    for (int off = 1; off < (int)blockDim.x; off <<= 1) { // inclusive Hillis-Steele scan
        const float add = threadIdx.x >= (unsigned)off ? scan[threadIdx.x - off] : 0.f;
        __syncthreads();
        scan[threadIdx.x] += add;
        __syncthreads();
    }
    const float total = scan[blockDim.x - 1];
    const u64 bits = mix64(sp.seed ^ mix64(sp.step + 1));
    const float u = (float)(bits >> 40) * (1.0f / 16777216.0f); // exact: a 24-bit integer / 2^24
    const float target = u * total;
    // Thread i owns [scan[i-1], scan[i]): neighbouring intervals share their bounds exactly, so at
    // most one thread claims the target (scan[i] - own could round into a neighbour's interval).
    const float before = threadIdx.x > 0 ? scan[threadIdx.x - 1] : 0.f;
    const float after = scan[threadIdx.x];
    if (threadIdx.x == 0) si[0] = amax; // fallback if rounding leaves the target past the end
    __syncthreads();
    if (own > 0.f && target >= before && target < after) {
        float run = before;
        int pick = -1;
        for (int i = lo; i < hi; i++) {
            if (lg[i] < thr || lg[i] == -INFINITY) continue; // masked tokens weigh nothing
            pick = i;
            run += expf((lg[i] - mx) * inv_t);
            if (target < run) break;
        }
        si[0] = pick;
    }
    __syncthreads();
    if (threadIdx.x == 0) out[row] = (u32)si[0];
}
