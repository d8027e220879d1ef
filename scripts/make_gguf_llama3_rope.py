#!/usr/bin/env python3
"""Writes tests/fixtures/gguf-llama3-rope/model.gguf: tests/fixtures/tiny-llama's weights as a
llama GGUF carrying Llama 3.1-style RoPE scaling the way llama.cpp's converter stores it — a
`rope_freqs.weight` tensor of one divisor per frequency — with q/k rows permuted as that converter
permutes them. The factors are computed as `convert_hf_to_gguf.py` (LlamaModel) computes them from
a config's `rope_scaling: {rope_type: llama3, factor, low_freq_factor, high_freq_factor,
original_max_position_embeddings}`; PARAMS below are those values. `worker/tests/gguf.rs` checks
that ringserve runs this file exactly as it runs tiny-llama with that `rope_scaling` in its config.

    PYTHONPATH=/tmp/gguf_py python3 scripts/make_gguf_llama3_rope.py   # pip install --target /tmp/gguf_py gguf safetensors
"""
import json
import math
import pathlib

import gguf
import numpy as np
from safetensors.numpy import load_file

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "tests/fixtures/tiny-llama"
OUT = ROOT / "tests/fixtures/gguf-llama3-rope"
# Small enough an original context that the 8 frequencies of a 16-wide head fall in all three
# regimes (kept, blended, divided by `factor`) at prompt lengths of a few dozen tokens.
PARAMS = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def llama3_factors(theta, head_dim):
    """One divisor per frequency, as llama.cpp's converter writes `rope_freqs.weight`."""
    factor, low, high = PARAMS["factor"], PARAMS["low_freq_factor"], PARAMS["high_freq_factor"]
    old_ctx = PARAMS["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def permute(w, n_head):
    """llama.cpp's converter's q/k row order (interleaved RoPE pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    cfg = json.loads((SRC / "config.json").read_text())
    theta = cfg["rope_parameters"]["rope_theta"]
    heads, kv_heads, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    t = load_file(str(SRC / "model.safetensors"))
    OUT.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(OUT / "model.gguf"), "llama")
    w.add_name("ringserve llama3-rope fixture")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    # A placeholder vocabulary (the weights are random; only the ids matter).
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "ab"] + [f"<t{i}>" for i in range(3, cfg["vocab_size"])])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_tensor("token_embd.weight", t["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        hf, g = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(g + "attn_norm.weight", t[hf + "input_layernorm.weight"])
        w.add_tensor(g + "attn_q.weight", permute(t[hf + "self_attn.q_proj.weight"], heads))
        w.add_tensor(g + "attn_k.weight", permute(t[hf + "self_attn.k_proj.weight"], kv_heads))
        w.add_tensor(g + "attn_v.weight", t[hf + "self_attn.v_proj.weight"])
        w.add_tensor(g + "attn_output.weight", t[hf + "self_attn.o_proj.weight"])
        w.add_tensor(g + "ffn_norm.weight", t[hf + "post_attention_layernorm.weight"])
        w.add_tensor(g + "ffn_gate.weight", t[hf + "mlp.gate_proj.weight"])
        w.add_tensor(g + "ffn_up.weight", t[hf + "mlp.up_proj.weight"])
        w.add_tensor(g + "ffn_down.weight", t[hf + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", t["model.norm.weight"])
    w.add_tensor("output.weight", t["lm_head.weight"])
    w.add_tensor("rope_freqs.weight", llama3_factors(theta, head_dim))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (OUT / "rope_scaling.json").write_text(json.dumps({"rope_type": "llama3", **PARAMS}) + "\n")
    print(OUT / "model.gguf", (OUT / "model.gguf").stat().st_size, "bytes; factors",
          llama3_factors(theta, head_dim).tolist())


if __name__ == "__main__":
    main()
