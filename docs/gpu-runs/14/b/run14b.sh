#!/usr/bin/env bash
# Run 14b: L2 prefetch of weight heads at the small kernels' boundaries (RINGSERVE_CUDA_L2_HEADS),
# cuda_bench decode at batches 1, 2, 8, each plan twice, plus the q/k/v + RoPE fusion off once.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1; cat $M/*.safetensors > /dev/null
run() { echo "== $1, round $2" >> "$OUT/ab.log"; env $1 ./cuda_bench decode $M 1,2,8 512 50 2>&1 | grep -E "^decode|rror" >> "$OUT/ab.log"; }
for r in 1 2; do
  for plan in 0 gu=12 dn=8 qkv=12 gu=12,dn=8,qkv=12,lm=12 gu=24,dn=12,qkv=24,lm=24; do
    run "RINGSERVE_CUDA_L2_HEADS=$plan" $r
  done
  run "RINGSERVE_CUDA_FUSE_ROPE=0 RINGSERVE_CUDA_L2_HEADS=0" $r
done
cat "$OUT/ab.log"
