#!/usr/bin/env bash
# Run 41, call g (carry .gpu41: cuda_bench built with the FP8 tile GEMV picked by size, stripped):
# where an FP8 batch-1 decode step's time goes: `cuda_bench decode` ms/step, then ncu's time of every
# kernel node of the step's graph (replayed alone) summed per kernel (scripts/timeline_summary.py).
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b41g; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B && tar xJf .gpu41/bins.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-41
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
cat $M/*.safetensors > /dev/null
for b in 1 8; do
  timeout 120 $B/cuda_bench decode $M $b 512 30 --quantization=fp8 2>&1 | grep -v INFO | tail -3 | tee -a $OUT/timeline.txt
done
timeout 300 ncu --graph-profiling node --cache-control none --clock-control none --csv \
  --metrics gpu__time_duration.sum -s 1200 -c 1100 \
  $B/cuda_bench decode $M 1 512 8 --quantization=fp8 > $OUT/ncu_1.csv 2> $OUT/ncu_1.err
echo "ncu rc=$?"
python3 scripts/timeline_summary.py --ncu $OUT/ncu_1.csv "fp8 batch 1" | tee -a $OUT/timeline.txt
tail -3 $OUT/ncu_1.err
