#!/usr/bin/env bash
# Run 55 (2026-12-07; call c ran, a and b did not — see README.md): the wgmma INT4 product with its k-steps rotated by
# block (gemm_int4_wgmma_p3r / p4r: the blocks of a product read different k-steps of x at any one
# time, not all the same 16 KiB from the same L2 slices), and where p3's warps stall (ncu's warp
# stall sampling).
# Also: the INT4 tile GEMV as a programmatic dependent (its first codes and scales loaded before
# its wait) in one-sequence decode graphs.
# .gpu55/a.tar.xz: ringserve, cuda_bench, cuda_int4 of the build (--features cuda, stripped).
#   a: cuda_bench int4 at 128 rows (every product alone, every kernel); bench engine on the random
#      8B AWQ model at 128 x 512 with RINGSERVE_CUDA_INT4_WGMMA p3 / p3r / p4r / p3_w1 / p3 /
#      p3_w1 (p3_w1: one warpgroup a block, four blocks an SM); ncu of p3 and p3_w1 on gate/up at
#      128 rows with the warp-state and source-counter sections (stall reasons)
#   b: the INT4 tests (every kernel at odd shapes, p3r / p4r among them; the PDL token test);
#      batch-1 decode of the 8B AWQ model with RINGSERVE_CUDA_PDL 0 / 1 alternating (cuda_bench
#      decode, three rounds; bench engine, one)
#   c: a and b in one call, most wanted first (for a session with one lease): the PDL token test;
#      batch-1 decode PDL 0 / 1, two rounds; bench engine 128 x 512 with p3 / p3_w1 / p3r / p3 /
#      p3_w1; the INT4 kernel test with the time left
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b55; A=/tmp/awq8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -f .gpu55/a.tar.xz ] && [ ! -f $B/cuda_int4 ] && tar xJf .gpu55/a.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-55 FIXTURES_DIR=$PWD/tests/fixtures
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
  wait $MK
  for x in p3 p3r p4r p3_w1 p3 p3_w1; do RINGSERVE_CUDA_INT4_WGMMA=$x engine w_$x $A 128; done
  echo "ncu: ${NCU:-none}"
  S="--section SpeedOfLight --section WarpStateStats --section SourceCounters --section SchedulerStats"
  for kern in gemm_int4_wgmma_p3 gemm_int4_wgmma_p3_w1; do
    echo "=== ncu gate_up 128 $kern" >> $OUT/a_ncu.txt
    [ -n "$NCU" ] && timeout 60 $NCU --clock-control none -k regex:$kern -s 1 -c 1 $S $B/cuda_bench int4one gate_up 128 $kern >> $OUT/a_ncu.txt 2>&1
  done
  grep -vE "^\s*$|^==PROF==|----" $OUT/a_ncu.txt | grep -iE "===|Duration|Throughput|stall|Eligible|Issue" | cut -c1-120 | head -60 ;;
b)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 ) &
  MK=$!
  timeout 280 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture > $OUT/b_int4.log 2>&1
  echo "cuda_int4 rc $?"; grep -E "^test |panicked|test result" $OUT/b_int4.log | tail -8
  grep -E "prompt of .*: \[" $OUT/b_int4.log | cut -c1-100 | head -6
  wait $MK
  for r in 1 2 3; do for pdl in 0 1; do
    RINGSERVE_CUDA_PDL=$pdl timeout 100 $B/cuda_bench decode $A 1 512 40 2>&1 | grep 'decode batch' | sed "s/^/pdl=$pdl /" | tee -a $OUT/b_decode.txt
  done; done
  for pdl in 0 1; do RINGSERVE_CUDA_PDL=$pdl engine pdl$pdl $A 1; done ;;
c)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 ) &
  MK=$!
  timeout 90 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture pdl > $OUT/c_pdl.log 2>&1
  echo "cuda_int4 pdl rc $?"; grep -E "^test |panicked|test result|prompt of" $OUT/c_pdl.log | cut -c1-110 | tail -9
  wait $MK; echo "model ready at ${SECONDS} s"
  for r in 1 2; do for pdl in 0 1; do
    RINGSERVE_CUDA_PDL=$pdl timeout 100 $B/cuda_bench decode $A 1 512 40 2>&1 | grep 'decode batch' | sed "s/^/pdl=$pdl /" | tee -a $OUT/c_decode.txt
  done; done
  echo "decode done at ${SECONDS} s"
  for x in p3 p3_w1 p3r p3 p3_w1; do RINGSERVE_CUDA_INT4_WGMMA=$x engine w_$x $A 128; done
  left=$((575 - SECONDS)); echo "engine done at ${SECONDS} s; kernel test gets ${left} s"
  [ $left -gt 30 ] && timeout $left $B/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/c_int4.log 2>&1
  echo "cuda_int4 int4_kernels rc $?"; grep -E "^test |panicked|test result" $OUT/c_int4.log | tail -3 ;;
esac
