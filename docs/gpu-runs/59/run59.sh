#!/usr/bin/env bash
# Run 59 (2026-12-07): async scheduling — the engine plans and launches the next decode step
# while the GPU runs this one, its input tokens this step's draws copied on the device — and the
# INT4 kernel test run 58's final build still owed.
# .gpu59/a.tar.xz: ringserve, cuda_int4, cuda_backend of the build with async scheduling
# (--features cuda, stripped).
#   a: cuda_backend async_scheduling_gives_the_synchronous_tokens; the random 8B bf16 model;
#      bench engine 1, 128, 256 x 512 (--peer-decode) with --async-scheduling false / true
#      alternating, twice; with the time left cuda_int4 int4_kernels (every wgmma kernel at odd
#      shapes, split and unsplit)
#   b: the same model with --quantization fp8, and the random 8B AWQ model, 1, 128, 256 x 512
#      with --async-scheduling false / true alternating, twice
set -uo pipefail
cd "$(dirname "$0")/../../.."
M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/a
[ -f /tmp/a/cuda_int4 ] || [ ! -f .gpu59/a.tar.xz ] || tar xJf .gpu59/a.tar.xz -C /tmp/a
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-59 FIXTURES_DIR=$PWD/tests/fixtures
export TINY_LLAMA_DIR=$PWD/tests/fixtures/tiny-llama
bench() {  # tag model batches [flags]: engine steps and vLLM's method
  local tag=$1 m=$2 n=$3; shift 3
  timeout 200 /tmp/a/ringserve bench engine --model $m --device cuda --batch-sizes $n --prompt-lens 512 \
    --output-len 65 --peer-decode "$@" 2>>$OUT/bench.err | grep -E "^\| [0-9]" | sed "s/^/$tag /" | tee -a $OUT/bench.txt
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make.log 2>&1 ) &
  MK=$!
  timeout 150 /tmp/a/cuda_backend --include-ignored --test-threads 1 --nocapture async_scheduling > $OUT/a_async.log 2>&1
  rc=$?; echo "cuda_backend async_scheduling rc $rc at ${SECONDS} s"; grep -E "^test |panicked|test result" $OUT/a_async.log | tail -3
  [ $rc -eq 0 ] || exit 1
  wait $MK; echo "model ready at ${SECONDS} s"
  for r in 1 2; do
    bench off$r $M 1,128,256 --async-scheduling false
    bench on$r $M 1,128,256 --async-scheduling true
  done
  left=$((480 - SECONDS)); echo "benches done at ${SECONDS} s; the INT4 kernel test gets ${left} s"
  timeout $left /tmp/a/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/a_kernels.log 2>&1
  echo "cuda_int4 int4_kernels rc $? at ${SECONDS} s"; grep -E "^test |panicked|test result" $OUT/a_kernels.log | tail -3 ;;
b)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  A=/tmp/awq8b
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make.log 2>&1
  for r in 1 2; do
    bench fp8off$r $M 1,128,256 --quantization fp8 --async-scheduling false
    bench fp8on$r $M 1,128,256 --quantization fp8 --async-scheduling true
  done
  echo "fp8 done at ${SECONDS} s"
  [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
  echo "AWQ model ready at ${SECONDS} s"
  for r in 1 2; do
    bench awqoff$r $A 1,128,256 --async-scheduling false
    bench awqon$r $A 1,128,256 --async-scheduling true
  done ;;
esac
