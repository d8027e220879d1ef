#!/usr/bin/env bash
# Run 40, call b (carry .gpu40, the same build as call a): ncu of one decode-attention launch in a
# full 64 x 3,900 decode step, the FP8 cache's kernel and the bf16 cache's, to see what holds the
# FP8 kernel below the bf16 one's bandwidth. Arguments: the cache dtypes (default: fp8 auto);
# call c ran `run40.sh` then `run40b.sh fp8` on the next build.
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b40; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B && tar xJf .gpu40/bins.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-40
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats"
# Decode launches of full-batch steps: 64 prompts of 3,900 prefill in ~31 steps (≤ 32 decode
# launches each), then 39 full decode steps of 32 launches; skip 1,500.
for kv in ${@:-fp8 auto}; do
  timeout 280 ncu --clock-control none -k regex:attn_decode_mma -s 1500 -c 1 $SECTIONS \
    $B/ringserve bench engine --model $M --device cuda --kv-cache-dtype $kv --max-model-len 4096 \
    --batch-sizes 64 --prompt-lens 3900 --output-len 41 --no-warmup > $OUT/ncu_$kv.txt 2>&1
  echo "ncu $kv rc=$?"
  grep -E "attn_decode|Block Limit Shared|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Stall|Warp Cycles Per Issued|No Eligible|Eligible Warps|Theoretical Occ|L1/TEX Hit|L2 Hit|Grid Size" $OUT/ncu_$kv.txt | head -40
done
