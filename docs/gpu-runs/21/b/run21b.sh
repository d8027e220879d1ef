#!/usr/bin/env bash
# Run 21b: vLLM's own client, `vllm bench serve --backend openai` (random 512 in / 128 out, ignore
# EOS, 640 prompts at 128 clients, 8 at 1), against `ringserve serve`'s HTTP API, then against
# `vllm serve`, then ringserve again — same weights, same word-level tokenizer, same call.
set -uo pipefail
cd "$(dirname "$0")/.."
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-21
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b; TOK=/tmp/vllm_tok
(mkdir -p /tmp/vllm_parts; cp ../.vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$?"; tail -1 "$OUT/install.log"
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > "$OUT/make_model.log" 2>&1
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python3 peer/tokenizer/make_tokenizer.py $TOK --check || exit 1
cp $TOK/tokenizer.json $M/tokenizer.json
VLLM=(python3 -m vllm.entrypoints.cli.main)
bench() {  # port name concurrency num_prompts
  "${VLLM[@]}" bench serve --backend openai --base-url "http://127.0.0.1:$1" --model $M \
    --tokenizer $TOK --dataset-name random --random-input-len 512 --random-output-len 128 \
    --num-prompts "$4" --max-concurrency "$3" --ignore-eos --seed 0 --num-warmups 0 \
    --save-result --result-dir "$OUT" --result-filename "$2.json" --disable-tqdm > "$OUT/$2.log" 2>&1
  echo "== $2"; grep -E "Successful|duration|Output token throughput|Mean TTFT|Median TTFT|P99 TTFT|Mean TPOT|Median ITL|P99 ITL" "$OUT/$2.log"
}
health() { python3 -c "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2).status == 200 else 1)" 2>/dev/null; }
ringserve() {  # tag
  ./ringserve serve --model $M --device cuda --max-model-len 2048 --enable-prefix-caching false \
    --addr 127.0.0.1:50062 --http-addr 127.0.0.1:8012 --metrics-addr 127.0.0.1:9092 > "$OUT/serve_$1.out" 2> "$OUT/serve_$1.log" &
  local S=$! t0=$(date +%s)
  until health 8012; do sleep 0.5; kill -0 $S || { tail -20 "$OUT/serve_$1.log"; return 2; }; done
  echo "ringserve healthy after $(( $(date +%s) - t0 )) s"
  bench 8012 ringserve_${1}_c128 128 640
  bench 8012 ringserve_${1}_c1 1 8
  kill $S; wait $S
}
ringserve 1
"${VLLM[@]}" serve $M --tokenizer $TOK --dtype bfloat16 --max-model-len 2048 \
  --gpu-memory-utilization 0.85 --no-enable-prefix-caching --seed 0 \
  --host 127.0.0.1 --port 8011 > "$OUT/vllm_server.log" 2>&1 &
V=$!; t0=$(date +%s)
until health 8011; do sleep 2; kill -0 $V || { tail -30 "$OUT/vllm_server.log"; exit 2; }; [ $(( $(date +%s) - t0 )) -gt 300 ] && { echo "vllm not healthy"; kill $V; exit 2; }; done
echo "vllm healthy after $(( $(date +%s) - t0 )) s"
bench 8011 vllm_c128 128 640
bench 8011 vllm_c1 1 8
kill $V; sleep 5; kill -9 $V 2>/dev/null; wait $V 2>/dev/null
sleep 5
ringserve 2
