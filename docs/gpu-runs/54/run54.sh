#!/usr/bin/env bash
# Run 54: where the wgmma INT4 product's time goes at 128 rows, codes prefetched further ahead
# than activations (gemm_int4_wgmma_p3c6 / p3c8 / p4c8), the splits of a tile added up through
# distributed shared memory (p3d, p3c6d), and session 54's unrun checks.
# .gpu54/a.tar.xz: ringserve, cuda_bench, cuda_int4 of the build (--features cuda, stripped) of
# commit 6f720cf: its p3c6 / p3c8 / p4c8 / p3d / p3c6d kernels were reverted after this run, so
# build that commit to run these calls again.
#   a: cuda_bench int4 at 128 rows (every product alone, every kernel); the INT4 kernel test
#      (every kernel at odd shapes); bench engine on the random 8B AWQ model at 128 x 512 with
#      RINGSERVE_CUDA_INT4_WGMMA p3 / p3d / p3c6d / p3 / p3d; ncu of gemm_int4_wgmma_p3 on
#      gate/up and p3d on o at 128 rows
#   b: (same machine) the INT4 model test (the default p3 in eager mode and in graphs)
#   c: (same machine) the GGUF Q4 layer test, then the INT4 kernel test again with time to finish
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b54; A=/tmp/awq8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -f .gpu54/a.tar.xz ] && [ ! -f $B/cuda_int4 ] && tar xJf .gpu54/a.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-54 FIXTURES_DIR=$PWD/tests/fixtures
NCU=$(ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
engine() {  # tag model batches [flags]
  local tag=$1 m=$2 b=$3; shift 3
  timeout 200 $B/ringserve bench engine --model $m --device cuda --batch-sizes $b --prompt-lens 512 \
    --output-len 64 "$@" 2>>$OUT/bench.err | grep -E "^\| [0-9]" | sed "s/^/$tag /" | tee -a $OUT/bench.txt
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 ) &
  MK=$!
  timeout 150 $B/cuda_bench int4 $OUT/a_int4_alone.json 128 2>&1 | grep -E "^int4|rror" > $OUT/a_int4_alone.txt
  sed -E 's/, (per-weight|tiles|mma_)[^,]*//g; s/gemm_int4_//g; s/ \([0-9]+ TFLOP\/s\)//g' $OUT/a_int4_alone.txt | cut -c1-800
  timeout 170 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/a_int4.log 2>&1
  echo "cuda_int4 int4_kernels rc $?"; grep -E "^test |panicked|test result" $OUT/a_int4.log | tail -3
  wait $MK
  for x in p3 p3d p3c6d p3 p3d; do RINGSERVE_CUDA_INT4_WGMMA=$x engine w_$x $A 128; done
  echo "ncu: ${NCU:-none}"
  S="--section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats"
  for sk in "gate_up gemm_int4_wgmma_p3" "o gemm_int4_wgmma_p3d"; do
    set -- $sk
    echo "=== ncu $1 128 $2" >> $OUT/a_ncu.txt
    [ -n "$NCU" ] && timeout 45 $NCU --clock-control none -k regex:$2 -s 1 -c 1 $S $B/cuda_bench int4one $1 128 $2 >> $OUT/a_ncu.txt 2>&1
  done
  grep -vE "^\s*$|^==PROF==|----" $OUT/a_ncu.txt | grep -E "===|Throughput|Pipe|Stall|Issue|Eligible|Active Warps|Duration|Bank|Hit Rate|Warp Cycles|Executed Ipc|Occupancy" | cut -c1-110 | head -70 ;;
b)
  timeout 270 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_models > $OUT/b_models.log 2>&1
  echo "cuda_int4 int4_models rc $?"; grep -E "^test |panicked|test result|rel" $OUT/b_models.log | tail -30 ;;
c)
  timeout 25 $B/cuda_int4 --include-ignored --test-threads 1 gguf > $OUT/c_gguf.log 2>&1
  echo "gguf rc $?"; grep -E "test result" $OUT/c_gguf.log
  timeout 255 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/c_int4.log 2>&1
  echo "cuda_int4 int4_kernels rc $?"; grep -E "^test |panicked|test result" $OUT/c_int4.log | tail -3 ;;
esac
