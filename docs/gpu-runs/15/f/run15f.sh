#!/usr/bin/env bash
# Run 15f: what a cold start-up spends. On a fresh lease, three bf16 tiny-llama `generate` runs
# (CUDA context, NVRTC compile or cache load, graphs) timed end to end: kernel cache cold (first
# CUDA use on the machine), cold again, then warm; RINGSERVE_LOG-free, wall times only.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache
nvidia-smi -q | grep -i -E "persistence mode" | head -2
nproc; grep -m1 "model name" /proc/cpuinfo
printf '{"prompt_token_ids": [1, 450, 49], "max_tokens": 8, "temperature": 0}\n' > /tmp/g.jsonl
for what in "cold (first CUDA use)" "cold" "warm"; do
  [ "$what" = warm ] || rm -rf $RINGSERVE_KERNEL_CACHE
  s=$(date +%s.%N)
  ./ringserve generate --model tiny-llama --device cuda --dtype bfloat16 --input /tmp/g.jsonl --output /tmp/g.out --quiet
  echo "generate, kernel cache $what: rc=$? $(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $s}") s"
done
python3 - <<'PY'
import ctypes, time
t = time.time(); cuda = ctypes.CDLL("libcuda.so.1"); cuda.cuInit(0)
d = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(d), 0); c = ctypes.c_void_p()
cuda.cuDevicePrimaryCtxRetain(ctypes.byref(c), d); print(f"cuInit + primary context: {time.time() - t:.2f} s")
PY
