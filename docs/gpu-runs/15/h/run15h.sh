#!/usr/bin/env bash
# Run 15h: decode splits merged inside the launch by thread-block clusters
# (attn_decode_mma_cluster_bf16_d128, v48). The attention test (every decode kernel against the
# CPU; the clustered merge bit-equal to attn_combine's), cuda_backend, memcheck on the attention
# test; every attention case alone; cuda_bench decode at small batches and bench engine with
# RINGSERVE_CUDA_DECODE_CLUSTER=1 / 0, twice.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
( python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
./cuda_kernels --include-ignored --test-threads=1 --nocapture attention > "$OUT/tests.log" 2>&1; echo "kernels (attention) rc=$?" >> "$OUT/tests.log"
./cuda_backend --include-ignored --test-threads=1 >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" >> "$OUT/tests.log"
compute-sanitizer --tool memcheck --leak-check no ./cuda_kernels --include-ignored --test-threads=1 attention \
  >> "$OUT/tests.log" 2>&1; echo "memcheck (attention test) rc=$?" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|ERROR SUMMARY|panicked|differ|out of tolerance" "$OUT/tests.log" | head -30
./cuda_bench kernels "$OUT/kernels.json" 2>&1 | grep -E "q1_ctx|rror" | grep -v split > "$OUT/kernels.log"; cat "$OUT/kernels.log"
wait; cat $M/*.safetensors > /dev/null
for r in 1 2; do for f in 1 0; do
  echo "== RINGSERVE_CUDA_DECODE_CLUSTER=$f, round $r" >> "$OUT/ab.log"
  RINGSERVE_CUDA_DECODE_CLUSTER=$f ./cuda_bench decode $M 1,2,4,8,32 512 30 2>&1 | grep -E "^decode|rror" >> "$OUT/ab.log"
  RINGSERVE_CUDA_DECODE_CLUSTER=$f ./cuda_bench decode $M 1,8 2048 30 2>&1 | grep -E "^decode|rror" >> "$OUT/ab.log"
done; done
cat "$OUT/ab.log"
for f in 1 0; do
  echo "== bench engine, RINGSERVE_CUDA_DECODE_CLUSTER=$f" >> "$OUT/engine.log"
  RINGSERVE_CUDA_DECODE_CLUSTER=$f ./ringserve bench engine --model $M --device cuda --batch-sizes 1,8 --prompt-lens 512 \
    --output-len 64 2>&1 | grep -E "^\| [0-9]|rror" >> "$OUT/engine.log"
done
cat "$OUT/engine.log"
