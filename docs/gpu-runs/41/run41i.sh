#!/usr/bin/env bash
# Run 41, call i (carry .gpu41: ringserve and the cuda_kernels / cuda_fp8 / cuda_tp tests with o's and
# down's raw FP8 products scaled by the norm that adds them, and ringserve_h, call h's build,
# stripped): the norm test (a raw delta scaled in the kernel against the scaling pass's bits), the
# FP8 model test and the tensor-parallel tests (which keep the scaling pass); bench engine fp8 at
# 128 and 256 x 512 (prefill at batch 128) alternating the two builds.
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b41i; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B && tar xJf .gpu41/bins.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-41i FIXTURES_DIR=$PWD/tests/fixtures
export TINY_LLAMA_DIR=$PWD/tests/fixtures/tiny-llama
( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
timeout 200 $B/cuda_kernels add_rmsnorm --include-ignored --test-threads=1 --nocapture > $OUT/kernels.log 2>&1; echo "cuda_kernels add_rmsnorm rc=$?"
grep -E "raw delta|test result|panicked" $OUT/kernels.log | head -20
timeout 200 $B/cuda_fp8 --include-ignored --test-threads=1 --nocapture > $OUT/cuda_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
grep -E "test result|panicked" $OUT/cuda_fp8.log | head
timeout 200 $B/cuda_tp --include-ignored --test-threads=1 --nocapture > $OUT/cuda_tp.log 2>&1; echo "cuda_tp rc=$?"
grep -E "test result|panicked|^test " $OUT/cuda_tp.log | head -20
wait
for r in ringserve ringserve_h ringserve ringserve_h; do
  echo "== $r" | tee -a $OUT/bench.txt
  timeout 120 $B/$r bench engine --model $M --device cuda --output-len 65 --peer-decode --batch-sizes 128,256 --prompt-lens 512 --quantization fp8 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
done
tail -2 $OUT/bench.err
