#!/usr/bin/env bash
# Run 22b: stash vLLM part 0; the sampling-scratch fix and masked sampling under the CUDA kernel
# tests; structured output on CUDA through the OpenAI API (the demo model's tokenizer on the random
# 8B weights); the shared-prefix job with ringserve generate.
set -uo pipefail
cd "$(dirname "$0")/.."
D=$(basename "$(dirname "$0")")
tar xJf $D/bins.tar.xz -C $D
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-22
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
(mkdir -p /tmp/vllm_parts; cp .vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $D/peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$? (3: part 1 still to come)"
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > "$OUT/make_model.log" 2>&1
cat $M/*.safetensors > /dev/null
echo "== kernel tests"
$D/cuda_kernels --ignored --test-threads 1 masked_device sampling_on_device device_sampling_matches sampling_scratch 2>&1 | grep -E "^test |test result|differ|panicked"
echo "== structured output on CUDA"
cp $D/tokenizer.json $D/tokenizer_config.json $M/
$D/ringserve serve --model $M --device cuda --max-model-len 4096 --addr 127.0.0.1:50071 \
  --http-addr 127.0.0.1:8071 --metrics-addr 127.0.0.1:9071 > "$OUT/serve.out" 2> "$OUT/serve.log" &
S=$!
health() { python3 -c "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8071/health', timeout=2).status == 200 else 1)" 2>/dev/null; }
t0=$(date +%s); until health; do sleep 0.5; kill -0 $S || { tail -20 "$OUT/serve.log"; break; }; done
echo "healthy after $(( $(date +%s) - t0 )) s"
timeout 300 python3 scripts/structured_gpu_check.py http://127.0.0.1:8071; echo "check rc=$?"
kill $S; wait $S
rm -f $M/tokenizer.json $M/tokenizer_config.json
echo "serve log warnings: $(grep -cE 'WARN|ERROR' "$OUT/serve.log")"; grep -E "WARN|ERROR" "$OUT/serve.log" | grep -v draining | head -3
python3 scripts/shared_prefix_job.py /tmp/spj
echo "== ringserve generate, shared-prefix job"
for budget in 8192 16384; do
  $D/ringserve generate --model $M --device cuda --max-model-len 4096 --max-num-batched-tokens $budget \
    --input /tmp/spj/job.jsonl --output /tmp/spj/out_$budget.jsonl 2> "$OUT/gen_b_$budget.log" > /dev/null
  echo "   (budget $budget) $(grep -E 'requests,' "$OUT/gen_b_$budget.log" | tail -1)"
done
