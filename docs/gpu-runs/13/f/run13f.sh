#!/usr/bin/env bash
# Run 13f: what the engine's decode step has that cuda_bench's has not, at batch 128, ctx 512:
# its sampled tokens fed back as the next inputs (CUDA_BENCH_FEED=1) and its KV block layout
# (CUDA_BENCH_TABLES=engine); `bench engine` 128 x 512 in the same rounds for reference.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
[ -d $M ] || python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1
cat $M/*.safetensors > /dev/null
for r in 1 2; do
  for setting in "" "CUDA_BENCH_FEED=1" "CUDA_BENCH_TABLES=engine" "CUDA_BENCH_FEED=1 CUDA_BENCH_TABLES=engine"; do
    echo "== ${setting:-defaults}, round $r" >> "$OUT/gap.log"
    env $setting ./cuda_bench decode $M 128 512 60 2>&1 | grep "^decode" >> "$OUT/gap.log"
  done
  echo "== bench engine 128 x 512, round $r" >> "$OUT/gap.log"
  ./ringserve bench engine --model $M --device cuda --batch-sizes 128 --prompt-lens 512 --output-len 64 2>&1 \
    | grep -E "^\| [0-9]" >> "$OUT/gap.log"
done
cat "$OUT/gap.log"
