#!/usr/bin/env bash
# Run 50: the INT4 product on Hopper's wgmma (gemm_int4_wgmma_*, issue 20's batch-128 decode), and
# the checks run 49 left waiting (the FP8 cuBLASLt tuning kept on disk). .gpu50/<call>.tar.xz:
# ringserve, cuda_bench and the test binaries of that call's build (--features cuda, stripped).
#   a: cuda_int4 (every INT4 kernel against the f64 reference, the wgmma ones among them; the
#      fixtures through the CUDA backend with and without it); cuda_bench int4 at 32-512 rows; the
#      random 8B AWQ checkpoint, bench engine at 64, 128, 256 x 512 with RINGSERVE_CUDA_INT4_WGMMA
#      1 / 0 / 1 / 0; the FP8 tuning's disk-cache test (cuda_kernels gemm_fp8_matches_cpu) and
#      cuda_fp8, with a kernel cache directory
#   (call a's build: commit 8d6072f, whose wgmma kernels were slower than gemm_int4_mma and
#   dequantization + cuBLAS and were reverted; calls b and c run the next build)
#   b: carry .gpu50/b.tar.xz .peer-vllm/carry/vllm-site.tar.xz.part00: part 00 stashed; cuda_int4;
#      the 8B AWQ and bf16 models; bench engine AWQ at 64, 128 x 512 with RINGSERVE_CUDA_INT4_MMA
#      1 / 0 / 1 / 0 (1: the tensor-core product up to 128 rows on the shape mma_kernel_for picks;
#      0: dequantization + cuBLAS past 32 rows, as 65-128 rows ran before), bf16 at 128 x 512
#   c: carry .peer-vllm/carry/vllm-site.tar.xz.part01 .gpu50/peer: vLLM installed; ringserve AWQ,
#      vLLM 0.26 AWQ (bench_vllm.py, its Machete kernels), ringserve AWQ again
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b50; A=/tmp/awq8b; M=/tmp/llama8b; P=/tmp/peer50; R=/tmp/r50
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B $R
[ -f .gpu50/$1.tar.xz ] && tar xJf .gpu50/$1.tar.xz -C $B
[ -d $P ] || { [ -d .gpu50/peer ] && cp -r .gpu50/peer $P; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-50 FIXTURES_DIR=$PWD/tests/fixtures
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
install_vllm() {
  (mkdir -p /tmp/vllm_parts; cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; [ -f $P/install.sh ] && bash $P/install.sh) > "$OUT/install_$1.log" 2>&1
  echo "vllm install rc=$? ($(tail -1 "$OUT/install_$1.log"))"
}
engine() {  # tag model batches [flags]
  local tag=$1 m=$2 b=$3; shift 3
  timeout 200 $B/ringserve bench engine --model $m --device cuda --batch-sizes $b --prompt-lens 512 \
    --output-len 64 "$@" 2>>$OUT/bench.err | grep -E "^\| [0-9]" | sed "s/^/$tag /" | tee -a $OUT/bench.txt
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  (time python3 scripts/make_random_awq8b.py $A) > $OUT/make_awq.log 2>&1 &
  MK=$!
  timeout 300 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture > $OUT/a_int4.log 2>&1
  echo "cuda_int4 rc $?"; grep -E "^test |panicked|test result|skipped" $OUT/a_int4.log | tail -8
  grep -E "wgmma true prompt of 200" $OUT/a_int4.log | head -3
  timeout 200 $B/cuda_bench int4 $OUT/a_int4_alone.json 32,64,128,256,512 2>&1 | grep -E "^int4" | tee $OUT/a_int4_alone.txt \
    | sed -E 's/, (per-weight|tiles)[^,]*//g' | cut -c1-400
  wait $MK; tail -2 $OUT/make_awq.log
  for w in 1 0 1 0; do RINGSERVE_CUDA_INT4_WGMMA=$w engine wgmma$w $A 64,128,256; done
  timeout 120 $B/cuda_kernels --include-ignored --test-threads 1 gemm_fp8_matches_cpu fused_fp8_silu > $OUT/a_kernels.log 2>&1
  echo "cuda_kernels (fp8 gemm, silu pair) rc $?"; grep -E "^test |test result|panicked|disk cache" $OUT/a_kernels.log | head
  timeout 200 $B/cuda_fp8 --include-ignored --test-threads 1 > $OUT/a_fp8.log 2>&1
  echo "cuda_fp8 rc $?"; grep -E "test result|panicked|FAILED" $OUT/a_fp8.log | head -4 ;;
b)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  install_vllm b
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
    [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  MK=$!
  timeout 300 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture > $OUT/b_int4.log 2>&1
  echo "cuda_int4 rc $?"; grep -E "^test |panicked|test result" $OUT/b_int4.log | tail -5
  grep -E "int4-awq .*prompt of 100" $OUT/b_int4.log | head -4
  wait $MK
  for x in 1 0 1 0; do RINGSERVE_CUDA_INT4_MMA=$x engine mma$x $A 64,128; done
  engine bf16 $M 128 ;;
c)
  install_vllm c
  engine awq $A 1,128
  PYTHONPATH=/tmp/site timeout 300 python3 $P/bench_vllm.py $A $OUT/vllm_awq.json --skip-256 > $OUT/vllm_awq.log 2>&1
  echo "== vllm awq rc=$?"; grep -E "Using .* for" $OUT/vllm_awq.log | head -2; grep -hE "prefill|decode|batch1" $OUT/vllm_awq.log | grep -v Warn | tail -6
  engine awq $A 1,128 ;;
esac
