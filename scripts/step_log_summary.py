#!/usr/bin/env python3
"""Summarises the per-step debug lines of `ringserve generate` or `ringserve bench engine`
(RUST_LOG=worker=debug): where a job's time goes — steps that compute prompt tokens against
decode-only steps (by batch size), and the one-time work inside them (cuBLASLt tuning and CUDA
graph captures of new decode shapes). With --points, `bench engine`'s log is split at its
"bench point" lines and each point (warm-up, the one-token run, the timed run) summarised alone.
usage: step_log_summary.py [--points] LOG"""
import re
import sys
from collections import defaultdict

kv = re.compile(r"(\w+)=([0-9.]+)")


def summarise(steps, captures, title):
    total = sum(s["step_ms"] for s in steps)
    print(f"{title}{len(steps)} steps, {total:.1f} ms in steps")
    kinds = defaultdict(lambda: [0, 0.0, 0.0, 0, 0])
    for s in steps:
        if s["prefill_tokens"] > 0:
            k = "prefill only" if s["decode_tokens"] == 0 else "prefill + decode"
        else:
            k = f"decode only, {int(s['decode_tokens'])} seqs"
        e = kinds[k]
        e[0] += 1
        e[1] += s["step_ms"]
        e[2] += s["backend_ms"]
        e[3] += int(s["prefill_tokens"])
        e[4] += int(s["decode_tokens"])
    for k, (n, ms, be, pt, dt) in sorted(kinds.items(), key=lambda x: -x[1][1]):
        print(f"  {k:28} {n:4} steps {ms:8.1f} ms (backend {be:8.1f}), {ms / n:7.2f} ms a step, "
              f"{pt} prompt tokens, {dt} decode tokens")
    if captures:
        tune = sum(c.get("tune_ms", 0) for c in captures)
        cap = sum(c.get("capture_ms", 0) for c in captures)
        print(f"  {len(captures)} decode graphs captured: tuning {tune:.1f} ms, capture {cap:.1f} ms")
        for c in captures:
            print(f"    bucket {int(c['bucket'])} stride {int(c['stride'])}: tune {c['tune_ms']:.1f} ms, "
                  f"capture {c['capture_ms']:.1f} ms")


points = sys.argv[1] == "--points"
segments = [["", [], []]]
for line in open(sys.argv[-1], errors="replace"):
    if points and "bench point" in line:
        d = {k: v for k, v in kv.findall(line)}
        segments.append([f"point batch {d.get('batch')} x {d.get('prompt_len')}, "
                         f"{d.get('output_len')} out: ", [], []])
    elif "decode graph captured" in line:
        segments[-1][2].append({k: float(v) for k, v in kv.findall(line)})
    elif line.rstrip().endswith(" step") or " step " in line and "step_ms=" in line:
        d = {k: float(v) for k, v in kv.findall(line)}
        if "step_ms" in d:
            segments[-1][1].append(d)
for title, steps, captures in segments:
    if steps or captures:
        summarise(steps, captures, title)
