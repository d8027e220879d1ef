#!/usr/bin/env bash
# Run 41, call k (carry .gpu41: cuda_bench and the cuda_int4 test with the INT4 tile GEMV variant
# holding each item's x in its register ring, stripped): the INT4 kernel test (every tile variant
# bit-equal to the tile kernel), then `cuda_bench int4` (the INT4 products alone at the 8B shapes).
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b41k
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B && tar xJf .gpu41/bins.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-41k FIXTURES_DIR=$PWD/tests/fixtures
timeout 100 $B/cuda_int4 int4_kernels_match --include-ignored --nocapture > $OUT/int4_test.log 2>&1; echo "cuda_int4 kernels rc=$?"
grep -E "test result|panicked|differs" $OUT/int4_test.log | head
timeout 100 $B/cuda_bench int4 $OUT/int4.json > $OUT/int4.log 2>&1; echo "cuda_bench int4 rc=$?"
grep -E " m1:| m8:" $OUT/int4.log
