#!/usr/bin/env bash
# Run 14j: gemv_rope_fits also requires bf16 RoPE buffers; the GEMV tests (the fused one now also
# checks that f32 RoPE buffers are refused) and memcheck on them.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
./cuda_kernels --include-ignored --test-threads=1 > "$OUT/tests.log" 2>&1; echo "kernels rc=$?" >> "$OUT/tests.log"
compute-sanitizer --tool memcheck --leak-check no ./cuda_kernels --include-ignored --test-threads=1 gemv_rope \
  >> "$OUT/tests.log" 2>&1; echo "memcheck (gemv_rope test) rc=$?" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|ERROR SUMMARY|panicked" "$OUT/tests.log"
