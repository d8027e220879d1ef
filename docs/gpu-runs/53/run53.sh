#!/usr/bin/env bash
# Run 53: the pipelined wgmma INT4 products (gemm_int4_wgmma_p3 / p4 / p4_w4: each k-step's wgmma
# its own group, the next k-step's weights dequantized while it runs) against run 52's s3 (the
# default) on the 8B shapes; and the FP8 cuBLASLt tuning's disk cache (run 49's unrun check).
# .gpu53/a.tar.xz: ringserve, cuda_bench, cuda_int4, cuda_kernels of the build (--features cuda,
# stripped).
#   a: cuda_bench int4 at 128 rows (every product alone); the INT4 kernel test (every wgmma
#      kernel at odd shapes against the f64 product); bench engine on the random 8B AWQ model at
#      128 x 512 with RINGSERVE_CUDA_INT4_WGMMA s3 / p4 / p3 / p4_w4 / s3 / p4; cuda_kernels
#      gemm_fp8_matches_cpu with a kernel cache directory (the tuning taken from the disk)
#   b: (after a, same machine) 128 x 512 with p3 / s3 / p3
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b53; A=/tmp/awq8b
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
[ -f .gpu53/$1.tar.xz ] && tar xJf .gpu53/$1.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-53 FIXTURES_DIR=$PWD/tests/fixtures
engine() {  # tag model batches [flags]
  local tag=$1 m=$2 b=$3; shift 3
  timeout 200 $B/ringserve bench engine --model $m --device cuda --batch-sizes $b --prompt-lens 512 \
    --output-len 64 "$@" 2>>$OUT/bench.err | grep -E "^\| [0-9]" | sed "s/^/$tag /" | tee -a $OUT/bench.txt
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $A/config.json ] || python3 scripts/make_random_awq8b.py $A > $OUT/make_awq.log 2>&1 ) &
  MK=$!
  timeout 120 $B/cuda_bench int4 $OUT/a_int4_alone.json 128 2>&1 | grep -E "^int4" > $OUT/a_int4_alone.txt
  sed -E 's/, (per-weight|tiles|mma_)[^,]*//g; s/gemm_int4_//g; s/ \([0-9]+ TFLOP\/s\)//g' $OUT/a_int4_alone.txt | cut -c1-600
  timeout 200 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/a_int4.log 2>&1
  echo "cuda_int4 kernels rc $?"; grep -E "^test |panicked|test result" $OUT/a_int4.log | tail -3
  wait $MK
  for x in s3 p4 p3 p4_w4 s3 p4; do RINGSERVE_CUDA_INT4_WGMMA=$x engine w_$x $A 128; done
  rm -rf /tmp/kc-53f; RINGSERVE_KERNEL_CACHE=/tmp/kc-53f timeout 150 $B/cuda_kernels --include-ignored \
    --test-threads 1 gemm_fp8_matches_cpu > $OUT/a_fp8.log 2>&1
  echo "cuda_kernels gemm_fp8_matches_cpu rc $?"; grep -E "^test |panicked|test result|disk cache" $OUT/a_fp8.log | head -5
  echo "tuning file lines: $(cat /tmp/kc-53f/*.tsv 2>/dev/null | wc -l)" ;;
b)
  for x in p3 s3 p3; do RINGSERVE_CUDA_INT4_WGMMA=$x engine w_$x $A 128; done ;;
esac
