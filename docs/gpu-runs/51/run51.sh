#!/usr/bin/env bash
# Run 51: the scaled INT4 tensor-core product (gemm_int4_mmas_*: operands q - z, scales on each
# step's f32 sums, weights and scales through the shared-memory ring with the activations) against
# the dequantizing one (gemm_int4_mma_*) and dequantization + cuBLAS; issue 20's batch-128 decode.
# .gpu51/<call>.tar.xz: ringserve, cuda_bench and cuda_int4 of that call's build (--features cuda,
# stripped).
#   a: cuda_int4 (every kernel at odd shapes against the f64 product, the scaled family among
#      them; the fixtures through the CUDA backend, scaled on and off); the random 8B AWQ and bf16
#      models; cuda_bench int4 at 64, 128, 256 rows (all eight tensor-core kernels); bench engine
#      AWQ at 64, 128 x 512 with RINGSERVE_CUDA_INT4_MMA_SCALED 1 / 0 / 1 / 0 and
#      RINGSERVE_CUDA_INT4_MMA=0 (dequantization + cuBLAS), bf16 at 128 x 512
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b51; A=/tmp/awq8b; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -f .gpu51/$1.tar.xz ] && tar xJf .gpu51/$1.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-51 FIXTURES_DIR=$PWD/tests/fixtures
engine() {  # tag model batches [flags]
  local tag=$1 m=$2 b=$3; shift 3
  timeout 200 $B/ringserve bench engine --model $m --device cuda --batch-sizes $b --prompt-lens 512 \
    --output-len 64 "$@" 2>>$OUT/bench.err | grep -E "^\| [0-9]" | sed "s/^/$tag /" | tee -a $OUT/bench.txt
}
ncu_one() {  # shape rows kernel
  local S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section InstructionStats --section SchedulerStats --section ComputeWorkloadAnalysis"
  timeout 120 ncu --clock-control none -k regex:gemm_int4_mma -s 1 -c 1 $S $B/cuda_bench int4one $1 $2 $3 >> $OUT/$4_ncu.txt 2>&1
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
    [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  MK=$!
  timeout 240 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture > $OUT/a_int4.log 2>&1
  echo "cuda_int4 rc $?"; grep -E "^test |panicked|test result" $OUT/a_int4.log | tail -5
  grep -E "int4-awq .*prompt of 100" $OUT/a_int4.log | head -5
  timeout 150 $B/cuda_bench int4 $OUT/a_int4_alone.json 64,128,256 2>&1 | grep -E "^int4" > $OUT/a_int4_alone.txt
  sed -E 's/, (per-weight|tiles)[^,]*//g; s/gemm_int4_//g' $OUT/a_int4_alone.txt | grep -E "m(64|128|256)" | cut -c1-600
  wait $MK; tail -1 $OUT/make_awq.log; tail -1 $OUT/make_model.log
  for x in 1 0 1 0; do RINGSERVE_CUDA_INT4_MMA_SCALED=$x engine scaled$x $A 64,128; done
  RINGSERVE_CUDA_INT4_MMA=0 engine dequant $A 64,128
  engine bf16 $M 128
  ncu_one gate_up 128 gemm_int4_mmas_t2w4 a; ncu_one down 128 gemm_int4_mmas_t1w4 a
  grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Instructions  " $OUT/a_ncu.txt | head -24 ;;
esac
