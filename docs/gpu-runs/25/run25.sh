#!/usr/bin/env bash
# Run 25: a GGUF file on the GPU: the tiny Qwen2 GGUF fixture (seven tensor types, q/k/v biases)
# through `ringserve generate --device cuda` in float32 and bfloat16, greedy, against HF
# transformers' float32 tokens (tests/fixtures/gguf-qwen2/expected.json).
set -uo pipefail
cd "$(dirname "$0")/../../.."
D=.gpu25
tar xJf $D/bins.tar.xz -C $D
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-25
M=tests/fixtures/gguf-qwen2/model.gguf
for dt in float32 bfloat16; do
  echo "== $dt"
  timeout 200 $D/ringserve generate --model $M --device cuda --dtype $dt --input docs/gpu-runs/25/in.jsonl \
    --output $OUT/out-$dt.jsonl --quiet 2> $OUT/err-$dt.log; echo "rc=$?"
  python3 - "$OUT/out-$dt.jsonl" <<'PY'
import json, sys
want = [c["greedy"] for c in json.load(open("tests/fixtures/gguf-qwen2/expected.json"))["cases"]]
got = [json.loads(l)["token_ids"] for l in open(sys.argv[1])]
for w, g in zip(want, got):
    print("HF  ", w); print("ours", g, "equal" if w == g else "DIFFERENT")
PY
  grep -iE "error|panic|device memory" $OUT/err-$dt.log | head -3
done
