#!/usr/bin/env bash
# Run 28, call d (carry .gpu28b: ringserve and cuda_kernels rebuilt with the FP8-cache decode
# kernel's ring at 7 stages, 3 blocks an SM): the attention test again, then the FP8 cache's
# long-context bench against the bf16 cache's (the random 8B model written first if the machine
# is a fresh one).
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b28d; M=/tmp/llama8b
mkdir -p $B && tar xJf .gpu28b/bins.tar.xz -C $B
export FIXTURES_DIR=$PWD/tests/fixtures LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-28d
( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
timeout 200 $B/cuda_kernels attention_matches_cpu --include-ignored --nocapture > $OUT/attention.log 2>&1; echo "attention rc=$?"
grep -E "FP8 cache" $OUT/attention.log | head -3; grep -E "test result|panicked" $OUT/attention.log
wait
for kv in fp8 auto fp8; do
  echo "== --kv-cache-dtype $kv, 32/64 x 3900" | tee -a $OUT/bench.txt
  timeout 200 $B/ringserve bench engine --model $M --device cuda --kv-cache-dtype $kv --max-model-len 4096 \
    --batch-sizes 32,64 --prompt-lens 3900 --output-len 65 --peer-decode 2>/dev/null | tee -a $OUT/bench.txt
done
