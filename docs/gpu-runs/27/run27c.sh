#!/usr/bin/env bash
# Run 27, call C (carry .gpu27/c: smol.part02, after calls A and B): SmolLM2-135M-Instruct (Q4_1)
# through `ringserve generate --device cuda --dtype bfloat16`, greedy, on the five prompts of
# tests/fixtures/smollm2/expected.json, with its Q4_1 layers on the INT4 kernels (the default) and
# dequantized to bf16 (RINGSERVE_CUDA_GGUF_INT4=0); then `bench engine` both ways.
set -uo pipefail
cd "$(dirname "$0")/../../.."
S=/tmp/smol
cp .gpu27/c/smol.part02 $S/ && cat $S/smol.part00 $S/smol.part01 /tmp/smol/smol.part02 > $S/model.gguf
echo "$(cat scripts/smollm2.sha256)  $S/model.gguf" | sha256sum --check || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-27
for q4 in 1 0; do
  echo "== SmolLM2 bfloat16, RINGSERVE_CUDA_GGUF_INT4=$q4"
  RINGSERVE_CUDA_GGUF_INT4=$q4 timeout 300 $S/ringserve generate --model $S/model.gguf \
    --device cuda --dtype bfloat16 --input docs/gpu-runs/26/in.jsonl --output $OUT/out-int4-$q4.jsonl \
    2> $OUT/err-int4-$q4.log; echo "rc=$?"; grep -E "GGUF|weights streamed" $OUT/err-int4-$q4.log | tail -2
  python3 - "$OUT/out-int4-$q4.jsonl" <<'PY'
import json, sys
want = [c["greedy"] for c in json.load(open("tests/fixtures/smollm2/expected.json"))["cases"]]
got = [json.loads(l)["token_ids"] for l in open(sys.argv[1])]
for i, (w, g) in enumerate(zip(want, got)):
    same = next((k for k, (a, b) in enumerate(zip(w, g)) if a != b), len(w))
    print(f"case {i}: {'equal' if w == g else f'first {same} of {len(w)} equal'}")
PY
done
for q4 in 1 0; do
  echo "== bench engine, RINGSERVE_CUDA_GGUF_INT4=$q4"
  RINGSERVE_CUDA_GGUF_INT4=$q4 timeout 300 $S/ringserve bench engine --model $S/model.gguf --device cuda \
    --dtype bfloat16 --batch-sizes 1,16,64 --prompt-lens 128 --output-len 64 2> $OUT/bench-err-$q4.log \
    | tee $OUT/bench-int4-$q4.txt
  grep -iE "error|panic" $OUT/bench-err-$q4.log | head -3
done
