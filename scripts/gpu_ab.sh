#!/usr/bin/env bash
# A/B of backend switches on the 8B-shaped model: `ringserve bench engine` once per setting, same
# call, same machine. Run from the folder holding the carried binaries; logs go to $OUT.
#   usage: scripts/gpu_ab.sh [--tests] "ENV=VALUE ..." ["ENV=VALUE ..." ...]   ("" = defaults)
# BATCHES / PROMPTS override the points (default 1,128 and 512; 64 output tokens each).
# DECODE=1 also times `cuda_bench decode` (batches $BATCHES, ctx 512, $STEPS steps, default 30)
# per setting, before the engine; NO_ENGINE=1 leaves the engine out. CLOCKS=1 samples the GPU's
# clocks, power and throttle reasons every 200 ms into $OUT/clocks.csv, with each phase's start in
# $OUT/marks.log (scripts/clock_summary.py reads them; a second run into the same $OUT replaces
# clocks.csv and appends to marks.log).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODEL=/tmp/llama8b
[ -d $MODEL ] || ( python3 scripts/make_random_llama8b.py $MODEL > /tmp/make_model.log 2>&1 ) &
MAKE=$!
mark() { echo "$(date +'%Y/%m/%d %H:%M:%S.%N' | cut -c1-26)|$*" >> "$OUT/marks.log"; }
if [ -n "${CLOCKS:-}" ]; then
  Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu=$Q --format=csv,noheader > /dev/null 2>&1 || Q=${Q/clocks_event_reasons/clocks_throttle_reasons}
  nvidia-smi --query-gpu=$Q --format=csv -lms 200 > "$OUT/clocks.csv" 2>&1 &
  SMI=$!
  trap 'kill $SMI 2>/dev/null' EXIT
fi
if [ "${1:-}" = --tests ]; then
  shift
  mark tests
  ./cuda_kernels --include-ignored --test-threads=1 --nocapture > "$OUT/tests.log" 2>&1; echo "kernels rc=$?" | tee -a "$OUT/tests.log"
  ./cuda_backend --include-ignored --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" | tee -a "$OUT/tests.log"
  grep -E "^test |test result|rc=|panicked" "$OUT/tests.log"
fi
wait $MAKE; cat $MODEL/*.safetensors > /dev/null
for setting in "$@"; do
  echo "== setting: ${setting:-defaults}" | tee -a "$OUT/ab.log"
  if [ -n "${DECODE:-}" ]; then
    mark "decode ${setting:-defaults}"
    env $setting ./cuda_bench decode $MODEL "${BATCHES:-1,128}" 512 "${STEPS:-30}" 2>&1 | grep -vi "tuning\|lt " | tee -a "$OUT/ab.log"
  fi
  [ -n "${NO_ENGINE:-}" ] && continue
  mark "engine ${setting:-defaults}"
  env $setting ./ringserve bench engine --model $MODEL --device cuda --batch-sizes "${BATCHES:-1,128}" \
    --prompt-lens "${PROMPTS:-512}" --output-len 64 2>&1 | grep -E "^\||error|Error" | tee -a "$OUT/ab.log"
done
mark end
