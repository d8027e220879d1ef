#!/usr/bin/env bash
# Run 20a: the norms before q/k/v and gate/up quantize their output themselves (no separate
# quantization launch for those two products). Kernel, FP8 and backend tests; bench engine bf16 and
# fp8; vLLM part 1 stashed for call b.
set -uo pipefail
cd "$(dirname "$0")"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 TINY_LLAMA_DIR=$PWD/fixtures/tiny-llama FIXTURES_DIR=$PWD/fixtures
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
(mkdir -p /tmp/vllm_parts; cp ../.vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$?" >> "$OUT/install.log"
( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
export RINGSERVE_KERNEL_CACHE=/tmp/kc-20
for t in cuda_kernels cuda_fp8 cuda_backend; do ./$t --include-ignored --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; echo "$t rc=$?" >> "$OUT/tests.log"; done
grep -E "test result|rc=|panicked|fp8 rows|CUDA FP8 vs" -A1 "$OUT/tests.log" | head -50
wait; cat $M/*.safetensors > /dev/null
for q in "--quantization fp8" ""; do
  echo "== bench engine $q" | tee -a "$OUT/engine.log"
  ./ringserve bench engine --model $M --device cuda $q --batch-sizes 1,8,128,256 --prompt-lens 512 --output-len 64 2>&1 | grep -E "^\||error|caused" | tee -a "$OUT/engine.log"
done
