"""The weight fingerprint of docs/format.md ("Weight fingerprint"), from arrays."""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import numpy as np

_M64 = 0xFFFFFFFFFFFFFFFF
_SALT = np.uint64(0x5851F42D4C957F2D)


def _mix64(z: Any) -> Any:
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class FingerprintHasher:
    """The 128-bit stream hash: feed words and float arrays, then ``digest()``."""

    def __init__(self) -> None:
        self.n = 0
        self.h1 = 0
        self.h2 = 0

    def words(self, w: Iterable[int] | np.ndarray, chunk: int = 1 << 22) -> None:
        w = np.ascontiguousarray(np.asarray(w, dtype=np.uint32)).ravel()
        for s in range(0, len(w), chunk):
            part = w[s:s + chunk].astype(np.uint64)
            idx = np.arange(self.n, self.n + len(part), dtype=np.uint64)
            with np.errstate(over="ignore"):
                x = _mix64(idx) ^ part
                self.h1 = (self.h1 + int(np.sum(_mix64(x), dtype=np.uint64))) & _M64
                self.h2 = (self.h2 + int(np.sum(_mix64(x ^ _SALT), dtype=np.uint64))) & _M64
            self.n += len(part)

    def floats(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32).ravel() + np.float32(0.0)  # -0 -> +0
        bits = x.view(np.uint32).copy()
        bits[np.isnan(x)] = 0x7FC00000
        self.words(bits)

    def matrix(self, w: np.ndarray) -> None:
        w = np.asarray(w)
        if w.ndim == 1:
            self.words([1, w.shape[0]])
        else:
            self.words([w.shape[0], int(np.prod(w.shape[1:]))])
        self.floats(w)

    def digest(self) -> str:
        with np.errstate(over="ignore"):
            a = _mix64(np.uint64(self.h1) ^ np.uint64(self.n))
            b = _mix64(np.uint64(self.h2) ^ (np.uint64(self.n) ^ np.uint64(_M64)))
        return "%016x%016x" % (int(a), int(b))


def weight_fingerprint(n_heads: int, n_kv_heads: int, head_dim: int, embedding: np.ndarray,
                       layers: Sequence[tuple]) -> str:
    """The fingerprint from the token embedding [vocab, dim] and, per layer, the tuple
    (attn_norm [dim], Wq [n_heads*d, dim], bq or None, Wk [n_kv*d, dim], bk or None),
    every row in the HF order (RoPE pairs (i, i + d/2))."""
    h = FingerprintHasher()
    h.words([0x4B565146, 1, len(layers), n_heads, n_kv_heads, head_dim])
    h.matrix(embedding)
    for norm, wq, bq, wk, bk in layers:
        h.matrix(np.asarray(norm).ravel())
        h.matrix(wq)
        if bq is not None:
            h.matrix(np.asarray(bq).ravel())
        h.matrix(wk)
        if bk is not None:
            h.matrix(np.asarray(bk).ravel())
    return h.digest()


def check_fingerprint(fp: Optional[str]) -> Optional[str]:
    """fp when it is 32 lower-case hex digits, else ValueError."""
    if fp is None:
        return None
    if len(fp) != 32 or any(c not in "0123456789abcdef" for c in fp):
        raise ValueError(f"fingerprint {fp!r}: expected 32 lower-case hex digits")
    return fp
