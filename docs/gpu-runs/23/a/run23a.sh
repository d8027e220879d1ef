#!/usr/bin/env bash
# Run 23a: stash vLLM part 0; INT4 kernel and model tests; HF transformers' float32 reference for the
# tiny INT4 fixtures' twins; the random 8B model, quantized to AWQ and GPTQ (g128) by
# scripts/make_int4_checkpoint.py; ringserve bench engine on AWQ.
set -uo pipefail
cd "$(dirname "$0")/.."
D=$(basename "$(dirname "$0")")
tar xJf $D/bins.tar.xz -C $D
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-23
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
(mkdir -p /tmp/vllm_parts; cp .vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $D/peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$? (3: part 1 still to come)"
t0=$(date +%s)
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > "$OUT/make_model.log" 2>&1
echo "8B source: $(( $(date +%s) - t0 )) s"; python3 -c "import numpy; print('numpy', numpy.__version__)"
(time python3 scripts/make_int4_checkpoint.py $M /tmp/llama8b-awq --format awq --group-size 128) > "$OUT/q_awq.log" 2>&1 &
QA=$!
(time python3 scripts/make_int4_checkpoint.py $M /tmp/llama8b-gptq --format gptq --group-size 128 --sym) > "$OUT/q_gptq.log" 2>&1 &
QG=$!
echo "== kernel and model tests"
$D/cuda_int4 --include-ignored --test-threads 1 2>&1 | grep -E "^test |test result|rel L2|panicked|vs " | head -40
echo "== HF float32 reference of the twins"
python3 scripts/int4_hf_reference.py tests/fixtures/int4-awq-twin tests/fixtures/int4-gptq-twin tests/fixtures/int4-gptq-sym-twin 2>&1 | grep -vE "Warning|warn" | tail -5
mkdir -p $OUT/expected; for t in awq gptq gptq-sym; do cp tests/fixtures/int4-$t-twin/expected.json $OUT/expected/$t.json; done
wait $QA; echo "awq quantized rc=$?: $(grep real "$OUT/q_awq.log")"; du -sh /tmp/llama8b-awq
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
$D/ringserve bench engine --model /tmp/llama8b-awq --device cuda --batch-sizes 1,8,32,128 --prompt-lens 512 --output-len 64 2> "$OUT/engine_awq.err" | grep -E "^\|"
grep -E "weights|KV cache|error|Error" "$OUT/engine_awq.err" | head -5
wait $QG; echo "gptq quantized rc=$?: $(grep real "$OUT/q_gptq.log")"
