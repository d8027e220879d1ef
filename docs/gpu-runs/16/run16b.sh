#!/usr/bin/env bash
# Run 16b (the code-health check, call 2): `ringserve bench engine` of both builds, alternating.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1
cat $M/*.safetensors > /dev/null
for v in new old; do
  export RINGSERVE_KERNEL_CACHE=/tmp/kc-$v
  ./$v/ringserve bench engine --model $M --device cuda --batch-sizes 1,8,128 --prompt-lens 128,512 --output-len 64 \
    2>&1 | grep -E "^\|" | sed "s/^/$v /" | tee -a "$OUT/engine.log"
done
