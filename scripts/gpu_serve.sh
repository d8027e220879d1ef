#!/usr/bin/env bash
# The serving run on the GPU: the 8B-shaped model behind `ringserve serve --device cuda`, loaded by
# `ringserve bench serve` (128 clients, 512-token prompts; then one client), start-up time from launch
# to "worker 0 ready" with the kernel cache cold and warm, and (with --baseline) HuggingFace's
# baseline after the server is gone. Run from the folder holding the carried `ringserve` binary
# (`.gpu/`, see docs/benchmarks.md); logs and JSON go to $OUT.
# Then `bench engine` at batch 1 and 8 with cuBLAS only (RINGSERVE_CUDA_GEMV=0), the default (the
# GEMV kernel for q/k/v and o) and the GEMV kernel everywhere (=1) and, with the `cuda_kernels` test
# and `cuda_bench` binaries beside it, the GEMV kernel against the CPU and against cuBLAS alone.
# At most 8 files come back from $OUT: bench.log, serve.log, serve_warm.log, bench_c128.json,
# bench_c1.json, gemv.log, gemv.json, hf_baseline.json.
# --serve-only stops after the serving part (no GEMV checks); the model is written only if /tmp
# has none yet.
#   usage: scripts/gpu_serve.sh [--baseline] [--serve-only]
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BASELINE=0; SERVE_ONLY=0
for a in "$@"; do case $a in --baseline) BASELINE=1;; --serve-only) SERVE_ONLY=1;; esac; done
MODEL=/tmp/llama8b
ADDR=127.0.0.1:50051
LOG="$OUT/bench.log"
now() { date +%s.%N; }
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,driver_version --format=csv | tee "$LOG"
[ -f $MODEL/config.json ] || python3 scripts/make_random_llama8b.py $MODEL 2>&1 | tail -3 | tee -a "$LOG"
cat $MODEL/*.safetensors > /dev/null  # page cache warm, as the start-up goal assumes

# Starts the server (log: $1), waits for its worker, prints the seconds from launch to ready.
SERVER=
start_server() {
  local t0; t0=$(now)
  ./ringserve serve --model $MODEL --device cuda --addr $ADDR --metrics-addr 127.0.0.1:9090 \
    > "$1" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 2400); do
    if grep -q "worker 0 ready" "$1"; then
      echo "start-up ($2): $(awk "BEGIN{printf \"%.2f\", $(now) - $t0}") s from launch to 'worker 0 ready'" | tee -a "$LOG"
      return 0
    fi
    kill -0 $SERVER 2>/dev/null || { echo "server exited" | tee -a "$LOG"; tail -20 "$1"; return 1; }
    sleep 0.05
  done
  echo "server not ready after 2 min" | tee -a "$LOG"; return 1
}
stop_server() {
  kill -TERM $SERVER; wait $SERVER; echo "server stopped rc=$?" | tee -a "$LOG"
}

rm -rf $RINGSERVE_KERNEL_CACHE
if start_server "$OUT/serve.log" "kernel cache cold"; then
  echo "client (greedy, 8 tokens):" | tee -a "$LOG"
  ./ringserve client --addr $ADDR --token-ids "128000 791 4062 14198" --max-tokens 8 \
    --temperature 0 --print-ids 2>&1 | tee -a "$LOG"
  echo "== bench serve: 128 clients, 512 in / 128 out, 640 requests" | tee -a "$LOG"
  ./ringserve bench serve --addr $ADDR --concurrency 128 --num-requests 640 --input-len 512 \
    --output-len 128 --quiet --result-file "$OUT/bench_c128.json" 2>&1 | tee -a "$LOG"
  echo "== bench serve: 1 client, 512 in / 128 out, 8 requests" | tee -a "$LOG"
  ./ringserve bench serve --addr $ADDR --concurrency 1 --num-requests 8 --input-len 512 \
    --output-len 128 --quiet --seed 1 --result-file "$OUT/bench_c1.json" 2>&1 | tee -a "$LOG"
  stop_server
  # Warm start: page cache and kernel cache both warm.
  start_server "$OUT/serve_warm.log" "kernel cache warm" && stop_server
fi
if [ $SERVE_ONLY = 1 ]; then exit 0; fi
G="$OUT/gemv.log"; : > "$G"
if [ -x ./cuda_kernels ] && [ -x ./cuda_bench ]; then
  ./cuda_kernels --include-ignored --test-threads=1 gemv_and_gemm_match_cpu >> "$G" 2>&1
  echo "gemv test rc=$?" | tee -a "$G"
  ./cuda_bench gemv "$OUT/gemv.json" 2>&1 | tee -a "$G"
fi
# Correctness of the GEMV path end to end: greedy tokens with and without it (tiny-llama in f32
# must agree exactly; the 8B model in bf16 is reported, its random logits have near-ties).
printf '{"prompt_token_ids": [%s], "max_tokens": 32, "temperature": 0}\n' \
  "1, 450, 49" "1, 298, 13, 22, 100" "477" "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11" > /tmp/p.jsonl
for m in ../tiny-llama:float32 $MODEL:bfloat16; do
  for gemv in 0 default; do
    RINGSERVE_CUDA_GEMV=$gemv ./ringserve generate --model ${m%%:*} --device cuda --dtype ${m##*:} \
      --input /tmp/p.jsonl --output /tmp/g$gemv.jsonl --quiet >> "$G" 2>&1
  done
  if cmp -s /tmp/g0.jsonl /tmp/gdefault.jsonl; then r=identical; else r=DIFFERENT; fi
  echo "greedy 4x32 tokens ${m}: cuBLAS only vs default (GEMV for q/k/v and o) $r" | tee -a "$G"
  head -c 400 /tmp/g0.jsonl >> "$G"; head -c 400 /tmp/gdefault.jsonl >> "$G"
done
for gemv in 0 default 1; do
  echo "== bench engine, RINGSERVE_CUDA_GEMV=$gemv" | tee -a "$G"
  RINGSERVE_CUDA_GEMV=$gemv ./ringserve bench engine --model $MODEL --device cuda \
    --batch-sizes 1,8 --prompt-lens 128 --output-len 128 2>&1 | tee -a "$G"
done
if [ $BASELINE = 1 ]; then
  python3 scripts/hf_baseline.py --cases 1x128x128,128x512x64 2>&1 | tail -3
fi
