#!/usr/bin/env python3
"""Times vLLM's offline LLM.generate on a job written by shared_prefix_job.py (token-id prompts,
greedy, ignore_eos), after a warm-up, in one process. Prints one line: `vllm job: N requests,
T s`. Usage: vllm_generate_job.py MODEL JOB_JSON [--no-prefix-caching] [--max-num-batched-tokens N]
"""
import argparse
import json
import os
import time

os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("job")
p.add_argument("--no-prefix-caching", action="store_true")
p.add_argument("--max-num-batched-tokens", type=int, default=None)
a = p.parse_args()
job = json.load(open(a.job))
kw = {}
if a.max_num_batched_tokens:
    kw["max_num_batched_tokens"] = a.max_num_batched_tokens
llm = LLM(model=a.model, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=4096,
          gpu_memory_utilization=0.85, enable_prefix_caching=not a.no_prefix_caching, seed=0, **kw)
sp = SamplingParams(temperature=0, max_tokens=job["max_tokens"], ignore_eos=True, detokenize=False)
# Warm-up on unrelated prompts (no shared prefix with the job).
llm.generate([TokensPrompt(prompt_token_ids=[5 + i] * 300) for i in range(8)], sp, use_tqdm=False)
prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
t0 = time.perf_counter()
outs = llm.generate(prompts, sp, use_tqdm=False)
dt = time.perf_counter() - t0
gen = sum(len(o.outputs[0].token_ids) for o in outs)
print(f"vllm job: {len(outs)} requests, {gen} generated tokens, {dt:.3f} s")
