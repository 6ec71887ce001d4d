#!/usr/bin/env python3
"""Golden data for the runtime's compressed KV caches (tests/test_kvcache.c).

An independent numpy reference, written from the papers' text and the formulas of
runtime/cache/kvc.h and runtime/kernels/kvc_rows.h (not from kvq's code or output):

  LeanKV per-vector asymmetric quantization (leankv paper eq. 2, f16 scale rounded up,
  f16 zero point, codes floor((x + z) / s + 1/2) clamped), its packed row and the
  dequantized values; PATS truncation of the f16 bits by b low mantissa bits and the
  64-byte block packing (pats paper section 3); the three b(t) schedules; LeanKV's
  prompt rule and the generation phase (Algorithm 1, written with the paper's sets
  KV_h, KV_l and the window) on significance sequences recorded from synthetic
  attention, the classes of every token after every step.

Writes tests/data/kvcache_golden.bin (little-endian):
  "KVCG", u32 version 1, u32 records; each record a u32 kind then
  1 lkq      u32 n, u32 bits, f32 x[n], u32 ok, [ok] u8 row[4 + ceil(n bits / 8)], f32 xh[n]
  2 pats     u32 n, u32 b, f32 x[n], u32 ok, [ok] u8 row[64 ceil(n / floor(512/(16-b)))],
             f32 xt[n]
  3 schedule u32 schedule, u32 b_min, u32 b_max, u32 T, i32 b[T]
  4 policy   u32 N, u32 P, u32 W, f64 alpha_h, f64 alpha_l, then for n = P .. N:
             f64 sig[n], u8 cls[n] (0 pruned, 1 low, 2 high) after the prompt phase
             (n = P) or the generation step of token n - 1 (n > P)
  5 lkpats   u32 n, u32 b, u32 bits, f32 x[n], u32 ok, [ok] u8 row[4 + ceil(n bits / 8)],
             f32 xh[n]: the leankv+pats row (docs/kvcache.md): x truncated as PATS
             truncates it by b low mantissa bits (record 2's values), then quantized
             as LeanKV quantizes (record 1's rule) at `bits`; refused when either is
"""
from __future__ import annotations

import argparse
import math
import struct
from pathlib import Path

import numpy as np

F16_MAX = 65504.0


def f16_up(s: np.float32) -> np.float16:
    """The smallest f16 >= s (s finite, >= 0)."""
    h = np.float16(s)
    if np.float32(h) < s:
        h = np.nextafter(h, np.float16(np.inf))
    return np.float16(h)


def lkq(x: np.ndarray, bits: int) -> tuple[bytes, np.ndarray] | None:
    """LeanKV row and dequantized values, or None when refused."""
    if not np.all(np.isfinite(x)):
        return None
    lo, hi = x.min(), x.max()
    levels = (1 << bits) - 1
    s = np.float32((float(hi) - float(lo)) / levels)
    if abs(float(lo)) > F16_MAX or float(s) > F16_MAX:
        return None
    z16 = np.float16(np.float32(0.0) - lo)
    s16 = f16_up(s) if s > 0 else np.float16(0.0)
    z, sc = np.float32(z16), np.float32(s16)
    if sc > 0:
        q = np.floor((x + z) / sc + np.float32(0.5)).astype(np.float32)
        q = np.clip(q, 0, levels).astype(np.uint32)
    else:
        q = np.zeros(x.size, dtype=np.uint32)
    nbits = x.size * bits
    stream = np.zeros(((nbits + 7) // 8) * 8, dtype=np.uint8)
    for t, c in enumerate(q):
        for k in range(bits):
            stream[t * bits + k] = (int(c) >> k) & 1
    codes = np.packbits(stream, bitorder="little").tobytes()
    meta = np.array([s16, z16], dtype=np.float16).tobytes()
    xh = (sc * q.astype(np.float32) - z).astype(np.float32)
    return meta + codes, xh


def pats(x: np.ndarray, b: int) -> tuple[bytes, np.ndarray] | None:
    """PATS row and truncated values, or None when refused."""
    with np.errstate(over="ignore"):
        h = x.astype(np.float16)
    if not np.all(np.isfinite(h)):
        return None
    bits = h.view(np.uint16).astype(np.uint32)
    w = 16 - b
    per_block = 512 // w
    n_blocks = -(-x.size // per_block)
    row = bytearray()
    for blk in range(n_blocks):
        stream = np.zeros(512, dtype=np.uint8)
        for i, c in enumerate(range(blk * per_block, min(x.size, (blk + 1) * per_block))):
            field = int(bits[c]) >> b
            for k in range(w):
                stream[i * w + k] = (field >> k) & 1
        row += np.packbits(stream, bitorder="little").tobytes()
    trunc = ((bits >> b) << b).astype(np.uint16).view(np.float16).astype(np.float32)
    return bytes(row), trunc


def lkpats(x: np.ndarray, b: int, bits: int) -> tuple[bytes, np.ndarray] | None:
    """leankv+pats row and dequantized values, or None when refused."""
    t = pats(x, b)
    return None if t is None else lkq(t[1], bits)


def schedule(kind: int, b_min: int, b_max: int, T: int) -> list[int]:
    """b(t) for t = 1..T: old-heavy (0), new-heavy (1), middle-heavy (2)."""
    D, den = b_max - b_min, max(T - 1, 1)
    out = []
    for t in range(1, T + 1):
        if kind == 0:
            f = b_max - math.floor(D * (t - 1) / den + 0.5)
        elif kind == 1:
            f = b_min + math.floor(D * (t - 1) / den + 0.5)
        else:
            f = b_max - math.floor(D * abs(2 * t - T - 1) / den + 0.5)
        out.append(max(b_min, min(b_max, f)))
    return out


def significance_sequence(rng: np.random.Generator, N: int, gs: int, ties: bool) -> list[np.ndarray]:
    """sig after each of N tokens: sig_n[j] = max_g mean_{j < r < n} a_g(r, j), +inf for
    the last token, from causal softmax rows with a few heavy-hitter tokens."""
    bias = np.where(rng.random(N) < 0.15, 3.0, 0.0)
    attn = np.zeros((gs, N, N))
    for g in range(gs):
        for r in range(N):
            lg = rng.normal(0, 1.5, r + 1) + bias[: r + 1]
            lg[max(0, r - 3):] += 1.0
            p = np.exp(lg - lg.max())
            attn[g, r, : r + 1] = p / p.sum()
    seqs = []
    for n in range(1, N + 1):
        sig = np.full(n, np.inf)
        for j in range(n - 1):
            sig[j] = max(attn[g, j + 1 : n, j].mean() for g in range(gs))
            if ties:  # a coarse grid: equal scores inside the sections
                sig[j] = np.floor(sig[j] * 200) / 200
        seqs.append(sig)
    return seqs


def policy(seqs: list[np.ndarray], P: int, W: int, ah: float, al: float) -> list[np.ndarray]:
    """Classes after the prompt (n = P) and each generation step, Algorithm 1 with sets."""
    sig = seqs[P - 1]
    window = list(range(max(0, P - W), P))
    kv_h, kv_l = set(), set()
    for i in range(P - len(window)):
        s = sig[i]
        if s >= ah / (i + 1):
            kv_h.add(i)
        elif s >= al / (i + 1):
            kv_l.add(i)

    def classes(n: int) -> np.ndarray:
        c = np.zeros(n, dtype=np.uint8)
        for t in kv_l:
            c[t] = 1
        for t in kv_h | set(window):
            c[t] = 2
        return c

    out = [classes(P)]
    for n in range(P + 1, len(seqs) + 1):
        sc = seqs[n - 1]
        window.append(n - 1)
        if len(window) > W:
            tc = window.pop(0)
            th, tl = ah / n, al / n
            if sc[tc] >= th:
                kv_h.add(tc)
                tv = min(kv_h, key=lambda t: (sc[t], t))
                if tl <= sc[tv] < th:
                    kv_h.remove(tv)
                    kv_l.add(tv)
                elif sc[tv] < tl:
                    kv_h.remove(tv)
            elif sc[tc] >= tl:
                kv_l.add(tc)
                tv = min(kv_l, key=lambda t: (sc[t], t))
                if sc[tv] < tl:
                    kv_l.remove(tv)
        out.append(classes(n))
    return out


def vec_cases(rng: np.random.Generator) -> list[np.ndarray]:
    f = np.float32
    cases = [rng.normal(0, 1, 64).astype(f), (rng.normal(0, 3, 64) + 5).astype(f),
             rng.normal(0, 1, 7).astype(f), rng.normal(0, 1, 100).astype(f),
             np.zeros(64, f), np.full(64, 0.37, f), np.full(5, -2.5, f),
             np.array([1e-40, -3e-41, 0.0, 2e-39, 1.4e-45], f),         # f32 denormals
             np.array([3e-6, -5e-7, 6e-5, 1e-7, 0.0, -0.0], f),          # f16 subnormals
             (1.0 + rng.normal(0, 1e-6, 16)).astype(f),                  # tiny range
             np.array([65504.0, -65504.0, 100.0], f), np.array([-65520.0, 1.0], f),
             np.array([60000.0, -60000.0], f),
             np.array([0.0, 0.5, 1.5, 2.5, 3.0], f), np.arange(0, 8, 0.5, dtype=f),  # halves
             np.array([1.0, np.inf, 2.0], f), np.array([np.nan, 1.0], f),
             np.array([-np.inf], f), np.array([65519.0, 65520.0], f)]
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/data/kvcache_golden.bin")
    ap.add_argument("--seed", type=int, default=32)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    recs: list[bytes] = []
    cases = vec_cases(rng)
    for x in cases:
        for bits in (1, 2, 3, 4, 8):
            r = lkq(x, bits)
            body = struct.pack("<III", 1, x.size, bits) + x.tobytes()
            body += struct.pack("<I", 0 if r is None else 1)
            if r is not None:
                body += r[0] + r[1].tobytes()
            recs.append(body)
        for b in range(0, 11):
            r = pats(x, b)
            body = struct.pack("<III", 2, x.size, b) + x.tobytes()
            body += struct.pack("<I", 0 if r is None else 1)
            if r is not None:
                body += r[0] + r[1].tobytes()
            recs.append(body)
    for kind in range(3):
        for b_min, b_max, T in ((2, 8, 1), (2, 8, 2), (2, 8, 1000), (2, 10, 37), (0, 0, 5),
                                (3, 3, 9), (1, 7, 64)):
            bs = schedule(kind, b_min, b_max, T)
            recs.append(struct.pack("<IIIII", 3, kind, b_min, b_max, T)
                        + np.array(bs, dtype=np.int32).tobytes())
    for N, P, W, ah, al, gs, ties in ((90, 40, 8, 1.0, 0.02, 3, False),
                                      (90, 40, 8, 2.0, 0.5, 2, False),
                                      (70, 30, 0, 0.5, 0.1, 1, False),
                                      (70, 20, 4, 1.0, 0.3, 3, True),
                                      (60, 10, 64, 1.0, 0.02, 2, False),
                                      (80, 50, 3, 0.0, 0.0, 2, False),
                                      (80, 25, 5, 3.0, 0.2, 4, False)):
        seqs = significance_sequence(rng, N, gs, ties)
        cls = policy(seqs, P, W, ah, al)
        body = struct.pack("<IIIIdd", 4, N, P, W, ah, al)
        for n in range(P, N + 1):
            body += seqs[n - 1].astype("<f8").tobytes() + cls[n - P].tobytes()
        recs.append(body)
    for x in cases:  # after the others: the records before are unchanged
        for b, bits in ((0, 8), (2, 8), (5, 4), (8, 8), (8, 2), (10, 4), (3, 1)):
            r = lkpats(x, b, bits)
            body = struct.pack("<IIII", 5, x.size, b, bits) + x.tobytes()
            body += struct.pack("<I", 0 if r is None else 1)
            if r is not None:
                body += r[0] + r[1].tobytes()
            recs.append(body)
    out = Path(a.out)
    out.write_bytes(b"KVCG" + struct.pack("<II", 1, len(recs)) + b"".join(recs))


if __name__ == "__main__":
    main()
