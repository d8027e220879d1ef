"""Writes a Llama-3-8B-shaped model with random bf16 weights (HF init, seed 0) to a folder, for the
GPU benchmarks. Never carried: made on the GPU machine in /tmp.   usage: make_random_llama8b.py DIR"""
import sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM

out = sys.argv[1]
t = time.time()
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                  rope_theta=500000.0, rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128001,
                  tie_word_embeddings=False)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg)
model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
print(f"wrote {out} in {time.time() - t:.1f} s", flush=True)
