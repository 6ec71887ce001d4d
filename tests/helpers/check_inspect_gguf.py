#!/usr/bin/env python3
"""check_inspect_gguf.py MODEL.gguf TEXT JSON — checks `kvq inspect` of a GGUF file (its
text output TEXT and its --json output JSON) against the same file read by the `gguf`
package, an independent reader: sizes, offsets, every metadata key (type and value, or
array length), the hyperparameters, the tokenizer ids and every tensor's type, shape,
offset and size. For any model (tests/cli/inspect.sh runs it on SmolLM2 when
stories260K, whose exact output is pinned in tests/cli/expected/, is absent)."""
import json
import os
import sys

import gguf

path, text_path, json_path = sys.argv[1:4]
r = gguf.GGUFReader(path)
d = json.load(open(json_path))
text = open(text_path).read().split("\n")

T = gguf.GGUFValueType
TYPE = {T.UINT8: "u8", T.INT8: "i8", T.UINT16: "u16", T.INT16: "i16", T.UINT32: "u32",
        T.INT32: "i32", T.UINT64: "u64", T.INT64: "i64", T.FLOAT32: "f32", T.FLOAT64: "f64",
        T.BOOL: "bool", T.STRING: "str", T.ARRAY: "arr"}
fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
val = lambda k, dflt=None: fields[k].contents() if k in fields else dflt

# the header
size = os.path.getsize(path)
assert d["format"] == "gguf" and d["version"] == int(r.fields["GGUF.version"].contents())
assert d["file_size"] == size and d["alignment"] == r.alignment, d
assert d["data_offset"] == r.data_offset, (d["data_offset"], r.data_offset)
name = path  # as given on the command line
assert text[0] == "%s: GGUF version %d, %d bytes" % (name, d["version"], size), text[0]
assert text[1] == "  %d metadata keys, %d tensors, alignment %d, data at offset %d" % (
    len(fields), len(r.tensors), r.alignment, r.data_offset), text[1]

# every metadata key, in file order
m = d["metadata"]
assert list(m) == list(fields), (list(m)[:5], list(fields)[:5])
for k, f in fields.items():
    t = f.types[0]
    assert m[k]["type"] == TYPE[t], (k, m[k])
    if t == T.ARRAY:
        assert m[k]["n"] == len(f.data) and m[k]["item_type"] == TYPE[f.types[1]], (k, m[k])
    elif t in (T.FLOAT32, T.FLOAT64):
        v = float(f.contents())   # printed with 9 significant digits
        assert abs(m[k]["value"] - v) <= 1e-8 * abs(v), (k, m[k], v)
    else:
        assert m[k]["value"] == f.contents(), (k, m[k], f.contents())
at = text.index("metadata (%d):" % len(fields))
for line, k in zip(text[at + 1:], fields):
    assert line.split()[:2] == [k, TYPE[fields[k].types[0]]], (line, k)

# hyperparameters, head dim, rope base, tokenizer
arch = val("general.architecture")
assert d["architecture"] == arch
for k, v in d["hyperparameters"].items():
    assert k.startswith(arch + ".") and (v == val(k) or abs(v - val(k)) <= 1e-6 * abs(v)), (k, v)
assert f"{arch}.block_count" in d["hyperparameters"]
heads = val(f"{arch}.attention.head_count")
assert d["head_dim"] == val(f"{arch}.embedding_length") // heads
assert d["rope_base"] == val(f"{arch}.rope.freq_base", 10000.0)
assert d["rope_base_default"] == (f"{arch}.rope.freq_base" not in fields)
tk = d["tokenizer"]
assert tk["model"] == val("tokenizer.ggml.model")
assert tk["vocab_size"] == len(fields["tokenizer.ggml.tokens"].data)
for a, k in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unknown", "unknown_token_id")):
    assert tk[a] == val("tokenizer.ggml." + k), (a, tk)

# every tensor: name, type, ne, offset (from the data section) and size
ts = d["tensors"]
assert len(ts) == len(r.tensors)
for x, t in zip(ts, r.tensors):
    want = {"name": t.name, "type": t.tensor_type.name, "ne": [int(n) for n in t.shape],
            "offset": int(t.data_offset) - r.data_offset, "nbytes": int(t.n_bytes)}
    assert x == want, (x, want)
n_el = sum(int(t.n_elements) for t in r.tensors)
n_b = sum(int(t.n_bytes) for t in r.tensors)
at = text.index("tensors (%d, %d elements, %d bytes):" % (len(ts), n_el, n_b))
for line, t in zip(text[at + 2:], r.tensors):
    s = line.split()
    assert s[0] == t.name and s[1] == t.tensor_type.name, (line, t.name)
    assert s[-1] == str(int(t.data_offset) - r.data_offset), (line, t.name)
print("inspect agrees with the gguf package: %d keys, %d tensors" % (len(fields), len(ts)))
