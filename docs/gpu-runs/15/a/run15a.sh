#!/usr/bin/env bash
# Run 15a: decode attention on tensor cores (attn_decode_mma_bf16_d128). The attention and backend
# tests, memcheck on the attention test, every attention case alone (tensor-core and CUDA-core
# decode kernels in the same process), then cuda_bench decode and bench engine with
# RINGSERVE_CUDA_DECODE_MMA=1 / 0, twice.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
( python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
./cuda_kernels --include-ignored --test-threads=1 --nocapture attention > "$OUT/tests.log" 2>&1; echo "kernels (attention) rc=$?" >> "$OUT/tests.log"
./cuda_backend --include-ignored --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" >> "$OUT/tests.log"
compute-sanitizer --tool memcheck --leak-check no ./cuda_kernels --include-ignored --test-threads=1 attention \
  >> "$OUT/tests.log" 2>&1; echo "memcheck (attention test) rc=$?" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|ERROR SUMMARY|panicked|out of tolerance" "$OUT/tests.log" | head -40
for r in 1 2; do ./cuda_bench kernels "$OUT/kernels$r.json" 2>&1 | grep -E "q1_|rror" > "$OUT/kernels$r.log"; done
paste -d'|' "$OUT/kernels1.log" "$OUT/kernels2.log" | sed 's/attention //g'
wait; cat $M/*.safetensors > /dev/null
for r in 1 2; do for f in 1 0; do
  echo "== RINGSERVE_CUDA_DECODE_MMA=$f, round $r" >> "$OUT/ab.log"
  RINGSERVE_CUDA_DECODE_MMA=$f ./cuda_bench decode $M 1,8,32,128,256 512 30 2>&1 | grep -E "^decode|rror" >> "$OUT/ab.log"
  RINGSERVE_CUDA_DECODE_MMA=$f ./cuda_bench decode $M 128 2048 30 2>&1 | grep -E "^decode|rror" >> "$OUT/ab.log"
done; done
cat "$OUT/ab.log"
for f in 1 0; do
  echo "== bench engine, RINGSERVE_CUDA_DECODE_MMA=$f" >> "$OUT/engine.log"
  RINGSERVE_CUDA_DECODE_MMA=$f ./ringserve bench engine --model $M --device cuda --batch-sizes 1,128 --prompt-lens 512 \
    --output-len 64 2>&1 | grep -E "^\||rror" >> "$OUT/engine.log"
done
cat "$OUT/engine.log"
