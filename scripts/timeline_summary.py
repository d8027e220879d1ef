#!/usr/bin/env python3
"""Summarises an `nsys stats -r cuda_gpu_trace -f csv` export of `cuda_bench decode` (or, with
--ncu, `ncu --csv --metrics gpu__time_duration.sum`, kernels timed alone: no start times, so no
idle time is reported): per decode
step (a step starts at its embedding gather), the GPU span, the kernels' summed time and the idle
rest; the host gap between steps; each kernel's mean time per step; and one middle layer's kernel
sequence with the idle time before each kernel.  usage: timeline_summary.py TRACE.csv LABEL"""
import csv
import sys
from collections import defaultdict

ncu = sys.argv[1] == "--ncu"
if ncu:
    sys.argv.pop(1)
rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]  # ncu prints its own log lines too
    for r in csv.DictReader(lines):
        if ncu:
            if r.get("Metric Name") != "gpu__time_duration.sum":
                continue
            d = float(r["Metric Value"].replace(",", ""))
            # ncu's unit is ns or us depending on --print-units; the column says which
            d *= {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6}.get(r["Metric Unit"], 1)
            rows.append((int(r["ID"]), int(d), r["Kernel Name"]))
            continue
        name = r.get("Name", "")
        if name.startswith("["):  # memcpy / memset
            continue
        rows.append((int(r["Start (ns)"]), int(r["Duration (ns)"]), name))
rows.sort()
if ncu:  # back to back: a start time that makes the idle time zero
    t, timed = 0, []
    for _, d, name in rows:
        timed.append((t, d, name))
        t += d
    rows = timed
steps, cur = [], []
for r in rows:
    if r[2].startswith("embedding") and cur and not cur[-1][2].startswith("embedding"):
        # the LM head's row gather is an embedding too: a step starts at the first embedding
        # that follows a sampling kernel
        if cur[-1][2].startswith("sample"):
            steps.append(cur)
            cur = []
    cur.append(r)
if cur:
    steps.append(cur)
# Whole steps only: from an embedding to a sampling kernel (a profiler's window may cut the first).
steps = [s for s in steps if s[0][2].startswith("embedding") and s[-1][2].startswith("sample")][-20:]
if not steps:
    sys.exit("no complete steps in the trace")
label = sys.argv[2]
span = [s[-1][0] + s[-1][1] - s[0][0] for s in steps]
busy = [sum(d for _, d, _ in s) for s in steps]
between = [b[0][0] - (a[-1][0] + a[-1][1]) for a, b in zip(steps, steps[1:])]
n = len(steps)
print(f"== {label}: {n} steps, {len(steps[0])} kernels a step")
if ncu:
    print(f"kernels timed alone, summed: {sum(busy)/n/1e3:.1f} us a step")
else:
    print(f"GPU span {sum(span)/n/1e3:.1f} us, kernels {sum(busy)/n/1e3:.1f} us, idle inside step "
          f"{(sum(span)-sum(busy))/n/1e3:.1f} us, host gap between steps "
          f"{(sum(between)/max(len(between),1))/1e3:.1f} us")
per = defaultdict(lambda: [0, 0])
for s in steps:
    for _, d, name in s:
        per[name[:90]][0] += d
        per[name[:90]][1] += 1
print(f"{'us/step':>9} {'count':>6} {'mean us':>8}  kernel")
for name, (tot, cnt) in sorted(per.items(), key=lambda kv: -kv[1][0]):
    print(f"{tot/n/1e3:9.1f} {cnt/n:6.0f} {tot/cnt/1e3:8.2f}  {name}")
s = steps[-1]
emb = [i for i, r in enumerate(s) if r[2].startswith("rms") or r[2].startswith("add_rms")]
mid = emb[len(emb) // 2 - (len(emb) // 2) % 2] if emb else 0
print("one layer (idle before, duration, kernel):")
for i in range(mid, min(mid + 14, len(s))):
    idle = s[i][0] - (s[i-1][0] + s[i-1][1]) if i else 0
    print(f"  {idle/1e3:6.2f} {s[i][1]/1e3:7.2f}  {s[i][2][:90]}")
