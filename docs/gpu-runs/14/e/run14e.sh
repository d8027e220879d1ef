#!/usr/bin/env bash
# Run 14e, the benchmark call of the final build (run 13g's script): the cuda_bench decode sweep, bench engine and
# HuggingFace's baseline (scripts/hf_baseline.py) in one call.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv | tee "$OUT/bench.log"
[ -d $M ] || python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1
cat $M/*.safetensors > /dev/null
for ctx in 512 2048; do ./cuda_bench decode $M 1,8,32,128,256 $ctx 30 2>&1 | grep "^decode" | tee -a "$OUT/bench.log"; done
./ringserve bench engine --model $M --device cuda --batch-sizes 1,8,32,128 --prompt-lens 128,512 --output-len 64 \
  2>&1 | grep -E "^\|" | tee -a "$OUT/bench.log"
python3 scripts/hf_baseline.py > "$OUT/hf_baseline.log" 2>&1; tail -2 "$OUT/hf_baseline.log"
