#!/usr/bin/env bash
# Run 28, call e (carry .gpu28c: the cuda_tp test executable, built with --features cuda): tensor
# parallelism on one GPU through host collectives, FP8 included (--quantization fp8 at TP=2 against
# TP=1, bf16 and FP8 KV caches); the two-GPU test skipped.
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b28e; mkdir -p $B && tar xJf .gpu28c/bins.tar.xz -C $B
export TINY_LLAMA_DIR=$PWD/tests/fixtures/tiny-llama LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-28e
timeout 400 $B/cuda_tp --include-ignored --test-threads=1 --nocapture --skip two_gpus > $OUT/cuda_tp.log 2>&1; echo "cuda_tp rc=$?"
grep -E "^test |test result|panicked|FP8 TP=2|cases equal" $OUT/cuda_tp.log | head -40
