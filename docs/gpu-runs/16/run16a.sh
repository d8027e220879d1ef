#!/usr/bin/env bash
# Run 16a (the code-health check, call 1): the GPU tests of the refactored build (new/), then the
# benchmark of both builds, old/ (6e84e74, before the refactor) and new/, alternating, on the random
# 8B-shaped model; greedy tokens of both builds compared.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 PYTHONUNBUFFERED=1 TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv | tee "$OUT/bench.log"
( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
export RINGSERVE_KERNEL_CACHE=/tmp/kc-new
./new/cuda_kernels --include-ignored --test-threads=1 > "$OUT/tests.log" 2>&1; echo "kernels rc=$?" >> "$OUT/tests.log"
./new/cuda_backend --include-ignored --test-threads=1 >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" >> "$OUT/tests.log"
grep -E "test result|rc=|panicked" "$OUT/tests.log" | tee -a "$OUT/bench.log"
wait; tail -1 /tmp/make_model.log 2>/dev/null
cat $M/*.safetensors > /dev/null
# Greedy tokens of both builds on tiny-llama (f32 and bf16) and the 8B shape (bf16).
printf '{"prompt_token_ids": [1, 450, 49], "max_tokens": 24, "temperature": 0}\n{"prompt_token_ids": [1, 298, 13, 22, 100], "max_tokens": 24, "temperature": 0.8, "seed": 5}\n' > /tmp/tiny.jsonl
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
# The switches through the struct: a bad value is an error naming it; the effective values are logged.
RINGSERVE_CUDA_DECODE_MMA=maybe ./new/ringserve generate --model tiny-llama --device cuda --input /tmp/tiny.jsonl --output /tmp/x.jsonl 2>&1 | tail -2 | tee -a "$OUT/bench.log"
RINGSERVE_CUDA_DECODE_MMA=0 ./new/ringserve generate --model tiny-llama --device cuda --input /tmp/tiny.jsonl --output /tmp/x.jsonl 2>&1 | grep "CUDA kernels" | tee -a "$OUT/bench.log"
# The benchmark, old and new alternating.
for round in 1 2; do for v in old new; do
  export RINGSERVE_KERNEL_CACHE=/tmp/kc-$v
  ./$v/cuda_bench decode $M 1,8,32,128,256 512 30 2>&1 | grep "^decode" | sed "s/^/$v $round /" | tee -a "$OUT/bench.log"
done; done
