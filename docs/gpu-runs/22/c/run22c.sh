#!/usr/bin/env bash
# Run 22c (right after 22b, same machine): vLLM part 1 → install; the shared-prefix job with vLLM's
# LLM.generate (prefix caching on, its defaults), then ringserve generate again, same call.
set -uo pipefail
cd "$(dirname "$0")/.."
D=$(basename "$(dirname "$0")")
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-22
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
[ -x $D/ringserve ] || tar xJf $D/bins.tar.xz -C $D
(mkdir -p /tmp/vllm_parts; cp .vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $D/peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$?"; tail -1 "$OUT/install.log"
[ -f /tmp/spj/job.json ] || python3 scripts/shared_prefix_job.py /tmp/spj
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
echo "== vLLM LLM.generate, shared-prefix job"
timeout 420 python3 scripts/vllm_generate_job.py $M /tmp/spj/job.json > "$OUT/vllm_job.log" 2>&1; echo "vllm rc=$?"
grep -E "vllm job:" "$OUT/vllm_job.log" || tail -20 "$OUT/vllm_job.log"
echo "== ringserve generate, shared-prefix job (after vLLM, same call)"
for budget in 8192 16384 2048; do
  $D/ringserve generate --model $M --device cuda --max-model-len 4096 --max-num-batched-tokens $budget \
    --input /tmp/spj/job.jsonl --output /tmp/spj/out_c_$budget.jsonl 2> "$OUT/gen_c_$budget.log" > /dev/null
  echo "   (budget $budget) $(grep -E 'requests,' "$OUT/gen_c_$budget.log" | tail -1)"
done
