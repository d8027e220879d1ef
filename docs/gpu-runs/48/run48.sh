#!/usr/bin/env bash
# Run 48: run 47's build (HEAD 992712a) beside vLLM 0.26 in the same calls, FP8 and bf16, on one
# machine kept warm between calls (each within ~30 s of the one before):
#   p: carry .gpu48/new.tar.xz and .gpu48/peer: the random 8B model; a first ringserve FP8 round
#   d: carry .peer-vllm/carry/vllm-site.tar.xz.part00: vLLM's part 00 stashed; a ringserve bf16 round
#   e: carry .peer-vllm/carry/vllm-site.tar.xz.part01: vLLM installed; ringserve FP8 / vLLM FP8 /
#      ringserve FP8
#   f: ringserve bf16 / vLLM bf16 / ringserve bf16
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b48; M=/tmp/llama8b; P=/tmp/peer48
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -d $P ] || { [ -d .gpu48/peer ] && cp -r .gpu48/peer $P; }
[ -f .gpu48/new.tar.xz ] && mkdir -p $B/new && tar xJf .gpu48/new.tar.xz -C $B/new
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
esac
