#!/usr/bin/env bash
# Run 14h: the final commit (pad_decode indexes table rows directly). GPU tests and a short
# cuda_bench decode + bench engine at batch 1 and 8 (graph steps, padded buckets).
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
( python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
./cuda_kernels --include-ignored --test-threads=1 > "$OUT/tests.log" 2>&1; echo "kernels rc=$?" >> "$OUT/tests.log"
./cuda_backend --include-ignored --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|panicked" "$OUT/tests.log"
wait; cat $M/*.safetensors > /dev/null
./cuda_bench decode $M 1,3,8 512 50 2>&1 | grep -E "^decode|rror" | tee "$OUT/bench.log"
./ringserve bench engine --model $M --device cuda --batch-sizes 1,8 --prompt-lens 512 --output-len 64 2>&1 \
  | grep -E "^\||rror" | tee -a "$OUT/bench.log"
