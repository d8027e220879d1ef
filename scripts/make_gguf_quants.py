#!/usr/bin/env python3
"""Writes tests/fixtures/gguf-quants/quants.gguf: for every tensor type ringserve decodes, a tensor
`q.TYPE` of random blocks and `ref.TYPE`, its dequantization by gguf-py (llama.cpp's own Python
package), stored as F32. The gguf crate's tests decode `q.TYPE` and compare it with `ref.TYPE`.

    python3 -m pip install --target /tmp/gguf_py gguf numpy
    PYTHONPATH=/tmp/gguf_py python3 scripts/make_gguf_quants.py

Random bytes are valid blocks of every type except in their f16 scale fields, which are written as
random finite f16 values so no block decodes to inf or NaN.
"""
import pathlib

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/gguf-quants/quants.gguf"
ROWS, COLS = 3, 512
# Byte offsets of each type's f16 fields within one block.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}


def main():
    rng = np.random.default_rng(20261201)
    w = gguf.GGUFWriter(str(OUT), "llama")
    w.add_string("ringserve.fixture", "random blocks of every decoded type, with gguf-py's values")
    floats = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    w.add_tensor("q.F32", floats)
    w.add_tensor("ref.F32", floats)
    halves = floats.astype(np.float16)
    w.add_tensor("q.F16", halves)
    w.add_tensor("ref.F16", halves.astype(np.float32))
    bf16_bits = (floats.view(np.uint32) >> 16).astype(np.uint16)
    w.add_tensor("q.BF16", bf16_bits.view(np.uint8).reshape(ROWS, COLS * 2),
                 raw_dtype=T.BF16)
    w.add_tensor("ref.BF16", gguf.quants.dequantize(bf16_bits.view(np.uint8), T.BF16)
                 .reshape(ROWS, COLS))
    for ty, fields in F16_FIELDS.items():
        block, size = gguf.GGML_QUANT_SIZES[ty]
        blocks = ROWS * COLS // block
        raw = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
        for at in fields:
            scale = (rng.uniform(-0.5, 0.5, size=blocks)).astype(np.float16)
            raw[:, at:at + 2] = scale.view(np.uint8).reshape(blocks, 2)
        raw = raw.reshape(ROWS, COLS // block * size)
        w.add_tensor(f"q.{ty.name}", raw, raw_dtype=ty)
        ref = gguf.quants.dequantize(raw, ty).astype(np.float32).reshape(ROWS, COLS)
        assert np.isfinite(ref).all(), ty.name
        w.add_tensor(f"ref.{ty.name}", ref)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(OUT, OUT.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
