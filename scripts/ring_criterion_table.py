#!/usr/bin/env python3
"""Summarise `cargo bench --bench ring` (criterion's target/criterion/*/new/) as the markdown tables
docs/benchmarks.md and ringbuf/README.md quote: median throughput per contestant and record size,
and each ringbuf figure as a ratio of rtrb's in the same run; ping-pong medians beside the bare
shared word."""
import json
import pathlib
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")


def median_ns(group, function, value):
    path = root / group / function / value / "new" / "estimates.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())["median"]["point_estimate"]


def elements(group, function, value):
    path = root / group / function / value / "new" / "benchmark.json"
    return json.loads(path.read_text())["throughput"]["Elements"]


rows = []
for size in (8, 64, 512, 4096):
    group = f"ring_{size}B"
    if not (root / group).exists():
        continue
    for batch in (1, 32):
        value = f"batch{batch}"
        rate = {}
        for f in ("ringbuf_xproc", "ringbuf_inproc", "rtrb", "crossbeam_arrayqueue"):
            t = median_ns(group, f, value)
            if t:
                rate[f] = elements(group, f, value) / t * 1e3  # M records/s
        if "rtrb" not in rate:
            continue
        r = rate["rtrb"]
        cells = [f"{size} B", str(batch)]
        for f in ("ringbuf_xproc", "ringbuf_inproc"):
            cells.append(f"{rate[f]:.1f} M/s ({rate[f] / r:.2f}×)" if f in rate else "—")
        cells.append(f"{r:.1f} M/s")
        cells.append(f"{rate['crossbeam_arrayqueue']:.1f} M/s" if "crossbeam_arrayqueue" in rate else "—")
        rows.append(cells)

print("| record | batch | ringbuf cross-process (× rtrb) | ringbuf in-process (× rtrb) | rtrb in-process | crossbeam ArrayQueue |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
for cells in rows:
    print("| " + " | ".join(cells) + " |")

pp = {}
for f, v in (("ringbuf_xproc", "spin"), ("ringbuf_xproc", "futex"), ("rtrb_inproc", "spin"), ("shared_word_xproc", "spin")):
    t = median_ns("pingpong_64B", f, v)
    if t:
        pp[f"{f}/{v}"] = t
if pp:
    word = pp.get("shared_word_xproc/spin")
    print()
    print("| ping-pong, 64 B | mean round trip | × bare shared word |")
    print("| --- | ---: | ---: |")
    for k, t in pp.items():
        ratio = f"{t / word:.2f}×" if word else "—"
        print(f"| {k} | {t:.0f} ns | {ratio} |")
t = median_ns("stress_random_8B_4KiB", "ringbuf_xproc_1pair", "")
if t is None:
    p = root / "stress_random_8B_4KiB" / "ringbuf_xproc_1pair" / "new" / "estimates.json"
    if p.exists():
        t = json.loads(p.read_text())["median"]["point_estimate"]
if t:
    print()
    print(f"stress (1 pair, random 8 B – 4 KiB, checksummed): {1e3 / t:.2f} M records/s")
