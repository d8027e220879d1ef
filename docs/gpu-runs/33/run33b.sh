#!/usr/bin/env bash
# Run 33b (same machine as 33a, carry .gpu33 and .peer-vllm/carry/vllm-site.tar.xz.part01): vLLM
# 0.26 installed, its bench_vllm.py on the random 8B AWQ checkpoint (Machete kernels), and ringserve
# bench engine on the same checkpoint in the same call.
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b33; A=/tmp/awq8b
mkdir -p $B /tmp/vllm_parts && tar xJf .gpu33/bins.tar.xz -C $B
cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-33 PYTHONUNBUFFERED=1
bash $B/peer/install.sh > $OUT/install_b.log 2>&1; echo "install rc $?" | tee -a $OUT/run.log; tail -1 $OUT/install_b.log | tee -a $OUT/run.log
[ -f $A/config.json ] || (time python3 scripts/make_random_awq8b.py $A) > $OUT/make_awq.log 2>&1
echo "== ringserve" | tee -a $OUT/run.log
timeout 150 $B/ringserve bench engine --model $A --device cuda --batch-sizes 1,8,32,128 --prompt-lens 512 \
  --output-len 64 2>$OUT/bench.err | tee -a $OUT/run.log
echo "== vLLM awq" | tee -a $OUT/run.log
PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 timeout 300 python3 $B/peer/bench_vllm.py $A $OUT/vllm_awq.json \
  --batches 8,32,128 > $OUT/vllm_awq.log 2>&1; echo "vllm rc $?" | tee -a $OUT/run.log
grep -E "batch1 decode|decode tok/s|prefill|engine init|Machete|Marlin|kernel" $OUT/vllm_awq.log | head -12 | tee -a $OUT/run.log
