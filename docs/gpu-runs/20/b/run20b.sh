#!/usr/bin/env bash
# Run 20b (as run 19b): vLLM 0.26 --quantization fp8 and ringserve --quantization fp8 in the same call.
set -uo pipefail
cd "$(dirname "$0")"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
(mkdir -p /tmp/vllm_parts; cp ../.vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$?"; tail -1 "$OUT/install.log"
python3 -m pip install --no-deps --no-index --target /tmp/site peer/extra/*.whl > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1
export RINGSERVE_KERNEL_CACHE=/tmp/kc-19
./ringserve bench engine --model $M --device cuda --quantization fp8 --batch-sizes 1,128,256 --prompt-lens 512 --output-len 64 2>&1 | grep -E "^\||error|caused" | tee "$OUT/engine_fp8.log"
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
python3 peer/bench_vllm.py $M "$OUT/vllm_fp8.json" --quantization fp8 > "$OUT/vllm_fp8.log" 2>&1; echo "vllm fp8 rc=$?"
grep -E "batch1 decode|: decode tok/s|engine init" "$OUT/vllm_fp8.log"
./ringserve bench engine --model $M --device cuda --quantization fp8 --batch-sizes 1,128 --prompt-lens 512 --output-len 64 2>&1 | grep -E "^\|" | tee "$OUT/engine_fp8_2.log"
