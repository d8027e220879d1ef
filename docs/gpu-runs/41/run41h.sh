#!/usr/bin/env bash
# Run 41, call h (carry .gpu41: ringserve and the cuda_kernels / cuda_fp8 tests with SiLU·mul's FP8
# quantization on 1,024 threads a row for few rows, and ringserve_c, call c's build, stripped): the
# fused SiLU·mul test and the FP8 model test, then bench engine fp8 at 1, 8, 128 x 512 alternating
# the two builds.
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b41h; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B && tar xJf .gpu41/bins.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-41h FIXTURES_DIR=$PWD/tests/fixtures
export TINY_LLAMA_DIR=$PWD/tests/fixtures/tiny-llama
( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
timeout 200 $B/cuda_kernels silu_mul --include-ignored --test-threads=1 --nocapture > $OUT/kernels.log 2>&1; echo "cuda_kernels silu_mul rc=$?"
grep -E "silu|test result|panicked" $OUT/kernels.log | head -20
timeout 200 $B/cuda_fp8 --include-ignored --test-threads=1 --nocapture > $OUT/cuda_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
grep -E "test result|panicked" $OUT/cuda_fp8.log | head
wait
for r in ringserve ringserve_c ringserve ringserve_c; do
  echo "== $r" | tee -a $OUT/bench.txt
  timeout 120 $B/$r bench engine --model $M --device cuda --output-len 65 --peer-decode --batch-sizes 1,8,128 --prompt-lens 512 --quantization fp8 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
done
tail -2 $OUT/bench.err
