#!/usr/bin/env bash
# Run 14i: query_tile (one decoding of an attention work item for every attention kernel). The
# attention and backend tests, memcheck on the attention test, then `cuda_bench kernels` (every
# attention case alone) with v39's binary and this one, twice each.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/ringserve-kcache TINY_LLAMA_DIR=$PWD/tiny-llama
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
./cuda_kernels --include-ignored --test-threads=1 --nocapture attention > "$OUT/tests.log" 2>&1; echo "kernels (attention) rc=$?" >> "$OUT/tests.log"
./cuda_backend --include-ignored --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1; echo "backend rc=$?" >> "$OUT/tests.log"
compute-sanitizer --tool memcheck --leak-check no ./cuda_kernels --include-ignored --test-threads=1 attention \
  >> "$OUT/tests.log" 2>&1; echo "memcheck (attention test) rc=$?" >> "$OUT/tests.log"
grep -E "^test |test result|rc=|ERROR SUMMARY|panicked" "$OUT/tests.log"
for r in 1 2; do
  ./cuda_bench_old kernels "$OUT/old$r.json" > /dev/null 2>&1; echo "old $r rc=$?"
  ./cuda_bench kernels "$OUT/new$r.json" > /dev/null 2>&1; echo "new $r rc=$?"
done
python3 - "$OUT" <<'PY'
import json, sys, glob
out = sys.argv[1]
runs = {n: json.load(open(f"{out}/{n}.json")) for n in ["old1", "new1", "old2", "new2"]}
def flat(d, pre=""):
    for k, v in d.items():
        if isinstance(v, dict): yield from flat(v, pre + k + ".")
        elif isinstance(v, (int, float)): yield pre + k, v
keys = [k for k, _ in flat(runs["old1"]) if k.endswith(".ms")]
for k in keys:
    vals = [dict(flat(runs[n])).get(k) for n in ["old1", "new1", "old2", "new2"]]
    print(k, " ".join(f"{v:.4f}" if v is not None else "-" for v in vals))
PY
