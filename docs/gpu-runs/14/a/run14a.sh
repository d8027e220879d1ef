#!/usr/bin/env bash
# Run 14a: the fused GEMV epilogues (q/k/v + RoPE + KV write; o/down + residual add + RMSNorm).
# GPU tests, memcheck on the fused kernels' tests and a bf16 `generate` (tiny-llama, graphs), then
# cuda_bench decode with each RINGSERVE_CUDA_FUSE setting, twice, and bench engine off/on.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
( python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
./cuda_kernels --include-ignored --test-threads=1 --nocapture > "$OUT/tests.log" 2>&1; echo "kernels rc=$?" >> "$OUT/tests.log"
./cuda_backend --include-ignored --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" >> "$OUT/tests.log"
compute-sanitizer --tool memcheck --leak-check no ./cuda_kernels --include-ignored --test-threads=1 gemv_ \
  >> "$OUT/tests.log" 2>&1; echo "memcheck (gemv tests) rc=$?" >> "$OUT/tests.log"
printf '{"prompt_token_ids": [%s], "max_tokens": 24, "temperature": %s, "seed": 5}\n' \
  "1, 450, 49" 0 "1, 298, 13, 22, 100" 0.8 "477" 0 > /tmp/sanitize.jsonl
compute-sanitizer --tool memcheck --leak-check no ./ringserve generate --model tiny-llama \
  --device cuda --dtype bfloat16 --input /tmp/sanitize.jsonl --output /tmp/sanitize.out --quiet \
  >> "$OUT/tests.log" 2>&1; echo "memcheck (generate, bf16, graphs) rc=$?" >> "$OUT/tests.log"
RINGSERVE_CUDA_FUSE=0 ./ringserve generate --model tiny-llama --device cuda --dtype bfloat16 \
  --input /tmp/sanitize.jsonl --output /tmp/unfused.out --quiet >> "$OUT/tests.log" 2>&1
cp /tmp/sanitize.out /tmp/unfused.out "$OUT"/; cmp /tmp/sanitize.out /tmp/unfused.out >> "$OUT/tests.log" 2>&1 && echo "generate: fused = unfused output" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|ERROR SUMMARY|panicked|generate:" "$OUT/tests.log"
wait; cat $M/*.safetensors > /dev/null
for r in 1 2; do for f in 0 rope norm 1; do
  echo "== FUSE=$f, round $r" >> "$OUT/ab.log"
  RINGSERVE_CUDA_FUSE=$f ./cuda_bench decode $M 1,2,8 512 50 2>&1 | grep "^decode" >> "$OUT/ab.log"
done; done
for f in 0 1; do
  echo "== engine FUSE=$f" >> "$OUT/ab.log"
  RINGSERVE_CUDA_FUSE=$f ./ringserve bench engine --model $M --device cuda --batch-sizes 1,8 --prompt-lens 512 \
    --output-len 64 2>&1 | grep -E "^\||rror" >> "$OUT/ab.log"
done
cat "$OUT/ab.log"
