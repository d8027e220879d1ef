#!/usr/bin/env python3
"""Sums ncu's per-launch kernel times by kernel: where a run's GPU time goes.

usage: ncu_summary.py NCU_CSV [--top N]
NCU_CSV: the output of `ncu --csv --page raw --print-units base --metrics gpu__time_duration.sum
... PROGRAM` (the program's own lines mixed in are skipped). Prints one line a kernel, largest
total first: launches, total ms, share of all kernel time, mean µs."""
import argparse
import csv
from collections import defaultdict

ap = argparse.ArgumentParser()
ap.add_argument("path")
ap.add_argument("--top", type=int, default=30)
a = ap.parse_args()
header, col_name, col_time = None, None, None
total = defaultdict(float)
count = defaultdict(int)
with open(a.path, errors="replace") as f:
    for row in csv.reader(f):
        if header is None:
            if "Kernel Name" in row and "gpu__time_duration.sum" in row:
                header = row
                col_name, col_time = row.index("Kernel Name"), row.index("gpu__time_duration.sum")
            continue
        if len(row) != len(header):
            continue
        try:
            ns = float(row[col_time].replace(",", ""))
        except ValueError:
            continue  # the units row
        name = row[col_name].split("(")[0].strip()[:70]
        total[name] += ns
        count[name] += 1
if header is None:
    raise SystemExit(f"{a.path}: no ncu CSV header with gpu__time_duration.sum")
all_ns = sum(total.values())
print(f"{a.path}: {sum(count.values())} launches, {all_ns / 1e6:.2f} ms of kernel time")
for name, ns in sorted(total.items(), key=lambda kv: -kv[1])[: a.top]:
    print(f"{count[name]:6d} {ns / 1e6:9.3f} ms {100 * ns / all_ns:5.1f} %  {ns / count[name] / 1e3:9.1f} µs  {name}")
