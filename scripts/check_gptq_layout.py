#!/usr/bin/env python3
"""Checks a GPTQ checkpoint's layout with AutoGPTQ's own dequantization (an implementation this project
did not write): for every quantized linear of FIXTURE, auto-gptq 0.7.1's `QuantLinear`
(`auto_gptq/nn_modules/qlinear/qlinear_cuda.py`, its torch path on the CPU: codes and zero points
unpacked, the stored zero points plus one, scales and zeros taken per column through `g_idx`) is
given the checkpoint's `qweight`, `qzeros`, `scales` and `g_idx`, and its product with the identity
must be the dequantized twin's float32 weight — within float32 rounding of `scale * (q - z)`, as
its arithmetic is `scales[g_idx] * (weight - zeros[g_idx])` in the scales' type, here float32.

usage: PYTHONPATH=<torch + transformers>:<auto-gptq wheel unpacked> check_gptq_layout.py FIXTURE TWIN
Only qlinear_cuda.py is loaded (without its CUDA extension), not the package's __init__.
"""
import importlib.util
import json
import logging
import sys

import torch
from safetensors.torch import load_file


def quant_linear():
    for path in sys.path:
        file = f"{path}/auto_gptq/nn_modules/qlinear/qlinear_cuda.py"
        spec = importlib.util.spec_from_file_location("agq_qlinear_cuda", file)
        try:
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod.QuantLinear
        except FileNotFoundError:
            continue
    sys.exit("auto-gptq not found on PYTHONPATH")


def main(fixture, twin):
    logging.disable(logging.WARNING)  # "CUDA extension not installed"
    QuantLinear = quant_linear()
    cfg = json.load(open(f"{fixture}/config.json"))["quantization_config"]
    bits, gs = cfg["bits"], cfg["group_size"]
    q, t = load_file(f"{fixture}/model.safetensors"), load_file(f"{twin}/model.safetensors")
    layers = sorted(k[: -len(".qweight")] for k in q if k.endswith(".qweight"))
    worst = 0.0
    for name in layers:
        want = t[f"{name}.weight"].float()  # [out, in]
        out_f, in_f = want.shape
        lin = QuantLinear(bits, gs if gs > 0 else in_f, in_f, out_f, False, weight_dtype=torch.float32)
        lin.qweight = q[f"{name}.qweight"]
        lin.qzeros = q[f"{name}.qzeros"]
        lin.scales = q[f"{name}.scales"].float()
        lin.g_idx = q[f"{name}.g_idx"] if f"{name}.g_idx" in q else torch.arange(in_f) // lin.group_size
        with torch.no_grad():
            got = lin(torch.eye(in_f, dtype=torch.float32)).t()  # [out, in]
        rel = ((got - want).abs().max() / want.abs().max()).item()
        worst = max(worst, rel)
        if rel > 1e-6:
            sys.exit(f"{name}: AutoGPTQ's dequantization differs from the twin (relative {rel:.2e})")
        print(f"{name}: {tuple(want.shape)} equal within {rel:.1e}")
    print(f"{len(layers)} layers of {fixture}: AutoGPTQ's dequantization gives the twin's weights "
          f"(worst relative difference {worst:.1e})")


if __name__ == "__main__":
    main(*sys.argv[1:3])
