#!/usr/bin/env bash
# Run 48: run 47's build (HEAD 992712a) beside vLLM 0.26 in the same calls, FP8 and bf16, on one
# machine kept warm between calls (each within ~30 s of the one before):
#   p: carry .gpu48/new.tar.xz and .gpu48/peer: the random 8B model; a first ringserve FP8 round
#   d: carry .peer-vllm/carry/vllm-site.tar.xz.part00: vLLM's part 00 stashed; a ringserve bf16 round
#   e: carry .peer-vllm/carry/vllm-site.tar.xz.part01: vLLM installed; ringserve FP8 / vLLM FP8 /
#      ringserve FP8
#   f: ringserve bf16 / vLLM bf16 / ringserve bf16
#   n: carry .gpu48/new.tar.xz: ncu of the FP8 SiLU·mul quantizer on a prefill chunk's 8,176 rows
# Then the build with fewer instructions an element in the FP8 quantizers and SiLU (new) against
# HEAD 992712a's (old, the build above):
#   r: carry .gpu48/new.tar.xz and .gpu48/old.tar.xz: every SiLU·mul quantizer alone, old and new;
#      the tests
#   s: old and new alternating: bench engine 128 x 512 FP8 and bf16, cuda_bench decode FP8
#   d, e again on s's machine (its $B/new the new build): d carried part 00 only and its install
#   stopped for want of .gpu48/peer (the part stashed all the same); e carried part 01 and
#   .gpu48/peer: ringserve FP8 / vLLM FP8 / ringserve FP8 with the new build
# Then the FP8 cuBLASLt products of a decode graph tuned (the fastest of cuBLASLt's first 8
# candidates, as bf16's are), RoPE's raw-product rounding two values a cvt (new) against the build
# above (old):
#   t: carry .gpu48/new.tar.xz and .gpu48/old.tar.xz: the tests; cuda_bench decode FP8 and bench
#      engine FP8 at 128 and 256 rows, old and new alternating; the tuning's choices (debug log)
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b48; M=/tmp/llama8b; P=/tmp/peer48
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -d $P ] || { [ -d .gpu48/peer ] && cp -r .gpu48/peer $P; }
for v in new old; do [ -f .gpu48/$v.tar.xz ] && mkdir -p $B/$v && tar xJf .gpu48/$v.tar.xz -C $B/$v; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-48
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
install_vllm() {
  (mkdir -p /tmp/vllm_parts; cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $P/install.sh) > "$OUT/install_$1.log" 2>&1
  echo "vllm install rc=$? ($(tail -1 "$OUT/install_$1.log"))"
}
R="$B/new/ringserve bench engine --model $M --device cuda --output-len 65 --peer-decode --batch-sizes 1,128,256 --prompt-lens 512"
ours() {  # tag, flags...
  local tag=$1; shift
  timeout 120 $R "$@" 2>>$OUT/${tag}_bench.err | grep -E "^\| [0-9]" | sed "s/^/$tag /" | tee -a $OUT/bench.txt
}
peer() {  # tag, flags...
  local tag=$1; shift
  PYTHONPATH=/tmp/site timeout 240 python3 $P/bench_vllm.py $M $OUT/vllm_$tag.json --batches 128,256 "$@" > $OUT/vllm_$tag.log 2>&1; echo "vllm $tag rc $?"
  grep -hE "prefill|decode|batch1" $OUT/vllm_$tag.log | grep -v Warn | tail -8
}
case "$1" in
p)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  cat $M/*.safetensors > /dev/null
  ours fp8 --quantization fp8 ;;
d)
  install_vllm d
  ours bf16 ;;
e)
  install_vllm e
  ours fp8 --quantization fp8
  peer fp8 --quantization fp8
  ours fp8 --quantization fp8 ;;
f)
  ours bf16
  peer bf16
  ours bf16 ;;
n)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  timeout 60 $B/new/cuda_bench silu-quant 2>&1 | tee $OUT/n_silu.txt
  S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats --section SchedulerStats"
  timeout 200 ncu --clock-control none -k "regex:^silu_mul_quant_fp8_bf16\$" -c 1 $S $B/new/cuda_bench silu-quant > $OUT/n_ncu_silu.txt 2>&1; echo "ncu rc=$?"
  grep -E "Duration|DRAM Throughput|L1/TEX Hit|L2 Hit|L1/TEX Cache Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|Achieved Occupancy|Theoretical Occupancy|Registers Per|No Eligible|Warp Cycles Per Issued|Mem Busy|Max Bandwidth|Block Limit" $OUT/n_ncu_silu.txt ;;
r)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  for v in old new old new; do timeout 60 $B/$v/cuda_bench silu-quant 2>&1 | sed "s/^/$v /" | tee -a $OUT/r_silu.txt; done
  timeout 240 $B/new/cuda_kernels --include-ignored --test-threads=1 > $OUT/r_kernels.log 2>&1; echo "cuda_kernels rc=$?"
  grep -E "test result|panicked|FAILED" $OUT/r_kernels.log | head -20
  timeout 240 $B/new/cuda_fp8 --include-ignored --test-threads=1 > $OUT/r_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
  grep -E "test result|panicked|FAILED" $OUT/r_fp8.log | head
  timeout 240 $B/new/cuda_backend --include-ignored --test-threads=1 > $OUT/r_backend.log 2>&1; echo "cuda_backend rc=$?"
  grep -E "test result|panicked|FAILED" $OUT/r_backend.log | head
  wait ;;
s)
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  cat $M/*.safetensors > /dev/null
  E="ringserve bench engine --model $M --device cuda --output-len 65 --peer-decode --batch-sizes 128 --prompt-lens 512"
  for v in old new old new; do
    echo "$v fp8 $(timeout 60 $B/$v/$E --quantization fp8 2>>$OUT/s_bench.err | grep -E '^\| [0-9]')" | tee -a $OUT/s_bench.txt
  done
  for v in old new; do
    echo "$v bf16 $(timeout 60 $B/$v/$E 2>>$OUT/s_bench.err | grep -E '^\| [0-9]')" | tee -a $OUT/s_bench.txt
  done
  for v in old new; do
    echo "$v fp8: $(timeout 90 $B/$v/cuda_bench decode $M 1,128,256 512 30 --quantization=fp8 2>&1 | grep 'decode batch' | tr '\n' ' ')" | tee -a $OUT/s_timeline.txt
  done ;;
t)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  timeout 240 $B/new/cuda_kernels --include-ignored --test-threads=1 > $OUT/t_kernels.log 2>&1; echo "cuda_kernels rc=$?"
  grep -E "test result|panicked|FAILED|fp8 gemm" $OUT/t_kernels.log | head -20
  timeout 240 $B/new/cuda_fp8 --include-ignored --test-threads=1 > $OUT/t_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
  grep -E "test result|panicked|FAILED" $OUT/t_fp8.log | head
  timeout 240 $B/new/cuda_backend --include-ignored --test-threads=1 > $OUT/t_backend.log 2>&1; echo "cuda_backend rc=$?"
  grep -E "test result|panicked|FAILED" $OUT/t_backend.log | head
  wait; cat $M/*.safetensors > /dev/null
  for v in old new; do
    echo "$v fp8: $(timeout 90 $B/$v/cuda_bench decode $M 128,256 512 30 --quantization=fp8 2>&1 | grep 'decode batch' | tr '\n' ' ')" | tee -a $OUT/t_timeline.txt
  done
  E="ringserve bench engine --model $M --device cuda --output-len 65 --peer-decode --batch-sizes 128,256 --prompt-lens 512 --quantization fp8"
  RUST_LOG=info,worker::backend::cuda::backend=debug timeout 60 $B/new/$E 2> $OUT/t_tuning.log | grep -E '^\| [0-9]' | sed 's/^/new /' | tee -a $OUT/t_bench.txt
  grep "fp8 cuBLASLt tuning" $OUT/t_tuning.log | sed 's/.*tuning//' | head -12
  for v in old new old; do
    timeout 60 $B/$v/$E 2>>$OUT/t_bench.err | grep -E '^\| [0-9]' | sed "s/^/$v /" | tee -a $OUT/t_bench.txt
  done ;;
esac
