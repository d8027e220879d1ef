#!/usr/bin/env bash
# Run 13e: the RMSNorm change (weights loaded with the row) A/B against run 12's kernels, and the
# b128 decode step held at context 512 for 30-1000 steps with the GPU's clocks logged.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
nvidia-smi -q -d POWER,CLOCK,PERFORMANCE > "$OUT/power.txt" 2>&1
OUT=$OUT bash scripts/gpu_ab.sh --tests | grep -E "rc=|test result"
for r in 1 2; do for v in old new; do
  echo "== $v, round $r" >> "$OUT/ab.log"
  B=./cuda_bench; R=./ringserve; [ $v = old ] && B=./cuda_bench_old && R=./ringserve_old
  $B decode $M 1,8,32,128 512 50 2>&1 | grep "^decode" >> "$OUT/ab.log"
  $R bench engine --model $M --device cuda --batch-sizes 1,128 --prompt-lens 512 --output-len 64 2>&1 \
    | grep -E "^\| [0-9]" >> "$OUT/ab.log"
done; done
cat "$OUT/ab.log"
for s in 30 100 300 1000; do
  STEPS=$s CLOCKS=1 DECODE=1 NO_ENGINE=1 BATCHES=128 OUT=/tmp/fixed$s bash scripts/gpu_ab.sh "CUDA_BENCH_FIXED_CTX=1" > /dev/null
  { echo "== $s steps at context 512"; grep "^decode" /tmp/fixed$s/ab.log; python3 scripts/clock_summary.py /tmp/fixed$s/clocks.csv /tmp/fixed$s/marks.log; } >> "$OUT/fixed.log"
done
cp /tmp/fixed1000/clocks.csv "$OUT/clocks_1000.csv"
cat "$OUT/fixed.log"
