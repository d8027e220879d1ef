#!/usr/bin/env python3
"""The shared-prefix job of issue 24, written once so both systems run the same prompts.

Usage: shared_prefix_job.py OUT_DIR [--groups 8] [--per-group 32] [--prefix 2048] [--unique 64]
       [--max-tokens 64] [--vocab 128256] [--seed 0]
Writes OUT_DIR/job.jsonl (`ringserve generate` input: token ids, greedy, ignore_eos) and
OUT_DIR/job.json (the same prompts as lists of ids, for vLLM's LLM.generate).
"""
import argparse
import json
import os
import random

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--groups", type=int, default=8)
p.add_argument("--per-group", type=int, default=32)
p.add_argument("--prefix", type=int, default=2048)
p.add_argument("--unique", type=int, default=64)
p.add_argument("--max-tokens", type=int, default=64)
p.add_argument("--vocab", type=int, default=128256)
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()
rng = random.Random(a.seed)
os.makedirs(a.out, exist_ok=True)
prompts = []
for g in range(a.groups):
    prefix = [rng.randrange(1000, a.vocab - 1000) for _ in range(a.prefix)]
    for _ in range(a.per_group):
        prompts.append(prefix + [rng.randrange(1000, a.vocab - 1000) for _ in range(a.unique)])
# Interleave the groups, as independent clients' requests would arrive.
prompts = [prompts[g * a.per_group + i] for i in range(a.per_group) for g in range(a.groups)]
with open(os.path.join(a.out, "job.jsonl"), "w") as f:
    for ids in prompts:
        f.write(json.dumps({"prompt_token_ids": ids, "max_tokens": a.max_tokens, "temperature": 0,
                            "ignore_eos": True}) + "\n")
with open(os.path.join(a.out, "job.json"), "w") as f:
    json.dump({"prompts": prompts, "max_tokens": a.max_tokens}, f)
print(f"{len(prompts)} prompts of {a.prefix + a.unique} tokens ({a.groups} prefixes) in {a.out}")
