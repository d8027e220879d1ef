#!/usr/bin/env bash
# Run 13i: RoPE four heads a block. GPU tests, memcheck on the RoPE test,
# and cuda_bench decode old (v31) against new, twice.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
( python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
./cuda_kernels --include-ignored --test-threads=1 --nocapture > "$OUT/tests.log" 2>&1; echo "kernels rc=$?" >> "$OUT/tests.log"
./cuda_backend --include-ignored --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" >> "$OUT/tests.log"
compute-sanitizer --tool memcheck --leak-check no ./cuda_kernels --include-ignored --test-threads=1 rope \
  >> "$OUT/tests.log" 2>&1; echo "memcheck (rope test) rc=$?" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|ERROR SUMMARY|panicked" "$OUT/tests.log"
wait; cat $M/*.safetensors > /dev/null
for r in 1 2; do for v in old new; do
  B=./cuda_bench; [ $v = old ] && B=./cuda_bench_old
  echo "== $v, round $r" >> "$OUT/ab.log"
  $B decode $M 1,8,128 512 50 2>&1 | grep "^decode" >> "$OUT/ab.log"
done; done
cat "$OUT/ab.log"
