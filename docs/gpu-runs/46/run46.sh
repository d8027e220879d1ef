#!/usr/bin/env bash
# Run 46: where a decode step of 128 and 256 sequences at 512 keys and a prefill step go, bf16 and
# FP8, kernel by kernel (ncu); then the kernels that showed up (rope_kv_write, the FP8 quantizers)
# rewritten, tested, timed against the build before and beside vLLM 0.26. One-GPU calls:
#   a: the random 8B model; cuda_bench decode bf16 and fp8 at 128 and 256 x 512; ncu of bf16 128,
#      fp8 128 and fp8 256, every node of the step's graph replayed alone, summed per kernel by
#      scripts/timeline_summary.py (carry .gpu46/bins.tar.xz: cuda_bench of the build before,
#      stripped; run first without CUDA_BENCH_ZERO_KV, when ncu's window held only the context's
#      prefill: the prefill breakdown, logs/a0_*)
#   b: ncu sections of the elementwise kernels of a prefill step
#   c: tests of the new build; old and new alternating (cuda_bench decode, bench engine 128 x 512);
#      ncu of the new prefill kernels (carry .gpu46: new.tar.xz, old.tar.xz, bins.tar.xz, peer/)
#   d: vLLM's part 00 stashed (carry .peer-vllm/carry/vllm-site.tar.xz.part00)
#   e: part 01 (carry it), vLLM installed, the new build's fp8 around vLLM 0.26 fp8
#   f: the new build's bf16 around vLLM 0.26 bf16
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b46; M=/tmp/llama8b; P=/tmp/peer46
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -f .gpu46/bins.tar.xz ] && tar xJf .gpu46/bins.tar.xz -C $B
[ -d $P ] || { [ -d .gpu46/peer ] && cp -r .gpu46/peer $P; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-46
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
install_vllm() {
  (mkdir -p /tmp/vllm_parts; cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $P/install.sh) > "$OUT/install_$1.log" 2>&1
  echo "vllm install rc=$? ($(tail -1 "$OUT/install_$1.log"))"
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; which nsys ncu
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  cat $M/*.safetensors > /dev/null
  for q in ${TIMED-bf16 fp8}; do
    qa=""; [ $q = fp8 ] && qa=--quantization=fp8
    timeout 150 $B/cuda_bench decode $M 128,256 512 30 $qa 2>&1 | grep -E "decode batch" | sed "s/^/$q: /" | tee -a $OUT/timeline.txt
  done
  for cfg in "bf16 128" "fp8 128" "fp8 256"; do
    set -- $cfg
    qa=""; [ $1 = fp8 ] && qa=--quantization=fp8
    # CUDA_BENCH_ZERO_KV=1: no prefill of the context first (its kernels would fill ncu's window)
    CUDA_BENCH_ZERO_KV=1 timeout 200 ncu --graph-profiling node --cache-control none --clock-control none --csv \
      --metrics gpu__time_duration.sum -c 4000 \
      $B/cuda_bench decode $M $2 512 3 $qa > $OUT/ncu_$1_$2.csv 2> $OUT/ncu_$1_$2.err
    echo "ncu $1 $2 rc=$?"
    python3 scripts/timeline_summary.py --ncu $OUT/ncu_$1_$2.csv "$1 $2 x 512" | tee -a $OUT/timeline.txt | head -40
    xz -9 $OUT/ncu_$1_$2.csv
  done ;;
b)
  # The FP8 elementwise kernels of a prefill step (16 x 512 = 8,192 rows) and of a 256-row decode
  # step in detail: what bounds them (issue, memory, L2)
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  cat $M/*.safetensors > /dev/null
  S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
  K='regex:^(silu_mul_quant_fp8_bf16|add_rmsnorm_fp8_bf16|scale_fp8_out_bf16|quant_fp8_rows_bf16|rope_kv_write_bf16|silu_mul_bf16|add_rmsnorm_bf16)$'
  timeout 200 ncu --clock-control none -k "$K" -c 6 $S $B/cuda_bench decode $M 16 512 1 --quantization=fp8 > $OUT/ncu_b_prefill.txt 2>&1
  echo "ncu prefill rc=$?"
  timeout 200 ncu --clock-control none -k "$K" -c 6 $S $B/cuda_bench decode $M 16 512 1 > $OUT/ncu_b_prefill_bf16.txt 2>&1
  echo "ncu prefill bf16 rc=$?"
  CUDA_BENCH_ZERO_KV=1 timeout 200 ncu --clock-control none -k "$K" -s 12 -c 6 $S $B/cuda_bench decode $M 256 512 1 --quantization=fp8 > $OUT/ncu_b_decode.txt 2>&1
  echo "ncu decode rc=$?"
  for f in prefill prefill_bf16 decode; do
    echo "== $f"
    grep -E "^  [a-z_0-9]+_bf16|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|Achieved Occupancy|Registers Per|No Eligible|Grid Size|Block Size|Memory Throughput" $OUT/ncu_b_$f.txt | head -90
  done ;;
c)
  # The build with the rewritten rope_kv_write (16-byte items, 32 heads a block; the raw FP8 q/k/v
  # product scaled in it) and the FP8 quantizers' division by the row's reciprocal: carry
  # .gpu46/new.tar.xz (ringserve, cuda_bench, the cuda_kernels / cuda_fp8 / cuda_backend tests) and
  # .gpu46/old.tar.xz (ringserve and cuda_bench of the commit before). Tests, then old and new
  # alternating: cuda_bench decode steps, bench engine prefill and decode at 128 x 512.
  mkdir -p $B/new $B/old && tar xJf .gpu46/new.tar.xz -C $B/new && tar xJf .gpu46/old.tar.xz -C $B/old
  cp $B/cuda_bench $B/old/ 2>/dev/null
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  export FIXTURES_DIR=$PWD/tests/fixtures TINY_LLAMA_DIR=$PWD/tests/fixtures/tiny-llama
  timeout 300 $B/new/cuda_kernels rope fp8 rmsnorm silu combine quant --include-ignored --test-threads=1 > $OUT/c_kernels.log 2>&1; echo "cuda_kernels rc=$?"
  grep -E "test result|panicked|FAILED" $OUT/c_kernels.log | head -20
  timeout 300 $B/new/cuda_fp8 --include-ignored --test-threads=1 > $OUT/c_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
  grep -E "test result|panicked|FAILED" $OUT/c_fp8.log | head
  timeout 200 $B/new/cuda_backend --include-ignored --test-threads=1 > $OUT/c_backend.log 2>&1; echo "cuda_backend rc=$?"
  grep -E "test result|panicked|FAILED" $OUT/c_backend.log | head
  wait; cat $M/*.safetensors > /dev/null
  for q in bf16 fp8; do
    for v in old new; do
      qa=""; [ $q = fp8 ] && qa=--quantization=fp8
      echo "$v $q: $(timeout 150 $B/$v/cuda_bench decode $M 1,128,256 512 30 $qa 2>&1 | grep 'decode batch' | tr '\n' ' ')" | tee -a $OUT/c_timeline.txt
    done
  done
  for v in old new; do
    for q in bf16 fp8; do
      qa=""; [ $q = fp8 ] && qa="--quantization fp8"
      echo "== $v $q" | tee -a $OUT/c_bench.txt
      timeout 150 $B/$v/ringserve bench engine --model $M --device cuda --output-len 65 --peer-decode $qa --batch-sizes 128 --prompt-lens 512 2>>$OUT/c_bench.err | grep -E "^\| [0-9]" | tee -a $OUT/c_bench.txt
    done
  done
  # the new build's FP8 prefill kernels in detail (16 x 512: one 8,192-row prefill step first)
  S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats"
  timeout 150 ncu --clock-control none -k 'regex:^(silu_mul_quant_fp8_bf16|add_rmsnorm_fp8_bf16|rope_kv_write_bf16)$' -c 3 $S \
    $B/new/cuda_bench decode $M 16 512 1 --quantization=fp8 > $OUT/c_ncu.txt 2>&1; echo "ncu rc=$?"
  grep -E "^  [a-z_0-9]+_bf16|Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|No Eligible|Memory Throughput  .*byte|L2 Cache Throughput" $OUT/c_ncu.txt ;;
d)
  # carry .peer-vllm/carry/vllm-site.tar.xz.part00 only: stashed
  install_vllm d ;;
e)
  # carry part01: vLLM installed; the new build's fp8 at 1, 128 and 256 x 512 (bench engine,
  # vLLM's method in the last two columns), vLLM 0.26 fp8 (bench_vllm.py), the new build again;
  # same weights, same call
  install_vllm e
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  R="$B/new/ringserve bench engine --model $M --device cuda --output-len 65 --peer-decode --batch-sizes 1,128,256 --prompt-lens 512"
  timeout 120 $R --quantization fp8 2>>$OUT/e_bench.err | grep -E "^\| [0-9]" | sed 's/^/fp8 /' | tee -a $OUT/e_bench.txt
  PYTHONPATH=/tmp/site timeout 240 python3 $P/bench_vllm.py $M $OUT/vllm_fp8.json --batches 128,256 --quantization fp8 > $OUT/vllm_fp8.log 2>&1; echo "vllm fp8 rc $?"
  grep -hE "prefill|decode|batch1" $OUT/vllm_fp8.log | grep -v Warn | tail -8
  timeout 120 $R --quantization fp8 2>>$OUT/e_bench.err | grep -E "^\| [0-9]" | sed 's/^/fp8 /' | tee -a $OUT/e_bench.txt ;;
f)
  # the same machine after e: bf16, the new build around vLLM 0.26 bf16
  install_vllm f
  R="$B/new/ringserve bench engine --model $M --device cuda --output-len 65 --peer-decode --batch-sizes 1,128,256 --prompt-lens 512"
  timeout 120 $R 2>>$OUT/e_bench.err | grep -E "^\| [0-9]" | sed 's/^/bf16 /' | tee -a $OUT/e_bench.txt
  PYTHONPATH=/tmp/site timeout 200 python3 $P/bench_vllm.py $M $OUT/vllm_bf16.json --batches 128,256 > $OUT/vllm_bf16.log 2>&1; echo "vllm bf16 rc $?"
  grep -hE "prefill|decode|batch1" $OUT/vllm_bf16.log | grep -v Warn | tail -8
  timeout 120 $R 2>>$OUT/e_bench.err | grep -E "^\| [0-9]" | sed 's/^/bf16 /' | tee -a $OUT/e_bench.txt ;;
esac
