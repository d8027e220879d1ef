#!/usr/bin/env bash
# Run 22h (right after 22g): vLLM part 1 → install; vLLM's bench_vllm.py at 32 and 64 × 3,900.
set -uo pipefail
cd "$(dirname "$0")/.."
D=$(basename "$(dirname "$0")")
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
(mkdir -p /tmp/vllm_parts; cp .vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $D/peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$?"; tail -1 "$OUT/install.log"
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
timeout 500 python3 $D/peer/bench_vllm.py $M $OUT/vllm_long.json --prompt-len 3900 --batches 32,64 --max-model-len 4096 > "$OUT/vllm_long.log" 2>&1; echo "vllm rc=$?"
grep -E "\[bench" "$OUT/vllm_long.log" | tail -12
