#!/usr/bin/env python3
"""Turns a float checkpoint (F32/BF16/F16 safetensors, one file or sharded) into an INT4 one laid out
exactly as AutoAWQ or AutoGPTQ/GPTQModel lay it out, plus its "dequantized twin": the same model as a
plain HF checkpoint whose linear weights are the INT4 weights dequantized, so that any engine (HF
transformers, vLLM, ringserve) can be checked against it. Needs numpy only.

  python3 scripts/make_int4_checkpoint.py SRC DST --format awq|gptq|ct [--group-size 128] [--sym]
      [--desc-act] [--gptq-v2] [--numpy-pack] [--twin DIR] [--twin-dtype f32|bf16]
  python3 scripts/make_int4_checkpoint.py --random-source DIR --hidden 128 --intermediate 256 \\
      --heads 4 --kv-heads 2 --layers 2 --vocab 256 [--seed 7]

Layouts (every decoder linear q/k/v/o/gate/up/down; embeddings, norms and lm_head unchanged):
- awq (AutoAWQ 0.2, `version: "gemm"`, `zero_point: true`): `qweight` int32 [in, out/8], eight output
  columns per word in the order 0, 2, 4, 6, 1, 3, 5, 7 (column 8c + ORDER[j] in bits 4j..4j+3);
  `qzeros` int32 [in/group, out/8] packed the same way; `scales` f16 [in/group, out].
- ct (llm-compressor's compressed-tensors 0.17 `pack-quantized`, W4A16): `weight_packed` int32
  [out, in/8], eight input columns a word in order, each the signed code q - 8 stored as q (packed by
  compressed-tensors' own `pack_to_int32`, so this needs torch and compressed-tensors); `weight_scale`
  bf16 [out, groups]; `weight_shape` int64 [2]; asymmetric (no --sym): `weight_zero_point` int32
  [out/8, groups] packed along the output dimension. --sym here is compressed-tensors' symmetric
  scheme (zero 8, scale = 2 max|w| / 15, as above). With --desc-act, compressed-tensors'
  `actorder: "group"`: columns quantized in a seeded random order, saved in their original order,
  and `weight_g_idx` int32 [in] maps each column to its group (as GPTQ's g_idx). --numpy-pack packs
  with this script's own numpy code instead of `pack_to_int32` (no torch needed; the same bits:
  `int4-ct-sym`/`-asym` rebuilt with it are byte-identical to the committed ones).
- gptq (AutoGPTQ 0.7 / GPTQModel, `checkpoint_format: "gptq"`): `qweight` int32 [in/8, out], input
  rows 8p..8p+7 in bits 0..31 in order; `qzeros` int32 [groups, out/8], output columns in order, each
  stored as zero - 1 (masked to 4 bits: the historical off-by-one, which readers undo with + 1, so a
  zero of 0 reads back as 16); `scales` f16 [groups, out]; `g_idx` int32 [in]. With --gptq-v2 zeros
  are stored as they are (`checkpoint_format: "gptq_v2"`). With --desc-act, input columns are
  quantized in a seeded random order ("activation order") and g_idx[i] = (position of i) // group.
  Layers that read the same input (q/k/v; gate/up) share that order, as GPTQ's do.
  --sym: GPTQ's symmetric scheme (zero 8, scale = 2 max|w| / 15).

Quantization is round-to-nearest (the tools' own `pseudo_quantize_tensor` step, without AWQ's scale
search or GPTQ's Hessian updates, which change the values, never the layout): per group,
scale = max(max - min, 1e-5) / 15 rounded to f16, zero = clamp(round(-min / scale), 0, 15),
q = clamp(round(w / scale) + zero, 0, 15). The twin holds (q - z) * s with z as a reader reads it back,
exact in f32 (--twin-dtype bf16 rounds it to nearest even, for models too big for f32 on disk).
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def read_safetensors(path):
    """{name: (dtype string, shape, raw bytes view)} of one file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[b:e])
    return out


def to_f32(dtype, shape, raw):
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float32)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").reshape(shape).astype(np.float32)
    if dtype == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    raise SystemExit(f"unsupported source dtype {dtype}")


def bf16_bytes(x):
    """x (float32) rounded to bf16, nearest even, as little-endian bytes."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.astype("<u2").tobytes()


def write_safetensors(path, tensors):
    """tensors: {name: (dtype string, shape, bytes)}."""
    header, offset = {}, 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in sorted(tensors):
            f.write(tensors[name][2])


def pack_rows(nibbles, order):
    """[r, 8c] codes -> [r, c] int32, code 8c + order[j] in bits 4j."""
    r, n = nibbles.shape
    v = nibbles.reshape(r, n // 8, 8).astype(np.uint32)
    out = np.zeros((r, n // 8), dtype=np.uint32)
    for j, o in enumerate(order):
        out |= (v[:, :, o] & 0xF) << np.uint32(4 * j)
    return out.view(np.int32)


def round_scale(x, kind):
    """Scales as the checkpoint stores them: f16 (AWQ, GPTQ) or bf16 (compressed-tensors, the
    model's dtype), returned as float32 values."""
    if kind == "f16":
        return x.astype(np.float16).astype(np.float32)
    bits = np.frombuffer(bf16_bytes(x), dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32).reshape(x.shape)


def quantize(w, group, sym, perm, scale_kind="f16"):
    """w [out, in] f32 -> codes [out, in], scales f16 [out, groups], zeros [out, groups] (true zeros),
    quantizing the columns in `perm` order in groups of `group` (perm None: natural order)."""
    out_f, in_f = w.shape
    wp = w if perm is None else w[:, perm]
    groups = -(-in_f // group)
    pad = groups * group - in_f
    wg = np.pad(wp, ((0, 0), (0, pad)), mode="edge").reshape(out_f, groups, group)
    if sym:
        amax = np.abs(wg).max(axis=2)
        scales = round_scale(np.maximum(2 * amax, 1e-5) / 15, scale_kind)
        zeros = np.full((out_f, groups), 8, dtype=np.int32)
    else:
        wmax, wmin = wg.max(axis=2), wg.min(axis=2)
        scales = round_scale(np.maximum(wmax - wmin, 1e-5) / 15, scale_kind)
        zeros = np.clip(np.round(-wmin / scales), 0, 15).astype(np.int32)
    s32 = scales
    q = np.clip(np.round(wg / s32[:, :, None]) + zeros[:, :, None], 0, 15).astype(np.int32)
    q = q.reshape(out_f, groups * group)[:, :in_f]
    if perm is not None:
        unq = np.empty_like(q)
        unq[:, perm] = q
        q = unq
    return q, scales, zeros


def input_of(module):
    """Which input a linear layer reads: q/k/v share one, gate/up another (GPTQ's act order derives
    the column order from that input, so layers fused into one product share it)."""
    layer, name = module.split(".", 3)[2], module.split(".", 3)[3]
    kind = {"self_attn.q_proj": "attn", "self_attn.k_proj": "attn", "self_attn.v_proj": "attn",
            "mlp.gate_proj": "mlp", "mlp.up_proj": "mlp"}.get(name, name)
    return layer, kind


def pack_nibbles(v, packed_dim=1):
    """Codes 0..15 packed eight a word along `packed_dim`, the first in bits 0..3 (what
    compressed-tensors' `pack_to_int32` makes of the signed codes v - 8)."""
    v = np.moveaxis(v.astype(np.uint32), packed_dim, -1)
    v = v.reshape(*v.shape[:-1], v.shape[-1] // 8, 8)
    words = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i in range(8):
        words |= v[..., i] << np.uint32(4 * i)
    return np.moveaxis(words.view(np.int32), -1, packed_dim)


def quantize_linear(w, args, rng, perms, key):
    """One linear layer: ({tensor suffix: (dtype, shape, bytes)}, dequantized f32 [out, in] or None
    without --twin)."""
    out_f, in_f = w.shape
    group = args.group_size if args.group_size > 0 else in_f
    perm = None
    if args.desc_act:
        if key not in perms:
            perms[key] = rng.permutation(in_f)
        perm = perms[key]
    q, scales, zeros = quantize(w, group, args.sym, perm, "bf16" if args.format == "ct" else "f16")
    groups = scales.shape[1]
    col_group = np.arange(in_f) // group
    if perm is not None:
        g_idx = np.empty(in_f, dtype=np.int32)
        g_idx[perm] = np.arange(in_f) // group
        col_group = g_idx
    if args.format == "ct":
        # Packed by compressed-tensors' own pack_to_int32 (the signed codes q - 8, shifted back
        # by its + 8): a packer this project did not write; --numpy-pack: by pack_nibbles.
        if args.numpy_pack:
            pack = pack_nibbles
        else:
            import torch
            from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

            def pack(v, packed_dim=1):
                return pack_to_int32(torch.from_numpy((v - 8).astype(np.int8)), 4,
                                     packed_dim=packed_dim).numpy()
        packed = pack(q)  # [out, in/8]
        read_zeros = zeros
        tensors = {"weight_packed": ("I32", list(packed.shape), packed.astype("<i4").tobytes()),
                   "weight_scale": ("BF16", [out_f, groups], bf16_bytes(scales.astype(np.float32))),
                   "weight_shape": ("I64", [2], np.array([out_f, in_f], dtype="<i8").tobytes())}
        if not args.sym:
            zp = pack(zeros, packed_dim=0)
            tensors["weight_zero_point"] = ("I32", list(zp.shape), zp.astype("<i4").tobytes())
        if perm is not None:
            tensors["weight_g_idx"] = ("I32", [in_f], col_group.astype("<i4").tobytes())
        qweight = packed
    elif args.format == "awq":
        qweight = pack_rows(q.T.copy(), AWQ_ORDER)  # [in, out/8]
        read_zeros = zeros
        tensors = {"qweight": ("I32", [in_f, out_f // 8], qweight.tobytes()),
                   "qzeros": ("I32", [groups, out_f // 8],
                              pack_rows(zeros.T.copy(), AWQ_ORDER).tobytes()),
                   "scales": ("F16", [groups, out_f], scales.T.astype("<f2").tobytes())}
    else:
        qt = q.T.reshape(in_f // 8, 8, out_f).astype(np.uint32)  # [in/8, 8, out]
        qweight = np.zeros((in_f // 8, out_f), dtype=np.uint32)
        for j in range(8):
            qweight |= qt[:, j, :] << np.uint32(4 * j)
        stored = zeros if args.gptq_v2 else (zeros - 1) & 0xF
        read_zeros = stored if args.gptq_v2 else stored + 1
        tensors = {"qweight": ("I32", [in_f // 8, out_f], qweight.view(np.int32).tobytes()),
                   "qzeros": ("I32", [groups, out_f // 8],
                              pack_rows(stored.T.copy(), range(8)).tobytes()),
                   "scales": ("F16", [groups, out_f], scales.T.astype("<f2").tobytes()),
                   "g_idx": ("I32", [in_f], col_group.astype("<i4").tobytes())}
    del qweight
    if not args.twin:
        return tensors, None
    s32 = scales.astype(np.float32)
    deq = (q - read_zeros[:, col_group]).astype(np.float32) * s32[:, col_group]
    return tensors, deq


def quant_config(args):
    if args.format == "ct":
        group = ({"strategy": "group", "group_size": args.group_size} if args.group_size > 0
                 else {"strategy": "channel", "group_size": None})
        return {"quant_method": "compressed-tensors", "format": "pack-quantized",
                "quantization_status": "compressed", "version": "0.17.0", "ignore": ["lm_head"],
                "config_groups": {"group_0": {
                    "targets": ["Linear"], "input_activations": None, "output_activations": None,
                    "weights": dict(group, num_bits=4, type="int", symmetric=args.sym, dynamic=False,
                                    actorder="group" if args.desc_act else None,
                                    observer="minmax")}}}
    if args.format == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": args.group_size, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": None}
    return {"quant_method": "gptq", "bits": 4, "group_size": args.group_size,
            "desc_act": args.desc_act, "sym": args.sym, "static_groups": False,
            "true_sequential": True, "damp_percent": 0.01, "lm_head": False,
            "checkpoint_format": "gptq_v2" if args.gptq_v2 else "gptq"}


def convert(args):
    rng = np.random.default_rng(args.seed)
    index_path = os.path.join(args.src, "model.safetensors.index.json")
    if os.path.exists(index_path):
        weight_map = json.load(open(index_path))["weight_map"]
        shards = sorted(set(weight_map.values()))
    else:
        shards = ["model.safetensors"]
    os.makedirs(args.dst, exist_ok=True)
    if args.twin:
        os.makedirs(args.twin, exist_ok=True)
    q_map, t_map, perms = {}, {}, {}
    for shard in shards:
        src = read_safetensors(os.path.join(args.src, shard))
        q_out, t_out = {}, {}
        for name in sorted(src):
            dtype, shape, raw = src[name]
            module = name[: -len(".weight")] if name.endswith(".weight") else None
            if module and module.startswith("model.layers.") and module.split(".", 3)[3] in LINEARS:
                tensors, deq = quantize_linear(to_f32(dtype, shape, raw), args, rng, perms,
                                               input_of(module))
                for suffix, t in tensors.items():
                    q_out[f"{module}.{suffix}"] = t
                if args.twin:
                    t_out[name] = (("F32", shape, deq.astype("<f4").tobytes())
                                   if args.twin_dtype == "f32" else ("BF16", shape, bf16_bytes(deq)))
            else:
                q_out[name] = (dtype, shape, bytes(raw))
                if args.twin:
                    t_out[name] = ((dtype, shape, bytes(raw)) if args.twin_dtype == "f32" or dtype == "BF16"
                                   else ("BF16", shape, bf16_bytes(to_f32(dtype, shape, raw))))
        write_safetensors(os.path.join(args.dst, shard), q_out)
        q_map.update({n: shard for n in q_out})
        if args.twin:
            write_safetensors(os.path.join(args.twin, shard), t_out)
            t_map.update({n: shard for n in t_out})
        print(f"{shard}: {len(q_out)} tensors", flush=True)
    cfg = json.load(open(os.path.join(args.src, "config.json")))
    qcfg = dict(cfg, quantization_config=quant_config(args))
    json.dump(qcfg, open(os.path.join(args.dst, "config.json"), "w"), indent=2)
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(args.src, extra)):
            shutil.copy(os.path.join(args.src, extra), args.dst)
            if args.twin:
                shutil.copy(os.path.join(args.src, extra), args.twin)
    if len(shards) > 1:
        json.dump({"metadata": {}, "weight_map": q_map},
                  open(os.path.join(args.dst, "model.safetensors.index.json"), "w"))
    if args.twin:
        tcfg = dict(cfg, dtype="float32" if args.twin_dtype == "f32" else "bfloat16")
        tcfg.pop("torch_dtype", None)
        json.dump(tcfg, open(os.path.join(args.twin, "config.json"), "w"), indent=2)
        if len(shards) > 1:
            json.dump({"metadata": {}, "weight_map": t_map},
                      open(os.path.join(args.twin, "model.safetensors.index.json"), "w"))


def random_source(args):
    """A small random Llama in float32 (HF layout and config), the source of the test fixtures."""
    rng = np.random.default_rng(args.seed)
    h, inter, heads, kv = args.hidden, args.intermediate, args.heads, args.kv_heads
    d = h // heads
    t = {}

    def w(name, shape, std):
        t[name] = ("F32", shape, (rng.standard_normal(shape) * std).astype("<f4").tobytes())

    w("model.embed_tokens.weight", [args.vocab, h], 1.0)
    w("lm_head.weight", [args.vocab, h], 1 / np.sqrt(h))
    t["model.norm.weight"] = ("F32", [h], (1 + 0.1 * rng.standard_normal(h)).astype("<f4").tobytes())
    for i in range(args.layers):
        p = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            t[p + n + ".weight"] = ("F32", [h], (1 + 0.1 * rng.standard_normal(h)).astype("<f4").tobytes())
        w(p + "self_attn.q_proj.weight", [heads * d, h], 1 / np.sqrt(h))
        w(p + "self_attn.k_proj.weight", [kv * d, h], 1 / np.sqrt(h))
        w(p + "self_attn.v_proj.weight", [kv * d, h], 1 / np.sqrt(h))
        w(p + "self_attn.o_proj.weight", [h, heads * d], 1 / np.sqrt(h))
        w(p + "mlp.gate_proj.weight", [inter, h], 1 / np.sqrt(h))
        w(p + "mlp.up_proj.weight", [inter, h], 1 / np.sqrt(h))
        w(p + "mlp.down_proj.weight", [h, inter], 1 / np.sqrt(inter))
    os.makedirs(args.random_source, exist_ok=True)
    write_safetensors(os.path.join(args.random_source, "model.safetensors"), t)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
           "bos_token_id": 1, "eos_token_id": 2, "dtype": "float32", "head_dim": d, "hidden_act": "silu",
           "hidden_size": h, "intermediate_size": inter, "max_position_embeddings": 512,
           "num_attention_heads": heads, "num_hidden_layers": args.layers, "num_key_value_heads": kv,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
           "vocab_size": args.vocab}
    json.dump(cfg, open(os.path.join(args.random_source, "config.json"), "w"), indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", nargs="?")
    ap.add_argument("dst", nargs="?")
    ap.add_argument("--format", choices=["awq", "gptq", "ct"])
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--sym", action="store_true")
    ap.add_argument("--desc-act", action="store_true")
    ap.add_argument("--gptq-v2", action="store_true")
    ap.add_argument("--numpy-pack", action="store_true")
    ap.add_argument("--twin")
    ap.add_argument("--twin-dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--random-source")
    for n, v in (("hidden", 128), ("intermediate", 256), ("heads", 4), ("kv-heads", 2), ("layers", 2),
                 ("vocab", 256)):
        ap.add_argument(f"--{n}", type=int, default=v)
    args = ap.parse_args()
    if args.random_source:
        return random_source(args)
    if not (args.src and args.dst and args.format):
        ap.error("SRC, DST and --format are required")
    if args.format == "awq" and (args.sym or args.desc_act or args.group_size <= 0):
        ap.error("awq: zero points, no act order, a positive group size")
    convert(args)


if __name__ == "__main__":
    main()
