#!/usr/bin/env bash
# Run 22g: stash vLLM part 0; long-context decode with `bench engine --peer-decode` (decode as the
# vLLM script measures it: batch × 64 / (t(65) − t(1))), 32 and 64 × 3,900-token prompts.
set -uo pipefail
cd "$(dirname "$0")/.."
D=$(basename "$(dirname "$0")")
tar xJf $D/bins.tar.xz -C $D
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-22
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
(mkdir -p /tmp/vllm_parts; cp .vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $D/peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$? (3: part 1 still to come)"
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > "$OUT/make_model.log" 2>&1
cat $M/*.safetensors > /dev/null
$D/ringserve bench engine --model $M --device cuda --max-model-len 4096 --batch-sizes 32,64 \
  --prompt-lens 3900 --output-len 65 --peer-decode 2>&1 | grep -E "^\|"
