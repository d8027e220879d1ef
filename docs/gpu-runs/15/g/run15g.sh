#!/usr/bin/env bash
# Run 15g, the final commit (v47: v46 with the L2 prefetch gated on the compute capability
# instead of the arch string): the GPU tests, cuda_bench decode at batch 1 with the o_proj L2
# prefetch on and off (it must still be on by default), and bench engine 1 and 128 x 512 on one
# more lease, twice.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
( python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
./cuda_kernels --include-ignored --test-threads=1 > "$OUT/tests.log" 2>&1; echo "kernels rc=$?" >> "$OUT/tests.log"
./cuda_backend --include-ignored --test-threads=1 >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" >> "$OUT/tests.log"
./cuda_tp --include-ignored --test-threads=1 --skip nccl_tp2_two_gpus >> "$OUT/tests.log" 2>&1; echo "tp (one GPU) rc=$?" >> "$OUT/tests.log"
grep -E "test result|rc=|panicked" "$OUT/tests.log"
wait; cat $M/*.safetensors > /dev/null
for r in 1 2; do for f in 1 0; do
  echo "== RINGSERVE_CUDA_L2_PREFETCH=$f, round $r" >> "$OUT/ab.log"
  RINGSERVE_CUDA_L2_PREFETCH=$f ./cuda_bench decode $M 1 512 50 2>&1 | grep -E "^decode|rror" >> "$OUT/ab.log"
done; done
cat "$OUT/ab.log"
for r in 1 2; do
  ./ringserve bench engine --model $M --device cuda --batch-sizes 1,128 --prompt-lens 512 --output-len 64 \
    2>&1 | grep -E "^\| [0-9]|rror" | tee -a "$OUT/engine.log"
done
