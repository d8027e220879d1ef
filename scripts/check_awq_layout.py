#!/usr/bin/env python3
"""Checks an AWQ checkpoint's layout with AutoAWQ's own unpacking (an implementation this project did
not write): for every quantized linear of FIXTURE, AutoAWQ's `unpack_awq` + `reverse_awq_order`
(autoawq 0.2.9, `awq/utils/packing_utils.py`) turn `qweight` / `qzeros` into codes and zero points,
and `(q - z) * scale` must equal the dequantized twin's float32 weight bit for bit.

usage: PYTHONPATH=<torch>:<autoawq, installed with --no-deps> check_awq_layout.py FIXTURE TWIN
AutoAWQ's package __init__ imports transformers' model classes; only packing_utils is loaded here.
"""
import importlib.util
import json
import sys

import torch
from safetensors.torch import load_file


def packing_utils():
    """awq/utils/packing_utils.py alone (it imports only torch)."""
    for path in sys.path:
        spec = importlib.util.spec_from_file_location(
            "awq_packing_utils", f"{path}/awq/utils/packing_utils.py")
        try:
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
        except FileNotFoundError:
            continue
    sys.exit("autoawq not found on PYTHONPATH")


def main(fixture, twin):
    pu = packing_utils()
    cfg = json.load(open(f"{fixture}/config.json"))["quantization_config"]
    bits, gs = cfg["bits"], cfg["group_size"]
    q, t = load_file(f"{fixture}/model.safetensors"), load_file(f"{twin}/model.safetensors")
    layers = sorted(k[: -len(".qweight")] for k in q if k.endswith(".qweight"))
    for name in layers:
        iw, iz = pu.unpack_awq(q[f"{name}.qweight"], q[f"{name}.qzeros"], bits)
        iw, iz = pu.reverse_awq_order(iw, iz, bits)
        iw, iz = torch.bitwise_and(iw, 2**bits - 1), torch.bitwise_and(iz, 2**bits - 1)
        scales = q[f"{name}.scales"].float()  # [in / gs, out]
        rows = torch.arange(iw.shape[0]) // gs
        w = (iw.float() - iz[rows].float()) * scales[rows]  # [in, out]
        want = t[f"{name}.weight"].float().t()  # [out, in] -> [in, out]
        if not torch.equal(w, want):
            diff = (w - want).abs().max().item()
            sys.exit(f"{name}: AutoAWQ's unpacking differs from the twin (max |diff| {diff})")
        print(f"{name}: {tuple(want.shape)} equal, bit for bit")
    print(f"{len(layers)} layers of {fixture}: AutoAWQ's unpacking gives the twin's weights exactly")


if __name__ == "__main__":
    main(*sys.argv[1:3])
