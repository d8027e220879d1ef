#!/usr/bin/env bash
# Run 43: the FP8 bulk-copy tile GEMV (gemv_fp8_bulk_j<J>_s<S>: weights brought into per-warp
# shared-memory rings by cp.async.bulk, sm_90+).
#   a (the build of commits c7d9501 + eeab94e, reverted after it; carry .gpu43/bins.tar.xz =
#      cuda_bench and the cuda_kernels test of that build, built with --features
#      cuda, stripped): the FP8 GEMV test (every tile kernel bit for bit, bulk ones included) and
#      the bf16 bulk GEMV test; cuda_bench gemv (every GEMV alone at the 8B shapes, 1-8 rows); the
#      random 8B model; cuda_bench decode at batch 1 x 512, fp8 with each tile kernel for every
#      product and bf16 with the bulk GEMVs on every product but the LM head, alternating
#   b (carry .gpu43/bins.tar.xz = ringserve with bench engine's "bench point" debug line and its
#      "peer decode: t(N) - t(1) = ..." line; build it from the commit that added the latter):
#      bench engine --peer-decode at 32 and 64 x 3,900 with every step logged, summarised point by
#      point (scripts/step_log_summary.py --points): where t(65) - t(1) goes
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b43; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -f .gpu43/bins.tar.xz ] && tar xJf .gpu43/bins.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-43
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  timeout 200 $B/cuda_kernels gemv_ --include-ignored --test-threads=1 --nocapture > $OUT/kernels.log 2>&1; echo "cuda_kernels gemv_ rc=$?"
  grep -E "gemv_fp8 m|gemv_bulk m|test result|panicked" $OUT/kernels.log | head -30
  timeout 150 $B/cuda_bench gemv $OUT/gemv.json > $OUT/gemv.log 2>&1; echo "cuda_bench gemv rc=$?"
  grep -E "fp8 gemv" $OUT/gemv.log | grep -E "m1:|m8:" | sed 's/fp8 gemv r32.*t16_d4x_b2/t16_d4x_b2/; s/, t16_d6x_b2[^,]*, t16_d8x[^,]*, t16_d4 [^,]*//'
  grep -E "linear .* gemv r16" $OUT/gemv.log | grep -E "m1:|m8:"
  wait
  cat $M/*.safetensors > /dev/null
  for round in 1 2; do
    for c in auto bulk_j4_s5 bulk_j2_s8 bulk_j8_s2; do
      echo "== fp8 batch 1, RINGSERVE_CUDA_FP8_GEMV=$c, round $round"
      RINGSERVE_CUDA_FP8_GEMV=$c timeout 100 $B/cuda_bench decode $M 1 512 40 --quantization=fp8 2>&1 | grep -E "decode batch|panicked|rror"
    done
    for c in 0 bulk_j4_s5 bulk_j2_s8; do
      echo "== bf16 batch 1 and 8, RINGSERVE_CUDA_GEMV=500000000 RINGSERVE_CUDA_GEMV_BULK=$c, round $round"
      RINGSERVE_CUDA_GEMV=500000000 RINGSERVE_CUDA_GEMV_BULK=$c timeout 100 $B/cuda_bench decode $M 1,8 512 40 2>&1 | grep -E "decode batch|panicked|rror"
    done
    echo "== bf16 batch 1 and 8, defaults, round $round"
    timeout 100 $B/cuda_bench decode $M 1,8 512 40 2>&1 | grep -E "decode batch|panicked|rror"
  done ;;
b)
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 )
  cat $M/*.safetensors > /dev/null
  for b in 32 64; do
    RUST_LOG=worker=debug timeout 250 $B/ringserve bench engine --model $M --device cuda --max-model-len 4096 \
      --output-len 65 --peer-decode --batch-sizes $b --prompt-lens 3900 > $OUT/b_bench_$b.txt 2> $OUT/b_steps_$b.log
    echo "bench $b rc=$?"; grep -E "^\| [0-9]" $OUT/b_bench_$b.txt; grep "peer decode:" $OUT/b_steps_$b.log
    python3 scripts/step_log_summary.py --points $OUT/b_steps_$b.log | tee $OUT/b_summary_$b.txt
    grep -E "step_ms=|bench point" $OUT/b_steps_$b.log | sed -E 's/.*(bench point|prefill_tokens)/\1/' > $OUT/b_seq_$b.txt
    rm $OUT/b_steps_$b.log
  done ;;
esac
