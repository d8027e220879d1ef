#!/usr/bin/env bash
# Run 42: where a long-context bf16 decode step's time goes (issue 24's 32 / 64 x 3,900 goal).
#   a (carry .gpu42: bins.tar.xz = ringserve and cuda_bench built with --features cuda, stripped):
#      the random 8B model; cuda_bench decode at 32 and 64 x 3,900; bench engine --peer-decode at
#      32 and 64 x 3,900 (RUST_LOG=worker=debug: bench engine logged no steps until the commit
#      after this call); ncu's time of every kernel
#      node of one 32 x 3,900 decode step (replayed alone, zero KV: attention reads the same bytes)
#   Calls b-d ran builds whose changes were measured and reverted (the run's README says what each was).
#   b (+ cold.tar.xz, cold24.tar.xz: the build whose cuBLASLt tuning times each product on every
#      layer's weights in turn, with 8 and 24 candidates): call a's build (warm tuning) and the two,
#      alternating: cuda_bench decode at 32 / 64 x 3,900 and 128 x 512 with the tuning's lines,
#      bench engine --peer-decode at 32 / 64 x 3,900; ncu of the 8-candidate build's 32 x 3,900 step
#   c (+ fp8t.tar.xz: FP8 products on cuBLASLt timed among 16 candidates on every layer's weights
#      in turn, the fastest kept, instead of the heuristic's first): cuda_bench decode fp8 at 16-256
#      x 512 with each shape's times; bench engine fp8 at 128 / 256 x 512, call a's build and this
#      one alternating
#   d (carry .gpu42/merge.tar.xz: ringserve, cuda_bench and the cuda_kernels, cuda_backend and
#      cuda_fp8 tests of the build whose decode kernels merge their own splits): the attention
#      tests (bits of the merge against attn_combine's, shared splits), the backend and FP8-cache
#      tests; cuda_bench decode at batch 1 x 512, bf16 and FP8, merge on and off alternating;
#      bench engine --peer-decode at 32 / 64 x 3,900, merge on and off
#   e (carry .gpu42/pdl.tar.xz: ringserve, cuda_bench, cuda_kernels and cuda_fp8 of the build whose
#      decode graphs make the kernels of kernels::PDL_KERNELS programmatic dependents): the FP8
#      tests with the new PDL test, the FP8 GEMV and attention kernel tests; `ringserve generate`
#      on the 8B model (4 and 16 requests sharing prefixes, bf16 and FP8) with PDL on and off, token
#      ids compared; cuda_bench decode at 1 / 8 / 32 x 512, bf16 and FP8, PDL on and off
#      alternating; bench engine --peer-decode at 32 / 64 x 3,900, PDL on and off
#   f (carry .gpu42/pdl1.tar.xz: the same with PDL only in graphs of one sequence, PDL_MAX_ROWS):
#      the FP8 tests with the PDL test (each prompt alone); `ringserve generate`
#      of one request, bf16 and FP8, PDL on and off, token ids compared; cuda_bench decode at 1 / 8
#      x 512 and bench engine --peer-decode at 1 x 512, bf16 and FP8, PDL on and off alternating
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b42; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -f .gpu42/bins.tar.xz ] && tar xJf .gpu42/bins.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-42
E="$B/ringserve bench engine --model $M --device cuda --max-model-len 4096 --output-len 65 --peer-decode"
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  cat $M/*.safetensors > /dev/null
  timeout 150 $B/cuda_bench decode $M 32,64 3900 20 2>&1 | grep -v INFO | grep -E "decode batch" | tee $OUT/timeline.txt
  RUST_LOG=worker=debug timeout 200 $E --batch-sizes 32,64 --prompt-lens 3900 > $OUT/bench.txt 2> $OUT/bench_steps.log
  echo "bench rc=$?"; grep -E "^\| [0-9]" $OUT/bench.txt
  xz -9 $OUT/bench_steps.log
  CUDA_BENCH_ZERO_KV=1 timeout 300 ncu --graph-profiling node --cache-control none --clock-control none --csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum -s 1500 -c 1000 \
    $B/cuda_bench decode $M 32 3900 6 > $OUT/ncu_32.csv 2> $OUT/ncu_32.err
  echo "ncu rc=$?"
  python3 scripts/timeline_summary.py --ncu $OUT/ncu_32.csv "bf16 32 x 3900" | tee -a $OUT/timeline.txt
  tail -3 $OUT/ncu_32.err ;;
b)
  for v in cold cold24; do mkdir -p $B/$v; [ -f .gpu42/$v.tar.xz ] && tar xJf .gpu42/$v.tar.xz -C $B/$v; done
  ln -sfn $B $B/warm
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  cat $M/*.safetensors > /dev/null
  for round in 1 2; do
    for v in warm cold cold24; do
      export RINGSERVE_KERNEL_CACHE=/tmp/kc-42$v
      echo "== $v, round $round" | tee -a $OUT/bench.txt $OUT/timeline.txt
      [ $round = 1 ] && timeout 150 $B/$v/cuda_bench decode $M 32,64 3900 20 2>&1 | grep -E "decode batch|gemm tuning" | tee -a $OUT/timeline.txt | grep "decode batch"
      [ $round = 1 ] && timeout 150 $B/$v/cuda_bench decode $M 128 512 30 2>&1 | grep -E "decode batch|gemm tuning" | tee -a $OUT/timeline.txt | grep "decode batch"
      timeout 200 $B/$v/ringserve bench engine --model $M --device cuda --max-model-len 4096 --output-len 65 --peer-decode --batch-sizes 32,64 --prompt-lens 3900 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
    done
  done
  export RINGSERVE_KERNEL_CACHE=/tmp/kc-42cold
  CUDA_BENCH_ZERO_KV=1 timeout 120 ncu --graph-profiling node --cache-control none --clock-control none --csv \
    --metrics gpu__time_duration.sum -s 1500 -c 1000 \
    $B/cold/cuda_bench decode $M 32 3900 6 > $OUT/ncu_32.csv 2> $OUT/ncu_32.err
  echo "ncu rc=$?"
  python3 scripts/timeline_summary.py --ncu $OUT/ncu_32.csv "bf16 32 x 3900, cold tuning" | tee -a $OUT/timeline.txt | head -16 ;;
c)
  mkdir -p $B/fp8t && tar xJf .gpu42/fp8t.tar.xz -C $B/fp8t; ln -sfn $B $B/heur
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  cat $M/*.safetensors > /dev/null
  export RINGSERVE_KERNEL_CACHE=/tmp/kc-42c
  timeout 200 $B/fp8t/cuda_bench decode $M 16,32,64,128,256 512 30 --quantization=fp8 2>&1 | grep -E "decode batch|gemm tuning" | tee $OUT/timeline.txt
  timeout 100 $B/heur/cuda_bench decode $M 16,32,64,128,256 512 30 --quantization=fp8 2>&1 | grep -E "decode batch" | tee -a $OUT/timeline.txt
  for round in 1 2; do
    for v in heur fp8t; do
      echo "== $v, round $round" | tee -a $OUT/bench.txt
      timeout 150 $B/$v/ringserve bench engine --model $M --device cuda --output-len 65 --peer-decode --quantization fp8 --batch-sizes 128,256 --prompt-lens 512 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
    done
  done ;;
d)
  mkdir -p $B/merge && tar xJf .gpu42/merge.tar.xz -C $B/merge; R=$B/merge
  export FIXTURES_DIR=$PWD/tests/fixtures TINY_LLAMA_DIR=$PWD/tests/fixtures/tiny-llama RINGSERVE_KERNEL_CACHE=/tmp/kc-42d
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  timeout 200 $R/cuda_kernels attention shared_decode --include-ignored --test-threads=1 --nocapture > $OUT/kernels.log 2>&1; echo "cuda_kernels attention rc=$?"
  grep -E "test result|panicked|differs" $OUT/kernels.log | head
  timeout 200 $R/cuda_backend --include-ignored --test-threads=1 > $OUT/backend.log 2>&1; echo "cuda_backend rc=$?"
  grep -E "test result|panicked" $OUT/backend.log | head
  timeout 200 $R/cuda_fp8 kv_cache --include-ignored --test-threads=1 --nocapture > $OUT/cuda_fp8.log 2>&1; echo "cuda_fp8 kv_cache rc=$?"
  grep -E "test result|panicked" $OUT/cuda_fp8.log | head
  wait; cat $M/*.safetensors > /dev/null
  for merge in 1 0 1 0; do
    for q in bf16 fp8; do
      qa=""; [ $q = fp8 ] && qa="--quantization=fp8"
      echo "merge=$merge $q: $(RINGSERVE_CUDA_DECODE_MERGE=$merge timeout 100 $R/cuda_bench decode $M 1 512 40 $qa 2>&1 | grep 'decode batch')" | tee -a $OUT/timeline.txt
    done
  done
  for merge in 1 0; do
    echo "== merge=$merge" | tee -a $OUT/bench.txt
    RINGSERVE_CUDA_DECODE_MERGE=$merge timeout 200 $R/ringserve bench engine --model $M --device cuda --max-model-len 4096 --output-len 65 --peer-decode --batch-sizes 32,64 --prompt-lens 3900 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  done ;;
e)
  mkdir -p $B/pdl && tar xJf .gpu42/pdl.tar.xz -C $B/pdl; R=$B/pdl; J=/tmp/job42
  export FIXTURES_DIR=$PWD/tests/fixtures TINY_LLAMA_DIR=$PWD/tests/fixtures/tiny-llama RINGSERVE_KERNEL_CACHE=/tmp/kc-42e
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  timeout 200 $R/cuda_fp8 --include-ignored --test-threads=1 --nocapture > $OUT/cuda_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
  grep -E "^test |test result|panicked" $OUT/cuda_fp8.log | head
  timeout 200 $R/cuda_kernels fp8 attention --include-ignored --test-threads=1 > $OUT/kernels.log 2>&1; echo "cuda_kernels fp8 attention rc=$?"
  grep -E "test result|panicked" $OUT/kernels.log | head
  wait; cat $M/*.safetensors > /dev/null
  python3 scripts/shared_prefix_job.py $J/s --groups 1 --per-group 4 --prefix 256 --unique 32 > /dev/null
  python3 scripts/shared_prefix_job.py $J/m --groups 2 --per-group 8 --prefix 512 --unique 32 > /dev/null
  for job in s m; do for q in bf16 fp8; do
    qa=""; [ $q = fp8 ] && qa="--quantization fp8"
    for pdl in 1 0; do
      RINGSERVE_CUDA_PDL=$pdl RUST_LOG=worker=debug timeout 120 $R/ringserve generate --model $M --device cuda --max-model-len 4096 $qa \
        --input $J/$job/job.jsonl --output $J/out_${job}_${q}_$pdl.jsonl --quiet 2> $OUT/gen_${job}_${q}_$pdl.log > /dev/null
    done
    echo "$job $q: $(grep -o 'programmatic_edges=[0-9]*' $OUT/gen_${job}_${q}_1.log | sort | uniq -c | tr '\n' ' ') $(cmp -s $J/out_${job}_${q}_1.jsonl $J/out_${job}_${q}_0.jsonl && echo same || echo DIFFER) ($(wc -l < $J/out_${job}_${q}_1.jsonl) lines)"
  done; done
  for pdl in 1 0 1 0; do
    for q in bf16 fp8; do
      qa=""; [ $q = fp8 ] && qa="--quantization=fp8"
      RINGSERVE_CUDA_PDL=$pdl timeout 100 $R/cuda_bench decode $M 1,8,32 512 40 $qa 2>&1 | grep 'decode batch' | sed "s/^/pdl=$pdl $q: /" | tee -a $OUT/timeline.txt
    done
  done
  for pdl in 1 0; do
    echo "== pdl=$pdl" | tee -a $OUT/bench.txt
    RINGSERVE_CUDA_PDL=$pdl timeout 200 $R/ringserve bench engine --model $M --device cuda --max-model-len 4096 --output-len 65 --peer-decode --batch-sizes 32,64 --prompt-lens 3900 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  done ;;
f)
  mkdir -p $B/pdl1 && tar xJf .gpu42/pdl1.tar.xz -C $B/pdl1; R=$B/pdl1; J=/tmp/job42f
  export FIXTURES_DIR=$PWD/tests/fixtures TINY_LLAMA_DIR=$PWD/tests/fixtures/tiny-llama RINGSERVE_KERNEL_CACHE=/tmp/kc-42f
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  timeout 200 $R/cuda_fp8 --include-ignored --test-threads=1 --nocapture > $OUT/cuda_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
  grep -E "^test |test result|panicked" $OUT/cuda_fp8.log | head
  wait; cat $M/*.safetensors > /dev/null
  python3 scripts/shared_prefix_job.py $J --groups 1 --per-group 1 --prefix 256 --unique 32 > /dev/null
  for q in bf16 fp8; do
    qa=""; [ $q = fp8 ] && qa="--quantization fp8"
    for pdl in 1 0; do
      RINGSERVE_CUDA_PDL=$pdl RUST_LOG=worker=debug timeout 120 $R/ringserve generate --model $M --device cuda --max-model-len 4096 $qa \
        --input $J/job.jsonl --output $J/out_${q}_$pdl.jsonl --quiet 2> $OUT/gen_${q}_$pdl.log > /dev/null
    done
    echo "$q: $(grep -o 'programmatic_edges=[0-9]*' $OUT/gen_${q}_1.log | sort | uniq -c | tr '\n' ' ') $(cmp -s $J/out_${q}_1.jsonl $J/out_${q}_0.jsonl && echo same || echo DIFFER)"
  done
  for pdl in 1 0 1 0; do
    for q in bf16 fp8; do
      qa=""; [ $q = fp8 ] && qa="--quantization=fp8"
      RINGSERVE_CUDA_PDL=$pdl timeout 100 $R/cuda_bench decode $M 1,8 512 40 $qa 2>&1 | grep 'decode batch' | sed "s/^/pdl=$pdl $q: /" | tee -a $OUT/timeline.txt
    done
  done
  for pdl in 1 0; do
    for q in bf16 fp8; do
      qa=""; [ $q = fp8 ] && qa="--quantization fp8"
      echo "pdl=$pdl $q: $(RINGSERVE_CUDA_PDL=$pdl timeout 100 $R/ringserve bench engine --model $M --device cuda --output-len 65 --peer-decode --batch-sizes 1 --prompt-lens 512 $qa 2>>$OUT/bench.err | grep -E '^\| [0-9]')" | tee -a $OUT/bench.txt
    done
  done ;;
esac
