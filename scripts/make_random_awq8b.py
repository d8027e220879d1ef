"""Writes a Llama-3-8B-shaped AutoAWQ (GEMM, 4-bit, zero points) checkpoint whose packed codes,
zero points and scales are drawn at random on the GPU (torch, seed 0), for speed runs of the INT4
kernels: the same tensors, shapes and config a quantized 8B model has, in seconds instead of the
minutes scripts/make_int4_checkpoint.py takes to quantize one (whose weights mean something).
Never carried: made on the GPU machine in /tmp.

usage: make_random_awq8b.py DIR [--group-size 128]"""
import argparse, json, os, time
import torch
from safetensors.torch import save_file

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--group-size", type=int, default=128)
args = ap.parse_args()
t0 = time.time()
torch.manual_seed(0)
hidden, inter, layers, heads, kv_heads, vocab = 4096, 14336, 32, 32, 8, 128256
head_dim = hidden // heads
gs = args.group_size
os.makedirs(args.dir, exist_ok=True)
dev = "cuda"


def awq(prefix, inp, out):
    """AutoAWQ's tensors of one linear layer: qweight I32 [in, out/8], qzeros I32 [in/gs, out/8],
    scales F16 [in/gs, out]; any 32 random bits are 8 valid codes."""
    words = lambda r, c: torch.randint(-2**31, 2**31 - 1, (r, c), dtype=torch.int32, device=dev)
    scale = 0.002 + 0.002 * torch.rand(inp // gs, out, device=dev)
    return {
        f"{prefix}.qweight": words(inp, out // 8).cpu(),
        f"{prefix}.qzeros": words(inp // gs, out // 8).cpu(),
        f"{prefix}.scales": scale.to(torch.float16).cpu(),
    }


def bf16(*shape, std=0.02):
    return (torch.randn(*shape, device=dev) * std).to(torch.bfloat16).cpu()


weight_map = {}


def shard(name, tensors):
    save_file(tensors, os.path.join(args.dir, name), metadata={"format": "pt"})
    weight_map.update({t: name for t in tensors})


shard("embed.safetensors", {"model.embed_tokens.weight": bf16(vocab, hidden),
                            "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                            "lm_head.weight": bf16(vocab, hidden)})
for i in range(layers):
    p = f"model.layers.{i}"
    t = {f"{p}.input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
         f"{p}.post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    for name, inp, out in [("self_attn.q_proj", hidden, hidden),
                           ("self_attn.k_proj", hidden, kv_heads * head_dim),
                           ("self_attn.v_proj", hidden, kv_heads * head_dim),
                           ("self_attn.o_proj", hidden, hidden),
                           ("mlp.gate_proj", hidden, inter), ("mlp.up_proj", hidden, inter),
                           ("mlp.down_proj", inter, hidden)]:
        t.update(awq(f"{p}.{name}", inp, out))
    shard(f"layer{i:02}.safetensors", t)
json.dump({"metadata": {}, "weight_map": weight_map},
          open(os.path.join(args.dir, "model.safetensors.index.json"), "w"))
config = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
    "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
    "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": 8192,
    "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "bos_token_id": 128000, "eos_token_id": 128001,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu",
    "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": gs,
                            "zero_point": True, "version": "gemm"},
}
json.dump(config, open(os.path.join(args.dir, "config.json"), "w"), indent=2)
print(f"wrote {args.dir} in {time.time() - t0:.1f} s", flush=True)
