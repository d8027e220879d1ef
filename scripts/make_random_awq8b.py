"""Writes a Llama-3-8B-shaped AutoAWQ (GEMM, 4-bit, zero points) checkpoint on the GPU (torch, seed
0): bf16 weights drawn from N(0, 0.02), every decoder linear quantized round-to-nearest exactly as
scripts/make_int4_checkpoint.py quantizes (per group of `--group-size` input columns: scale =
max(max - min, 1e-5) / 15 rounded to f16, zero = clamp(round(-min / scale), 0, 15), q = clamp(round(w
/ scale) + zero, 0, 15)) and packed in its layouts — in seconds instead of the minutes its numpy
takes on an 8B model. Never carried: made on the GPU machine in /tmp.

  make_random_awq8b.py DIR [--format awq|gptq] [--sym] [--group-size 128] [--twin DIR2]
  make_random_awq8b.py --check          # the packers against make_int4_checkpoint.py's, on the CPU

--format awq (default): AutoAWQ's layout (`qweight` I32 [in, out/8] in the column order 0, 2, 4, 6,
1, 3, 5, 7, `qzeros` I32 [in/group, out/8], `scales` F16 [in/group, out]). gptq: AutoGPTQ's
(`qweight` I32 [in/8, out], `qzeros` stored as zero - 1, `scales`, `g_idx`; no act order). --sym:
GPTQ's symmetric scheme (zero 8, scale = 2 max|w| / 15; vLLM 0.26 reads GPTQ only so). --twin: the
dequantized model, (q - zero) * scale in float32 for the linears (exact), embeddings, norms and
lm_head as in DIR — the plain checkpoint HF transformers is run on as the reference. The same seed
gives the same bf16 weights for every format."""
import argparse, json, os, sys, time
import torch
from safetensors.torch import save_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)

ap = argparse.ArgumentParser()
ap.add_argument("dir", nargs="?")
ap.add_argument("--group-size", type=int, default=128)
ap.add_argument("--format", choices=("awq", "gptq"), default="awq")
ap.add_argument("--sym", action="store_true", help="GPTQ's symmetric scheme (zero 8)")
ap.add_argument("--twin", help="also write the dequantized float32 twin here")
ap.add_argument("--check", action="store_true", help="compare the packers with make_int4_checkpoint.py's")
args = ap.parse_args()


def quantize(w, gs, sym):
    """w [out, in] f32 -> codes [out, in] int64, scales [out, groups] f32 (f16 values), zeros
    [out, groups] int64: make_int4_checkpoint.py's quantize() without act order, in torch."""
    out_f, in_f = w.shape
    wg = w.reshape(out_f, in_f // gs, gs)
    if sym:
        amax = wg.abs().amax(dim=2)
        scales = (torch.clamp(2 * amax, min=1e-5) / 15).to(torch.float16).to(torch.float32)
        zeros = torch.full_like(scales, 8)
    else:
        wmax, wmin = wg.amax(dim=2), wg.amin(dim=2)
        scales = (torch.clamp(wmax - wmin, min=1e-5) / 15).to(torch.float16).to(torch.float32)
        zeros = torch.clamp(torch.round(-wmin / scales), 0, 15)
    q = torch.clamp(torch.round(wg / scales[:, :, None]) + zeros[:, :, None], 0, 15)
    return q.reshape(out_f, in_f).to(torch.int64), scales, zeros.to(torch.int64)


def to_i32(words):
    """Unsigned 32-bit words held in int64 -> int32 with the same bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_cols(v, order):
    """[r, 8c] codes -> [r, c] int32, code 8c + order[j] in bits 4j (make_int4_checkpoint.pack_rows)."""
    r, n = v.shape
    v = v.reshape(r, n // 8, 8)
    out = torch.zeros((r, n // 8), dtype=torch.int64, device=v.device)
    for j, o in enumerate(order):
        out |= (v[:, :, o] & 0xF) << (4 * j)
    return to_i32(out)


def awq_tensors(prefix, q, scales, zeros):
    return {f"{prefix}.qweight": pack_cols(q.T.contiguous(), AWQ_ORDER),
            f"{prefix}.qzeros": pack_cols(zeros.T.contiguous(), AWQ_ORDER),
            f"{prefix}.scales": scales.T.contiguous().to(torch.float16)}


def gptq_tensors(prefix, q, scales, zeros, gs):
    out_f, in_f = q.shape
    qt = q.T.reshape(in_f // 8, 8, out_f)
    words = torch.zeros((in_f // 8, out_f), dtype=torch.int64, device=q.device)
    for j in range(8):
        words |= qt[:, j, :] << (4 * j)
    stored = (zeros - 1) & 0xF
    return {f"{prefix}.qweight": to_i32(words),
            f"{prefix}.qzeros": pack_cols(stored.T.contiguous(), range(8)),
            f"{prefix}.scales": scales.T.contiguous().to(torch.float16),
            f"{prefix}.g_idx": (torch.arange(in_f, device=q.device) // gs).to(torch.int32)}


def dequantize(q, scales, zeros, gs):
    """(q - zero) * scale in f32: exact (a 4-bit integer times an f16 value)."""
    col_group = torch.arange(q.shape[1], device=q.device) // gs
    return (q - zeros[:, col_group]).to(torch.float32) * scales[:, col_group]


def check():
    """The torch quantizer and packers against make_int4_checkpoint.py's numpy ones, bit for bit."""
    import numpy as np
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_int4_checkpoint as ref
    gen = torch.Generator().manual_seed(1)
    w = (torch.randn(48, 256, generator=gen) * 0.02).to(torch.bfloat16).to(torch.float32)
    w[3, :64] = w[3, :64].abs() + 0.01  # a group with min > 0: zero 0
    gs = 64
    for fmt, sym in (("awq", False), ("gptq", False), ("gptq", True)):
        q, s, z = quantize(w, gs, sym)
        rq, rs, rz = ref.quantize(w.numpy(), gs, sym, None)
        assert np.array_equal(q.numpy(), rq) and np.array_equal(s.numpy(), rs) and np.array_equal(z.numpy(), rz)
        mine = awq_tensors("x", q, s, z) if fmt == "awq" else gptq_tensors("x", q, s, z, gs)
        a = argparse.Namespace(format=fmt, group_size=gs, desc_act=False, sym=sym, gptq_v2=False,
                               twin=True, numpy_pack=True)
        tensors, deq = ref.quantize_linear(w.numpy(), a, None, {}, "x")
        assert set(f"x.{n}" for n in tensors) == set(mine), (fmt, sym)
        for name, (dtype, shape, raw) in tensors.items():
            t = mine[f"x.{name}"]
            assert list(t.shape) == shape, (fmt, name, t.shape, shape)
            assert t.numpy().tobytes() == raw, (fmt, sym, name)
        if not (fmt == "gptq" and not sym):  # there a zero of 0 reads back as 16 (the check below)
            assert np.array_equal(dequantize(q, s, z, gs).numpy(), deq), (fmt, sym)
    print("torch quantizer, AWQ and GPTQ (asymmetric, symmetric) packers and dequantization equal "
          "make_int4_checkpoint.py's")


if args.check:
    check()
    sys.exit(0)
if not args.dir:
    ap.error("DIR is required")
t0 = time.time()
torch.manual_seed(0)
hidden, inter, layers, heads, kv_heads, vocab = 4096, 14336, 32, 32, 8, 128256
head_dim = hidden // heads
gs = args.group_size
dev = "cuda"
outs = {args.format: args.dir, "twin": args.twin}
outs = {k: v for k, v in outs.items() if v}
maps = {k: {} for k in outs}
for d in outs.values():
    os.makedirs(d, exist_ok=True)


def save(kind, name, tensors):
    save_file(tensors, os.path.join(outs[kind], name), metadata={"format": "pt"})
    maps[kind].update({t: name for t in tensors})


def bf16(*shape, std=0.02):
    return (torch.randn(*shape, device=dev) * std).to(torch.bfloat16).cpu()


plain = {"model.embed_tokens.weight": bf16(vocab, hidden),
         "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
         "lm_head.weight": bf16(vocab, hidden)}
for kind in outs:
    save(kind, "embed.safetensors", plain)
for i in range(layers):
    p = f"model.layers.{i}"
    norms = {f"{p}.input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
             f"{p}.post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    t = {k: dict(norms) for k in outs}
    for name, inp, out in [("self_attn.q_proj", hidden, hidden),
                           ("self_attn.k_proj", hidden, kv_heads * head_dim),
                           ("self_attn.v_proj", hidden, kv_heads * head_dim),
                           ("self_attn.o_proj", hidden, hidden),
                           ("mlp.gate_proj", hidden, inter), ("mlp.up_proj", hidden, inter),
                           ("mlp.down_proj", inter, hidden)]:
        w = (torch.randn(out, inp, device=dev) * 0.02).to(torch.bfloat16).to(torch.float32)
        q, s, z = quantize(w, gs, args.sym)
        if args.format == "gptq":
            if bool((z == 0).any()):
                sys.exit(f"{p}.{name}: a zero point of 0, which GPTQ's stored zero - 1 reads back as "
                         "16: the twin would not be this checkpoint's weights")
            t["gptq"].update({k: v.cpu() for k, v in gptq_tensors(f"{p}.{name}", q, s, z, gs).items()})
        else:
            t["awq"].update({k: v.cpu() for k, v in awq_tensors(f"{p}.{name}", q, s, z).items()})
        if "twin" in outs:
            t["twin"][f"{p}.{name}.weight"] = dequantize(q, s, z, gs).cpu()
    for kind in outs:
        save(kind, f"layer{i:02}.safetensors", t[kind])
config = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
    "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
    "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": 8192,
    "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "bos_token_id": 128000, "eos_token_id": 128001,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu",
}
quant = {"awq": {"quant_method": "awq", "bits": 4, "group_size": gs, "zero_point": True,
                 "version": "gemm"},
         "gptq": {"quant_method": "gptq", "bits": 4, "group_size": gs, "desc_act": False,
                  "sym": args.sym, "static_groups": False, "true_sequential": True,
                  "damp_percent": 0.01, "lm_head": False, "checkpoint_format": "gptq"}}
for kind, d in outs.items():
    json.dump({"metadata": {}, "weight_map": maps[kind]},
              open(os.path.join(d, "model.safetensors.index.json"), "w"))
    c = dict(config, quantization_config=quant[kind]) if kind in quant else dict(config, torch_dtype="float32")
    json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
print(f"wrote {', '.join(outs.values())} in {time.time() - t0:.1f} s", flush=True)
