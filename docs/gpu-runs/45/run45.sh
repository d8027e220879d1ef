#!/usr/bin/env bash
# Run 45: issue 18's FP8 batch 1 — decode attention's split combine quantizing the o product's
# input (attn_combine_quant_fp8_bf16, KernelSwitches::fuse_o_quant), and RoPE with the KV write in
# the FP8 q/k/v tile GEMV's epilogue (gemv_fp8_rope_kv_t16_*, fuse_rope) measured again, now under
# the one-sequence graphs' programmatic dependent launch (run 41b measured it before PDL: no gain).
# Calls on one warm H200 (a call carries at most 64 MiB):
#   a (carry .gpu45/bins.tar.xz = ringserve, cuda_bench and the cuda_kernels, cuda_fp8,
#      cuda_backend tests built with --features cuda, stripped; peer/ = ../shared/peers/vllm
#      without its parts): the FP8 kernel tests (the two fused kernels against the unfused ones and
#      the CPU quantizer), the FP8 model tests with the new token test, the backend tests; the random
#      8B model; cuda_bench decode fp8 at 1 and 8 x 512 with each fusion on and off, alternating;
#      bench engine fp8 at 1 and 8 x 512, both on and both off
#   b (carry .peer-vllm/carry/…part00): vLLM's first part stashed
#   c (carry part01): vLLM installed; ringserve fp8 (1, 128, 256 x 512), vLLM 0.26 fp8, ringserve
#      fp8 again, in one call (ran with RINGSERVE_CUDA_FUSE_ROPE=0 exported: after call a the
#      build runs that fusion from FP8_ROPE_MIN_ROWS = 2 rows, so the figures are the build's)
#   d (carry .gpu45/bins2.tar.xz): that build's FP8 model tests and cuda_bench decode, defaults
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b45; P=/tmp/peer45; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -f .gpu45/bins.tar.xz ] && tar xJf .gpu45/bins.tar.xz -C $B
[ -d $P ] || cp -r .gpu45/peer $P
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-45 FIXTURES_DIR=$PWD/tests/fixtures
export TINY_LLAMA_DIR=$PWD/tests/fixtures/tiny-llama
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
install_vllm() {
  (mkdir -p /tmp/vllm_parts; cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $P/install.sh) > "$OUT/install_$1.log" 2>&1
  echo "vllm install rc=$? ($(tail -1 "$OUT/install_$1.log"))"
}
E="$B/ringserve bench engine --model $M --device cuda --output-len 65 --peer-decode --quantization fp8"
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  timeout 200 $B/cuda_kernels fp8 rope --include-ignored --test-threads=1 --nocapture > $OUT/kernels.log 2>&1; echo "cuda_kernels fp8 rope rc=$?"
  grep -E "^test |test result|panicked|differ" $OUT/kernels.log | head -30
  timeout 300 $B/cuda_fp8 --include-ignored --test-threads=1 --nocapture > $OUT/cuda_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
  grep -E "^test |test result|panicked|same tokens" $OUT/cuda_fp8.log | head -20
  timeout 200 $B/cuda_backend --include-ignored --test-threads=1 > $OUT/backend.log 2>&1; echo "cuda_backend rc=$?"
  grep -E "test result|panicked" $OUT/backend.log | head
  wait; cat $M/*.safetensors > /dev/null
  for round in 1 2; do
    for cfg in "1 1" "0 1" "1 0" "0 0"; do
      set -- $cfg
      echo "rope=$1 oquant=$2: $(RINGSERVE_CUDA_FUSE_ROPE=$1 RINGSERVE_CUDA_FUSE_O_QUANT=$2 timeout 100 $B/cuda_bench decode $M 1,8 512 40 --quantization=fp8 2>&1 | grep 'decode batch' | tr '\n' ' ')" | tee -a $OUT/timeline.txt
    done
  done
  for round in 1 2; do
    for f in 1 0; do
      echo "== fused=$f, round $round" | tee -a $OUT/bench.txt
      RINGSERVE_CUDA_FUSE_ROPE=$f RINGSERVE_CUDA_FUSE_O_QUANT=$f timeout 100 $E --batch-sizes 1,8 --prompt-lens 512 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
    done
  done
  tail -2 $OUT/bench.err ;;
b)
  install_vllm b ;;
c)
  install_vllm c
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  timeout 120 $E --batch-sizes 1,128,256 --prompt-lens 512 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  PYTHONPATH=/tmp/site timeout 240 python3 $P/bench_vllm.py $M $OUT/vllm_fp8.json --batches 128,256 --quantization fp8 > $OUT/vllm_fp8.log 2>&1; echo "vllm fp8 rc $?"
  grep -hE "prefill|decode|batch1" $OUT/vllm_fp8.log | grep -v Warn | tail -8
  timeout 120 $E --batch-sizes 1,128,256 --prompt-lens 512 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  tail -2 $OUT/bench.err ;;
d)
  # The build after call a (RoPE in the FP8 tile GEMV from FP8_ROPE_MIN_ROWS = 2 rows): carry
  # .gpu45/bins2.tar.xz (cuda_bench and the cuda_fp8 tests); defaults only.
  mkdir -p /tmp/b45d && tar xJf .gpu45/bins2.tar.xz -C /tmp/b45d
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  timeout 300 /tmp/b45d/cuda_fp8 --include-ignored --test-threads=1 --nocapture > $OUT/cuda_fp8_d.log 2>&1; echo "cuda_fp8 rc=$?"
  grep -E "^test |test result|panicked|same tokens" $OUT/cuda_fp8_d.log | head -20
  wait; cat $M/*.safetensors > /dev/null
  for round in 1 2 3; do
    echo "defaults: $(timeout 100 /tmp/b45d/cuda_bench decode $M 1,8 512 40 --quantization=fp8 2>&1 | grep 'decode batch' | tr '\n' ' ')" | tee -a $OUT/timeline_d.txt
  done ;;
esac
