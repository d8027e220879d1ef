#!/usr/bin/env bash
# Run 17b: the peer in the same call. vLLM 0.26 (bf16, then --quantization fp8) with its own offline
# benchmark, and ringserve's `bench engine` (new/), on the same random 8B-shaped weights.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
(mkdir -p /tmp/vllm_parts; cp ../.vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$?" >> "$OUT/install.log"; tail -2 "$OUT/install.log"
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1
cat $M/*.safetensors > /dev/null
export RINGSERVE_KERNEL_CACHE=/tmp/kc-new
./new/ringserve bench engine --model $M --device cuda --batch-sizes 1,128,256 --prompt-lens 512 --output-len 64 2>&1 | grep -E "^\|" | tee "$OUT/engine.log"
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
python3 peer/bench_vllm.py $M "$OUT/vllm_bf16.json" > "$OUT/vllm_bf16.log" 2>&1; echo "vllm bf16 rc=$?"
grep -E "batch1 decode|: decode tok/s|init" "$OUT/vllm_bf16.log"
python3 peer/bench_vllm.py $M "$OUT/vllm_fp8.json" --quantization fp8 > "$OUT/vllm_fp8.log" 2>&1; echo "vllm fp8 rc=$?"
grep -E "batch1 decode|: decode tok/s|init" "$OUT/vllm_fp8.log"
./new/ringserve bench engine --model $M --device cuda --batch-sizes 1,128 --prompt-lens 512 --output-len 64 2>&1 | grep -E "^\|" | tee "$OUT/engine2.log"
