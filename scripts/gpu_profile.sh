#!/usr/bin/env bash
# ncu profiles of the attention kernels alone (decode at batch 128 x 512 context with the split size
# the backend picks, prefill 8 x 2048; case numbers index cuda_bench's ATTN_CASES), from the folder
# holding the carried binaries. Text reports go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats --section ComputeWorkloadAnalysis"
./cuda_bench attention 5 > "$OUT/ncu_decode.txt" 2>&1  # compiles the kernel cache, plain timing
ncu --clock-control none -k regex:attn_decode -s 1 -c 1 $SECTIONS ./cuda_bench attention 5 >> "$OUT/ncu_decode.txt" 2>&1
ncu --clock-control none -k regex:attn_prefill -s 1 -c 1 $SECTIONS ./cuda_bench attention 0 > "$OUT/ncu_prefill.txt" 2>&1
grep -E "Duration|Throughput|Achieved Occupancy|Registers|Stall|Theoretical Occupancy|Block Limit|One or More|Issue Slot|Bandwidth" "$OUT"/ncu_*.txt | head -80
