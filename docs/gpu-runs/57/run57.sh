#!/usr/bin/env bash
# Run 57 (2026-12-07): the INT4 tile GEMV with RoPE + the KV write (q/k/v) and SiLU·mul (gate/up)
# in its epilogue — two launches a layer fewer in steps of up to 32 rows. What ran: e, then the
# inline commands of README.md's f and g on the same machine, then j on another; a, b and g–i
# never started.
# .gpu55/c.tar.xz: ringserve, cuda_bench, cuda_int4 of the build before (run 56's c);
# .gpu55/d.tar.xz: the same of this build (--features cuda, stripped).
# This build also leaves x unloaded in the tile GEMVs' lanes of batch rows past b (INT4 and FP8).
#   a: cuda_int4's new test (fused against unfused: the same logits and tokens) and the PDL test;
#      cuda_bench decode at batch 1 on the random 8B AWQ model — the build before, this build with
#      the fused epilogues off and on (RINGSERVE_CUDA_FUSE_ROPE / _SILU), alternating — and on the
#      bf16 model with --quantization fp8, before and now; bench engine INT4 at 8 and 32 x 512
#   b: ncu's time of every kernel node of the INT4 batch-1 decode graph (where the step goes now);
#      the FP8 kernel and model tests (cuda_kernels fp8, cuda_fp8); the INT4 model and kernel tests
#   e: a and b's essentials in one call: the fused test, the FP8 kernel tests, batch-1 INT4 (before,
#      fused off, on) and FP8 (before, now), the INT4 kernel test with the time left
#   g (carry .gpu55/peer: vLLM's install.sh, SHA256SUMS, bench_vllm.py and extra wheels; and
#      .peer-vllm/carry/vllm-site.tar.xz.part00): part 00 stashed; ringserve's AWQ engine steps
#   h (the next call on that machine, carry .gpu55/peer and part01): vLLM 0.26 installed;
#      bench_vllm.py on the same AWQ checkpoint (its Machete kernels) at 1, 128 and 256
#   i (the next, carry .gpu55/d.tar.xz): ringserve on the AWQ model measured as vLLM's script
#      measures (--peer-decode) at 128 and 256, and batch 1 by cuda_bench
set -uo pipefail
cd "$(dirname "$0")/../../.."
A=/tmp/awq8b M=/tmp/l8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/c /tmp/d
[ -f /tmp/c/cuda_int4 ] || [ ! -f .gpu55/c.tar.xz ] || tar xJf .gpu55/c.tar.xz -C /tmp/c
[ -f /tmp/d/cuda_int4 ] || [ ! -f .gpu55/d.tar.xz ] || tar xJf .gpu55/d.tar.xz -C /tmp/d
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-57 FIXTURES_DIR=$PWD/tests/fixtures
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
P=/tmp/peer57; [ -d $P ] || { [ -d .gpu55/peer ] && cp -r .gpu55/peer $P; }
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
fused() {  # on|off: the INT4 tile GEMV's RoPE and SiLU·mul epilogues
  if [ "$1" = on ]; then echo "RINGSERVE_CUDA_FUSE_ROPE=1 RINGSERVE_CUDA_FUSE_SILU=1"; else echo "RINGSERVE_CUDA_FUSE_ROPE=0 RINGSERVE_CUDA_FUSE_SILU=0"; fi
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
    [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  MK=$!
  timeout 150 /tmp/d/cuda_int4 --include-ignored --test-threads 1 --nocapture epilogue > $OUT/a_fused.log 2>&1
  echo "cuda_int4 epilogue rc $? at ${SECONDS} s"; grep -E "^test |panicked|test result|same logits" $OUT/a_fused.log | cut -c1-130 | tail -16
  timeout 100 /tmp/d/cuda_int4 --include-ignored --test-threads 1 --nocapture pdl > $OUT/a_pdl.log 2>&1
  echo "cuda_int4 pdl rc $? at ${SECONDS} s"; grep -E "^test |panicked|test result" $OUT/a_pdl.log | tail -2
  wait $MK; echo "models ready at ${SECONDS} s"
  for r in 1 2; do
    timeout 100 /tmp/c/cuda_bench decode $A 1 512 40 2>&1 | grep 'decode batch' | sed "s/^/int4 before /" | tee -a $OUT/a_decode.txt
    for f in off on; do
      ( export $(fused $f); timeout 100 /tmp/d/cuda_bench decode $A 1 512 40 2>&1 | grep 'decode batch' | sed "s/^/int4 fused=$f /" | tee -a $OUT/a_decode.txt )
    done
  done
  for r in 1 2; do for v in c d; do
    timeout 120 /tmp/$v/cuda_bench decode $M 1 512 40 --quantization=fp8 2>&1 | grep 'decode batch' | sed "s/^/fp8 $v /" | tee -a $OUT/a_decode.txt
  done; done
  echo "decode done at ${SECONDS} s"
  for f in off on; do ( export $(fused $f); engine int4_fused_$f /tmp/d $A 8,32 ); done
  echo "done at ${SECONDS} s" ;;
b)
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 )
  NCU=$(ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 240 $NCU --graph-profiling node --cache-control none --clock-control none --csv \
    --metrics gpu__time_duration.sum -s 1200 -c 1100 \
    /tmp/d/cuda_bench decode $A 1 512 8 > $OUT/b_ncu.csv 2> $OUT/b_ncu.err
  echo "ncu rc=$? at ${SECONDS} s"
  python3 scripts/timeline_summary.py --ncu $OUT/b_ncu.csv "int4 batch 1" | tee $OUT/b_timeline.txt | head -40
  timeout 120 /tmp/d/cuda_kernels --include-ignored --test-threads 1 fp8 > $OUT/b_kernels_fp8.log 2>&1
  echo "cuda_kernels fp8 rc $?"; grep -E "panicked|test result" $OUT/b_kernels_fp8.log | tail -2
  timeout 150 /tmp/d/cuda_fp8 --include-ignored --test-threads 1 > $OUT/b_fp8.log 2>&1
  echo "cuda_fp8 rc $? at ${SECONDS} s"; grep -E "panicked|test result" $OUT/b_fp8.log | tail -2
  left=$((570 - SECONDS)); echo "at ${SECONDS} s; model and kernel tests get ${left} s"
  [ $left -gt 30 ] && timeout $left /tmp/d/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_models int4_kernels > $OUT/b_models.log 2>&1
  echo "cuda_int4 models+kernels rc $?"; grep -E "^test |panicked|test result" $OUT/b_models.log | tail -4 ;;
e)
  # a and b's essentials in one call, for a session with little device time left.
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
    [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  MK=$!
  timeout 150 /tmp/d/cuda_int4 --include-ignored --test-threads 1 --nocapture epilogue > $OUT/e_fused.log 2>&1
  echo "cuda_int4 epilogue rc $? at ${SECONDS} s"; grep -E "^test |panicked|test result|same logits" $OUT/e_fused.log | cut -c1-130 | tail -16
  timeout 60 /tmp/d/cuda_kernels --include-ignored --test-threads 1 fp8 > $OUT/e_kernels_fp8.log 2>&1
  echo "cuda_kernels fp8 rc $? at ${SECONDS} s"; grep -E "panicked|test result" $OUT/e_kernels_fp8.log | tail -2
  wait $MK; echo "models ready at ${SECONDS} s"
  for r in 1 2; do
    timeout 100 /tmp/c/cuda_bench decode $A 1 512 40 2>&1 | grep 'decode batch' | sed "s/^/int4 before /" | tee -a $OUT/e_decode.txt
    for f in off on; do
      ( export $(fused $f); timeout 100 /tmp/d/cuda_bench decode $A 1 512 40 2>&1 | grep 'decode batch' | sed "s/^/int4 fused=$f /" | tee -a $OUT/e_decode.txt )
    done
  done
  for v in c d; do
    timeout 120 /tmp/$v/cuda_bench decode $M 1 512 40 --quantization=fp8 2>&1 | grep 'decode batch' | sed "s/^/fp8 $v /" | tee -a $OUT/e_decode.txt
  done
  left=$((570 - SECONDS)); echo "decode done at ${SECONDS} s; the INT4 kernel test gets ${left} s"
  [ $left -gt 30 ] && timeout $left /tmp/d/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/e_kernels.log 2>&1
  echo "cuda_int4 int4_kernels rc $?"; grep -E "^test |panicked|test result" $OUT/e_kernels.log | tail -3 ;;
j)
  # The final build (.gpu55/f.tar.xz: cuda_bench, cuda_int4 and cuda_kernels: the fused epilogues
  # from two rows, x through every lane, the tile rows of the FP8 and INT4 twins from one TileRows)
  # against c, with little device time left.
  mkdir -p /tmp/f; tar xJf .gpu55/f.tar.xz -C /tmp/f
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 ) &
  MK=$!
  timeout 100 /tmp/f/cuda_int4 --include-ignored --test-threads 1 --nocapture epilogue > $OUT/j_fused.log 2>&1
  echo "cuda_int4 epilogue rc $? at ${SECONDS} s"; grep -E "panicked|test result" $OUT/j_fused.log | tail -2
  timeout 110 /tmp/f/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/j_kernels.log 2>&1
  echo "cuda_int4 int4_kernels rc $? at ${SECONDS} s"; grep -E "panicked|test result" $OUT/j_kernels.log | tail -2
  timeout 60 /tmp/f/cuda_kernels --include-ignored --test-threads 1 fp8 > $OUT/j_kernels_fp8.log 2>&1
  echo "cuda_kernels fp8 rc $? at ${SECONDS} s"; grep -E "panicked|test result" $OUT/j_kernels_fp8.log | tail -2
  wait $MK
  for v in f c; do timeout 60 /tmp/$v/cuda_bench decode $A 1 512 40 2>&1 | grep 'decode batch' | sed "s/^/$v /" | tee -a $OUT/j_decode.txt; done ;;
g)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  install_vllm g
  [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1
  engine d /tmp/d $A 128,256 ;;
h)
  install_vllm h
  PYTHONPATH=/tmp/site timeout 330 python3 $P/bench_vllm.py $A $OUT/vllm_awq.json > $OUT/vllm_awq.log 2>&1
  echo "== vllm awq rc=$?"; grep -E "Using .* for" $OUT/vllm_awq.log | head -2; grep -hE "prefill|decode|batch1" $OUT/vllm_awq.log | grep -v Warn | tail -5 ;;
i)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  for r in 1 2; do timeout 100 /tmp/d/cuda_bench decode $A 1 512 40 2>&1 | grep 'decode batch' | tee -a $OUT/i_decode.txt; done
  peer d_peer /tmp/d $A 128,256
  engine d /tmp/d $A 128,256 ;;
esac
