#!/usr/bin/env bash
# Tensor parallelism and multi-GPU serving on the GPU machine. Run from the folder holding the carried
# binaries (`ringserve`, and the test binaries `cuda_kernels`, `cuda_backend`, `cuda_tp`; see
# docs/benchmarks.md), with the repository's tests/fixtures/tiny-llama at $TINY_LLAMA_DIR.
#  1. the GPU tests: kernels, backend, tensor parallelism (the two-GPU test only with >= 2 GPUs);
#  2. `ringserve serve` on tiny-llama in float32 with --gpus 0, with --tp 2 --tp-collectives host
#     (two ranks sharing GPU 0) and, with >= 2 GPUs, --tp 2 --gpus 0,1 (NCCL): the client's greedy
#     tokens must equal HF's (expected.json);
#  3. with --8b: the Llama-3-8B-shaped random model in float32, `serve` TP=1 vs TP=2 (host
#     collectives on one GPU, or NCCL on two): 64 greedy tokens for 4 prompts must be identical;
#  4. with --bf16 and >= 2 GPUs: tiny-llama in bf16 (the path with the L2 prefetch branch and the
#     cuBLASLt tuning inside the decode graphs) under `serve` TP=1 and TP=2 (NCCL): both must
#     answer every prompt; their tokens are compared with HF's float32 ones and each other
#     (bf16 rounding may part them on near-ties, so this is reported, not required).
# Logs go to $OUT (tp.log and the servers' logs).
#   usage: scripts/gpu_tp.sh [--8b]
set -uo pipefail
HERE=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export RINGSERVE_KERNEL_CACHE=${RINGSERVE_KERNEL_CACHE:-/tmp/ringserve-kcache}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/tp.log"; : > "$LOG"
FIXTURE=${TINY_LLAMA_DIR:?set TINY_LLAMA_DIR to tests/fixtures/tiny-llama}
EIGHT_B=0; BF16=0
for a in "$@"; do case $a in --8b) EIGHT_B=1;; --bf16) BF16=1;; esac; done
NGPU=$(nvidia-smi -L | wc -l)
nvidia-smi -L | tee -a "$LOG"
ADDR=127.0.0.1:50061

run_tests() {
  local bin=$1; shift
  echo "== $bin $*" | tee -a "$LOG"
  "$HERE/$bin" --include-ignored --test-threads=1 "$@" 2>&1 | grep -E "^test |test result|panicked|rank|cases equal|differ" | tee -a "$LOG"
}
run_tests cuda_kernels
run_tests cuda_backend
if [ "$NGPU" -ge 2 ]; then run_tests cuda_tp; else run_tests cuda_tp --skip two_gpus; fi

SERVER=
start_server() { # log, args...
  local log=$1; shift
  "$HERE/ringserve" serve --addr $ADDR --metrics-addr 127.0.0.1:9091 "$@" > "$log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 3000); do
    grep -q "worker 0 ready\|rank 0 ready" "$log" && return 0
    kill -0 $SERVER 2>/dev/null || { echo "server exited: $*" | tee -a "$LOG"; tail -15 "$log" | tee -a "$LOG"; return 1; }
    sleep 0.1
  done
  echo "server not ready after 5 min: $*" | tee -a "$LOG"; return 1
}
stop_server() { kill -TERM $SERVER; wait $SERVER; echo "server stopped rc=$?" | tee -a "$LOG"; }

# Greedy token ids of each prompt in $PROMPTS (one per line), $1 tokens each.
client_tokens() {
  while read -r p; do
    "$HERE/ringserve" client --addr $ADDR --token-ids "$p" --max-tokens "$1" --temperature 0 --print-ids 2>/dev/null | tr '\n' ' '
    echo
  done < "$PROMPTS"
}

PROMPTS=/tmp/tp_prompts.txt
python3 - "$FIXTURE/expected.json" > $PROMPTS <<'EOF'
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
    print(" ".join(map(str, c["prompt"])))
EOF
python3 - "$FIXTURE/expected.json" > /tmp/tp_expected.txt <<'EOF'
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
    print(" ".join(map(str, c["greedy"])))
EOF
N=$(head -1 /tmp/tp_expected.txt | wc -w)
check_tiny() { # label
  client_tokens "$N" > /tmp/tp_got.txt
  if python3 - /tmp/tp_got.txt /tmp/tp_expected.txt <<'EOF'
import re, sys
got = [re.findall(r"\d+", l) for l in open(sys.argv[1])]
want = [l.split() for l in open(sys.argv[2])]
sys.exit(0 if got == want else 1)
EOF
  then echo "tiny-llama $1: greedy tokens equal HF's ($(wc -l < $PROMPTS) prompts)" | tee -a "$LOG"
  else echo "tiny-llama $1: tokens DIFFER from HF's" | tee -a "$LOG"; cat /tmp/tp_got.txt | tee -a "$LOG"; fi
}
TINY=(--model "$FIXTURE" --device cuda --dtype float32 --num-kv-blocks 256 --block-size 16)
start_server "$OUT/serve_gpus0.log" "${TINY[@]}" --gpus 0 && { check_tiny "serve --gpus 0"; stop_server; }
start_server "$OUT/serve_tp2_host.log" "${TINY[@]}" --tp 2 --tp-collectives host && {
  check_tiny "serve --tp 2 --tp-collectives host (one GPU)"; stop_server; }
if [ "$NGPU" -ge 2 ]; then
  start_server "$OUT/serve_tp2_nccl.log" "${TINY[@]}" --tp 2 --gpus 0,1 && {
    check_tiny "serve --tp 2 --gpus 0,1 (NCCL)"; stop_server; }
fi

if [ "$BF16" = 1 ] && [ "$NGPU" -ge 2 ]; then
  BF=(--model "$FIXTURE" --device cuda --dtype bfloat16 --num-kv-blocks 256 --block-size 16)
  : > /tmp/bf_tp1.txt; : > /tmp/bf_tp2.txt
  start_server "$OUT/serve_bf16_tp1.log" "${BF[@]}" --gpus 0 && { client_tokens "$N" > /tmp/bf_tp1.txt; stop_server; }
  start_server "$OUT/serve_bf16_tp2.log" "${BF[@]}" --tp 2 --gpus 0,1 && { client_tokens "$N" > /tmp/bf_tp2.txt; stop_server; }
  python3 - /tmp/bf_tp1.txt /tmp/bf_tp2.txt /tmp/tp_expected.txt <<'EOF' | tee -a "$LOG"
import re, sys
tp1, tp2 = ([re.findall(r"\d+", l) for l in open(p)] for p in sys.argv[1:3])
hf = [l.split() for l in open(sys.argv[3])]
full = lambda rows: sum(len(r) == len(h) for r, h in zip(rows, hf))
same = lambda a, b: sum(x == y for x, y in zip(a, b))
print(f"tiny-llama bf16: TP=1 answered {full(tp1)}/{len(hf)}, TP=2 (NCCL) {full(tp2)}/{len(hf)} prompts in full; "
      f"equal to HF float32: TP=1 {same(tp1, hf)}, TP=2 {same(tp2, hf)}; TP=2 equal to TP=1: {same(tp1, tp2)}")
EOF
fi

if [ "$EIGHT_B" = 1 ]; then
  MODEL=/tmp/llama8b
  [ -f $MODEL/config.json ] || python3 "$HERE/scripts/make_random_llama8b.py" $MODEL 2>&1 | tail -2 | tee -a "$LOG"
  python3 - > $PROMPTS <<'EOF'
import random
r = random.Random(7)
for n in (5, 17, 64, 200):
    print(" ".join(str(r.randrange(128000)) for _ in range(n)))
EOF
  EIGHT=(--model $MODEL --device cuda --dtype float32 --num-kv-blocks 2048 --max-num-seqs 8)
  if [ "$NGPU" -ge 2 ]; then TP2=(--tp 2 --gpus 0,1); else TP2=(--tp 2 --tp-collectives host); fi
  start_server "$OUT/serve_8b_tp1.log" "${EIGHT[@]}" && { client_tokens 64 > /tmp/tp1.txt; stop_server; }
  start_server "$OUT/serve_8b_tp2.log" "${EIGHT[@]}" "${TP2[@]}" && { client_tokens 64 > /tmp/tp2.txt; stop_server; }
  echo "TP=1 tokens (first 12 of each prompt):" | tee -a "$LOG"; cut -d' ' -f1-12 /tmp/tp1.txt | tee -a "$LOG"
  echo "TP=2 tokens (first 12 of each prompt):" | tee -a "$LOG"; cut -d' ' -f1-12 /tmp/tp2.txt | tee -a "$LOG"
  if cmp -s /tmp/tp1.txt /tmp/tp2.txt && [ "$(wc -w < /tmp/tp1.txt)" -ge 4 ]; then
    echo "8B float32: TP=2 (${TP2[*]}) greedy tokens IDENTICAL to TP=1, 4 prompts x 64 tokens" | tee -a "$LOG"
  else
    echo "8B float32: TP=2 (${TP2[*]}) vs TP=1 DIFFER" | tee -a "$LOG"
    paste -d'\n' /tmp/tp1.txt /tmp/tp2.txt | cut -c1-400 | tee -a "$LOG"
  fi
fi
echo "done" | tee -a "$LOG"
