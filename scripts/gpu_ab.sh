#!/usr/bin/env bash
# A/B of backend switches on the 8B-shaped model: `ringserve bench engine` once per setting, same
# call, same machine. Run from the folder holding the carried binaries; logs go to $OUT.
#   usage: scripts/gpu_ab.sh [--tests] "ENV=VALUE ..." ["ENV=VALUE ..." ...]   ("" = defaults)
# BATCHES / PROMPTS override the points (default 1,128 and 512; 64 output tokens each).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODEL=/tmp/llama8b
[ -d $MODEL ] || ( python3 scripts/make_random_llama8b.py $MODEL > /tmp/make_model.log 2>&1 ) &
MAKE=$!
if [ "${1:-}" = --tests ]; then
  shift
  ./cuda_kernels --include-ignored --test-threads=1 --nocapture > "$OUT/tests.log" 2>&1; echo "kernels rc=$?" | tee -a "$OUT/tests.log"
  ./cuda_backend --include-ignored --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" | tee -a "$OUT/tests.log"
  grep -E "^test |test result|rc=|panicked" "$OUT/tests.log"
fi
wait $MAKE; cat $MODEL/*.safetensors > /dev/null
for setting in "$@"; do
  echo "== setting: ${setting:-defaults}" | tee -a "$OUT/ab.log"
  env $setting ./ringserve bench engine --model $MODEL --device cuda --batch-sizes "${BATCHES:-1,128}" \
    --prompt-lens "${PROMPTS:-512}" --output-len 64 2>&1 | grep -E "^\||error|Error" | tee -a "$OUT/ab.log"
done
