#!/usr/bin/env python3
"""test_engine_kvcache.py - kvq.Engine sequences over a compressed KV cache (kv_cache
leankv, pats, leankv+pats; docs/kvcache.md "The embedding API") with the codebook
selector (retrieval over the compressed cache) and with selector full, checked against
numpy, with numpy only.

A capture of stories260K (real q, k, v of every layer, 256 tokens) and an artifact
fitted on it (tests/helpers/pyref.py), rewritten to positions rope / score rb
(tests/helpers/edit_artifact.py: retrieval over a compressed cache needs rope). Each
sequence appends the first 200 rows of every layer, then decodes 56 steps of every
layer. The reference is scripts/gen_kvcache_golden.py's numpy implementation of the
formats (written from the papers and docs/kvcache.md "Formats", not from kvq's code):
LeanKV's quantizer (lkq), PATS's truncation and packing (pats), their combination
(lkpats) and the b(t) schedules. For every decode step, layer and KV head:

  - the output equals a numpy attention (float64, exact RoPE at the true positions:
    the artifact's positions rope) of the step's query heads over the rows the cache
    holds, i.e. each attended token's rotated key and value dequantized by the numpy
    reference, the attended tokens being the sinks, the selection the engine reports
    and the window (selector codebook), or every token (selector full); and it is
    measurably farther from the same attention over the exact rows (a test that can
    tell the cache's rows from exact ones);
  - kv_cache pats with b 0:0 gives the f16 retrieval sequence's outputs and selections
    bit for bit (its rows are the f16 rows);
  - the bytes the sequence reports (Sequence.nbytes) equal the format sizes of every
    row held, computed in numpy (the rows' byte strings of the reference), plus with a
    selection the retrieval context's codes, residuals, positions and RoPE table;
and bad input raises kvq.InvalidArgumentError naming the problem.
Exit 0 pass, 77 skip (reason on the last line), else fail.
"""
import os
import sys
import tempfile

# test_engine_measure puts scripts/, python/ and tests/helpers/ on the path and exits 77
# (the reason printed) without numpy or zstandard
from test_engine_measure import KVQ, MODEL, load_capture, softmax

import numpy as np  # noqa: E402

import edit_artifact  # noqa: E402
import gen_kvcache_golden as gold  # noqa: E402
import pyref  # noqa: E402
import kvq  # noqa: E402

failures = []
P, N, SINK, BUDGET = 200, 256, 4, 12
SCHED, B_MIN, B_MAX = "middle-heavy", 2, 8  # PATS settings (middle-heavy = 2)
ALPHA_H, ALPHA_L, LK_WINDOW = 0.0, 0.0, 16  # LeanKV: every token K8V4 (no pruning)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def rope_artifact(tmp):
    """The fitted artifact, and a copy recording positions rope / score rb."""
    cap, art = pyref.fitted_artifact(KVQ, MODEL, tmp)
    rope = os.path.join(tmp, "rope.kvq")
    with open(art, "rb") as f:
        buf = edit_artifact.edit(f.read(), [], {"positions.mode": "rope", "positions.score": "rb"})
    with open(rope, "wb") as f:
        f.write(buf)
    return cap, art, rope


KV_ARGS = {
    "f16": {},
    "leankv": dict(kv_alpha_h=ALPHA_H, kv_alpha_l=ALPHA_L, kv_window=LK_WINDOW),
    "pats": dict(kv_pats_schedule=SCHED, kv_pats_b_min=B_MIN, kv_pats_b_max=B_MAX),
}
KV_ARGS["leankv+pats"] = {**KV_ARGS["leankv"], **KV_ARGS["pats"]}


def run(eng, spec, q, k, v, kv, selector, **over):
    """Outputs [N - P, layers, heads, d], selections {(t, layer): [per KV head]} and the
    sequence's bytes at the end."""
    args = {**KV_ARGS[kv], **over}
    s = eng.sequence(budget=BUDGET, sink=SINK, max_tokens=N, selector=selector, kv_cache=kv, **args)
    for layer in range(spec.n_layers):
        s.append(layer, k[layer, :P], v[layer, :P])
    outs = np.zeros((N - P, spec.n_layers, spec.n_heads, spec.head_dim), dtype=np.float32)
    sels = {}
    for t in range(P, N):
        for layer in range(spec.n_layers):
            outs[t - P, layer], sels[t, layer] = s.decode(layer, q[layer, t], k[layer, t], v[layer, t])
    nbytes = s.nbytes
    check(s.length(0) == N, f"{kv}/{selector}: {N} tokens held")
    s.close()
    return outs, sels, nbytes


def held_rows(kv, spec, k, v):
    """The rows the cache holds by the numpy reference: dequantized (rotated) keys and
    values [layers, N, kv_heads, d] (float64) and the bytes of every row."""
    n_kv = spec.n_kv_heads
    kr = np.stack([pyref.rope(k[l], np.arange(N), spec.rope_base, spec.rope_interleaved)
                   for l in range(spec.n_layers)]).astype(np.float32)
    bt = gold.schedule(2, B_MIN, B_MAX, N)  # b(t) for t = 1..N (max_tokens)
    kq, vq = np.zeros(kr.shape), np.zeros(kr.shape)
    nbytes = 0
    for l in range(spec.n_layers):
        for j in range(N):
            for h in range(n_kv):
                x, y = kr[l, j, h], v[l, j, h].astype(np.float32)
                if kv == "leankv":
                    rk, rv = gold.lkq(x, 8), gold.lkq(y, 4)
                elif kv == "pats":
                    rk, rv = gold.pats(x, bt[j]), gold.pats(y, bt[j])
                else:
                    rk, rv = gold.lkpats(x, bt[j], 8), gold.lkpats(y, bt[j], 4)
                kq[l, j, h], vq[l, j, h] = rk[1], rv[1]
                nbytes += len(rk[0]) + len(rv[0])
    return kq, vq, nbytes


def attend(spec, q, kq, vq, sels, selector, w):
    """numpy's outputs [N - P, layers, heads, d] over the rows kq, vq (rotated keys)."""
    d, n_kv = spec.head_dim, spec.n_kv_heads
    g = spec.n_heads // n_kv
    out = np.zeros((N - P, spec.n_layers, spec.n_heads, d))
    for (t, layer), sel in sels.items():
        n = t + 1
        s_end, w_beg = min(SINK, n), max(n - w, min(SINK, n))
        for h in range(n_kv):
            if selector == "full" or w_beg <= s_end:
                att = np.arange(n)
            else:
                att = np.concatenate([np.arange(s_end), np.asarray(sel[h], dtype=np.int64), np.arange(w_beg, n)])
            qi = pyref.rope(q[layer, t, h * g:(h + 1) * g], t, spec.rope_base, spec.rope_interleaved)
            p = softmax(qi @ kq[layer, att, h].T / np.sqrt(d))
            out[t - P, layer, h * g:(h + 1) * g] = p @ vq[layer, att, h]
    return out


def check_kind(eng, spec, q, k, v, kv, w, exact_k, exact_v):
    kq, vq, want_bytes = held_rows(kv, spec, k, v)
    for selector in ("codebook", "full"):
        outs, sels, nbytes = run(eng, spec, q, k, v, kv, selector)
        ref = attend(spec, q, kq, vq, sels, selector, w)
        exact = attend(spec, q, exact_k, exact_v, sels, selector, w)
        scale = float(np.abs(ref).max())
        err = float(np.abs(outs - ref).max()) / scale
        far = float(np.abs(outs - exact).max()) / scale
        picked = sum(len(x) for sel in sels.values() for x in sel)
        if selector == "codebook":
            check(picked > 0, f"{kv}/codebook: the selector chose candidates ({picked} over the steps)")
        # float sums in 16 lanes against float64; full attention over LeanKV rows computes
        # a logit as s (q . c) - z sum(q) from the codes (kvc_rows.h), not over the
        # dequantized row: a few float roundings more
        tol = 2e-6 if selector == "codebook" or kv == "pats" else 1e-5
        check(err <= tol, f"{kv}/{selector}: every step's output = numpy attention over the rows "
              f"dequantized by the numpy reference (max |diff| {err:.2g} of max |o|, <= {tol:g})")
        check(far >= 100 * max(err, 1e-7), f"{kv}/{selector}: the exact rows' attention is farther "
              f"({far:.2g} of max |o|): the compressed rows are read")
        # with a selection the retrieval context's bytes count too (kvq/engine.h
        # kvq_engine_seq_bytes; docs/kvcache.md "Memory held"): per token the RoPE table
        # (cos, sin: 4 d bytes), per layer an int64 position, per layer and KV head the
        # codebook's uint16 code (one group), the 1-bit residuals (d / 8 bytes) and their
        # f32 scale, and the int32 token of the code-ordered row
        d, L, H = spec.head_dim, spec.n_layers, spec.n_kv_heads
        ctx = N * (4 * d + L * (8 + H * (2 + d // 8 + 4 + 4))) if selector == "codebook" else 0
        check(nbytes == want_bytes + ctx, f"{kv}/{selector}: Sequence.nbytes {nbytes} = the format sizes "
              f"of the {N} x {L} x {H} K and V rows held ({want_bytes}) + the context's ({ctx})")


def refusals(eng, wrope_eng):
    def refused(what, must, **kw):
        try:
            eng.sequence(max_tokens=N, **kw)
            check(False, f"{what} refused")
        except kvq.InvalidArgumentError as e:
            check(all(m in str(e) for m in must), f"{what} refused ({e})")
    refused("unknown kv_cache name", ["kv_cache", "'lean'", "leankv+pats"], kv_cache="lean")
    refused("unknown PATS schedule", ["kv_pats_schedule", "'middle'"], kv_cache="pats",
            kv_pats_schedule="middle", kv_pats_b_min=0, kv_pats_b_max=4)
    refused("alpha_l > alpha_h", ["alpha"], kv_cache="leankv", kv_alpha_h=0.1, kv_alpha_l=0.5, kv_window=16)
    refused("PATS b_max 11", ["b_max"], kv_cache="pats", kv_pats_schedule="old-heavy", kv_pats_b_min=0,
            kv_pats_b_max=11)
    refused("PATS b_min > b_max", ["b_m"], kv_cache="pats", kv_pats_schedule="old-heavy", kv_pats_b_min=6,
            kv_pats_b_max=4)
    refused("unknown selector", ["selector", "'nope'"], kv_cache="leankv", selector="nope", **KV_ARGS["leankv"])
    for kv in ("leankv", "pats", "leankv+pats"):
        try:
            wrope_eng.sequence(max_tokens=N, kv_cache=kv, selector="codebook", **KV_ARGS[kv])
            check(False, f"{kv} with the codebook selector on a wrope artifact refused")
        except kvq.InvalidArgumentError as e:
            check("positions rope" in str(e), f"{kv} with the codebook selector on a wrope artifact refused ({e})")
        wrope_eng.sequence(max_tokens=N, kv_cache=kv, selector="full", **KV_ARGS[kv]).close()
        check(True, f"{kv} with selector full on a wrope artifact opens")


def retrieval_refusals():
    """kvq.hf.retrieval's own checks, made before the model is read (no torch needed)."""
    import types
    import kvq.hf  # noqa: F401
    R = sys.modules["kvq.hf.retrieval"]
    dummy = types.SimpleNamespace(config=None)
    try:
        R.Retrieval(dummy, "x.kvq", kv_alpha=0.5)
        check(False, "kvq.hf.retrieval: an unknown kv option refused")
    except kvq.InvalidArgumentError as e:
        check("'kv_alpha'" in str(e) and "kv_alpha_h" in str(e),
              f"kvq.hf.retrieval: an unknown kv option refused ({e})")
    try:
        R.Retrieval(dummy, "x.kvq", backend="torch", kv_cache="leankv")
        check(False, "kvq.hf.retrieval: kv_cache with the torch back end refused")
    except kvq.UnsupportedError as e:
        check("torch" in str(e) and "kv_cache" in str(e), f"kvq.hf.retrieval: kv_cache with the torch back end "
              f"refused ({e})")


def main():
    if not os.path.exists(MODEL):
        print(f"model {MODEL} not found (set KVQ_TEST_MODEL)")
        sys.exit(77)
    with tempfile.TemporaryDirectory() as tmp:
        cap, art, rope = rope_artifact(tmp)
        a = kvq.Artifact(rope)
        spec = a.model
        w, _ = a.wrope
        q, k, v = load_capture(cap, spec.n_layers)
        exact_k = np.stack([pyref.rope(k[l], np.arange(N), spec.rope_base, spec.rope_interleaved)
                            for l in range(spec.n_layers)])
        exact_v = v.astype(np.float64)
        with kvq.Engine(rope, spec) as eng, kvq.Engine(art, spec) as wrope_eng:
            # PATS b 0:0 holds the f16 rows: the f16 retrieval sequence, bit for bit
            o16, s16, _ = run(eng, spec, q, k, v, "f16", "codebook")
            o0, s0, _ = run(eng, spec, q, k, v, "pats", "codebook", kv_pats_b_min=0, kv_pats_b_max=0)
            same = all(np.array_equal(x, y) for key in s16 for x, y in zip(s16[key], s0[key]))
            check(np.array_equal(o16, o0) and same, "pats b 0:0 with the codebook selector: the f16 retrieval "
                  f"sequence's outputs and selections bit for bit ({len(s16)} steps x layers)")
            for kv in ("leankv", "pats", "leankv+pats"):
                check_kind(eng, spec, q, k, v, kv, w, exact_k, exact_v)
            refusals(eng, wrope_eng)
    retrieval_refusals()
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("engine kvcache: all checks passed")


if __name__ == "__main__":
    main()
