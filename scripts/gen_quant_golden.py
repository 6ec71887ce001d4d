#!/usr/bin/env python3
"""gen_quant_golden.py - writes tests/data/quant_golden.bin, the golden data of
tests/test_quant.c: random ggml blocks of every quantized type kvq reads, and their
dequantization by an independent implementation, the `gguf` PyPI package's numpy code
(gguf.quants.dequantize). kvq never produces these values itself.

    pip install gguf numpy
    python3 scripts/gen_quant_golden.py            # rewrite the file
    python3 scripts/gen_quant_golden.py --check    # exit 1 if it differs

Blocks are random bytes (seeded) whose f16 scale fields (d, and dmin / m where the
type has one) are overwritten with finite values: zero, negative zero, a subnormal,
the largest f16, and random magnitudes from 1e-4 to 10 of either sign. No NaN or Inf
scales. The quants themselves are all random bits, so every code of every field occurs.

File layout (little-endian):
    8 bytes  magic "KVQQGLD1"
    u32      number of types
    per type:
        u32  ggml type id
        u32  number of blocks B
        u32  bytes per block
        u32  values per block E
        B * bytes     the blocks
        B * E * f32   gguf's dequantization, in order
"""
import os
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "quant_golden.bin")

# type, number of blocks, byte offsets of the f16 scale fields inside a block
TYPES = [
    (T.Q4_0, 16, [0]),
    (T.Q4_1, 16, [0, 2]),
    (T.Q5_0, 16, [0]),
    (T.Q5_1, 16, [0, 2]),
    (T.Q8_0, 16, [0]),
    (T.Q2_K, 4, [80, 82]),
    (T.Q3_K, 4, [108]),
    (T.Q4_K, 4, [0, 2]),
    (T.Q5_K, 4, [0, 2]),
    (T.Q6_K, 4, [208]),
]

SPECIAL = [0.0, -0.0, 2.0**-20, 65504.0, -1.0]


def sane_scale(rng, block, field):
    """Finite f16 scales: special values on the first blocks, random ones after."""
    if block < len(SPECIAL) and field == 0:
        return np.float16(SPECIAL[block])
    mag = 10.0 ** rng.uniform(-4.0, 1.0)
    return np.float16(mag if rng.random() < 0.5 else -mag)


def make(qtype, nblocks, scale_offsets, rng):
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(nblocks, nbytes), dtype=np.uint8)
    for b in range(nblocks):
        for f, off in enumerate(scale_offsets):
            raw[b, off:off + 2] = np.frombuffer(sane_scale(rng, b, f).tobytes(), dtype=np.uint8)
    values = dequantize(raw, qtype).astype(np.float32).reshape(-1)
    assert values.size == nblocks * elems and np.all(np.isfinite(values)), qtype.name
    return elems, nbytes, raw, values


def build():
    rng = np.random.default_rng(20240611)
    out = bytearray(b"KVQQGLD1")
    out += struct.pack("<I", len(TYPES))
    for qtype, nblocks, offs in TYPES:
        elems, nbytes, raw, values = make(qtype, nblocks, offs, rng)
        out += struct.pack("<IIII", int(qtype), nblocks, nbytes, elems)
        out += raw.tobytes()
        out += values.astype("<f4").tobytes()
    return bytes(out)


def main():
    data = build()
    if "--check" in sys.argv[1:]:
        with open(OUT, "rb") as f:
            same = f.read() == data
        print("quant_golden.bin:", "up to date" if same else "DIFFERS")
        return 0 if same else 1
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(data)
    print(f"wrote {OUT} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
