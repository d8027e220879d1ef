#!/usr/bin/env bash
# Run 44: the bf16 tile product for 9-64 rows (gemm_bf16_tile_b<B>_s<S>, RINGSERVE_CUDA_TILE_GEMM).
# Build here first from commit c1c74d4 (the last with the tile product; reverted after call a), then carry .gpu44:
#   cargo build --release --features cuda --bin ringserve --example cuda_bench
#   cargo test --release -p worker --features cuda --no-run   # cuda_kernels-*, cuda_backend-*
#   mkdir -p .gpu44/b && cp target/release/ringserve target/release/examples/cuda_bench .gpu44/b/
#   cp $(ls -t target/release/deps/cuda_kernels-* | grep -v '\.d$' | head -1) .gpu44/b/cuda_kernels
#   cp $(ls -t target/release/deps/cuda_backend-* | grep -v '\.d$' | head -1) .gpu44/b/cuda_backend
#   strip .gpu44/b/*; tar cJf .gpu44/bins.tar.xz -C .gpu44/b . && rm -r .gpu44/b
#   a: the kernel test (every split, every block height, against f64), the model test (tiny-llama
#      prefill through the tile product against cuBLAS and HF; 12 requests in CUDA graphs), the
#      products alone (cuda_bench tile: tile at each split, cuBLAS, tuned cuBLASLt, 8B shapes,
#      16-64 rows), then decode steps of the random 8B model at 16 / 32 / 64 x 512 and 32 x 3,900
#      with the switch off and on, alternating, two rounds
#   b: bench engine --peer-decode at 32 and 64 x 3,900 (issue 24's method) with the switch off and
#      on, every step logged and summarised point by point (run 43's prepared call b: where
#      t(65) - t(1) goes)
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b44; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -f .gpu44/bins.tar.xz ] && tar xJf .gpu44/bins.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-44
export TINY_LLAMA_DIR=$PWD/tests/fixtures/tiny-llama
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  timeout 200 $B/cuda_kernels tile_gemm --include-ignored --test-threads=1 --nocapture > $OUT/a_kernels.log 2>&1
  echo "cuda_kernels tile_gemm rc=$?"; grep -E "^tile m|test result|panicked" $OUT/a_kernels.log | head -20
  timeout 120 $B/cuda_backend bf16_tile --include-ignored --test-threads=1 --nocapture > $OUT/a_model.log 2>&1
  echo "cuda_backend bf16_tile rc=$?"; grep -E "prompt of|graphs:|test result|panicked" $OUT/a_model.log | head -20
  timeout 150 $B/cuda_bench tile $OUT/a_tile.json > $OUT/a_tile.log 2>&1; echo "cuda_bench tile rc=$?"
  cat $OUT/a_tile.log | grep -E "^tile|rror|panicked"
  wait
  cat $M/*.safetensors > /dev/null
  for round in ${ROUNDS:-1 2}; do
    for t in 0 1; do
      echo "== RINGSERVE_CUDA_TILE_GEMM=$t, round $round"
      RINGSERVE_CUDA_TILE_GEMM=$t timeout 100 $B/cuda_bench decode $M 16,32,64 512 40 2>&1 | grep -E "decode batch|panicked|rror"
      RINGSERVE_CUDA_TILE_GEMM=$t timeout 100 $B/cuda_bench decode $M 32 3900 20 2>&1 | grep -E "decode batch|panicked|rror"
    done
  done ;;
b)
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 )
  cat $M/*.safetensors > /dev/null
  for b in 32 64; do
    for t in ${TILES:-0 1}; do
      RINGSERVE_CUDA_TILE_GEMM=$t RUST_LOG=worker=debug timeout 250 $B/ringserve bench engine --model $M --device cuda \
        --max-model-len 4096 --output-len 65 --peer-decode --batch-sizes $b --prompt-lens 3900 \
        > $OUT/b_bench_${b}_t$t.txt 2> $OUT/b_steps_${b}_t$t.log
      echo "bench $b tile=$t rc=$?"; grep -E "^\| [0-9]" $OUT/b_bench_${b}_t$t.txt; grep "peer decode:" $OUT/b_steps_${b}_t$t.log
      python3 scripts/step_log_summary.py --points $OUT/b_steps_${b}_t$t.log > $OUT/b_summary_${b}_t$t.txt
      tail -5 $OUT/b_summary_${b}_t$t.txt
      rm $OUT/b_steps_${b}_t$t.log
    done
  done ;;
esac
