#!/usr/bin/env bash
# Run 21a: stash vLLM part 0; write the random 8B model; ringserve's own load generator through
# gRPC and through the OpenAI HTTP API against one `serve --device cuda` (token-id prompts).
set -uo pipefail
cd "$(dirname "$0")/.."
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-21
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
(mkdir -p /tmp/vllm_parts; cp ../.vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$?"
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > "$OUT/make_model.log" 2>&1
cat $M/*.safetensors > /dev/null
./ringserve serve --model $M --device cuda --max-model-len 2048 --enable-prefix-caching false \
  --addr 127.0.0.1:50061 --http-addr 127.0.0.1:8012 --metrics-addr 127.0.0.1:9091 > "$OUT/serve_a.out" 2> "$OUT/serve_a.log" &
S=$!
t0=$(date +%s); until grep -q "ready" "$OUT/serve_a.out"; do sleep 0.5; kill -0 $S || { tail -20 "$OUT/serve_a.log"; exit 2; }; done
echo "ringserve ready after $(( $(date +%s) - t0 )) s"
B=(./ringserve bench serve --addr http://127.0.0.1:50061 --input-len 512 --output-len 128 --range-ratio 0 --quiet)
for round in 1 2; do
  for api in grpc http; do
    extra=(); [ $api = http ] && extra=(--openai-addr 127.0.0.1:8012)
    echo "== $api c128 round $round"; "${B[@]}" --concurrency 128 --num-requests 640 "${extra[@]}"
    echo "== $api c1 round $round"; "${B[@]}" --concurrency 1 --num-requests 8 "${extra[@]}"
  done
done 2>&1 | tee "$OUT/bench_a.log"
kill $S; wait $S
