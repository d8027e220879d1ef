#!/usr/bin/env python3
"""Writes tests/fixtures/gguf-qwen2/: a tiny random Qwen2 model as a GGUF file (model.gguf, written
with gguf-py) and HF transformers' float32 reading of it (expected.json): the prompt ids of a few
texts, their greedy continuations and the last position's logits.

The vocabulary is the first 2,048 tokens of SmolLM2's byte-level BPE (with the merges that stay
inside them), under the `qwen2` pre-tokenizer; the weights are random, in F32, F16, Q8_0, Q4_0,
Q4_1, Q5_0 and Q5_1, with q/k/v biases as Qwen2 has. transformers reads the file with its own code
(gguf-py's dequantization, its own tokenizer conversion), so the fixture checks ringserve's qwen2
mapping — names, no q/k permutation, biases — and its `qwen2` pre-tokenizer.

    scripts/get-smollm2.sh
    PYTHONPATH=/tmp/ref_py python3 scripts/make_gguf_qwen2.py [models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import json
import pathlib
import sys

import gguf
import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType as T
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = ROOT / "tests/fixtures/gguf-qwen2"
VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 2048, 64, 128, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS
TEXTS = [
    "Hello world! It's 2026, isn't it?",
    "Numbers 3.14159 and 1234567 split\n\n  twice\tover",
]


def main():
    src = gguf.GGUFReader(str(SRC))
    f = src.fields
    tokens = f["tokenizer.ggml.tokens"].contents()[:VOCAB]
    types = f["tokenizer.ggml.token_type"].contents()[:VOCAB]
    keep = set(tokens)
    merges = [m for m in f["tokenizer.ggml.merges"].contents()
              if "".join(m.split(" ")) in keep and all(p in keep for p in m.split(" "))]

    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(OUT / "model.gguf"), "qwen2")
    w.add_name("ringserve qwen2 fixture")
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(f["tokenizer.chat_template"].contents())

    def tensor(name, shape, ty, scale=0.08):
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        if ty == T.F32:
            w.add_tensor(name, x)
        elif ty == T.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(x, ty), raw_dtype=ty)

    tensor("token_embd.weight", (VOCAB, HIDDEN), T.F16, 0.5)
    kinds = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.F16, T.F32]
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        w.add_tensor(p + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        tensor(p + "attn_q.weight", (HEADS * HEAD_DIM, HIDDEN), kinds[(i + 0) % 7])
        tensor(p + "attn_k.weight", (KV_HEADS * HEAD_DIM, HIDDEN), kinds[(i + 1) % 7])
        tensor(p + "attn_v.weight", (KV_HEADS * HEAD_DIM, HIDDEN), kinds[(i + 2) % 7])
        tensor(p + "attn_q.bias", (HEADS * HEAD_DIM,), T.F32, 0.3)
        tensor(p + "attn_k.bias", (KV_HEADS * HEAD_DIM,), T.F32, 0.3)
        tensor(p + "attn_v.bias", (KV_HEADS * HEAD_DIM,), T.F32, 0.3)
        tensor(p + "attn_output.weight", (HIDDEN, HEADS * HEAD_DIM), kinds[(i + 3) % 7])
        tensor(p + "ffn_gate.weight", (FFN, HIDDEN), kinds[(i + 4) % 7])
        tensor(p + "ffn_up.weight", (FFN, HIDDEN), kinds[(i + 5) % 7])
        tensor(p + "ffn_down.weight", (HIDDEN, FFN), kinds[(i + 6) % 7])
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    tensor("output.weight", (VOCAB, HIDDEN), T.Q8_0, 0.3)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    tok = AutoTokenizer.from_pretrained(OUT, gguf_file="model.gguf")
    model = AutoModelForCausalLM.from_pretrained(OUT, gguf_file="model.gguf", dtype=torch.float32)
    model.eval()
    assert type(model).__name__ == "Qwen2ForCausalLM", type(model).__name__
    cases = []
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].tolist()
            out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        cases.append({"text": text, "prompt_ids": ids, "greedy": out[0].tolist()[len(ids):],
                      "last_logits": logits})
    (OUT / "expected.json").write_text(json.dumps({
        "made_by": f"transformers {transformers.__version__}, torch {torch.__version__}, float32",
        "cases": cases}) + "\n")
    print((OUT / "model.gguf").stat().st_size, "bytes;", [c["prompt_ids"][:12] for c in cases])


if __name__ == "__main__":
    main()
