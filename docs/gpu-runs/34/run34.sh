#!/usr/bin/env bash
# Run 34 (carry .gpu34: ringserve, cuda_bench and the cuda_int4 test built with --features cuda,
# stripped): the tile INT4 GEMV with its scales packed per tile (one 8-byte load a step).
# predicated without branches, no x prefetch or zeroing, every item computed, shifts for groups).
# The kernel and model tests; the products alone (cuda_bench int4, with the ring-depth and
# occupancy variants); bench engine on the random 8B AWQ checkpoint with the tile kernel and
# without.
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b34; A=/tmp/awq8b
mkdir -p $B && tar xJf .gpu34/bins.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-34 FIXTURES_DIR=$PWD/tests/fixtures
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/run.log 2>&1
[ -f $A/config.json ] || (time python3 scripts/make_random_awq8b.py $A) > $OUT/make_awq.log 2>&1 &
echo "== cuda_int4" >> $OUT/run.log
timeout 300 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture > $OUT/cuda_int4.log 2>&1
echo "cuda_int4 rc $?" | tee -a $OUT/run.log
grep -E "^test |panicked|tiles true" $OUT/cuda_int4.log | tail -30 >> $OUT/run.log
echo "== cuda_bench int4" >> $OUT/run.log
timeout 240 $B/cuda_bench int4 $OUT/int4_alone.json 2>&1 | grep -v "^\[" | tee -a $OUT/run.log > /dev/null
wait
tail -2 $OUT/make_awq.log >> $OUT/run.log
for tiles in 1 0 1; do
  echo "== bench engine, RINGSERVE_CUDA_INT4_TILES=$tiles" | tee -a $OUT/bench.txt
  RINGSERVE_CUDA_INT4_TILES=$tiles timeout 150 $B/ringserve bench engine --model $A --device cuda \
    --batch-sizes 1,8,16,32 --prompt-lens 512 --output-len 64 2>>$OUT/bench.err | tee -a $OUT/bench.txt
done
