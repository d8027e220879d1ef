#!/usr/bin/env bash
# Run 17a: issue 17's last changes (own error types, PrivateShm under the CPU communicator, sampling
# settings in one engine type, FP8's CPU path) on the H200: every GPU test of the new build, memcheck,
# greedy tokens and decode steps of run 16's build (old/) against this one (new/), the CUDA FP8
# refusal; vLLM part 1 is stashed for call b.
set -uo pipefail
cd "$(dirname "$0")"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
(mkdir -p /tmp/vllm_parts; cp ../.vllm-parts/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash peer/install.sh) > "$OUT/install.log" 2>&1; echo "install rc=$? (3: a part still missing)" >> "$OUT/install.log"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv | tee "$OUT/bench.log"
( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
export RINGSERVE_KERNEL_CACHE=/tmp/kc-new
for t in cuda_kernels cuda_backend cuda_tp; do
  ./new/$t --include-ignored --test-threads=1 >> "$OUT/tests.log" 2>&1; echo "$t rc=$?" >> "$OUT/tests.log"
done
grep -E "test result|rc=|panicked" "$OUT/tests.log" | tee -a "$OUT/bench.log"
printf '{"prompt_token_ids": [1, 450, 49], "max_tokens": 24, "temperature": 0}\n{"prompt_token_ids": [1, 298, 13, 22, 100], "max_tokens": 24, "temperature": 0.8, "seed": 5}\n' > /tmp/tiny.jsonl
/usr/local/cuda/bin/compute-sanitizer --tool memcheck ./new/ringserve generate --model tiny-llama --device cuda --dtype bfloat16 --input /tmp/tiny.jsonl --output /tmp/memcheck.jsonl --quiet > "$OUT/memcheck.log" 2>&1
grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | tee -a "$OUT/bench.log"
echo "== FP8 on CUDA (not built yet: must be a clear error)" | tee -a "$OUT/bench.log"
./new/ringserve generate --model tiny-llama-fp8-dynamic --device cuda --input /tmp/tiny.jsonl --output /tmp/x.jsonl 2>&1 | grep -E "^error|caused" | tee -a "$OUT/bench.log"
./new/ringserve generate --model tiny-llama --device cuda --quantization fp8 --input /tmp/tiny.jsonl --output /tmp/x.jsonl 2>&1 | grep -E "^error|caused" | tee -a "$OUT/bench.log"
wait; tail -1 /tmp/make_model.log 2>/dev/null
cat $M/*.safetensors > /dev/null
python3 -c "
import json, random
random.seed(1)
with open('/tmp/big.jsonl', 'w') as f:
    for i in range(8):
        f.write(json.dumps({'prompt_token_ids': [random.randrange(128000) for _ in range(64 + 40 * i)], 'max_tokens': 32, 'temperature': 0}) + '\n')
"
for v in old new; do
  export RINGSERVE_KERNEL_CACHE=/tmp/kc-$v
  for dt in float32 bfloat16; do ./$v/ringserve generate --model tiny-llama --device cuda --dtype $dt --input /tmp/tiny.jsonl --output /tmp/tiny-$v-$dt.jsonl --quiet 2>/dev/null; done
  ./$v/ringserve generate --model $M --device cuda --input /tmp/big.jsonl --output /tmp/big-$v.jsonl --quiet 2>/dev/null
done
for f in tiny-%s-float32 tiny-%s-bfloat16 big-%s; do
  a=/tmp/$(printf $f old).jsonl; b=/tmp/$(printf $f new).jsonl
  if cmp -s $a $b && [ -s $a ]; then echo "same tokens: $(printf $f X)"; else echo "DIFFERENT: $(printf $f X)"; fi
done | tee -a "$OUT/bench.log"
for v in old new; do
  export RINGSERVE_KERNEL_CACHE=/tmp/kc-$v
  ./$v/cuda_bench decode $M 1,8,32,128,256 512 30 2>&1 | grep "^decode" | sed "s/^/$v /" | tee -a "$OUT/bench.log"
done
