#!/usr/bin/env python3
"""Summarises gpu_ab.sh's CLOCKS=1 logs: per phase of marks.log (tests, decode SETTING,
engine SETTING), the GPU's mean and minimum SM clock, mean memory clock, mean and peak power,
peak temperature and the throttle reasons seen while the GPU was busy (drawing over 150 W; an
idle H200 draws 80-130 W). Throttle reason 0x4 is the software power cap.
usage: clock_summary.py clocks.csv marks.log"""
import csv
import sys
from datetime import datetime


def num(s):
    try:
        return float(s.strip().split()[0])
    except (ValueError, IndexError):
        return None


samples = []
with open(sys.argv[1]) as f:
    rows = csv.reader(f)
    next(rows, None)  # header
    for r in rows:
        if len(r) < 6:
            continue
        try:
            t = datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        except ValueError:
            continue
        samples.append((t, num(r[1]), num(r[2]), num(r[3]), num(r[4]), r[5].strip()))

marks = []
with open(sys.argv[2]) as f:
    for line in f:
        t, _, name = line.strip().partition("|")  # nvidia-smi's local time format
        marks.append((datetime.strptime(t, "%Y/%m/%d %H:%M:%S.%f").timestamp(), name))

print("| phase | s | SM MHz mean / min (busy) | mem MHz | W mean / peak | max °C | throttle reasons (busy) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
for (t0, name), (t1, _) in zip(marks, marks[1:]):
    ph = [s for s in samples if t0 <= s[0] < t1]
    busy = [s for s in ph if s[1] and s[3] and s[3] > 150]  # drawing well above idle
    if not ph:
        continue
    sm = [s[1] for s in busy if s[1]] or [0]
    mem = [s[2] for s in busy if s[2]] or [0]
    pw = [s[3] for s in ph if s[3]] or [0]
    temp = [s[4] for s in ph if s[4]] or [0]
    reasons = sorted({s[5] for s in busy})
    print(f"| {name} | {t1 - t0:.0f} | {sum(sm) / len(sm):.0f} / {min(sm):.0f} | "
          f"{sum(mem) / len(mem):.0f} | {sum(pw) / len(pw):.0f} / {max(pw):.0f} | {max(temp):.0f} | "
          f"{', '.join(reasons)} |")
