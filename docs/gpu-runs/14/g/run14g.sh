#!/usr/bin/env bash
# Run 14g: the norms and SiLU·mul prefetch the next product's weight head into L2 as they start
# (RINGSERVE_CUDA_L2_HEADS), no graph branch, spread over extra prefetch-only blocks (256 KiB each). Kernel tests (the hint must not change a bit), then
# cuda_bench decode at batches 1, 2, 8 for each plan, twice.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
( python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
./cuda_kernels --include-ignored --test-threads=1 add_rmsnorm silu_mul > "$OUT/tests.log" 2>&1; echo "kernels rc=$?" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|panicked" "$OUT/tests.log"
wait; cat $M/*.safetensors > /dev/null
run() { echo "== $1, round $2" >> "$OUT/ab.log"; env $1 ./cuda_bench decode $M 1,2,8 512 50 2>&1 | grep -E "^decode|rror" >> "$OUT/ab.log"; }
for r in 1 2; do
  for plan in 0 qkv=8 gu=8 dn=8 qkv=8,gu=8,dn=8,lm=8 qkv=16,gu=16,dn=12,lm=16; do
    run "RINGSERVE_CUDA_L2_HEADS=$plan" $r
  done
done
cat "$OUT/ab.log"
