#!/usr/bin/env bash
# Run 35: closed-loop serving with prefill chunks capped while streams decode, through vLLM's own
# client beside vLLM 0.26 (bf16 and FP8), and FP8 logits beside vLLM's FP8. Calls on one warm H200,
# each carrying .gpu35 (bins.tar.xz: ringserve and cuda_bench built with --features cuda, stripped;
# peer/: ../shared/peers/vllm without its parts) and one part of vLLM as .peer-vllm/carry/…:
#   bash docs/gpu-runs/35/run35.sh a                                 # + part00: the 8B model; ringserve's own client, caps A/B
#   bash docs/gpu-runs/35/run35.sh i; bash docs/gpu-runs/35/run35.sh c # + part01: vLLM installed; vllm bench serve, --quantization fp8 on both
#   bash docs/gpu-runs/35/run35.sh d                                 # FP8 logits (weights; KV cache) against HF float32, beside vLLM's
#   bash docs/gpu-runs/35/run35.sh e                                 # open loop 16/32/48 req/s through vllm bench serve, bf16, both
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b35; M=/tmp/llama8b; TOK=/tmp/vllm_tok; P=.gpu35/peer; R=/tmp/r35
mkdir -p $B $R; [ -x $B/ringserve ] || tar xJf .gpu35/bins.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-35 PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
install_vllm() {
  (mkdir -p /tmp/vllm_parts; cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $P/install.sh) > "$OUT/install_$1.log" 2>&1
  echo "vllm install rc=$? ($(tail -1 "$OUT/install_$1.log"))"
}
health() { python3 -c "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2).status == 200 else 1)" 2>/dev/null; }
VLLM=(env PYTHONPATH=/tmp/site python3 -m vllm.entrypoints.cli.main)
S=
serve_up() {  # tag, flags...
  local tag=$1; shift
  $B/ringserve serve --model $M --device cuda --max-model-len 2048 --enable-prefix-caching false \
    --addr 127.0.0.1:50062 --http-addr 127.0.0.1:8012 --metrics-addr 127.0.0.1:9092 "$@" > "$OUT/serve_$tag.out" 2> "$R/serve_$tag.log" &
  S=$!; local t0=$(date +%s)
  until health 8012; do sleep 0.5; kill -0 $S 2>/dev/null || { tail -20 "$R/serve_$tag.log"; return 2; }; done
  echo "ringserve $tag ($*) healthy after $(( $(date +%s) - t0 )) s"
}
serve_down() { kill $S; wait $S 2>/dev/null; sleep 1; }
own_bench() {  # tag, bench flags...
  local tag=$1; shift
  timeout 200 $B/ringserve bench serve --addr 127.0.0.1:50062 --openai-addr 127.0.0.1:8012 --input-len 512 --output-len 128 \
    --quiet --result-file $R/own_$tag.json "$@" > $R/own_$tag.txt 2>&1
  echo "== own client, $tag: $*"; grep -vE "^\s*$" $R/own_$tag.txt | head -24
}
vllm_bench() {  # port name concurrency num_prompts
  "${VLLM[@]}" bench serve --backend openai --base-url "http://127.0.0.1:$1" --model $M \
    --tokenizer $TOK --dataset-name random --random-input-len 512 --random-output-len 128 \
    --num-prompts "$4" --max-concurrency "$3" --ignore-eos --seed 0 --num-warmups 0 \
    --save-result --result-dir "$R" --result-filename "$2.json" --disable-tqdm > "$R/$2.log" 2>&1
  echo "== vllm bench serve, $2"; grep -E "Successful|duration|Output token throughput|Mean TTFT|Median TTFT|P99 TTFT|Mean TPOT|Median ITL|P99 ITL" "$R/$2.log"
}
vllm_up() {  # extra flags...
  "${VLLM[@]}" serve $M --tokenizer $TOK --dtype bfloat16 --max-model-len 2048 \
    --gpu-memory-utilization 0.85 --no-enable-prefix-caching --seed 0 \
    --host 127.0.0.1 --port 8011 "$@" > "$R/vllm_server.log" 2>&1 &
  V=$!; local t0=$(date +%s)
  until health 8011; do sleep 2; kill -0 $V || { tail -30 "$R/vllm_server.log"; return 2; }; [ $(( $(date +%s) - t0 )) -gt 300 ] && { echo "vllm not healthy"; kill $V; return 2; }; done
  echo "vllm serve $* healthy after $(( $(date +%s) - t0 )) s"
}
vllm_down() { kill $V; sleep 5; kill -9 $V 2>/dev/null; wait $V 2>/dev/null; sleep 3; }
CAP=$(cat /tmp/best_cap 2>/dev/null || echo 1024)
case "$1" in
i) install_vllm b ;;
a)
  install_vllm a &
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > "$OUT/make_model.log" 2>&1
  python3 $P/tokenizer/make_tokenizer.py $TOK --check > "$OUT/tok.log" 2>&1 || { tail -5 "$OUT/tok.log"; exit 1; }
  cp $TOK/tokenizer.json $M/tokenizer.json
  wait
  for cfg in default cap512 cap1024 cap2048 mnbt2048; do
    case $cfg in
      default) f=();; cap*) f=(--max-prefill-tokens-while-decoding ${cfg#cap});; mnbt*) f=(--max-num-batched-tokens ${cfg#mnbt});;
    esac
    serve_up $cfg "${f[@]}" || continue
    own_bench ${cfg}_c128 --concurrency 128 --num-requests 640
    serve_down
  done
  # the best cap by closed-loop output tok/s, for the next calls
  python3 - <<'PY' | tee /tmp/best_cap_line
import json
best = max((json.load(open(f"/tmp/r35/own_cap{c}_c128.json"))["output_tokens_per_s"], c) for c in (512, 1024, 2048))
print(best[1], best[0]); open("/tmp/best_cap", "w").write(str(best[1]))
PY
  CAP=$(cat /tmp/best_cap)
  for cfg in default cap$CAP; do
    case $cfg in default) f=();; *) f=(--max-prefill-tokens-while-decoding $CAP);; esac
    serve_up $cfg "${f[@]}" || continue
    own_bench ${cfg}_open --num-requests 400 --sweep 16,32,48 --plot $R/own_${cfg}_open.png
    serve_down
  done
  tar czf "$OUT/r35a.tgz" -C $R . ;;
c)
  serve_up fp8_cap$CAP --quantization fp8 --max-prefill-tokens-while-decoding $CAP && {
    vllm_bench 8012 rs_fp8_cap${CAP}_c128 128 640; vllm_bench 8012 rs_fp8_cap${CAP}_c1 1 8; serve_down; }
  serve_up fp8_default --quantization fp8 && { vllm_bench 8012 rs_fp8_default_c128 128 640; serve_down; }
  vllm_up --quantization fp8 || exit 2
  vllm_bench 8011 vllm_fp8_c128 128 640
  vllm_bench 8011 vllm_fp8_c1 1 8
  vllm_down
  tar czf "$OUT/r35c.tgz" -C $R . ;;
d)
  for cfg in "fp8:--quantization=fp8" "kv8:--kv-cache-dtype=fp8"; do
    name=${cfg%%:*}
    timeout 200 $B/cuda_bench accuracy $M $R/ours_$name.bin $R/prompts_$name.json ${cfg#*:} > $R/dump_$name.log 2>&1
    echo "dump $name rc=$?"
  done
  PYTHONPATH=/tmp/site timeout 200 python3 scripts/vllm_logprobs.py $M $R/prompts_fp8.json $R/vllm_fp8.json --quantization fp8 > $R/vllm_lp_fp8.log 2>&1; echo "vllm fp8 rc=$?"; tail -1 $R/vllm_lp_fp8.log
  PYTHONPATH=/tmp/site timeout 200 python3 scripts/vllm_logprobs.py $M $R/prompts_kv8.json $R/vllm_kv8.json --kv-cache-dtype fp8 > $R/vllm_lp_kv8.log 2>&1; echo "vllm kv8 rc=$?"; tail -1 $R/vllm_lp_kv8.log
  timeout 200 python3 scripts/accuracy_vs_peer.py $M $R/prompts_fp8.json $R/acc_peer.json \
    fp8=$R/ours_fp8.bin:$R/vllm_fp8.json kv8=$R/ours_kv8.bin:$R/vllm_kv8.json 2>$R/acc_peer.err; echo "acc rc=$?"; tail -3 $R/acc_peer.err
  rm -f $R/*.bin $R/*.bin.prefill
  tar czf "$OUT/r35d.tgz" -C $R . ;;
e)
  [ -f /tmp/site/.ok ] || { echo "vllm not installed on this machine"; exit 3; }
  open_loop() {  # port name
    for rate in 16 32 48; do
      "${VLLM[@]}" bench serve --backend openai --base-url "http://127.0.0.1:$1" --model $M --tokenizer $TOK \
        --dataset-name random --random-input-len 512 --random-output-len 128 --num-prompts 400 \
        --request-rate $rate --ignore-eos --seed 0 --num-warmups 0 --save-result --result-dir $R \
        --result-filename ${2}_$rate.json --disable-tqdm > "$R/${2}_$rate.log" 2>&1
      echo "== $2 $rate req/s"; grep -E "Output token throughput|Median TTFT|P99 TTFT|Mean TPOT|Median ITL|P99 ITL" "$R/${2}_$rate.log"
    done
  }
  serve_up cap512 --max-prefill-tokens-while-decoding 512 && { open_loop 8012 rs_cap512; serve_down; }
  serve_up default && { open_loop 8012 rs_default; serve_down; }
  vllm_up || exit 2
  open_loop 8011 vllm
  vllm_down
  tar czf "$OUT/r35e.tgz" -C $R . ;;
esac
