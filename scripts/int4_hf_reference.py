#!/usr/bin/env python3
"""HuggingFace transformers' float32 reference for a dequantized twin (make_int4_checkpoint.py --twin):
writes TWIN/expected.json as tests/fixtures/tiny-llama/expected.json is laid out —
{"dtype", "transformers", "torch", "cases": [{"prompt", "last_logits", "greedy"}]}, `greedy` the next
24 tokens of generate(do_sample=False) with no EOS stop. Runs on the CPU; needs torch and transformers
(the device machine's vLLM environment has both).   usage: int4_hf_reference.py TWIN [TWIN ...]
"""
import json
import sys

import torch
import transformers
from transformers import LlamaForCausalLM

PROMPTS = [[1, 17, 42, 99, 3], [1, 200, 5, 64, 128, 31, 7, 250], [1] + list(range(30, 60))]

for twin in sys.argv[1:]:
    model = LlamaForCausalLM.from_pretrained(twin, dtype=torch.float32).eval()
    cases = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            logits = model(ids).logits[0, -1].tolist()
            out = model.generate(ids, do_sample=False, max_new_tokens=24, min_new_tokens=24,
                                 eos_token_id=None, pad_token_id=0)
        top = sorted(logits, reverse=True)
        cases.append({"prompt": prompt, "last_logits": logits, "greedy": out[0, len(prompt):].tolist(),
                      "top_gap": top[0] - top[1]})
    json.dump({"dtype": "float32", "transformers": transformers.__version__, "torch": torch.__version__,
               "cases": cases}, open(f"{twin}/expected.json", "w"))
    print(twin, [c["greedy"][:6] for c in cases], "gaps", [round(c["top_gap"], 4) for c in cases])
