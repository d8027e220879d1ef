#!/usr/bin/env bash
# Run 39: what rope_kv_write a warp a head and the FP8 gate/up scaling folded into SiLU-mul's
# quantization (both from run 38's last commit, tested in run 38 call d) give on prefill, beside
# vLLM 0.26 in the same call. Two calls on one warm H200, each carrying .gpu39/peer
# (../shared/peers/vllm without its parts) and one part of vLLM as .peer-vllm/carry/…:
#   a (+ part00): the random 8B model; vLLM's first part stashed
#   b (+ part01, .gpu39/ringserve.tar.xz: ringserve built with --features cuda, stripped, xz): vLLM
#      installed; vLLM bf16 at 512-token prompts (batch 128); ringserve `bench engine --peer-decode`
#      bf16 128 x 512 and 32 x 3,900, FP8 1,128 x 512; vLLM bf16 at 3,900 (32); vLLM FP8 at 512
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b39; P=.gpu39/peer; M=/tmp/llama8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
for t in .gpu39/*.tar.xz; do [ -f "$t" ] && tar xJf "$t" -C $B; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-39 FIXTURES_DIR=$PWD/tests/fixtures
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
install_vllm() {
  (mkdir -p /tmp/vllm_parts; cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $P/install.sh) > "$OUT/install_$1.log" 2>&1
  echo "vllm install rc=$? ($(tail -1 "$OUT/install_$1.log"))"
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  install_vllm a &
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  wait; ls $M ;;
b)
  install_vllm b
  V="timeout 200 python3 $P/bench_vllm.py $M"
  E="$B/ringserve bench engine --model $M --device cuda --max-model-len 4096 --output-len 65 --peer-decode"
  PYTHONPATH=/tmp/site $V $OUT/vllm_512.json --batches 128 > $OUT/vllm_512.log 2>&1; echo "vllm 512 rc $?"
  grep -hE "prefill|decode|batch1" $OUT/vllm_512.log | grep -v Warn | tail -6
  timeout 100 $E --batch-sizes 128 --prompt-lens 512 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  timeout 100 $E --batch-sizes 32 --prompt-lens 3900 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  timeout 120 $E --batch-sizes 1,128 --prompt-lens 512 --quantization fp8 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  tail -2 $OUT/bench.err
  PYTHONPATH=/tmp/site $V $OUT/vllm_3900.json --prompt-len 3900 --batches 32 --max-model-len 4096 > $OUT/vllm_3900.log 2>&1; echo "vllm 3900 rc $?"
  grep -hE "prefill|decode|batch1" $OUT/vllm_3900.log | grep -v Warn | tail -6
  PYTHONPATH=/tmp/site $V $OUT/vllm_fp8.json --batches 128 --quantization fp8 > $OUT/vllm_fp8.log 2>&1; echo "vllm fp8 rc $?"
  grep -hE "prefill|decode|batch1" $OUT/vllm_fp8.log | grep -v Warn | tail -6 ;;
esac
