#!/usr/bin/env bash
# Run 15e, the final build (v46) on another lease: `serve` under `bench serve` (scripts/gpu_serve.sh
# --serve-only: 128 clients and 1, start-up cold and warm), then bench engine 1 and 128 x 512 with
# the tensor-core and the CUDA-core decode kernel, twice.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/serve"; M=/tmp/llama8b
OUT=$OUT/serve bash scripts/gpu_serve.sh --serve-only > /dev/null 2>&1; echo "gpu_serve rc=$?"
grep -E "start-up|tok/s|TTFT|ITL|==" "$OUT/serve/bench.log" | head -30
for r in 1 2; do for f in 1 0; do
  echo "== RINGSERVE_CUDA_DECODE_MMA=$f, round $r" >> "$OUT/engine.log"
  RINGSERVE_CUDA_DECODE_MMA=$f ./ringserve bench engine --model $M --device cuda --batch-sizes 1,128 --prompt-lens 512 \
    --output-len 64 2>&1 | grep -E "^\| [0-9]|rror" >> "$OUT/engine.log"
done; done
cat "$OUT/engine.log"
