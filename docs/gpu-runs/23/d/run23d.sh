#!/usr/bin/env bash
# Run 23d: the random 8B model and its AWQ (g128) checkpoint again (the machine was fresh); INT4
# kernel and model tests (the g128 GEMV added, the partial-step mma fixed); HF transformers' float32
# reference of the tiny twins; ringserve bench engine on AWQ and on the bf16 source.
set -uo pipefail
cd "$(dirname "$0")/.."
D=$(basename "$(dirname "$0")")
tar xJf $D/bins.tar.xz -C $D
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-23
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > "$OUT/make_model.log" 2>&1
(time python3 scripts/make_int4_checkpoint.py $M $M-awq --format awq --group-size 128) > "$OUT/q_awq.log" 2>&1 &
QA=$!
echo "== kernel tests"
timeout 150 $D/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels 2>&1 | grep -vE "^\s+[0-9]+:|^\s+at " | tail -14
echo "== model tests"
timeout 60 $D/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_models 2>&1 | grep -E "rel L2|test result|panicked|backend on"
echo "== HF float32 reference of the twins"
python3 scripts/int4_hf_reference.py tests/fixtures/int4-awq-twin tests/fixtures/int4-gptq-twin tests/fixtures/int4-gptq-sym-twin 2>&1 | grep -E "twin|Error|error" | tail -5
mkdir -p $OUT/expected; for t in awq gptq gptq-sym; do cp tests/fixtures/int4-$t-twin/expected.json $OUT/expected/$t.json; done
wait $QA; echo "awq quantized rc=$?: $(grep real "$OUT/q_awq.log")"
for m in $M-awq $M; do
  echo "== ringserve $m"
  timeout 150 $D/ringserve bench engine --model $m --device cuda --batch-sizes 1,8,32,128 --prompt-lens 512 --output-len 64 2> "$OUT/engine_$(basename $m).err" | grep -E "^\|"
  grep -E "device memory" "$OUT/engine_$(basename $m).err" | sed 's/.*INFO//' | head -1; grep -iE "error|panic" "$OUT/engine_$(basename $m).err" | head -3
done
