#!/usr/bin/env bash
# Run 60 (2026-12-07): async scheduling on the GPU — the engine plans and launches the next step
# (decodes fed by this step's draws on the device, prompt chunks, admissions) while the GPU runs
# this one — and the INT4 kernel test run 58's final build still owed.
# .gpu60/a.tar.xz: ringserve, cuda_int4, cuda_backend (--features cuda, stripped), commit b046cbf's
# parent 7918265 (steps with prompt tokens planned ahead too); .gpu60/b.tar.xz: ringserve and
# cuda_backend of b046cbf (a step planned ahead only decodes).
#   a: cuda_backend async_scheduling_gives_the_synchronous_tokens; the random 8B bf16 model;
#      bench engine 1, 128, 256 x 512 (--peer-decode), --async-scheduling false / true
#      alternating, twice; serving (ringserve's bench serve, 128 clients, 512 -> 128, gRPC)
#      off / on twice; with the time left cuda_int4 int4_kernels
#   b: (b.tar.xz) the async test again; the bf16 serving A/B again; the engine and serving A/B
#      with --quantization fp8; bench engine A/B on the random 8B AWQ model
#   c: (not run: too little device time left) the async test again; open loop, Poisson 16 and
#      32 req/s, 300 requests of 512 -> 128: bf16 serving with --async-scheduling false / true
set -uo pipefail
cd "$(dirname "$0")/../../.."
M=/tmp/llama8b; R=/tmp/r60
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/a $R
[ -f /tmp/a/cuda_int4 ] || [ ! -f .gpu60/a.tar.xz ] || tar xJf .gpu60/a.tar.xz -C /tmp/a
[ ! -f .gpu60/b.tar.xz ] || tar xJf .gpu60/b.tar.xz -C /tmp/a
[ ! -f .gpu60/c.tar.xz ] || tar xJf .gpu60/c.tar.xz -C /tmp/a  # c.tar.xz: a build of main
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-60 FIXTURES_DIR=$PWD/tests/fixtures
export TINY_LLAMA_DIR=$PWD/tests/fixtures/tiny-llama
bench() {  # tag model batches [flags]: engine steps and vLLM's method
  local tag=$1 m=$2 n=$3; shift 3
  timeout 200 /tmp/a/ringserve bench engine --model $m --device cuda --batch-sizes $n --prompt-lens 512 \
    --output-len 65 --peer-decode "$@" 2>>$OUT/bench.err | grep -E "^\| [0-9]" | sed "s/^/$tag /" | tee -a $OUT/bench.txt
}
health() { python3 -c "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2).status == 200 else 1)" 2>/dev/null; }
LOAD="--num-requests 512 --concurrency 128"
serve() {  # tag [flags]: serve, load it ($LOAD: 512 requests from 128 clients), stop it
  local tag=$1; shift
  /tmp/a/ringserve serve --model $M --device cuda --max-model-len 2048 --enable-prefix-caching false \
    --addr 127.0.0.1:50062 --http-addr 127.0.0.1:8012 --metrics-addr 127.0.0.1:9092 "$@" \
    > $R/serve_$tag.out 2> $R/serve_$tag.log &
  local S=$! t=0
  until health 8012; do sleep 0.5; t=$((t + 1)); kill -0 $S 2>/dev/null && [ $t -lt 240 ] || { tail -5 $R/serve_$tag.log; kill $S; return 2; }; done
  timeout 120 /tmp/a/ringserve bench serve --addr http://127.0.0.1:50062 $LOAD \
    --input-len 512 --output-len 128 --quiet > $R/bench_$tag.txt 2>&1
  echo "serve $tag rc $?: $(grep -E 'output tok/s|TTFT|ITL' $R/bench_$tag.txt | tr -s ' ' | tr '\n' ';')" | tee -a $OUT/serve.txt
  cp $R/bench_$tag.txt $OUT/
  kill $S; wait $S 2>/dev/null; sleep 1
}
start() {  # call: the GPU, the async test while the model is made; stops the call if the test fails
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make.log 2>&1 ) &
  local mk=$!
  timeout 150 /tmp/a/cuda_backend --include-ignored --test-threads 1 --nocapture async_scheduling > $OUT/$1_async.log 2>&1
  local rc=$?; echo "cuda_backend async_scheduling rc $rc at ${SECONDS} s"; grep -E "^test |panicked|test result" $OUT/$1_async.log | tail -3
  [ $rc -eq 0 ] || exit 1
  wait $mk; echo "model ready at ${SECONDS} s"
}
case "$1" in
a)
  start a
  for r in 1 2; do
    bench off$r $M 1,128,256 --async-scheduling false
    bench on$r $M 1,128,256 --async-scheduling true
  done
  echo "benches done at ${SECONDS} s"
  for r in 1 2; do serve off$r --async-scheduling false; serve on$r --async-scheduling true; done
  left=$((540 - SECONDS)); echo "serving done at ${SECONDS} s; the INT4 kernel test gets ${left} s"
  [ $left -gt 30 ] && timeout $left /tmp/a/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/a_kernels.log 2>&1
  echo "cuda_int4 int4_kernels rc $? at ${SECONDS} s"; grep -E "^test |panicked|test result" $OUT/a_kernels.log | tail -3 ;;
b)
  A=/tmp/awq8b
  start b
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 ) &
  for r in 1 2; do serve off$r --async-scheduling false; serve on$r --async-scheduling true; done
  for r in 1 2; do
    bench fp8off$r $M 1,128,256 --quantization fp8 --async-scheduling false
    bench fp8on$r $M 1,128,256 --quantization fp8 --async-scheduling true
  done
  for r in 1 2; do
    serve fp8off$r --quantization fp8 --async-scheduling false
    serve fp8on$r --quantization fp8 --async-scheduling true
  done
  wait; echo "AWQ model ready at ${SECONDS} s"
  for r in 1 2; do
    [ $SECONDS -lt 470 ] || break
    bench awqoff$r $A 1,128,256 --async-scheduling false
    bench awqon$r $A 1,128,256 --async-scheduling true
  done ;;
c)
  start c
  for rate in 16 32; do
    LOAD="--num-requests 300 --request-rate $rate"
    serve r${rate}off --async-scheduling false; serve r${rate}on --async-scheduling true
  done ;;
esac
