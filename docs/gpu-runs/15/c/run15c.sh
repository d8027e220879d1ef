#!/usr/bin/env bash
# Run 15c: the tensor-core decode kernel's build (v45 = the repository's code with 32 cuBLASLt
# candidates instead of 8): every GPU test, memcheck on a bf16 generate and the attention test,
# the bf16 accuracy check against HF float32 (decode path), then cuda_bench decode with 32
# candidates (v45) against 8 (v43's cuda_bench), twice, with the tuning each measured.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
( python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
./cuda_kernels --include-ignored --test-threads=1 --nocapture > "$OUT/tests.log" 2>&1; echo "kernels rc=$?" >> "$OUT/tests.log"
./cuda_backend --include-ignored --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" >> "$OUT/tests.log"
./cuda_tp --include-ignored --test-threads=1 --skip nccl_tp2_two_gpus >> "$OUT/tests.log" 2>&1; echo "tp (one GPU) rc=$?" >> "$OUT/tests.log"
printf '{"prompt_token_ids": [%s], "max_tokens": 24, "temperature": %s, "seed": 5}\n' \
  "1, 450, 49" 0 "1, 298, 13, 22, 100" 0.8 "477" 0 > /tmp/sanitize.jsonl
compute-sanitizer --tool memcheck --leak-check no ./ringserve generate --model tiny-llama \
  --device cuda --dtype bfloat16 --input /tmp/sanitize.jsonl --output /tmp/mma.out --quiet \
  >> "$OUT/tests.log" 2>&1; echo "memcheck (generate, bf16, graphs) rc=$?" >> "$OUT/tests.log"
RINGSERVE_CUDA_DECODE_MMA=0 ./ringserve generate --model tiny-llama --device cuda --dtype bfloat16 \
  --input /tmp/sanitize.jsonl --output /tmp/cudacore.out --quiet >> "$OUT/tests.log" 2>&1
cmp /tmp/mma.out /tmp/cudacore.out >> "$OUT/tests.log" 2>&1 && echo "generate: tensor-core = CUDA-core decode output" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|ERROR SUMMARY|panicked|generate:|differ" "$OUT/tests.log"
wait; cat $M/*.safetensors > /dev/null
./cuda_bench accuracy $M /tmp/ours_logits.bin /tmp/prompts.json > /tmp/acc.log 2>&1
python3 scripts/accuracy_vs_hf.py $M /tmp/prompts.json /tmp/ours_logits.bin "$OUT/accuracy.json" 2>&1 | tail -6
for r in 1 2; do for b in v43 v45; do
  exe=./cuda_bench; [ $b = v43 ] && exe=./cuda_bench_v43
  echo "== $b round $r" >> "$OUT/ab.log"
  $exe decode $M 32,128,256 512 30 2>&1 | grep -E "^decode|^gemm|rror" >> "$OUT/ab.log"
done; done
grep -E "^==|^decode" "$OUT/ab.log"
