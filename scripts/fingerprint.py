#!/usr/bin/env python3
"""fingerprint.py — the weight fingerprint of a GGUF model (docs/format.md "Weight
fingerprint"), computed independently of kvq with the `gguf` package and numpy.

    python3 scripts/fingerprint.py MODEL.gguf

Prints the 32 hex digits `kvq inspect MODEL` prints as "fingerprint". The tests compare
the two (tests/cli/fingerprint.sh); this script never reads kvq's output.
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
SALT = np.uint64(0x5851F42D4C957F2D)


def mix64(z):
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class Hasher:
    def __init__(self):
        self.n = 0
        self.h1 = 0
        self.h2 = 0

    def words(self, w):
        w = np.ascontiguousarray(w, dtype=np.uint32).astype(np.uint64)
        idx = np.arange(self.n, self.n + len(w), dtype=np.uint64)
        with np.errstate(over="ignore"):
            x = mix64(idx) ^ w
            self.h1 = (self.h1 + int(np.sum(mix64(x), dtype=np.uint64))) & 0xFFFFFFFFFFFFFFFF
            self.h2 = (self.h2 + int(np.sum(mix64(x ^ SALT), dtype=np.uint64))) & 0xFFFFFFFFFFFFFFFF
        self.n += len(w)

    def floats(self, x):
        x = np.asarray(x, dtype=np.float32).ravel() + np.float32(0.0)  # -0 -> +0
        bits = x.view(np.uint32).copy()
        bits[np.isnan(x)] = 0x7FC00000
        self.words(bits)

    def digest(self):
        with np.errstate(over="ignore"):
            a = mix64(np.uint64(self.h1) ^ np.uint64(self.n))
            b = mix64(np.uint64(self.h2) ^ (np.uint64(self.n) ^ M64))
        return "%016x%016x" % (int(a), int(b))


def field(r, key):
    f = r.fields[key]
    v = f.parts[f.data[0]]
    return v.tobytes().decode() if f.types[0].name == "STRING" else v[0]


def main():
    r = GGUFReader(sys.argv[1])
    arch = field(r, "general.architecture")
    n_layers = int(field(r, arch + ".block_count"))
    n_heads = int(field(r, arch + ".attention.head_count"))
    n_kv = int(field(r, arch + ".attention.head_count_kv"))
    dim = int(field(r, arch + ".embedding_length"))
    d = dim // n_heads
    key = arch + ".attention.key_length"
    if key in r.fields:
        d = int(field(r, key))
    interleaved = arch == "llama"  # llama.cpp's converter permutes llama Q/K rows
    t = {x.name: x for x in r.tensors}

    def mat(name):
        x = t[name]
        return dequantize(x.data, x.tensor_type).reshape(-1, int(x.shape[0])).astype(np.float32)

    def canon(rows):  # interleaved pair rows (2i, 2i+1) back to the half order (i, i + d/2)
        if not interleaved:
            return rows
        h = rows.reshape(-1, d // 2, 2, *rows.shape[1:])
        return np.swapaxes(h, 1, 2).reshape(rows.shape)

    hs = Hasher()
    hs.words([0x4B565146, 1, n_layers, n_heads, n_kv, d])

    def put_matrix(w):
        hs.words([w.shape[0], w.shape[1]])
        hs.floats(w)

    def put_vector(v):
        hs.words([1, len(v)])
        hs.floats(v)

    put_matrix(mat("token_embd.weight"))
    for layer in range(n_layers):
        p = "blk.%d." % layer
        put_vector(mat(p + "attn_norm.weight").ravel())
        put_matrix(canon(mat(p + "attn_q.weight")))
        if p + "attn_q.bias" in t:
            put_vector(canon(mat(p + "attn_q.bias").ravel()))
        put_matrix(canon(mat(p + "attn_k.weight")))
        if p + "attn_k.bias" in t:
            put_vector(canon(mat(p + "attn_k.bias").ravel()))
    print(hs.digest())


if __name__ == "__main__":
    main()
