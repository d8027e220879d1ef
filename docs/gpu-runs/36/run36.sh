#!/usr/bin/env bash
# Run 36: the INT4 tensor-core product for batches past the GEMVs (gemm_int4_mma). Calls on one
# warm H200, each carrying .gpu36 (bins.tar.xz: ringserve, cuda_bench and the cuda_int4 test
# built with --features cuda, stripped):
#   bash docs/gpu-runs/36/run36.sh a   # kernel and model tests; the products alone; bench engine on
#                                      # the random 8B AWQ checkpoint, the product on and off
#   b, c, e: the kernel test and the products alone after each change (c, e: every variant)
#   d: ncu of two variants at 128 rows; f: the final build, every INT4 test, the TP tests on
#   one GPU (INT4 and FP8 shards through host collectives) and bench engine
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b36; A=/tmp/awq8b; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -x $B/ringserve ] || tar xJf .gpu36/bins.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-36 FIXTURES_DIR=$PWD/tests/fixtures
engine() {  # tag model batches, env...
  local tag=$1 model=$2 batches=$3; shift 3
  echo "== bench engine $tag ($*)" | tee -a $OUT/bench.txt
  env "$@" timeout 200 $B/ringserve bench engine --model $model --device cuda \
    --batch-sizes $batches --prompt-lens 512 --output-len 64 2>>$OUT/bench.err | tee -a $OUT/bench.txt
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/run.log 2>&1
  [ -f $A/config.json ] || (time python3 scripts/make_random_awq8b.py $A) > $OUT/make_awq.log 2>&1 &
  echo "== cuda_int4" >> $OUT/run.log
  timeout 240 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture > $OUT/cuda_int4.log 2>&1
  echo "cuda_int4 rc $?" | tee -a $OUT/run.log
  grep -E "^test |panicked|prompt of" $OUT/cuda_int4.log | tail -60 >> $OUT/run.log
  echo "== cuda_bench int4" >> $OUT/run.log
  timeout 200 $B/cuda_bench int4 $OUT/int4_alone.json 2>&1 | grep -v "^\[" | tee -a $OUT/run.log > /dev/null
  wait
  tail -3 $OUT/make_awq.log >> $OUT/run.log
  engine mma-on $A 32,64,128,256
  engine mma-off $A 64,128,256 RINGSERVE_CUDA_INT4_MMA=0
  ;;
b)  # the kernel test, the products alone, bench engine at 64-256 rows
  timeout 200 $B/cuda_int4 --include-ignored --test-threads 1 int4_kernels > $OUT/cuda_int4.log 2>&1
  echo "cuda_int4 kernels rc $?" | tee -a $OUT/run.log
  grep -E "^test |panicked" $OUT/cuda_int4.log | tail -5 >> $OUT/run.log
  timeout 200 $B/cuda_bench int4 $OUT/int4_alone.json 2>&1 | grep -E "m(32|64|128|256):" | tee -a $OUT/run.log > /dev/null
  [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
  engine mma-on $A 64,128,256
  ;;
c)  # the kernel test with the four tensor-core variants, the products alone
  timeout 240 $B/cuda_int4 --include-ignored --test-threads 1 int4_kernels > $OUT/cuda_int4.log 2>&1
  echo "cuda_int4 kernels rc $?" | tee -a $OUT/run.log
  grep -E "^test |panicked" $OUT/cuda_int4.log | tail -5 >> $OUT/run.log
  timeout 300 $B/cuda_bench int4 $OUT/int4_alone.json 2>&1 | grep -E "m(32|64|128|256):" | tee -a $OUT/run.log > /dev/null
  ;;
d)  # ncu of the tensor-core product at 128 rows (gate_up on t2w4, down on t1w4)
  S="--section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats"
  $B/cuda_bench int4one gate_up 128 gemm_int4_mma_t2w4 > $OUT/ncu.txt 2>&1
  ncu --clock-control none -k regex:gemm_int4_mma -s 1 -c 1 $S $B/cuda_bench int4one gate_up 128 gemm_int4_mma_t2w4 >> $OUT/ncu.txt 2>&1
  ncu --clock-control none -k regex:gemm_int4_mma -s 1 -c 1 $S $B/cuda_bench int4one down 128 gemm_int4_mma_t1w4 >> $OUT/ncu.txt 2>&1
  grep -vE "^\s*$|^==PROF==|----" $OUT/ncu.txt | head -300
  ;;
e)  # the kernel test (six tensor-core variants), the products alone, bench engine 64 and 128
  timeout 240 $B/cuda_int4 --include-ignored --test-threads 1 int4_kernels > $OUT/cuda_int4.log 2>&1
  echo "cuda_int4 kernels rc $?" | tee -a $OUT/run.log
  grep -E "^test |panicked" $OUT/cuda_int4.log | tail -5 >> $OUT/run.log
  [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 &
  timeout 300 $B/cuda_bench int4 $OUT/int4_alone.json 2>&1 | grep -E "m(64|128|256):" | sed 's/gemm_int4_mma_//g' | tee -a $OUT/run.log > /dev/null
  wait
  engine default $A 64,128
  ;;
f)  # the final build: every INT4 CUDA test, cuda_tp's host-collective tests; bench engine with the product and without
  [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 &
  timeout 300 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture > $OUT/cuda_int4.log 2>&1
  echo "cuda_int4 rc $?" | tee -a $OUT/run.log
  grep -E "^test |panicked|test result" $OUT/cuda_int4.log | tail -8 >> $OUT/run.log
  timeout 200 $B/cuda_tp --include-ignored --test-threads 1 host_collectives_ > $OUT/cuda_tp.log 2>&1
  echo "cuda_tp rc $?" | tee -a $OUT/run.log
  grep -E "^test |panicked|test result|TP=2 vs TP=1|greedy tokens" $OUT/cuda_tp.log | tail -24 >> $OUT/run.log
  wait
  engine default $A 32,48,64,128
  engine mma-off $A 48,64 RINGSERVE_CUDA_INT4_MMA=0
  ;;
esac
