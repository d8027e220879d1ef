#!/usr/bin/env bash
# Run 15d, the benchmark call of the final build (run 14e's script, plus the engine's 128 x 512 point with the CUDA-core decode kernel): the cuda_bench decode sweep, bench engine and
# HuggingFace's baseline (scripts/hf_baseline.py) in one call.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv | tee "$OUT/bench.log"
( [ -d $M ] || python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
# The final build's GPU tests while the model is written.
export TINY_LLAMA_DIR=$PWD/tiny-llama
./cuda_kernels --include-ignored --test-threads=1 > "$OUT/tests.log" 2>&1; echo "kernels rc=$?" >> "$OUT/tests.log"
./cuda_backend --include-ignored --test-threads=1 >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" >> "$OUT/tests.log"
grep -E "test result|rc=" "$OUT/tests.log"
wait
cat $M/*.safetensors > /dev/null
for ctx in 512 2048; do ./cuda_bench decode $M 1,8,32,128,256 $ctx 30 2>&1 | grep "^decode" | tee -a "$OUT/bench.log"; done
./ringserve bench engine --model $M --device cuda --batch-sizes 1,8,32,128 --prompt-lens 128,512 --output-len 64 \
  2>&1 | grep -E "^\|" | tee -a "$OUT/bench.log"
python3 scripts/hf_baseline.py > "$OUT/hf_baseline.log" 2>&1; tail -2 "$OUT/hf_baseline.log"
RINGSERVE_CUDA_DECODE_MMA=0 ./ringserve bench engine --model $M --device cuda --batch-sizes 128 --prompt-lens 512 --output-len 64 \
  2>&1 | grep -E "^\|" | sed 's/^/cudacore /' | tee -a "$OUT/bench.log"
