#!/usr/bin/env bash
# Run 52: the INT4 product on Hopper's wgmma (gemm_int4_wgmma_s{3,4,6}[_w4]: weights dequantized in
# registers as wgmma's A operand, activations and codes through a cp.async ring) against the
# mma.sync families (scaled and dequantizing) and dequantization + cuBLAS; issue 20's batch-128
# decode. .gpu52/<call>.tar.xz: ringserve, cuda_bench and cuda_int4 of that call's build
# (--features cuda, stripped).
#   a: cuda_int4 (every kernel at odd shapes against the f64 product, the wgmma kernels among them,
#      split and not; the fixtures through the CUDA backend with wgmma and without); the random 8B
#      AWQ and bf16 models; cuda_bench int4 at 64, 128 rows; bench engine AWQ at 128 x 512
#      with RINGSERVE_CUDA_INT4_WGMMA 0 / s3 / s4_w4 / 0, bf16 at 128 x 512
#   k: a's cuda_bench int4 (128 rows) and the kernel test alone, carrying .gpu52/a.tar.xz
#   e: (after a, same machine) AWQ 128 and 256 x 512 with the switch s3 / 0 / s3, and s3 by
#      vLLM's method
# b, c, d: on one warm machine, calls chained (the tree, a vLLM part and a build pass the 64 MiB a
# call carries together, so the parts travel alone):
#   b: carry .peer-vllm/carry/vllm-site.tar.xz.part00: part 00 stashed; the random 8B AWQ and
#      bf16 models
#   c: carry .peer-vllm/carry/vllm-site.tar.xz.part01 .gpu52/peer: vLLM installed
#   d: carry .gpu52/d.tar.xz: ringserve AWQ 1, 128 x 512 (engine steps, then vLLM's method); vLLM
#      0.26 bench_vllm.py on the same checkpoint (Machete); ringserve AWQ again; bf16 1, 128
#      (as run: a's build, carrying nothing, RINGSERVE_CUDA_INT4_WGMMA=s3 exported, up to the
#      second `engine awq2`)
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b52; A=/tmp/awq8b; G=/tmp/gptq8b; M=/tmp/llama8b; P=/tmp/peer52
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -f .gpu52/$1.tar.xz ] && tar xJf .gpu52/$1.tar.xz -C $B
[ -d $P ] || { [ -d .gpu52/peer ] && cp -r .gpu52/peer $P; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-52 FIXTURES_DIR=$PWD/tests/fixtures
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
peer() {  # tag model batches: decode as vLLM's script measures it
  timeout 150 $B/ringserve bench engine --model $2 --device cuda --batch-sizes $3 --prompt-lens 512 \
    --output-len 65 --peer-decode 2>>$OUT/bench.err | grep -E "^\| [0-9]" | sed "s/^/$1 /" | tee -a $OUT/bench.txt
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
    [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  MK=$!
  timeout 150 $B/cuda_bench int4 $OUT/a_int4_alone.json 64,128 2>&1 | grep -E "^int4" > $OUT/a_int4_alone.txt
  sed -E 's/, (per-weight|tiles)[^,]*//g; s/gemm_int4_//g; s/ \([0-9]+ TFLOP\/s\)//g' $OUT/a_int4_alone.txt | grep -E "m(64|128)" | cut -c1-700
  timeout 200 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture > $OUT/a_int4.log 2>&1
  echo "cuda_int4 rc $?"; grep -E "^test |panicked|test result" $OUT/a_int4.log | tail -5
  grep -E "int4-awq .*prompt of 100" $OUT/a_int4.log | head -6
  wait $MK; tail -1 $OUT/make_awq.log; tail -1 $OUT/make_model.log
  for x in 0 s3 s4_w4 0; do RINGSERVE_CUDA_INT4_WGMMA=$x engine wgmma_$x $A 128; done
  engine bf16 $M 128 ;;
k)  # a's first half alone, for a short lease: the products alone, then the kernel test
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  timeout 120 $B/cuda_bench int4 $OUT/k_int4_alone.json 128 2>&1 | grep -E "^int4" > $OUT/k_int4_alone.txt
  sed -E 's/, (per-weight|tiles)[^,]*//g; s/gemm_int4_//g; s/ \([0-9]+ TFLOP\/s\)//g' $OUT/k_int4_alone.txt | cut -c1-700
  timeout 200 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/k_int4.log 2>&1
  echo "cuda_int4 kernels rc $?"; grep -E "^test |panicked|test result" $OUT/k_int4.log | tail -5 ;;
e)  # after a, on its warm machine: 128 and 256 rows with the switch s3 / 0 / s3, then vLLM's method
  for x in s3 0 s3; do RINGSERVE_CUDA_INT4_WGMMA=$x engine w_$x $A 128,256; done
  RINGSERVE_CUDA_INT4_WGMMA=s3 peer peer_s3 $A 128 ;;
b)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  install_vllm b
  [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  tail -qn1 $OUT/make_*.log ;;
c)
  install_vllm c ;;
d)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  engine awq $A 1,128
  peer awq_peer $A 128
  PYTHONPATH=/tmp/site timeout 200 python3 $P/bench_vllm.py $A $OUT/vllm_awq.json --skip-256 > $OUT/vllm_awq.log 2>&1
  echo "== vllm awq rc=$?"; grep -E "Using .* for" $OUT/vllm_awq.log | head -2; grep -hE "prefill|decode|batch1" $OUT/vllm_awq.log | grep -v Warn | tail -4
  engine awq2 $A 1,128
  peer awq2_peer $A 128
  engine bf16 $M 1,128 ;;
esac
