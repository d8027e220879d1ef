#!/usr/bin/env bash
# Run 17c: vLLM 0.26 --quantization fp8 (needs compressed-tensors and loguru, the extra/ wheels),
# and ringserve's bf16 `bench engine` again, in the same call.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
python3 -m pip install --no-deps --no-index --target /tmp/site peer/extra/*.whl > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
python3 peer/bench_vllm.py $M "$OUT/vllm_fp8.json" --quantization fp8 > "$OUT/vllm_fp8.log" 2>&1; echo "vllm fp8 rc=$?"
grep -E "batch1 decode|: decode tok/s|engine init" "$OUT/vllm_fp8.log"
export RINGSERVE_KERNEL_CACHE=/tmp/kc-new
./new/ringserve bench engine --model $M --device cuda --batch-sizes 1,128,256 --prompt-lens 512 --output-len 64 2>&1 | grep -E "^\|" | tee "$OUT/engine.log"
