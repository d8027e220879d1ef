#!/usr/bin/env python3
"""Writes tests/fixtures/gguf-q4/model.gguf: the random float32 Llama of tests/fixtures/int4-awq-twin
(hidden 128, intermediate 256, 4 heads of 32, 2 KV heads, 2 layers, vocab 256) as a llama GGUF whose
decoder linears are quantized by gguf-py's own quantizers — layer 0 to Q4_0, layer 1 to Q4_1 — with
the embeddings in Q8_0, the LM head in F16 and the norms in F32 (the mix llama.cpp's Q4_0 / Q4_1
files have), q/k rows permuted as llama.cpp's converter permutes them. Every input width is a
multiple of 32, so each layer can run on the INT4 kernels. `worker/tests/gguf.rs` checks the
4-bit blocks ringserve reads against its dequantized weights; `worker/tests/cuda_int4.rs` runs the
file on the GPU's INT4 kernels against the CPU.

    PYTHONPATH=/tmp/gguf_py python3 scripts/make_gguf_q4.py   # pip install --target /tmp/gguf_py gguf safetensors
"""
import json
import pathlib

import gguf
import numpy as np
from safetensors.numpy import load_file

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "tests/fixtures/int4-awq-twin"
OUT = ROOT / "tests/fixtures/gguf-q4"
Q = gguf.GGMLQuantizationType
LAYER_TYPES = [Q.Q4_0, Q.Q4_1]


def permute(w, n_head):
    """llama.cpp's converter's q/k row order (interleaved RoPE pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add(w, name, data, qtype):
    if qtype == Q.F32:
        w.add_tensor(name, data.astype(np.float32))
    elif qtype == Q.F16:
        w.add_tensor(name, data.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(data.astype(np.float32), qtype), raw_dtype=qtype)


def main():
    cfg = json.loads((SRC / "config.json").read_text())
    heads, kv_heads, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    t = load_file(str(SRC / "model.safetensors"))
    OUT.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(OUT / "model.gguf"), "llama")
    w.add_name("ringserve Q4_0/Q4_1 fixture")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    # A placeholder vocabulary (the weights are random; only the ids matter).
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "ab"] + [f"<t{i}>" for i in range(3, cfg["vocab_size"])])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    add(w, "token_embd.weight", t["model.embed_tokens.weight"], Q.Q8_0)
    for i, qt in enumerate(LAYER_TYPES):
        hf, g = f"model.layers.{i}.", f"blk.{i}."
        add(w, g + "attn_norm.weight", t[hf + "input_layernorm.weight"], Q.F32)
        add(w, g + "attn_q.weight", permute(t[hf + "self_attn.q_proj.weight"], heads), qt)
        add(w, g + "attn_k.weight", permute(t[hf + "self_attn.k_proj.weight"], kv_heads), qt)
        add(w, g + "attn_v.weight", t[hf + "self_attn.v_proj.weight"], qt)
        add(w, g + "attn_output.weight", t[hf + "self_attn.o_proj.weight"], qt)
        add(w, g + "ffn_norm.weight", t[hf + "post_attention_layernorm.weight"], Q.F32)
        add(w, g + "ffn_gate.weight", t[hf + "mlp.gate_proj.weight"], qt)
        add(w, g + "ffn_up.weight", t[hf + "mlp.up_proj.weight"], qt)
        add(w, g + "ffn_down.weight", t[hf + "mlp.down_proj.weight"], qt)
    add(w, "output_norm.weight", t["model.norm.weight"], Q.F32)
    add(w, "output.weight", t["lm_head.weight"], Q.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(OUT / "model.gguf", (OUT / "model.gguf").stat().st_size, "bytes")


if __name__ == "__main__":
    main()
