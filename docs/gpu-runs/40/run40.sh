#!/usr/bin/env bash
# Run 40, calls a and c (carry .gpu40: ringserve, cuda_kernels and cuda_fp8 built with the FP8-cache
# decode kernel that converts E4M3 codes in registers, stripped, in bins.tar.xz): the attention
# test and the FP8-cache backend test, then the FP8 cache's long-context decode against the bf16
# cache's (fp8, auto, fp8), the random 8B model written first on a fresh machine.
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b40; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B && tar xJf .gpu40/bins.tar.xz -C $B
export FIXTURES_DIR=$PWD/tests/fixtures LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-40
( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
timeout 200 $B/cuda_kernels attention_matches_cpu --include-ignored --nocapture > $OUT/attention.log 2>&1; echo "attention rc=$?"
grep -E "FP8 cache|fp8|Fp8" $OUT/attention.log | head -4; grep -E "test result|panicked" $OUT/attention.log
timeout 200 $B/cuda_fp8 fp8_kv_cache --include-ignored --nocapture > $OUT/cuda_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
grep -E "FP8-KV vs" $OUT/cuda_fp8.log | head -4; grep -E "test result|panicked" $OUT/cuda_fp8.log
wait
for kv in fp8 auto fp8; do
  echo "== --kv-cache-dtype $kv, 32/64 x 3900" | tee -a $OUT/bench.txt
  timeout 150 $B/ringserve bench engine --model $M --device cuda --kv-cache-dtype $kv --max-model-len 4096 \
    --batch-sizes 32,64 --prompt-lens 3900 --output-len 65 --peer-decode 2>>$OUT/bench.err | tee -a $OUT/bench.txt
done
tail -3 $OUT/bench.err
