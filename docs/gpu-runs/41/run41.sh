#!/usr/bin/env bash
# Run 41: the FP8 tile GEMV (gemv_fp8_t16_*). Calls on one warm H200 (a call carries at most 64 MiB
# with the tree, so the binaries travel in call a and stay in $B; the two parts of vLLM one a call):
#   a (carry .gpu41: bins.tar.xz = ringserve, cuda_bench, cuda_kernels, cuda_fp8 built with
#      --features cuda, stripped; peer/ = ../shared/peers/vllm without its parts): FP8 kernel and
#      model tests; cuda_bench gemv (every FP8 GEMV choice alone at the 8B shapes); the random 8B
#      model; bench engine --quantization fp8 at 1 and 8 x 512 with each RINGSERVE_CUDA_FP8_GEMV
#   b (carry .gpu41 rebuilt: more tile variants, RoPE fused into the FP8 q/k/v tile GEMV): the FP8
#      kernel and model tests again, cuda_bench gemv, bench engine fp8 1 and 8 x 512 with the
#      fusion off and on, and r16 (the fusion gained nothing and was removed)
#   c (carry .gpu41 rebuilt: ringserve and cuda_fp8 with the tile kernel picked by size): the FP8
#      model test; bench engine fp8 1 and 8 x 512 with RINGSERVE_CUDA_FP8_GEMV auto, r16, t16_d4x
#   d (carry .peer-vllm/carry/…part00): vLLM's first part stashed
#   e (+ part01): vLLM installed; ringserve fp8 (batch 1, 128, 256 x 512), vLLM 0.26 fp8, ringserve
#      fp8 again
#   f: bf16 prefill at vLLM's offline step budget (16,384 tokens, what its LLM class uses on this
#      GPU) and at ringserve's default (8,192), around vLLM bf16
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b41; P=/tmp/peer41; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -f .gpu41/bins.tar.xz ] && tar xJf .gpu41/bins.tar.xz -C $B
[ -d $P ] || cp -r .gpu41/peer $P
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-41 FIXTURES_DIR=$PWD/tests/fixtures
export TINY_LLAMA_DIR=$PWD/tests/fixtures/tiny-llama
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
install_vllm() {
  (mkdir -p /tmp/vllm_parts; cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $P/install.sh) > "$OUT/install_$1.log" 2>&1
  echo "vllm install rc=$? ($(tail -1 "$OUT/install_$1.log"))"
}
E="$B/ringserve bench engine --model $M --device cuda --output-len 65 --peer-decode"
V="timeout 240 python3 $P/bench_vllm.py $M"
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  timeout 200 $B/cuda_kernels fp8 --include-ignored --test-threads=1 --nocapture > $OUT/kernels.log 2>&1; echo "cuda_kernels fp8 rc=$?"
  grep -E "gemv_fp8 m|test result|panicked" $OUT/kernels.log | head -20
  timeout 200 $B/cuda_fp8 --include-ignored --test-threads=1 --nocapture > $OUT/cuda_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
  grep -E "test result|panicked|rel L2" $OUT/cuda_fp8.log | head -20
  timeout 150 $B/cuda_bench gemv $OUT/gemv.json > $OUT/gemv.log 2>&1; echo "cuda_bench gemv rc=$?"
  grep -E "fp8 gemv" $OUT/gemv.log
  wait
  for c in r16 t16_d4 t16_d6 t16_d8x t16_d4x r16 t16_d4; do
    echo "== fp8, RINGSERVE_CUDA_FP8_GEMV=$c" | tee -a $OUT/bench.txt
    RINGSERVE_CUDA_FP8_GEMV=$c timeout 100 $E --batch-sizes 1,8 --prompt-lens 512 --quantization fp8 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  done
  tail -2 $OUT/bench.err ;;
b)
  timeout 200 $B/cuda_kernels fp8 --include-ignored --test-threads=1 --nocapture > $OUT/kernels.log 2>&1; echo "cuda_kernels fp8 rc=$?"
  grep -E "gemv_fp8 m|fp8 q/k/v|test result|panicked" $OUT/kernels.log | head -40
  timeout 200 $B/cuda_fp8 --include-ignored --test-threads=1 --nocapture > $OUT/cuda_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
  grep -E "test result|panicked|rel L2" $OUT/cuda_fp8.log | head -20
  timeout 150 $B/cuda_bench gemv $OUT/gemv.json > $OUT/gemv.log 2>&1; echo "cuda_bench gemv rc=$?"
  grep -E "fp8 gemv" $OUT/gemv.log | grep -E "m1:|m8:"
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 )
  for c in "FP8_GEMV=r16" "FUSE_ROPE=0" "FUSE_ROPE=1" "FP8_GEMV=r16" "FUSE_ROPE=0" "FUSE_ROPE=1"; do
    echo "== fp8, RINGSERVE_CUDA_$c" | tee -a $OUT/bench.txt
    env RINGSERVE_CUDA_$c timeout 100 $E --batch-sizes 1,8 --prompt-lens 512 --quantization fp8 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  done
  tail -2 $OUT/bench.err ;;
c)
  timeout 200 $B/cuda_fp8 --include-ignored --test-threads=1 --nocapture > $OUT/cuda_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
  grep -E "test result|panicked|rel L2" $OUT/cuda_fp8.log | head -20
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 )
  for c in auto r16 t16_d4x auto r16 t16_d4x; do
    echo "== fp8, RINGSERVE_CUDA_FP8_GEMV=$c" | tee -a $OUT/bench.txt
    RINGSERVE_CUDA_FP8_GEMV=$c timeout 100 $E --batch-sizes 1,8 --prompt-lens 512 --quantization fp8 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  done
  tail -2 $OUT/bench.err ;;
d)
  install_vllm d ;;
e)
  install_vllm e
  timeout 120 $E --batch-sizes 1,128,256 --prompt-lens 512 --quantization fp8 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  PYTHONPATH=/tmp/site $V $OUT/vllm_fp8.json --batches 128,256 --quantization fp8 > $OUT/vllm_fp8.log 2>&1; echo "vllm fp8 rc $?"
  grep -hE "prefill|decode|batch1" $OUT/vllm_fp8.log | grep -v Warn | tail -8
  timeout 120 $E --batch-sizes 1,128,256 --prompt-lens 512 --quantization fp8 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  tail -2 $OUT/bench.err ;;
f)
  for t in 8192 16384; do
    echo "== bf16, --max-num-batched-tokens $t" | tee -a $OUT/bench.txt
    timeout 100 $E --batch-sizes 128 --prompt-lens 512 --max-num-batched-tokens $t 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  done
  PYTHONPATH=/tmp/site $V $OUT/vllm_512.json --batches 128 > $OUT/vllm_512.log 2>&1; echo "vllm 512 rc $?"
  grep -hE "prefill|decode|batch1|max_num_batched" $OUT/vllm_512.log | grep -v Warn | tail -6
  for t in 16384 8192; do
    echo "== bf16, --max-num-batched-tokens $t" | tee -a $OUT/bench.txt
    timeout 100 $E --batch-sizes 128 --prompt-lens 512 --max-num-batched-tokens $t 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  done
  tail -2 $OUT/bench.err ;;
esac
