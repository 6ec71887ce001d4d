#!/usr/bin/env python3
"""perturb_gguf.py IN.gguf OUT.gguf TENSOR — a copy of a GGUF model with one weight of
TENSOR changed (the first value: an F32/F16 value nudged, or one 4-bit quant of a Q4_0 /
Q4_1 block moved by one step), located with the `gguf` package, independently of kvq.
Used by tests/cli/shipping.sh for "the same shape, other weights"."""
import shutil
import struct
import sys

from gguf import GGUFReader, GGMLQuantizationType as Q

src, dst, name = sys.argv[1:4]
r = GGUFReader(src)
t = next(x for x in r.tensors if x.name == name)
off = int(t.data_offset)
shutil.copyfile(src, dst)
with open(dst, "r+b") as f:
    f.seek(off)
    if t.tensor_type == Q.F32:
        (v,) = struct.unpack("<f", f.read(4))
        f.seek(off)
        f.write(struct.pack("<f", v + 0.125))
    elif t.tensor_type == Q.F16:
        (v,) = struct.unpack("<e", f.read(2))
        f.seek(off)
        f.write(struct.pack("<e", v + 0.125))
    elif t.tensor_type in (Q.Q4_0, Q.Q4_1):
        q = off + (2 if t.tensor_type == Q.Q4_0 else 4)  # after the f16 scale (and min)
        f.seek(q)
        b = f.read(1)[0]
        f.seek(q)
        f.write(bytes([b ^ 0x01]))  # weight 0's quant moves by one step
    else:
        sys.exit("perturb_gguf: %s is %s, not F32, F16, Q4_0 or Q4_1" % (name, t.tensor_type.name))
