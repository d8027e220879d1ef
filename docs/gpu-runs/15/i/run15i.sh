#!/usr/bin/env bash
# Run 15i: the two decode kernels share their prologue and epilogue (decode_split,
# skip_empty_split, merge_states, write_decode_out in decode.cu; v49). The attention test,
# cuda_backend, memcheck on the attention test, then every attention case alone with v47's
# cuda_bench (before the change) and this one, twice each, and cuda_bench decode 1/128 with both.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/llama8b
( python3 scripts/make_random_llama8b.py $M > /tmp/make_model.log 2>&1 ) &
./cuda_kernels --include-ignored --test-threads=1 --nocapture attention > "$OUT/tests.log" 2>&1; echo "kernels (attention) rc=$?" >> "$OUT/tests.log"
./cuda_backend --include-ignored --test-threads=1 >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" >> "$OUT/tests.log"
compute-sanitizer --tool memcheck --leak-check no ./cuda_kernels --include-ignored --test-threads=1 attention \
  >> "$OUT/tests.log" 2>&1; echo "memcheck (attention test) rc=$?" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|ERROR SUMMARY|panicked|out of tolerance" "$OUT/tests.log" | head -30
for r in 1 2; do
  ./cuda_bench_v47 kernels "$OUT/old$r.json" > /dev/null 2>&1; echo "old $r rc=$?"
  ./cuda_bench kernels "$OUT/new$r.json" > /dev/null 2>&1; echo "new $r rc=$?"
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
runs = {n: json.load(open(f"{out}/{n}.json")) for n in ["old1", "new1", "old2", "new2"]}
print("case  old r1 / new r1 / old r2 / new r2 (us)")
for k in runs["old1"]:
    if "q1" in k:
        print(k, " ".join(f"{runs[n][k]['ms']*1e3:.1f}" if k in runs[n] else "-" for n in runs))
PY
wait; cat $M/*.safetensors > /dev/null
for b in old new; do
  exe=./cuda_bench; [ $b = old ] && exe=./cuda_bench_v47
  echo "== $b" >> "$OUT/ab.log"
  $exe decode $M 1,128 512 30 2>&1 | grep -E "^decode|rror" >> "$OUT/ab.log"
done
cat "$OUT/ab.log"
