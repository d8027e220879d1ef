#!/usr/bin/env python3
"""Turns a float checkpoint (F32/BF16/F16 safetensors) into an FP8 one laid out as the real tools lay
it out, so tests can load what those tools write without downloading it. Pure Python (no numpy or
torch): fine for test-sized models; make the 8B-shaped ones on the device, where it is slow but works.

  python3 scripts/make_fp8_checkpoint.py SRC DST --scheme fp8-dynamic|fp8-static|autofp8

Schemes (every decoder linear q/k/v/o/gate/up/down; embeddings, norms and lm_head unchanged):
- fp8-dynamic: llm-compressor (0.6, compressed-tensors 0.10) `QuantizationModifier(scheme="FP8_DYNAMIC",
  ignore=["lm_head"])`: `weight` F8_E4M3 [out, in], `weight_scale` [out, 1] in the model's dtype (BF16
  for a BF16 model; this script writes BF16 whatever the source), activations per token, dynamic.
- fp8-static: llm-compressor `scheme="FP8"`: one BF16 `weight_scale` [1] per tensor and a static
  `input_scale` [1]. llm-compressor calibrates input scales on data; this script does not run the
  model and writes a fixed input scale of 8/448 (inputs up to ±8 representable).
- autofp8: AutoFP8 / vLLM's `quant_method: "fp8"` serialisation with `activation_scheme: "dynamic"`:
  one F32 `weight_scale` of shape [] per tensor.

Quantization: scale = max(amax / 448, 1 / (448 * 512)) in float32 (rounded to the stored dtype), and
each weight is the E4M3 value nearest to w / scale (ties to even, saturated at ±448), found by brute
force over the format's 127 non-negative finite values: an implementation independent of the
engine's, which the Rust tests compare against bit for bit.
"""
import argparse
import bisect
import json
import math
import os
import shutil
import struct

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def f32(x):
    """x rounded to the nearest float32."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16_bits(x):
    """The bf16 nearest to float32 x (ties to even), as its 16 bits."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16) & 0xFFFF


def bf16_value(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


# The 127 non-negative finite E4M3 values, by code: 2^-6 * m/8 (subnormal), 2^(e-7) * (1 + m/8).
E4M3 = [(c & 7) / 8 * 2.0 ** -6 if c >> 3 == 0 else (1 + (c & 7) / 8) * 2.0 ** ((c >> 3) - 7)
        for c in range(0x7F)]


def e4m3(x):
    """The E4M3 code nearest to x: ties to the even code, saturated at 448."""
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = min(abs(x), 448.0)
    i = bisect.bisect_left(E4M3, a)
    if i == len(E4M3):
        return sign | 0x7E
    if i > 0:
        lo, hi = E4M3[i - 1], E4M3[i]
        if a - lo < hi - a or (a - lo == hi - a and (i - 1) % 2 == 0):
            i -= 1
    return sign | i


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    return header, data, meta


def values(info, data):
    a, b = info["data_offsets"]
    raw = data[a:b]
    dt = info["dtype"]
    if dt == "F32":
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    if dt == "BF16":
        return [bf16_value(v) for v in struct.unpack(f"<{len(raw) // 2}H", raw)]
    if dt == "F16":
        return list(struct.unpack(f"<{len(raw) // 2}e", raw))
    raise SystemExit(f"unsupported source dtype {dt}")


def scale_of(amax):
    return max(f32(amax / 448.0), f32(1.0 / (448.0 * 512.0)))


def quantize_rows(w, rows, cols, per_channel, stored):
    """Codes and stored scales; each row's codes use the scale as stored (as the tools do)."""
    scales = []
    for r in range(rows if per_channel else 1):
        part = w[r * cols:(r + 1) * cols] if per_channel else w
        s = scale_of(max(abs(v) for v in part))
        scales.append(bf16_value(bf16_bits(s)) if stored == "BF16" else s)
    codes = bytearray(rows * cols)
    for r in range(rows):
        s = scales[r if per_channel else 0]
        for c in range(cols):
            codes[r * cols + c] = e4m3(f32(w[r * cols + c] / s))
    return bytes(codes), scales


def pack(dtype, vals):
    if dtype == "F32":
        return struct.pack(f"<{len(vals)}f", *vals)
    if dtype == "BF16":
        return struct.pack(f"<{len(vals)}H", *[bf16_bits(v) for v in vals])
    raise ValueError(dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--scheme", required=True, choices=["fp8-dynamic", "fp8-static", "autofp8"])
    args = ap.parse_args()
    header, data, meta = read(os.path.join(args.src, "model.safetensors"))
    per_channel = args.scheme == "fp8-dynamic"
    scale_dtype = "F32" if args.scheme == "autofp8" else "BF16"
    out = {}
    for name in sorted(header):
        info = header[name]
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module and module.split(".", 3)[-1] in LINEARS and name.startswith("model.layers."):
            rows, cols = info["shape"]
            codes, scales = quantize_rows(values(info, data), rows, cols, per_channel, scale_dtype)
            out[name] = ("F8_E4M3", [rows, cols], codes)
            shape = {"fp8-dynamic": [rows, 1], "fp8-static": [1], "autofp8": []}[args.scheme]
            out[module + ".weight_scale"] = (scale_dtype, shape, pack(scale_dtype, scales))
            if args.scheme == "fp8-static":
                out[module + ".input_scale"] = ("BF16", [1], pack("BF16", [f32(8.0 / 448.0)]))
        else:
            a, b = info["data_offsets"]
            out[name] = (info["dtype"], info["shape"], data[a:b])
    os.makedirs(args.dst, exist_ok=True)
    new_header, blobs, offset = {}, [], 0
    for name, (dt, shape, blob) in out.items():
        new_header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    new_header["__metadata__"] = dict(meta or {}, format="pt")
    text = json.dumps(new_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(args.dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)
    config = json.load(open(os.path.join(args.src, "config.json")))
    config["quantization_config"] = quantization_config(args.scheme)
    json.dump(config, open(os.path.join(args.dst, "config.json"), "w"), indent=2)
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(args.src, extra)):
            shutil.copy(os.path.join(args.src, extra), args.dst)


def quantization_config(scheme):
    if scheme == "autofp8":
        return {"quant_method": "fp8", "activation_scheme": "dynamic"}
    dynamic = scheme == "fp8-dynamic"
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "global_compression_ratio": None,
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
                        "strategy": "channel" if dynamic else "tensor", "group_size": None,
                        "block_structure": None, "actorder": None, "observer": "minmax",
                        "observer_kwargs": {}},
            "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                                  "dynamic": dynamic, "strategy": "token" if dynamic else "tensor",
                                  "group_size": None, "block_structure": None, "actorder": None,
                                  "observer": None if dynamic else "minmax", "observer_kwargs": {}},
            "output_activations": None,
        }},
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "version": "0.10.2",
    }


if __name__ == "__main__":
    main()
