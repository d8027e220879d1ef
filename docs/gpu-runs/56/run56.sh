#!/usr/bin/env bash
# Run 56 (2026-12-07): the wgmma INT4 product with its group constants staged in the cp.async ring
# (the tile kernels' scale | zero words, 64 bytes a 16-row tile) and the loader counting groups,
# against the build before (register loads one step ahead that every thread waited for at the end
# of each step, and a group index divided out per step: run 55's ncu source counters).
# .gpu55/a.tar.xz: ringserve, cuda_bench, cuda_int4 of the build before (4ac26bd);
# .gpu55/b.tar.xz: the same of this build (--features cuda, stripped).
#   d: the INT4 kernel test (every wgmma kernel at odd shapes, split and not); cuda_bench int4 at
#      128 rows, old and new alternating; bench engine on the random 8B AWQ model at 128 x 512,
#      old and new alternating, twice; the INT4 model test with the time left
#   e: this build only: bench engine AWQ 128 x 512 with RINGSERVE_CUDA_INT4_WGMMA s3 / p4 / p3 / s3
#      / p4, the bf16 model's step beside it; cuda_bench int4 at 256 rows (wgmma against
#      dequantization + cuBLAS); ncu source counters of s3 on gate/up at 128 rows
# .gpu55/c.tar.xz: the build after e (the Hopper product up to 256 rows, p4 the default).
#   f: the INT4 model test (its 200-token prompt on the Hopper product now); bench engine AWQ at
#      256 x 512 and 128 x 512, b and c alternating; bf16 at 256 x 512
#   g (carry .gpu55/peer: vLLM's install.sh, bench_vllm.py and extra wheels; and
#      .peer-vllm/carry/vllm-site.tar.xz.part00): part 00 stashed; the AWQ model written
#   h (the next call on that machine, carry .gpu55/peer and part01): vLLM 0.26 installed;
#      bench_vllm.py on the same AWQ checkpoint (Machete) at 128 and 256
#   i (the next, carry .gpu55/g.tar.xz: ringserve of c alone; a call carries at most 64 MiB, the
#      tree and a part leave no room for it): ringserve on the AWQ model at 1, 128, 256 x 512,
#      engine steps and vLLM's method (--peer-decode)
#   j (not run yet; carry .gpu55/c.tar.xz): ncu's full set with source counters of the default p4
#      on gate/up at 128 and 256 rows (where its warps wait now)
set -uo pipefail
cd "$(dirname "$0")/../../.."
A=/tmp/awq8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/old /tmp/new
[ -f /tmp/old/cuda_int4 ] || [ ! -f .gpu55/a.tar.xz ] || tar xJf .gpu55/a.tar.xz -C /tmp/old
[ -f /tmp/new/cuda_int4 ] || [ ! -f .gpu55/b.tar.xz ] || tar xJf .gpu55/b.tar.xz -C /tmp/new
mkdir -p /tmp/c; [ -f /tmp/c/cuda_int4 ] || [ ! -f .gpu55/c.tar.xz ] || tar xJf .gpu55/c.tar.xz -C /tmp/c
[ -f /tmp/c/ringserve ] || [ ! -f .gpu55/g.tar.xz ] || tar xJf .gpu55/g.tar.xz -C /tmp/c
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-56 FIXTURES_DIR=$PWD/tests/fixtures
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
P=/tmp/peer56; [ -d $P ] || { [ -d .gpu55/peer ] && cp -r .gpu55/peer $P; }
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
case "$1" in
d)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 ) &
  MK=$!
  timeout 200 /tmp/new/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/d_kernels.log 2>&1
  echo "cuda_int4 int4_kernels rc $? at ${SECONDS} s"; grep -E "^test |panicked|test result" $OUT/d_kernels.log | tail -3
  for r in 1 2; do for v in old new; do
    timeout 100 /tmp/$v/cuda_bench int4 $OUT/d_int4_$v$r.json 128 2>&1 | grep -E "^int4|rror" | \
      sed -E 's/, (per-weight|tiles|mma_|mmas_)[^,]*//g; s/gemm_int4_//g; s/ \([0-9]+ TFLOP\/s\)//g' | sed "s/^/$v /" | tee -a $OUT/d_int4.txt
  done; done
  wait $MK; echo "model ready at ${SECONDS} s"
  for r in 1 2; do for v in old new; do engine $v$r /tmp/$v $A 128; done; done
  left=$((580 - SECONDS)); echo "engine done at ${SECONDS} s; model test gets ${left} s"
  [ $left -gt 30 ] && timeout $left /tmp/new/cuda_int4 --include-ignored --test-threads 1 --nocapture model > $OUT/d_model.log 2>&1
  echo "cuda_int4 model rc $?"; grep -E "^test |panicked|test result|rel L2" $OUT/d_model.log | cut -c1-140 | tail -14 ;;
e)
  M=/tmp/l8b
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
    [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  MK=$!
  timeout 100 /tmp/new/cuda_bench int4 $OUT/e_int4_256.json 256 2>&1 | grep -E "^int4|rror" | \
    sed -E 's/, (per-weight|tiles|mma_|mmas_)[^,]*//g; s/gemm_int4_//g; s/ \([0-9]+ TFLOP\/s\)//g' | tee $OUT/e_int4_256.txt
  NCU=$(ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 100 $NCU --clock-control none -k regex:gemm_int4_wgmma_s3\$ -s 1 -c 1 --set full --import-source no \
    -o /tmp/r_s3 /tmp/new/cuda_bench int4one gate_up 128 gemm_int4_wgmma_s3 > $OUT/e_ncu.log 2>&1
  $NCU -i /tmp/r_s3.ncu-rep --page source --csv --print-source sass > $OUT/e_s3_sass.csv 2>&1
  $NCU -i /tmp/r_s3.ncu-rep --page details --print-details all > $OUT/e_s3_details.txt 2>&1
  grep -E "Duration|Stall Long|Stall Wait|Stall Barrier|Stall GMMA|Stall Math|No Eligible" $OUT/e_s3_details.txt | head -9
  wait $MK; echo "models ready at ${SECONDS} s"
  for x in s3 p4 p3 s3 p4; do RINGSERVE_CUDA_INT4_WGMMA=$x engine $x /tmp/new $A 128; done
  engine bf16 /tmp/new $M 128
  engine bf16 /tmp/new $M 128 ;;
f)
  M=/tmp/l8b
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
    [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  MK=$!
  timeout 240 /tmp/c/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_models > $OUT/f_model.log 2>&1
  echo "cuda_int4 int4_models rc $? at ${SECONDS} s"; grep -E "^test |panicked|test result" $OUT/f_model.log | tail -3
  grep -E "wgmma Auto prompt of 200" $OUT/f_model.log | cut -c1-140 | head -12
  wait $MK; echo "models ready at ${SECONDS} s"
  for r in 1 2; do engine b256 /tmp/new $A 256; engine c256 /tmp/c $A 256; done
  engine b128 /tmp/new $A 128; engine c128 /tmp/c $A 128
  engine bf16_256 /tmp/c $M 256 ;;
g)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  install_vllm g
  [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
  tail -1 $OUT/make_awq.log ;;
h)
  install_vllm h
  PYTHONPATH=/tmp/site timeout 280 python3 $P/bench_vllm.py $A $OUT/vllm_awq.json > $OUT/vllm_awq.log 2>&1
  echo "== vllm awq rc=$?"; grep -E "Using .* for" $OUT/vllm_awq.log | head -2; grep -hE "prefill|decode|batch1" $OUT/vllm_awq.log | grep -v Warn | tail -5 ;;
i)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  engine c /tmp/c $A 1,128,256
  peer c_peer /tmp/c $A 128,256 ;;
j)
  NCU=$(ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for m in 128 256; do
    timeout 100 $NCU --clock-control none -k regex:gemm_int4_wgmma_p4\$ -s 1 -c 1 --set full --import-source no \
      -o /tmp/r$m /tmp/c/cuda_bench int4one gate_up $m gemm_int4_wgmma_p4 > $OUT/j_ncu$m.log 2>&1
    $NCU -i /tmp/r$m.ncu-rep --page source --csv --print-source sass > $OUT/j_p4_$m.csv 2>&1
    $NCU -i /tmp/r$m.ncu-rep --page details --print-details all > $OUT/j_p4_$m.txt 2>&1
    echo "== $m rows"; grep -E "^    (Duration|Compute \(SM\) Throughput|Stall (Long|Wait|Barrier|GMMA|Math|Short|Dispatch))" $OUT/j_p4_$m.txt | head -10
  done ;;
esac
