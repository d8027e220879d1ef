// Warming L2 with weights a later kernel will read, on a side branch of a decode step: at small
// batches the step's latency-bound kernels (RoPE, attention, its combine) leave HBM idle, and the
// product after them (o_proj) then reads its weights from L2.
#include "common.cuh"


// Asks L2 to fetch bytes [0, bytes) at p (16-byte aligned, bytes a multiple of 16), one bulk
// prefetch of PREFETCH_PIECE bytes per thread and round. A prefetch is a hint with no completion:
// the kernel ends once it has issued them and the data arrives while other kernels run. Compiled
// to nothing below sm_90 (no bulk copies there; the host launches it only on sm_90 and later).
extern "C" __global__ void l2_prefetch_u8(const char* p, u64 bytes) {
#if __CUDA_ARCH__ >= 900
    const u64 stride = (u64)gridDim.x * blockDim.x * PREFETCH_PIECE;
    for (u64 off = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * PREFETCH_PIECE; off < bytes; off += stride) {
        const u32 size = (u32)(bytes - off < PREFETCH_PIECE ? bytes - off : PREFETCH_PIECE);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + off), "r"(size) : "memory");
    }
#endif
}
