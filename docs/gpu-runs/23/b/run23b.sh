#!/usr/bin/env bash
# Run 23b: vLLM part 1 (install completes) and its extra wheels; the INT4 tests with a time limit,
# unbuffered; ringserve bench engine on the AWQ checkpoint if it is still there.
set -uo pipefail
cd "$(dirname "$0")/.."
D=$(basename "$(dirname "$0")")
tar xJf $D/bins.tar.xz -C $D
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-23
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
(mkdir -p /tmp/vllm_parts; cp .vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $D/peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$?"; tail -1 "$OUT/install.log"
python3 -m pip install --no-deps --no-index --target /tmp/site $D/peer/extra/*.whl > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
ls /tmp/llama8b-awq /tmp/llama8b-gptq 2>&1 | head -4
echo "== kernel tests"
timeout 120 $D/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels 2>&1 | tail -15
echo "== model tests"
timeout 60 $D/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_models 2>&1 | tail -15
