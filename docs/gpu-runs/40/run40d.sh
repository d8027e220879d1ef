#!/usr/bin/env bash
# Run 40, call d (carry .gpu40: ringserve with the FP8-cache decode kernel taking two tiles an
# iteration, ringserve_old = call c's build, the cuda_kernels and cuda_fp8 tests of the new build):
# the tests, then the two builds alternating at 64 x 3,900, FP8 and bf16 caches.
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b40d; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B && tar xJf .gpu40/bins.tar.xz -C $B
export FIXTURES_DIR=$PWD/tests/fixtures LD_LIBRARY_PATH=/usr/local/cuda/lib64
( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
RINGSERVE_KERNEL_CACHE=/tmp/kc-40d timeout 200 $B/cuda_kernels attention_matches_cpu --include-ignored --nocapture > $OUT/attention.log 2>&1; echo "attention rc=$?"
grep -E "FP8 cache.*d128" $OUT/attention.log | head -2; grep -E "test result|panicked" $OUT/attention.log
RINGSERVE_KERNEL_CACHE=/tmp/kc-40d timeout 200 $B/cuda_fp8 fp8_kv_cache --include-ignored --nocapture > $OUT/cuda_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
grep -E "test result|panicked" $OUT/cuda_fp8.log
wait
for kv in fp8 auto fp8; do
  for bin in ringserve ringserve_old; do
    echo "== $bin --kv-cache-dtype $kv, 64 x 3900" | tee -a $OUT/bench.txt
    RINGSERVE_KERNEL_CACHE=/tmp/kc-40d-$bin timeout 120 $B/$bin bench engine --model $M --device cuda --kv-cache-dtype $kv \
      --max-model-len 4096 --batch-sizes 64 --prompt-lens 3900 --output-len 65 --peer-decode 2>>$OUT/bench.err \
      | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  done
done
