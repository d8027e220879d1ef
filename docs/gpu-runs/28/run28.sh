#!/usr/bin/env bash
# Run 28: the FP8 KV cache (--kv-cache-dtype fp8) on the H200. Three calls on one warm machine,
# each carrying .gpu28 (bins.tar.xz: ringserve, cuda_bench and the cuda_kernels / cuda_fp8 /
# cuda_backend test executables, built with --features cuda and stripped):
#   bash docs/gpu-runs/28/run28.sh tests   # the CUDA tests; writes the random 8B model to /tmp/llama8b
#   bash docs/gpu-runs/28/run28.sh bench   # bench engine, bf16 cache against FP8 cache, two rounds
#   bash docs/gpu-runs/28/run28.sh acc     # logits against HF float32, both caches, both paths
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b28; M=/tmp/llama8b
mkdir -p $B && [ -x $B/ringserve ] || tar xJf .gpu28/bins.tar.xz -C $B
export FIXTURES_DIR=$PWD/tests/fixtures LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-28 PYTHONUNBUFFERED=1
case "$1" in
tests)
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  for t in cuda_kernels cuda_fp8 cuda_backend; do
    timeout 250 $B/$t --include-ignored --test-threads=1 --nocapture > $OUT/$t.log 2>&1; echo "$t rc=$?"
    grep -E "^test |test result|panicked" $OUT/$t.log | head -40
  done
  grep -E "FP8-KV" $OUT/cuda_fp8.log
  wait; ls -la $M | head -3 ;;
bench)
  for round in 1 2; do
    for kv in auto fp8; do
      echo "== round $round, --kv-cache-dtype $kv, 32/64 x 3900" | tee -a $OUT/bench.txt
      timeout 200 $B/ringserve bench engine --model $M --device cuda --kv-cache-dtype $kv --max-model-len 4096 \
        --batch-sizes 32,64 --prompt-lens 3900 --output-len 65 --peer-decode 2>$OUT/bench-$kv-$round.err | tee -a $OUT/bench.txt
      grep -E "KV cache|device memory" $OUT/bench-$kv-$round.err | tail -2 | cut -c1-300
    done
  done
  for kv in auto fp8; do
    echo "== --kv-cache-dtype $kv, 1/128 x 512" | tee -a $OUT/bench.txt
    timeout 150 $B/ringserve bench engine --model $M --device cuda --kv-cache-dtype $kv \
      --batch-sizes 1,128 --prompt-lens 512 --output-len 64 2>>$OUT/bench-short.err | tee -a $OUT/bench.txt
  done ;;
acc)
  for kv in auto fp8; do
    timeout 200 $B/cuda_bench accuracy $M $OUT/ours-$kv.bin $OUT/prompts-$kv.json --kv-cache-dtype=$kv > $OUT/dump-$kv.log 2>&1
    echo "dump $kv rc=$?"
    for path in "" ".prefill"; do
      timeout 200 python3 scripts/accuracy_vs_hf.py $M $OUT/prompts-$kv.json$path $OUT/ours-$kv.bin$path $OUT/acc-$kv$path.json > /dev/null 2>&1
      echo "acc $kv$path rc=$?"; python3 -c "import json,sys; d=json.load(open('$OUT/acc-$kv$path.json')); print({k: v for k, v in d.items() if not isinstance(v, list)})"
    done
  done
  rm -f $OUT/*.bin $OUT/*.bin.prefill ;;
esac
