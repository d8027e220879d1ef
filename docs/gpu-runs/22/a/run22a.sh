#!/usr/bin/env bash
# Run 22a: stash vLLM part 0; write the random 8B model; CUDA kernel tests of masked sampling;
# the shared-prefix job with ringserve generate (prefix-aware admission) at three step budgets;
# structured output on CUDA through the OpenAI API (the demo model's tokenizer on the 8B weights).
set -uo pipefail
cd "$(dirname "$0")/.."
D=$(basename "$(dirname "$0")")
tar xJf $D/bins.tar.xz -C $D
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 RINGSERVE_KERNEL_CACHE=/tmp/kc-22
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
(mkdir -p /tmp/vllm_parts; cp .vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $D/peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$? (3: part 1 still to come)"
[ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > "$OUT/make_model.log" 2>&1
cat $M/*.safetensors > /dev/null
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
echo "== kernel tests"
$D/cuda_kernels --ignored --test-threads 1 masked_device sampling_on_device device_sampling_matches 2>&1 | grep -E "^test |test result|mismatch|differ|panicked"
python3 scripts/shared_prefix_job.py /tmp/spj
echo "== ringserve generate, shared-prefix job"
for budget in 8192 16384 2048 8192; do
  $D/ringserve generate --model $M --device cuda --max-model-len 4096 --max-num-batched-tokens $budget \
    --input /tmp/spj/job.jsonl --output /tmp/spj/out_$budget.jsonl 2> "$OUT/gen_$budget.log" | tail -1
  echo "   (budget $budget) $(grep -E 'requests,' "$OUT/gen_$budget.log" | tail -1)"
done
$D/ringserve generate --model $M --device cuda --max-model-len 4096 --no-enable-prefix-caching \
  --input /tmp/spj/job.jsonl --output /tmp/spj/out_nocache.jsonl 2> "$OUT/gen_nocache.log" | tail -1
echo "   (caching off) $(grep -E 'requests,' "$OUT/gen_nocache.log" | tail -1)"
python3 - <<'PY'
import json
a=[json.loads(l)["token_ids"] for l in open("/tmp/spj/out_8192.jsonl")]
for b in ["2048","16384","nocache"]:
    o=[json.loads(l)["token_ids"] for l in open(f"/tmp/spj/out_{b}.jsonl")]
    print(f"   greedy tokens equal to budget 8192's with {b}: {sum(x==y for x,y in zip(a,o))}/{len(a)}")
PY
echo "== structured output on CUDA"
cp $D/tokenizer.json $D/tokenizer_config.json $M/
$D/ringserve serve --model $M --device cuda --max-model-len 4096 --addr 127.0.0.1:50071 \
  --http-addr 127.0.0.1:8071 --metrics-addr 127.0.0.1:9071 > "$OUT/serve.out" 2> "$OUT/serve.log" &
S=$!
health() { python3 -c "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8071/health', timeout=2).status == 200 else 1)" 2>/dev/null; }
t0=$(date +%s); until health; do sleep 0.5; kill -0 $S || { tail -20 "$OUT/serve.log"; break; }; done
echo "healthy after $(( $(date +%s) - t0 )) s"
timeout 400 python3 scripts/structured_gpu_check.py http://127.0.0.1:8071; echo "check rc=$?"
kill $S; wait $S
rm -f $M/tokenizer.json $M/tokenizer_config.json
grep -iE "error|panic" "$OUT/serve.log" | head -5
