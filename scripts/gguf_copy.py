#!/usr/bin/env python3
"""Copies a GGUF file with the `gguf` package (PyPI), optionally changing it:

    python3 scripts/gguf_copy.py SRC DST [--f32] [--set KEY=VALUE ...]

--f32      every tensor written as F32, dequantized by gguf.quants.dequantize (the
           same numbers as the quantized file; llama.cpp computes an F32 model without
           quantizing activations, so it is exact to float rounding)
--set      replaces (or adds) a scalar metadata key; VALUE true/false makes a bool,
           an integer a uint32, anything else a string (e.g.
           --set tokenizer.ggml.add_bos_token=true, --set tokenizer.ggml.pre=foo)

Used by scripts/gen_ppl_golden.py (the F32 copy for llama.cpp) and by tests that need
a variant of the default model (tests/cli/realmodel.sh). Never writes DST partially: the
file is written under a temporary name and renamed.
"""
import argparse
import os
import sys

import numpy as np


def _value(text):
    import gguf
    if text in ("true", "false"):
        return text == "true", gguf.GGUFValueType.BOOL
    try:
        return int(text), gguf.GGUFValueType.UINT32
    except ValueError:
        return text, gguf.GGUFValueType.STRING


def copy(src, dst, f32=False, sets=()):
    import gguf
    from gguf.quants import dequantize
    r = gguf.GGUFReader(src)
    tmp = dst + ".tmp"
    w = gguf.GGUFWriter(tmp, r.fields["general.architecture"].contents())
    override = dict(sets)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in override:
            continue
        if f32 and k == "general.file_type":
            w.add_key_value(k, 0, gguf.GGUFValueType.UINT32)  # ALL_F32
            continue
        vt = f.types[0]
        w.add_key_value(k, f.contents(), vt,
                        sub_type=f.types[1] if vt == gguf.GGUFValueType.ARRAY else None)
    for k, text in override.items():
        v, vt = _value(text)
        w.add_key_value(k, v, vt)
    for t in r.tensors:
        if f32:
            x = dequantize(t.data, t.tensor_type).astype(np.float32)
            w.add_tensor(t.name, np.ascontiguousarray(x.reshape(tuple(reversed(t.shape.tolist())))))
        else:
            w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--f32", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args()
    sets = []
    for s in a.set:
        if "=" not in s:
            sys.exit(f"gguf_copy: --set {s}: expected KEY=VALUE")
        sets.append(tuple(s.split("=", 1)))
    copy(a.src, a.dst, a.f32, sets)


if __name__ == "__main__":
    main()
