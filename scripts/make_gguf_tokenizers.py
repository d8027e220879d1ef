#!/usr/bin/env python3
"""Writes tests/fixtures/gguf-tokenizers/: one GGUF file per `tokenizer.ggml.pre` value ringserve
maps (gpt2, llama-bpe, qwen2, smollm), each holding only a tokenizer — the first 2,048 tokens of
SmolLM2's byte-level BPE and the merges inside them — and expected.json: HF transformers' token ids
for a few hard strings through each (its own GGUF tokenizer conversion), which
worker/tests/gguf.rs requires ringserve's to equal.

    PYTHONPATH=/tmp/ref_py python3 scripts/make_gguf_tokenizers.py [models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import json
import pathlib
import sys

import gguf
import numpy as np
import transformers
from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = ROOT / "tests/fixtures/gguf-tokenizers"
VOCAB = 2048
PRES = ["gpt2", "llama-bpe", "qwen2", "smollm"]
TEXTS = [
    "Hello world! It's 2026; DON'T you think 1234567 > 89?",
    "  leading spaces,\ttabs\n\nand\r\nnewlines   trailing  ",
    "Ünïcödé café — naïve 日本語 🎉 x²+y²",
    "<|im_start|>user\nhi<|im_end|>",
]


def main():
    f = gguf.GGUFReader(str(SRC)).fields
    tokens = f["tokenizer.ggml.tokens"].contents()[:VOCAB]
    types = f["tokenizer.ggml.token_type"].contents()[:VOCAB]
    keep = set(tokens)
    merges = [m for m in f["tokenizer.ggml.merges"].contents()
              if "".join(m.split(" ")) in keep and all(p in keep for p in m.split(" "))]
    expected = {"made_by": f"transformers {transformers.__version__}", "texts": TEXTS, "ids": {}}
    for pre in PRES:
        name = f"{pre}.gguf"
        w = gguf.GGUFWriter(str(OUT / name), "llama")
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_tensor("unused", np.zeros(1, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        tok = AutoTokenizer.from_pretrained(OUT, gguf_file=name)
        expected["ids"][pre] = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    (OUT / "expected.json").write_text(json.dumps(expected, ensure_ascii=False, indent=1) + "\n")
    for pre in PRES:
        print(pre, [len(i) for i in expected["ids"][pre]])


if __name__ == "__main__":
    main()
