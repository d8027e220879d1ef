#!/usr/bin/env bash
# Run 22f: is the 16 req/s tail a warm-up effect? One fresh `serve`, the sweep 16, 16, 48: lazily
# captured CUDA graphs (and cuBLASLt tuning) of each new batch bucket land in the first run.
set -uo pipefail
cd "$(dirname "$0")/.."
D=$(basename "$(dirname "$0")")
[ -x $D/ringserve ] || tar xJf $D/bins.tar.xz -C $D
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-22
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > "$OUT/make_model.log" 2>&1
cat $M/*.safetensors > /dev/null
health() { python3 -c "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2).status == 200 else 1)" 2>/dev/null; }
$D/ringserve serve --model $M --device cuda --max-model-len 2048 --addr 127.0.0.1:50081 \
  --http-addr 127.0.0.1:8081 --metrics-addr 127.0.0.1:9081 > "$OUT/serve_f.out" 2> "$OUT/serve_f.log" &
S=$!
until health 8081; do sleep 0.5; kill -0 $S || { tail -5 "$OUT/serve_f.log"; exit 2; }; done
$D/ringserve bench serve --addr 127.0.0.1:50081 --input-len 512 --output-len 128 --range-ratio 0 \
  --num-requests 400 --sweep 16,16,48 --result-file $OUT/ringserve_f.json --plot /tmp/f.png --quiet 2>&1 | grep -E "open loop|TTFT|ITL"
kill $S; wait $S
