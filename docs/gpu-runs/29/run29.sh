#!/usr/bin/env bash
# Run 29 (carry .gpu29: ringserve built with --features cuda, stripped): the INT4 GEMV's per-step
# variant (RINGSERVE_CUDA_INT4_G128=1, groups of 128: scales and zeros once per 128-wide k-step)
# against the exact one (the default) on the random 8B model quantized to AWQ groups of 128, in
# one call: bench engine at batch 1, 8 and 32 (the GEMV's rows), each way, twice.
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b29; M=/tmp/llama8b; A=/tmp/llama8b-awq
mkdir -p $B && tar xJf .gpu29/bins.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-29
[ -f $M/config.json ] || (time python3 scripts/make_random_llama8b.py $M) > $OUT/make_model.log 2>&1
[ -f $A/config.json ] || (time python3 scripts/make_int4_checkpoint.py $M $A --format awq --group-size 128) > $OUT/q_awq.log 2>&1
tail -3 $OUT/q_awq.log
for round in 1 2; do
  for g in 0 1; do
    echo "== round $round, RINGSERVE_CUDA_INT4_G128=$g" | tee -a $OUT/bench.txt
    RINGSERVE_CUDA_INT4_G128=$g timeout 120 $B/ringserve bench engine --model $A --device cuda \
      --batch-sizes 1,8,32 --prompt-lens 512 --output-len 64 2>>$OUT/bench.err | tee -a $OUT/bench.txt
  done
done
