#!/usr/bin/env bash
# Run 58 (2026-12-07): the wgmma INT4 product with mbarriers in place of the block's barrier (`m5`:
# a five-slot ring, two steps in flight, the two warpgroups free to drift a step apart) against
# `p4` (the default: four slots, a __syncthreads every step).
# .gpu58/a.tar.xz: ringserve, cuda_bench, cuda_int4 of the build with `m5` (--features cuda, stripped).
#   a: the INT4 kernel test (every wgmma kernel at odd shapes, split and not); cuda_bench int4 at
#      128 and 256 rows; bench engine on the random 8B AWQ model at 128 and 256 x 512 with
#      RINGSERVE_CUDA_INT4_WGMMA p4 / m5 alternating, twice; the INT4 model test with the time left
# vLLM 0.26 beside this build's INT4 in one lease (three calls, one machine kept warm):
#   b (carry .gpu58/peer: vLLM's install.sh, SHA256SUMS, bench_vllm.py and extra wheels; and
#      .peer-vllm/carry/vllm-site.tar.xz.part00): part 00 stashed; the AWQ model written
#   c (carry .gpu58/peer and part01): vLLM installed; bench_vllm.py on the AWQ checkpoint
#      (Machete) at 1, 128 and 256
#   d (carry .gpu58/a.tar.xz): ringserve on the same checkpoint at 1, 128, 256 x 512, engine
#      steps, then vLLM's method (--peer-decode)
# .gpu58/e.tar.xz: the same three of the build with 256 activation rows a block (`p4_b256`,
# `p6_b256`; `m5` gone).
#   e: the INT4 kernel test; cuda_bench int4 at 160 and 256 rows; bench engine AWQ 256 x 512 with
#      p4 / p4_b256 / p6_b256 / p4 / p6_b256; the INT4 model test with the time left (its switches
#      are its own: Auto, then `p4` everywhere)
# .gpu58/f.tar.xz: ringserve and cuda_int4 of the final build (Auto: `p4` up to 128 rows,
# `p6_b256` past them).
#   f: the INT4 model test (its 200-token prompt now on p6_b256); bench engine AWQ 192 and 256 x
#      512; the INT4 kernel test with the time left
set -uo pipefail
cd "$(dirname "$0")/../../.."
A=/tmp/awq8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/a
[ -f /tmp/a/cuda_int4 ] || [ ! -f .gpu58/a.tar.xz ] || tar xJf .gpu58/a.tar.xz -C /tmp/a
mkdir -p /tmp/f; [ -f /tmp/f/cuda_int4 ] || [ ! -f .gpu58/f.tar.xz ] || tar xJf .gpu58/f.tar.xz -C /tmp/f
mkdir -p /tmp/e; [ -f /tmp/e/cuda_int4 ] || [ ! -f .gpu58/e.tar.xz ] || tar xJf .gpu58/e.tar.xz -C /tmp/e
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-58 FIXTURES_DIR=$PWD/tests/fixtures
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
P=/tmp/peer58; [ -d $P ] || { [ -d .gpu58/peer ] && cp -r .gpu58/peer $P; }
install_vllm() {
  (mkdir -p /tmp/vllm_parts; cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $P/install.sh) > "$OUT/install_$1.log" 2>&1
  echo "vllm install rc=$? ($(tail -1 "$OUT/install_$1.log"))"
}
peer() {  # tag bindir model batches: decode as vLLM's script measures it
  timeout 150 $2/ringserve bench engine --model $3 --device cuda --batch-sizes $4 --prompt-lens 512 \
    --output-len 65 --peer-decode 2>>$OUT/bench.err | grep -E "^\| [0-9]" | sed "s/^/$1 /" | tee -a $OUT/bench.txt
}
engine() {  # tag bindir model batches [flags]
  local tag=$1 b=$2 m=$3 n=$4; shift 4
  timeout 200 $b/ringserve bench engine --model $m --device cuda --batch-sizes $n --prompt-lens 512 \
    --output-len 64 "$@" 2>>$OUT/bench.err | grep -E "^\| [0-9]" | sed "s/^/$tag /" | tee -a $OUT/bench.txt
}
int4() {  # tag rows [bindir]
  timeout 120 ${3:-/tmp/a}/cuda_bench int4 $OUT/int4_$1.json $2 2>&1 | grep -E "^int4|rror" | \
    sed -E 's/, (per-weight|tiles|mma_|mmas_)[^,]*//g; s/gemm_int4_//g; s/ \([0-9]+ TFLOP\/s\)//g' | sed "s/^/$1 /" | tee -a $OUT/int4.txt
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 ) &
  MK=$!
  timeout 150 /tmp/a/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/a_kernels.log 2>&1
  rc=$?; echo "cuda_int4 int4_kernels rc $rc at ${SECONDS} s"; grep -E "^test |panicked|test result" $OUT/a_kernels.log | tail -3
  [ $rc -eq 0 ] || exit 1
  int4 r128 128; int4 r256 256
  wait $MK; echo "model ready at ${SECONDS} s"
  for r in 1 2; do for v in p4 m5; do
    RINGSERVE_CUDA_INT4_WGMMA=$v engine $v$r /tmp/a $A 128,256
  done; done
  left=$((570 - SECONDS)); echo "engine done at ${SECONDS} s; model test gets ${left} s"
  [ $left -gt 30 ] && RINGSERVE_CUDA_INT4_WGMMA=m5 timeout $left /tmp/a/cuda_int4 --include-ignored --test-threads 1 --nocapture model > $OUT/a_model.log 2>&1
  echo "cuda_int4 model (m5) rc $?"; grep -E "^test |panicked|test result" $OUT/a_model.log | cut -c1-140 | tail -8 ;;
b)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  install_vllm b
  [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
  tail -1 $OUT/make_awq.log ;;
c)
  install_vllm c
  PYTHONPATH=/tmp/site timeout 400 python3 $P/bench_vllm.py $A $OUT/vllm_awq.json > $OUT/vllm_awq.log 2>&1
  echo "== vllm awq rc=$?"; grep -E "Using .* for" $OUT/vllm_awq.log | head -2; grep -hE "prefill|decode|batch1" $OUT/vllm_awq.log | grep -v Warn | tail -5 ;;
d)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  engine d /tmp/a $A 1,128,256
  peer d_peer /tmp/a $A 1,128,256 ;;
e)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 ) &
  MK=$!
  timeout 170 /tmp/e/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/e_kernels.log 2>&1
  rc=$?; echo "cuda_int4 int4_kernels rc $rc at ${SECONDS} s"; grep -E "^test |panicked|test result" $OUT/e_kernels.log | tail -3
  [ $rc -eq 0 ] || exit 1
  int4 e160 160 /tmp/e; int4 e256 256 /tmp/e
  wait $MK; echo "model ready at ${SECONDS} s"
  for v in p4 p4_b256 p6_b256 p4 p6_b256; do RINGSERVE_CUDA_INT4_WGMMA=$v engine e_$v /tmp/e $A 256; done
  left=$((560 - SECONDS)); echo "engine done at ${SECONDS} s; model test gets ${left} s"
  [ $left -gt 30 ] && RINGSERVE_CUDA_INT4_WGMMA=p6_b256 timeout $left /tmp/e/cuda_int4 --include-ignored --test-threads 1 --nocapture model > $OUT/e_model.log 2>&1
  echo "cuda_int4 model rc $?"; grep -E "^test |panicked|test result" $OUT/e_model.log | cut -c1-140 | tail -8 ;;
f)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 ) &
  MK=$!
  timeout 120 /tmp/f/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_models > $OUT/f_model.log 2>&1
  echo "cuda_int4 int4_models rc $? at ${SECONDS} s"; grep -E "^test |panicked|test result" $OUT/f_model.log | tail -3
  grep -E "prompt of 200" $OUT/f_model.log | cut -c1-140 | head -4
  wait $MK; echo "model ready at ${SECONDS} s"
  engine f /tmp/f $A 192,256
  left=$((235 - SECONDS)); echo "engine done at ${SECONDS} s; kernel test gets ${left} s"
  [ $left -gt 20 ] && timeout $left /tmp/f/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/f_kernels.log 2>&1
  echo "cuda_int4 int4_kernels rc $?"; grep -E "^test |panicked|test result" $OUT/f_kernels.log | tail -2 ;;
esac
