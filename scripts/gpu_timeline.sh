#!/usr/bin/env bash
# Kernel timeline of decode steps on the 8B-shaped model: `nsys` traces `cuda_bench decode` (CUDA
# graph nodes traced one by one) at each batch of BATCHES, context CTX, and `timeline_summary.py`
# reports, per step, the kernels' summed time against the step's span (the rest is gaps) and each
# kernel's mean duration. Falls back to ncu (kernels replayed alone) where nsys is missing. Run from
# the folder holding the carried binaries; reports go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODEL=/tmp/llama8b
[ -d $MODEL ] || python3 scripts/make_random_llama8b.py $MODEL > /tmp/make_model.log 2>&1
cat $MODEL/*.safetensors > /dev/null
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}" | tee "$OUT/timeline.txt"
for b in ${BATCHES:-1 128}; do
  ./cuda_bench decode $MODEL $b ${CTX:-512} 30 | tee -a "$OUT/timeline.txt"
  if [ -n "$NSYS" ]; then
    $NSYS profile -t cuda --cuda-graph-trace=node -o /tmp/tl_$b -f true \
      ./cuda_bench decode $MODEL $b ${CTX:-512} 30 > /tmp/nsys_$b.log 2>&1
    $NSYS stats -r cuda_gpu_trace -f csv -o /tmp/tl_$b /tmp/tl_$b.nsys-rep > /dev/null 2>&1
    python3 scripts/timeline_summary.py /tmp/tl_${b}_cuda_gpu_trace.csv "batch $b" | tee -a "$OUT/timeline.txt"
  else
    # ncu: every kernel node of the graph replays after the warm-up steps timed alone (no gaps);
    # 1,100 kernels hold two whole steps at batch 1 (about 355 kernels a step).
    K=$(( ${SKIP_KERNELS:-1200} ))
    ncu --graph-profiling node --cache-control none --clock-control none --csv \
      --metrics gpu__time_duration.sum -s $K -c ${COUNT_KERNELS:-1100} \
      ./cuda_bench decode $MODEL $b ${CTX:-512} 8 > /tmp/ncu_$b.csv 2> /tmp/ncu_$b.err
    python3 scripts/timeline_summary.py --ncu /tmp/ncu_$b.csv "batch $b" | tee -a "$OUT/timeline.txt"
    tail -3 /tmp/ncu_$b.err
  fi
done
