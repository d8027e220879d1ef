#!/usr/bin/env bash
# Run 22d: stash vLLM part 0; open-loop serving with ringserve's own client: Poisson arrivals,
# 400 requests of 512 in / 128 out at 16, 32 and 48 req/s, against `serve` as it is and with
# --max-prefill-tokens-while-decoding 2048.
set -uo pipefail
cd "$(dirname "$0")/.."
D=$(basename "$(dirname "$0")")
tar xJf $D/bins.tar.xz -C $D
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-22
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b; R=/tmp/r22; mkdir -p $R
(mkdir -p /tmp/vllm_parts; cp .vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $D/peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$? (3: part 1 still to come)"
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > "$OUT/make_model.log" 2>&1
cat $M/*.safetensors > /dev/null
health() { python3 -c "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2).status == 200 else 1)" 2>/dev/null; }
sweep() {  # tag, extra serve flags...
  local tag=$1; shift
  $D/ringserve serve --model $M --device cuda --max-model-len 2048 "$@" --addr 127.0.0.1:50081 \
    --http-addr 127.0.0.1:8081 --metrics-addr 127.0.0.1:9081 > "$OUT/serve_$tag.out" 2> "$OUT/serve_$tag.log" &
  local S=$!
  until health 8081; do sleep 0.5; kill -0 $S || { tail -5 "$OUT/serve_$tag.log"; return 2; }; done
  echo "== ringserve $tag $*"
  $D/ringserve bench serve --addr 127.0.0.1:50081 --input-len 512 --output-len 128 --range-ratio 0 \
    --num-requests 400 --sweep 16,32,48 --result-file $R/ringserve_$tag.json --plot $R/ringserve_$tag.png --quiet 2>&1 \
    | grep -vE "^\s*$" | head -40
  kill $S; wait $S
}
sweep default
sweep cap2048 --max-prefill-tokens-while-decoding 2048
cp $R/ringserve_*.json "$OUT/"
