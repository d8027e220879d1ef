#!/usr/bin/env bash
# Run 18a: the FP8 kernels (per-row E4M3 quantization, the FP8 small-batch GEMV) against the CPU
# reference, every other kernel test beside them, then the GEMV shapes of the 8B model alone:
# bf16 GEMV, cuBLAS and the FP8 GEMV.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export RINGSERVE_KERNEL_CACHE=/tmp/kc-18
./cuda_kernels --include-ignored --test-threads=1 --nocapture fp8 > "$OUT/tests.log" 2>&1; echo "cuda_kernels rc=$?" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|panicked|fp8" "$OUT/tests.log" | head -40
./cuda_bench gemv "$OUT/gemv.json" 2>&1 | tee "$OUT/gemv.log" | grep -E "m1:|m8:|gemm"
