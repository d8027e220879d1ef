#!/usr/bin/env bash
# Run 33a (carry .gpu33: ringserve, cuda_bench, the cuda_int4 test and the vLLM peer's scripts;
# and .peer-vllm/carry/vllm-site.tar.xz.part00): the tile INT4 GEMV as committed (b8: ring of 2
# items, 3 blocks an SM). vLLM part 0 stashed; the kernel and model tests; ncu on two products
# (if the machine has ncu); the products alone; bench engine on the random 8B AWQ checkpoint with
# the tile kernel and without. Run 33b follows on the same machine.
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b33; A=/tmp/awq8b
mkdir -p $B /tmp/vllm_parts && tar xJf .gpu33/bins.tar.xz -C $B
cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-33 FIXTURES_DIR=$PWD/tests/fixtures
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/run.log 2>&1
(bash $B/peer/install.sh > $OUT/install_a.log 2>&1; echo "install rc $?" >> $OUT/install_a.log) &
[ -f $A/config.json ] || (time python3 scripts/make_random_awq8b.py $A) > $OUT/make_awq.log 2>&1 &
echo "== cuda_int4" >> $OUT/run.log
timeout 300 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture > $OUT/cuda_int4.log 2>&1
echo "cuda_int4 rc $?" | tee -a $OUT/run.log
grep -E "^test |panicked" $OUT/cuda_int4.log | tail -8 >> $OUT/run.log
NCU=$(ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "== ncu: ${NCU:-none}" >> $OUT/run.log
if [ -n "$NCU" ]; then
  for sk in "gate_up gemv_int4_t16_k128_b8" "qkv gemv_int4_t16_k128_b8" "gate_up gemv_int4_t16x_d4_k128_b8"; do
    set -- $sk
    timeout 120 $NCU --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section MemoryWorkloadAnalysis -k $2 -c 1 $B/cuda_bench int4one $1 1 $2 >> $OUT/ncu.txt 2>&1
  done
fi
echo "== cuda_bench int4" >> $OUT/run.log
timeout 240 $B/cuda_bench int4 $OUT/int4_alone.json 2>&1 | grep -v "^\[" | tee -a $OUT/run.log > /dev/null
wait
cat $OUT/install_a.log | tail -2 >> $OUT/run.log; tail -2 $OUT/make_awq.log >> $OUT/run.log
for tiles in 1 0; do
  echo "== bench engine, RINGSERVE_CUDA_INT4_TILES=$tiles" | tee -a $OUT/bench.txt
  RINGSERVE_CUDA_INT4_TILES=$tiles timeout 150 $B/ringserve bench engine --model $A --device cuda \
    --batch-sizes 1,8,16,32 --prompt-lens 512 --output-len 64 2>>$OUT/bench.err | tee -a $OUT/bench.txt
done
