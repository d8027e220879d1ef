#!/usr/bin/env bash
# Run 22e (right after 22d, same machine): vLLM part 1 → install; `vllm serve` on the same weights
# (word-level tokenizer so random ids round-trip) under its own client, `vllm bench serve`, at the
# same rates; then ringserve's default sweep again, same call; the plot of both.
set -uo pipefail
cd "$(dirname "$0")/.."
D=$(basename "$(dirname "$0")")
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-22
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b; R=/tmp/r22; TOK=/tmp/vllm_tok; mkdir -p $R
[ -x $D/ringserve ] || tar xJf $D/bins.tar.xz -C $D
(mkdir -p /tmp/vllm_parts; cp .vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $D/peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$?"; tail -1 "$OUT/install.log"
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python3 $D/peer/tokenizer/make_tokenizer.py $TOK --check > "$OUT/tok.log" 2>&1 || { tail -5 "$OUT/tok.log"; exit 1; }
health() { python3 -c "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2).status == 200 else 1)" 2>/dev/null; }
VLLM=(python3 -m vllm.entrypoints.cli.main)
"${VLLM[@]}" serve $M --tokenizer $TOK --dtype bfloat16 --max-model-len 2048 \
  --gpu-memory-utilization 0.85 --seed 0 --host 127.0.0.1 --port 8011 > "$OUT/vllm_server.log" 2>&1 &
V=$!; t0=$(date +%s)
until health 8011; do sleep 2; kill -0 $V || { tail -30 "$OUT/vllm_server.log"; exit 2; }; [ $(( $(date +%s) - t0 )) -gt 300 ] && { echo "vllm not healthy"; kill $V; exit 2; }; done
echo "vllm healthy after $(( $(date +%s) - t0 )) s"
for rate in 16 32 48; do
  "${VLLM[@]}" bench serve --backend openai --base-url http://127.0.0.1:8011 --model $M --tokenizer $TOK \
    --dataset-name random --random-input-len 512 --random-output-len 128 --num-prompts 400 \
    --request-rate $rate --ignore-eos --seed 0 --num-warmups 0 --save-result --result-dir $R \
    --result-filename vllm_$rate.json --disable-tqdm > "$OUT/vllm_bench_$rate.log" 2>&1
  echo "== vllm $rate req/s"; grep -E "Output token throughput|Median TTFT|P99 TTFT|Median ITL|P99 ITL" "$OUT/vllm_bench_$rate.log"
done
kill $V; sleep 5; kill -9 $V 2>/dev/null; wait $V 2>/dev/null; sleep 3
$D/ringserve serve --model $M --device cuda --max-model-len 2048 --addr 127.0.0.1:50081 \
  --http-addr 127.0.0.1:8081 --metrics-addr 127.0.0.1:9081 > "$OUT/serve_again.out" 2> "$OUT/serve_again.log" &
S=$!
until health 8081; do sleep 0.5; kill -0 $S || { tail -5 "$OUT/serve_again.log"; exit 2; }; done
echo "== ringserve default, again"
$D/ringserve bench serve --addr 127.0.0.1:50081 --input-len 512 --output-len 128 --range-ratio 0 \
  --num-requests 400 --sweep 16,32,48 --result-file $R/ringserve_again.json --plot $R/ringserve_again.png --quiet 2>&1 | grep -vE "^\s*$" | head -40
kill $S; wait $S
$D/ringserve bench plot --ringserve $R/ringserve_again.json --vllm $R/vllm_16.json,$R/vllm_32.json,$R/vllm_48.json \
  --title "8B bf16, one H200, 512 in / 128 out, Poisson 16/32/48 req/s" --out $R/compare.png
cp $R/*.json $R/compare.png "$OUT/"
