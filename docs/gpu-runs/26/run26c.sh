#!/usr/bin/env bash
# Run 26, call C (carry .gpu26/smol.part02, after run26a.sh's calls A and B): SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized at load) through
# `ringserve generate --device cuda` in float32 and bfloat16, greedy, on the three text and two
# chat prompts of tests/fixtures/smollm2/expected.json (HF transformers' float32 tokens); then the
# Llama 3.1 rope_freqs fixture on CUDA against the CPU backend.
set -uo pipefail
cd "$(dirname "$0")/../../.."
S=/tmp/smol
cat $S/smol.part00 $S/smol.part01 .gpu26/smol.part02 > $S/model.gguf
echo "$(cat scripts/smollm2.sha256)  $S/model.gguf" | sha256sum --check || exit 1
tar xJf $S/bins.tar.xz -C $S
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-26
for dt in float32 bfloat16; do
  echo "== SmolLM2 $dt"
  /usr/bin/time -f "wall %e s, max RSS %M KiB" timeout 300 $S/ringserve generate --model $S/model.gguf \
    --device cuda --dtype $dt --input docs/gpu-runs/26/in.jsonl --output $OUT/out-$dt.jsonl --quiet \
    2> $OUT/err-$dt.log; echo "rc=$?"; tail -1 $OUT/err-$dt.log
  python3 - "$OUT/out-$dt.jsonl" <<'PY'
import json, sys
want = [c["greedy"] for c in json.load(open("tests/fixtures/smollm2/expected.json"))["cases"]]
got = [json.loads(l)["token_ids"] for l in open(sys.argv[1])]
for i, (w, g) in enumerate(zip(want, got)):
    same = next((k for k, (a, b) in enumerate(zip(w, g)) if a != b), len(w))
    print(f"case {i}: {'equal' if w == g else f'first {same} of {len(w)} equal'}")
PY
  grep -iE "error|panic" $OUT/err-$dt.log | head -3
done
M=tests/fixtures/gguf-llama3-rope/model.gguf
python3 -c 'import json; print(json.dumps({"prompt_token_ids": [(i*37+5)%512 for i in range(96)], "max_tokens": 16, "temperature": 0, "ignore_eos": True}))' > /tmp/rope.jsonl
for dev in cpu cuda; do
  timeout 200 $S/ringserve generate --model $M --device $dev --dtype float32 --input /tmp/rope.jsonl \
    --output $OUT/rope-$dev.jsonl --quiet 2> $OUT/rope-err-$dev.log; echo "rope $dev rc=$?"
done
python3 -c "
import json,sys
a=[json.loads(l)['token_ids'] for l in open('$OUT/rope-cpu.jsonl')]; b=[json.loads(l)['token_ids'] for l in open('$OUT/rope-cuda.jsonl')]
print('rope_freqs fixture, cpu', a[0]); print('rope_freqs fixture, cuda', b[0], 'equal' if a==b else 'DIFFERENT')"
