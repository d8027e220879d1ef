#!/usr/bin/env bash
# The device run: GPU tests, compute-sanitizer, the 8B-shaped benchmarks, the accuracy check and
# (with --baseline) HuggingFace's baseline, all in one call. Run from the folder holding the
# carried binaries (`.gpu/`, see docs/benchmarks.md); logs and JSON go to $OUT.
#   usage: scripts/gpu_run.sh [--baseline] [--no-tests]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BASELINE=0; TESTS=1
for a in "$@"; do case $a in --baseline) BASELINE=1;; --no-tests) TESTS=0;; esac; done
# At most 8 files come back from $OUT: tests.log (GPU info, tests, model creation), sanitizer.log,
# bench.log (cuda_bench + ringserve bench engine), ringserve_bench.json, accuracy.json, hf_baseline.json.
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,driver_version --format=csv | tee "$OUT/tests.log"
MODEL=/tmp/llama8b
( python3 scripts/make_random_llama8b.py $MODEL > /tmp/make_model.log 2>&1 ) &
MAKE=$!
if [ $TESTS = 1 ]; then
  ./cuda_kernels --include-ignored --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; echo "kernels rc=$?" | tee -a "$OUT/tests.log"
  ./cuda_backend --include-ignored --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" | tee -a "$OUT/tests.log"
  compute-sanitizer --tool memcheck --leak-check no ./cuda_backend --include-ignored --test-threads=1 f32_last_logits \
    > "$OUT/sanitizer.log" 2>&1; echo "sanitizer (backend) rc=$?" | tee -a "$OUT/sanitizer.log"
  compute-sanitizer --tool memcheck --leak-check no ./cuda_kernels --include-ignored --test-threads=1 attention \
    >> "$OUT/sanitizer.log" 2>&1; echo "sanitizer (attention kernels) rc=$?" | tee -a "$OUT/sanitizer.log"
  # The worker's path end to end (engine, CUDA graphs, device sampling) under memcheck, bf16.
  printf '{"prompt_token_ids": [%s], "max_tokens": 24, "temperature": %s, "seed": 5}\n' \
    "1, 450, 49" 0 "1, 298, 13, 22, 100" 0.8 "477" 0 > /tmp/sanitize.jsonl
  compute-sanitizer --tool memcheck --leak-check no ./ringserve generate --model tiny-llama \
    --device cuda --dtype bfloat16 --input /tmp/sanitize.jsonl --output /tmp/sanitize.out --quiet \
    >> "$OUT/sanitizer.log" 2>&1; echo "sanitizer (ringserve generate, bf16, graphs) rc=$?" | tee -a "$OUT/sanitizer.log"
  grep -E "test result|rc=|ERROR SUMMARY|panicked" "$OUT/tests.log" "$OUT/sanitizer.log"
fi
wait $MAKE; tail -1 /tmp/make_model.log | tee -a "$OUT/tests.log"
cat $MODEL/*.safetensors > /dev/null  # page cache, as the start-up goal assumes
./cuda_bench $MODEL "$OUT/ringserve_bench.json" /tmp/ours_logits.bin /tmp/prompts.json 2>&1 | tee "$OUT/bench.log"
# The whole engine (scheduler, paged KV, device sampling) on the 8B-shaped model.
./ringserve bench engine --model $MODEL --device cuda --batch-sizes 1,8,32,128 --prompt-lens 128,512 \
  --output-len 64 2>&1 | tee -a "$OUT/bench.log"
python3 scripts/accuracy_vs_hf.py $MODEL /tmp/prompts.json /tmp/ours_logits.bin "$OUT/accuracy.json" 2>&1 | tail -25
# The same check through the prefill path (chunked prefill over cached context; cuda_bench's
# second dump).
python3 scripts/accuracy_vs_hf.py $MODEL /tmp/prompts.json.prefill /tmp/ours_logits.bin.prefill \
  "$OUT/accuracy_prefill.json" 2>&1 | tail -25
if [ $BASELINE = 1 ]; then
  python3 scripts/hf_baseline.py 2>&1
fi
