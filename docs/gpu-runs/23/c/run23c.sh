#!/usr/bin/env bash
# Run 23c: ringserve bench engine on the AWQ and GPTQ checkpoints and on the bf16 source; vLLM 0.26
# bench_vllm.py on the AWQ checkpoint — same call, same weights.
set -uo pipefail
cd "$(dirname "$0")/.."
D=$(basename "$(dirname "$0")")
tar xJf $D/bins.tar.xz -C $D
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-23
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
for q in ${QUANTS:-awq gptq}; do
  echo "== ringserve $q"
  timeout 150 $D/ringserve bench engine --model $M-$q --device cuda --batch-sizes 1,8,32,128 --prompt-lens 512 --output-len 64 2> "$OUT/engine_$q.err" | grep -E "^\|"
  grep -E "device memory|weights streamed" "$OUT/engine_$q.err" | sed 's/.*INFO//' | head -2; grep -iE "error|panic" "$OUT/engine_$q.err" | head -3
done
[ "${SKIP_VLLM:-0}" = 1 ] && exit 0
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
echo "== vLLM awq"
timeout 240 python3 $D/peer/bench_vllm.py $M-awq "$OUT/vllm_awq.json" --skip-256 > "$OUT/vllm_awq.log" 2>&1; echo "vllm awq rc=$?"
grep -E "batch1 decode|: decode tok/s|prefill|engine init|quantization|kernel|Marlin|Machete" "$OUT/vllm_awq.log" | head -12
