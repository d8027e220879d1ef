#!/usr/bin/env bash
# Run 51: the scaled INT4 tensor-core product (gemm_int4_mmas_*: operands q - z, scales on each
# step's f32 sums, weights and scales through the shared-memory ring with the activations) against
# the dequantizing one (gemm_int4_mma_*) and dequantization + cuBLAS; issue 20's batch-128 decode.
# .gpu51/<call>.tar.xz: ringserve, cuda_bench and cuda_int4 of that call's build (--features cuda,
# stripped).
#   a: cuda_int4 (every kernel at odd shapes against the f64 product, the scaled family among
#      them; the fixtures through the CUDA backend, scaled on and off); the random 8B AWQ and bf16
#      models; cuda_bench int4 at 64, 128, 256 rows (all eight tensor-core kernels); bench engine
#      AWQ at 64, 128 x 512 with RINGSERVE_CUDA_INT4_MMA_SCALED 1 / 0 / 1 / 0 and
#      RINGSERVE_CUDA_INT4_MMA=0 (dequantization + cuBLAS), bf16 at 128 x 512
# b, c, d: on one warm machine, calls chained (the tree, a vLLM part and a build pass the 64 MiB a
# call carries together, so the parts travel alone):
#   b: carry .peer-vllm/carry/vllm-site.tar.xz.part00: part 00 stashed; the random 8B AWQ,
#      GPTQ (symmetric) and bf16 models
#   c: carry .peer-vllm/carry/vllm-site.tar.xz.part01 .gpu51/peer: vLLM installed
#   d: carry .gpu51/d.tar.xz (ringserve of commit 78c5b62): ringserve AWQ 1, 64, 128 x 512, GPTQ
#      1, 128; vLLM 0.26 bench_vllm.py on both (Machete); ringserve AWQ again; bf16 1, 128
#   f: carry .gpu51/f.tar.xz (cuda_bench and cuda_int4 with two more scaled kernels that take two
#      steps a barrier, gemm_int4_mmas_t2w4_p2s6 and _t1w4_p2s4): the kernel test; the products
#      alone at 64, 128 rows; ncu's stall reasons of the 2-tile kernels at 128 rows (gate/up)
#      (the variants were no faster and were not kept: that build is 78c5b62 plus them)
#   g: carry .gpu51/d.tar.xz, right after f on the same machine: the random 8B AWQ and bf16 models;
#      bench engine --peer-decode AWQ 64, 128 x 512 with RINGSERVE_CUDA_INT4_MMA_SCALED 1 / 0 / 1,
#      bf16 at 128 x 512
#   h: carry .gpu51/h.tar.xz (cuda_int4 of the final build: both tensor-core families share one
#      store of their accumulators): every INT4 test
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b51; A=/tmp/awq8b; G=/tmp/gptq8b; M=/tmp/llama8b; P=/tmp/peer51
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -f .gpu51/$1.tar.xz ] && tar xJf .gpu51/$1.tar.xz -C $B
[ -d $P ] || { [ -d .gpu51/peer ] && cp -r .gpu51/peer $P; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-51 FIXTURES_DIR=$PWD/tests/fixtures
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
ncu_one() {  # shape rows kernel
  local S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section InstructionStats --section SchedulerStats --section ComputeWorkloadAnalysis"
  timeout 120 ncu --clock-control none -k regex:gemm_int4_mma -s 1 -c 1 $S $B/cuda_bench int4one $1 $2 $3 >> $OUT/$4_ncu.txt 2>&1
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
    [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  MK=$!
  timeout 240 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture > $OUT/a_int4.log 2>&1
  echo "cuda_int4 rc $?"; grep -E "^test |panicked|test result" $OUT/a_int4.log | tail -5
  grep -E "int4-awq .*prompt of 100" $OUT/a_int4.log | head -5
  timeout 150 $B/cuda_bench int4 $OUT/a_int4_alone.json 64,128,256 2>&1 | grep -E "^int4" > $OUT/a_int4_alone.txt
  sed -E 's/, (per-weight|tiles)[^,]*//g; s/gemm_int4_//g' $OUT/a_int4_alone.txt | grep -E "m(64|128|256)" | cut -c1-600
  wait $MK; tail -1 $OUT/make_awq.log; tail -1 $OUT/make_model.log
  for x in 1 0 1 0; do RINGSERVE_CUDA_INT4_MMA_SCALED=$x engine scaled$x $A 64,128; done
  RINGSERVE_CUDA_INT4_MMA=0 engine dequant $A 64,128
  engine bf16 $M 128
  ncu_one gate_up 128 gemm_int4_mmas_t2w4 a; ncu_one down 128 gemm_int4_mmas_t1w4 a
  grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Instructions  " $OUT/a_ncu.txt | head -24 ;;
b)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  install_vllm b
  [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
  [ -f $G/config.json ] || python3 scripts/make_random_awq8b.py $G --format gptq --sym > $OUT/make_gptq.log 2>&1
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  tail -qn1 $OUT/make_*.log ;;
c)
  install_vllm c ;;
d)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  engine awq $A 1,64,128
  engine gptq $G 1,128
  for m in awq gptq; do
    d=$A; [ $m = gptq ] && d=$G
    PYTHONPATH=/tmp/site timeout 200 python3 $P/bench_vllm.py $d $OUT/vllm_$m.json --skip-256 > $OUT/vllm_$m.log 2>&1
    echo "== vllm $m rc=$?"; grep -E "Using .* for" $OUT/vllm_$m.log | head -2; grep -hE "prefill|decode|batch1" $OUT/vllm_$m.log | grep -v Warn | tail -4
  done
  engine awq2 $A 1,128
  engine bf16 $M 1,128 ;;
f)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  timeout 200 $B/cuda_int4 --include-ignored --test-threads 1 int4_kernels > $OUT/f_int4.log 2>&1
  echo "cuda_int4 kernels rc $?"; grep -E "^test |panicked|test result" $OUT/f_int4.log | tail -3
  timeout 120 $B/cuda_bench int4 $OUT/f_int4_alone.json 64,128 2>&1 | grep -E "^int4" > $OUT/f_int4_alone.txt
  sed -E 's/, (per-weight|tiles)[^,]*//g; s/gemm_int4_//g; s/ \([0-9]+ TFLOP\/s\)//g' $OUT/f_int4_alone.txt | cut -c1-700
  for k in gemm_int4_mmas_t2w4 gemm_int4_mmas_t2w4_p2s6; do
    timeout 120 ncu --clock-control none -k regex:gemm_int4_mma -s 1 -c 1 --section WarpStateStats \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      $B/cuda_bench int4one gate_up 128 $k > $OUT/f_ncu_$k.txt 2>&1
    echo "== $k"; grep -E "stalled|Warp Cycles Per Issued" $OUT/f_ncu_$k.txt | awk '$NF+0 > 0.1' | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | head -14
  done ;;
g)
  [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  peer() {  # tag model batches: decode as vLLM's script measures it
    timeout 150 $B/ringserve bench engine --model $2 --device cuda --batch-sizes $3 --prompt-lens 512 \
      --output-len 65 --peer-decode 2>>$OUT/bench.err | grep -E "^\| [0-9]" | sed "s/^/$1 /" | tee -a $OUT/g_bench.txt
  }
  for x in 1 0 1; do RINGSERVE_CUDA_INT4_MMA_SCALED=$x peer scaled$x $A 64,128; done
  peer bf16 $M 128 ;;
h)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  timeout 240 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture > $OUT/h_int4.log 2>&1
  echo "cuda_int4 rc $?"; grep -E "^test |panicked|test result" $OUT/h_int4.log | tail -4
  grep -E "int4-awq .*prompt of 100" $OUT/h_int4.log | head -5 ;;
esac
