#!/usr/bin/env bash
# Run 14c: the down projection fused with SiLU·mul (and q/k/v with RoPE). GPU tests, memcheck on
# the GEMV tests and a bf16 `generate`, then cuda_bench decode with the fusions on/off (twice),
# bench engine, and the bf16 accuracy check (decode path) against HF float32.
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
  --device cuda --dtype bfloat16 --input /tmp/sanitize.jsonl --output /tmp/fused.out --quiet \
  >> "$OUT/tests.log" 2>&1; echo "memcheck (generate, bf16, graphs) rc=$?" >> "$OUT/tests.log"
RINGSERVE_CUDA_FUSE_ROPE=0 RINGSERVE_CUDA_FUSE_SILU=0 ./ringserve generate --model tiny-llama --device cuda \
  --dtype bfloat16 --input /tmp/sanitize.jsonl --output /tmp/unfused.out --quiet >> "$OUT/tests.log" 2>&1
cmp /tmp/fused.out /tmp/unfused.out >> "$OUT/tests.log" 2>&1 && echo "generate: fused = unfused output" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|ERROR SUMMARY|panicked|generate:" "$OUT/tests.log"
wait; cat $M/*.safetensors > /dev/null
run() { echo "== ${1:-defaults}, round $2" >> "$OUT/ab.log"; env $1 ./cuda_bench decode $M 1,2,4,8,16 512 50 2>&1 | grep -E "^decode|rror" >> "$OUT/ab.log"; }
for r in 1 2; do
  run "" $r; run "RINGSERVE_CUDA_FUSE_SILU=0" $r; run "RINGSERVE_CUDA_FUSE_ROPE=0 RINGSERVE_CUDA_FUSE_SILU=0" $r
done
for f in "" "RINGSERVE_CUDA_FUSE_ROPE=0 RINGSERVE_CUDA_FUSE_SILU=0"; do
  echo "== engine ${f:-defaults}" >> "$OUT/ab.log"
  env $f ./ringserve bench engine --model $M --device cuda --batch-sizes 1,8 --prompt-lens 512 \
    --output-len 64 2>&1 | grep -E "^\||rror" >> "$OUT/ab.log"
done
cat "$OUT/ab.log"
./cuda_bench accuracy $M /tmp/ours_logits.bin /tmp/prompts.json > /tmp/acc.log 2>&1
python3 scripts/accuracy_vs_hf.py $M /tmp/prompts.json /tmp/ours_logits.bin "$OUT/accuracy.json" 2>&1 | tail -8
