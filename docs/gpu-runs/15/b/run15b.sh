#!/usr/bin/env bash
# Run 15b: decode attention blocks of 2 warps (16-key tiles, 24 KiB rings, 8 blocks an SM; v44)
# against 4 warps (32-key tiles, 48 KiB, 4 an SM; v43's cuda_bench as cuda_bench_v43), both for
# the tensor-core and the CUDA-core kernel: the attention test and memcheck on v44, every
# attention case alone, twice, cuda_bench decode and bench engine.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
( python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
./cuda_kernels --include-ignored --test-threads=1 --nocapture attention > "$OUT/tests.log" 2>&1; echo "kernels (attention) rc=$?" >> "$OUT/tests.log"
./cuda_backend --include-ignored --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" >> "$OUT/tests.log"
compute-sanitizer --tool memcheck --leak-check no ./cuda_kernels --include-ignored --test-threads=1 attention \
  >> "$OUT/tests.log" 2>&1; echo "memcheck (attention test) rc=$?" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|ERROR SUMMARY|panicked|out of tolerance" "$OUT/tests.log" | head -40
for r in 1 2; do
  ./cuda_bench_v43 kernels "$OUT/v43_$r.json" > /dev/null 2>&1; echo "v43 $r rc=$?"
  ./cuda_bench kernels "$OUT/v44_$r.json" > /dev/null 2>&1; echo "v44 $r rc=$?"
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
runs = {n: json.load(open(f"{out}/{n}.json")) for n in ["v43_1", "v43_2", "v44_1", "v44_2"]}
print("case  v43 r1/r2  v44 r1/r2 (us)")
for k in runs["v43_1"]:
    if "q1" in k:
        print(k, " ".join(f"{runs[n][k]['ms']*1e3:.1f}" if k in runs[n] else "-" for n in runs))
PY
wait; cat $M/*.safetensors > /dev/null
for b in v43 v44; do for f in 1 0; do
  exe=./cuda_bench; [ $b = v43 ] && exe=./cuda_bench_v43
  echo "== $b RINGSERVE_CUDA_DECODE_MMA=$f" >> "$OUT/ab.log"
  RINGSERVE_CUDA_DECODE_MMA=$f $exe decode $M 1,8,32,128,256 512 30 2>&1 | grep -E "^decode|rror" >> "$OUT/ab.log"
  RINGSERVE_CUDA_DECODE_MMA=$f $exe decode $M 128 2048 30 2>&1 | grep -E "^decode|rror" >> "$OUT/ab.log"
done; done
cat "$OUT/ab.log"
for f in 1 0; do
  echo "== v44 bench engine, RINGSERVE_CUDA_DECODE_MMA=$f" >> "$OUT/engine.log"
  RINGSERVE_CUDA_DECODE_MMA=$f ./ringserve bench engine --model $M --device cuda --batch-sizes 128 --prompt-lens 512 \
    --output-len 64 2>&1 | grep -E "^\||rror" >> "$OUT/engine.log"
done
cat "$OUT/engine.log"
