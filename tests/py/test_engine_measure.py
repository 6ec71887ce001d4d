#!/usr/bin/env python3
"""test_engine_measure.py - kvq.Engine's selectors and measured statistics (kvq eval's
row figures: recall_topk, recall_mass, out_rel_err, kv_read_fraction,
attended_fraction) against a numpy computation written here from their definitions
(kvq/runtime.h kvq_retrieval_stats, runtime/step.c, docs/runtime.md), with numpy only.

A capture of stories260K (real q, k, v of every layer) is fed to an engine sequence
(f32 cache): 200 rows appended, then 56 decode steps of every layer. For each step,
layer and KV head with candidates beyond sinks and window, numpy computes from the
rows and the indices the engine says it selected:
  - exact attention over every visible token (exact RoPE at the true positions):
    recall_mass = the group's mean exact mass on the attended tokens (sinks, selected,
    window); out_rel_err = the group's mean ||o - o_exact|| / ||o_exact||, o the
    retrieval output computed here under wrope (q R_b . k_j for the tokens outside the
    last w, exact RoPE inside) over the attended tokens;
  - recall_topk = |selected ∩ the oracle's top-K| / K, the oracle's scores being
    (sum of the group's q R_b) . k_j over the candidates (1 when every candidate fits;
    near-ties at the K-th score, which f32 and f64 may order otherwise, give a range;
    equal scores rank by token as the engine ranks them);
  - kv_read_fraction (oracle selector: every candidate's key row, then the attended K
    and V rows) and attended_fraction.
Their means over the steps must equal the engine's (kvq_engine_seq_stats).
Exit 0 pass, 77 skip (reason on the last line), else fail.
"""
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "helpers"))

try:
    import numpy as np
    import zstandard  # noqa: F401  (kvq_read needs it)
except ImportError as e:
    print(f"needs numpy and zstandard ({e.name} missing; make deps installs them)")
    sys.exit(77)

import kvq_read  # noqa: E402
import pyref  # noqa: E402

BUILD = os.environ.get("KVQ_BUILD", os.path.join(ROOT, "build"))
os.environ.setdefault("KVQ_BUILD", BUILD)
KVQ = os.environ.get("KVQ", os.path.join(BUILD, "kvq"))
MODEL = os.environ.get("KVQ_TEST_MODEL", os.path.join(ROOT, "..", "shared", "models", "stories260K.gguf"))

import kvq  # noqa: E402

failures = []
P, N, SINK, BUDGET = 200, 256, 4, 12


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def softmax(x):
    p = np.exp(x - x.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def load_capture(cap, n_layers):
    """q, k, v [n_layers, N, heads, d] of the capture's first sequence."""
    out = []
    for layer in range(n_layers):
        with open(os.path.join(cap, f"layer_{layer:03d}.safetensors"), "rb") as f:
            t, _, _ = kvq_read.parse_safetensors(f.read())
        rows = np.flatnonzero(t["seq"] == 0)[:N]
        out.append([np.asarray(t[x][rows], dtype=np.float32) for x in ("q", "k", "v")])
    return [np.stack([o[i] for o in out]) for i in range(3)]


def run_engine(art, spec, q, k, v, selector):
    """The engine's statistics and, per step, layer and KV head, its selection."""
    sels = {}
    with kvq.Engine(art, spec) as eng:
        s = eng.sequence(budget=BUDGET, sink=SINK, cache_f16=False, selector=selector, measure=True)
        for layer in range(spec.n_layers):
            s.append(layer, k[layer, :P], v[layer, :P])
        for t in range(P, N):
            for layer in range(spec.n_layers):
                _, sel = s.decode(layer, q[layer, t], k[layer, t], v[layer, t])
                sels[t, layer] = sel
        return s.stats(), sels


def recall_bounds(cand, score, chosen):
    """|chosen ∩ the oracle's top-K| / K, K = len(chosen), the oracle ranking by score
    (ties to the earlier token). The engine scores in f32: candidates within 1e-6 of
    the largest |score| of the K-th best (not equal to it) may rank either way there,
    so this returns the (lowest, highest) recall over those orders (equal when nothing
    is that close)."""
    kk = len(chosen)
    order = np.lexsort((cand, -score))
    kth = score[order[kk - 1]]
    eps = 1e-6 * float(np.abs(score).max())
    gap = np.abs(score - kth)
    if not np.any((gap > 0) & (gap <= eps)):  # equal scores (equal keys) rank by token
        return (len(np.intersect1d(cand[order[:kk]], chosen)) / kk,) * 2
    sure = set(cand[score > kth + eps].tolist())
    tied = set(cand[np.abs(score - kth) <= eps].tolist())
    c = set(chosen.tolist())
    free = kk - len(sure)  # places the tied candidates share
    a, t = len(c & sure), len(c & tied)
    return (a + max(0, t - (len(tied) - free))) / kk, (a + min(t, free)) / kk


def numpy_figures(spec, q, k, v, w, b, sels):
    """kvq eval's figures from their definitions (module docstring)."""
    d, g = spec.head_dim, spec.n_heads // spec.n_kv_heads
    base, il = spec.rope_base, spec.rope_interleaved
    z = dict(steps=0, visible=0.0, attended=0.0, read=0.0, full=0.0, topk=0.0, topk_hi=0.0, ties=0,
             mass=0.0, err=0.0)
    for (t, layer), sel in sels.items():
        n = t + 1
        s_end, w_beg = min(SINK, n), max(n - w, min(SINK, n))
        nc = w_beg - s_end
        if nc <= 0:
            continue
        kr = pyref.rope(k[layer, :n], np.arange(n), base, il)  # [n, kv, d] exact RoPE
        for h in range(spec.n_kv_heads):
            chosen = np.asarray(sel[h], dtype=np.int64)
            att = np.concatenate([np.arange(s_end), chosen, np.arange(w_beg, n)])
            far = att < n - w
            qs = q[layer, t, h * g:(h + 1) * g]  # [g, d]
            qi, qb = pyref.rope(qs, t, base, il), pyref.rope(qs, b, base, il)
            p_full = softmax(qi @ kr[:, h].T / np.sqrt(d))  # [g, n]
            o_exact = p_full @ v[layer, :n, h].astype(np.float64)
            lg = np.where(far[None, :], qb @ k[layer, att, h].astype(np.float64).T,
                          qi @ kr[att, h].T) / np.sqrt(d)
            o = softmax(lg) @ v[layer, att, h].astype(np.float64)
            z["mass"] += float(p_full[:, att].sum(axis=1).mean())
            z["err"] += float(np.mean(np.linalg.norm(o - o_exact, axis=1) / np.linalg.norm(o_exact, axis=1)))
            lo = hi = 1.0
            if 0 < len(chosen) < nc:
                cand = np.arange(s_end, w_beg)
                score = k[layer, cand, h].astype(np.float64) @ qb.sum(axis=0)
                lo, hi = recall_bounds(cand, score, chosen)
                z["ties"] += lo != hi
            z["topk"] += lo
            z["topk_hi"] += hi
            z["steps"] += 1
            z["visible"] += n
            z["attended"] += len(att)
            z["read"] += (nc * d + len(att) * 2 * d) * 4  # the oracle's key rows, then K, V
            z["full"] += n * 2 * d * 4
    return z


def compare(name, got, z, kv_read):
    m = z["steps"]
    check(got["steps"] == m and got["measured"] == m, f"{name}: {got['steps']} steps, {got['measured']} "
          f"measured; numpy {m}")
    lo, hi, r = z["topk"] / m, z["topk_hi"] / m, got["recall_topk_mean"]
    check(lo - 1e-12 <= r <= hi + 1e-12, f"{name}: recall_topk_mean {r:.6f} in numpy's [{lo:.6f}, {hi:.6f}] "
          f"({z['ties']} steps with candidates within 1e-6 of the K-th score)")
    for key, ref, tol in (("recall_mass_mean", z["mass"] / m, 1e-5),
                          ("out_rel_err_mean", z["err"] / m, 1e-4),
                          ("attended_fraction", z["attended"] / z["visible"], 1e-12)):
        e = abs(got[key] - ref)
        check(e <= tol * max(1.0, abs(ref)), f"{name}: {key} {got[key]:.6f} vs numpy {ref:.6f} "
              f"(|d| {e:.2g} <= {tol})")
    if kv_read:
        ref = z["read"] / z["full"]
        check(abs(got["kv_read_fraction"] - ref) <= 1e-12, f"{name}: kv_read_fraction "
              f"{got['kv_read_fraction']:.6f} vs numpy {ref:.6f}")


def main():
    if not os.path.exists(MODEL):
        print(f"model {MODEL} not found (set KVQ_TEST_MODEL)")
        sys.exit(77)
    with tempfile.TemporaryDirectory() as tmp:
        cap, art = pyref.fitted_artifact(KVQ, MODEL, tmp)
        a = kvq.Artifact(art)
        spec = a.model
        w, b = a.wrope
        q, k, v = load_capture(cap, spec.n_layers)
        check(q.shape[1] == N, f"capture sequence of {N} rows ({q.shape})")
        for sel in ("codebook", "oracle", "full", "quest", "fier", "mass"):
            got, sels = run_engine(art, spec, q, k, v, sel)
            z = numpy_figures(spec, q, k, v, w, b, sels)
            compare(sel, got, z, kv_read=sel == "oracle")
            if sel in ("oracle", "full"):
                check(got["recall_topk_mean"] == 1.0, f"{sel}: recall_topk 1 (the oracle's own selection)")
            if sel == "full":
                check(got["kv_read_fraction"] == 1.0 and abs(got["recall_mass_mean"] - 1) < 1e-6,
                      f"full: every token read ({got['kv_read_fraction']}) and its whole mass attended")
            if sel == "codebook":
                check(0 < got["recall_topk_mean"] < 1, "codebook: recall_topk strictly between 0 and 1 "
                      f"({got['recall_topk_mean']:.4f}): a test that can tell selections apart")
        with kvq.Engine(art, spec) as eng:
            try:
                eng.sequence(selector="nope")
                check(False, "unknown selector refused")
            except kvq.InvalidArgumentError as e:
                check("nope" in str(e), f"unknown selector refused ({e})")
            try:
                eng.sequence(kv_cache="leankv")
                check(False, "leankv without settings refused")
            except kvq.InvalidArgumentError as e:
                check("leankv" in str(e) and "alpha" in str(e), f"leankv without thresholds refused ({e})")
            try:  # retrieval over the compressed cache (the default selector) needs rope
                eng.sequence(kv_cache="leankv", kv_alpha_h=0.5, kv_alpha_l=0.2, kv_window=16, max_tokens=N)
                check(False, "leankv with a selection on a wrope artifact refused")
            except kvq.InvalidArgumentError as e:
                check("positions rope" in str(e), f"leankv with a selection on a wrope artifact refused ({e})")
            s = eng.sequence(kv_cache="leankv", kv_alpha_h=0.5, kv_alpha_l=0.2, kv_window=16, max_tokens=N,
                             selector="full")
            for layer in range(spec.n_layers):
                s.append(layer, k[layer, :P], v[layer, :P])
            dense = eng.sequence(cache_f16=True)
            for layer in range(spec.n_layers):
                dense.append(layer, k[layer, :P], v[layer, :P])
            want = spec.n_layers * spec.n_kv_heads * (2 * spec.head_dim * 2 + 2) * P
            check(dense.nbytes == want, f"f16 cache bytes {dense.nbytes} = layers x heads x (2 d x 2 + 2) x "
                  f"{P} tokens = {want}")
            check(0 < s.nbytes < dense.nbytes, f"leankv cache {s.nbytes} bytes, under the f16 cache's "
                  f"{dense.nbytes}")
            check(s.stats()["steps"] == 0, "leankv: no retrieval statistics")
            try:
                eng.sequence(kv_cache="leankv+pats", kv_alpha_h=0.5, kv_alpha_l=0.2, kv_window=16,
                             max_tokens=N, selector="full")
                check(False, "leankv+pats without PATS settings refused")
            except kvq.InvalidArgumentError as e:
                check("pats" in str(e), f"leankv+pats without a PATS schedule refused ({e})")
            both = eng.sequence(kv_cache="leankv+pats", kv_alpha_h=0.5, kv_alpha_l=0.2, kv_window=16,
                                kv_pats_schedule="middle-heavy", kv_pats_b_min=2, kv_pats_b_max=8,
                                max_tokens=N, selector="full")
            for layer in range(spec.n_layers):
                both.append(layer, k[layer, :P], v[layer, :P])
            check(both.nbytes == s.nbytes, f"leankv+pats holds LeanKV's bytes ({both.nbytes} = {s.nbytes}): "
                  "PATS truncates the values LeanKV quantizes")
            check(eng.layer_window(0) == 0, "a retrieval layer has no local window")
        # per-layer attention: the artifact's description (every layer global, scale
        # 1/sqrt(d)) opens; a window on one layer is a mismatch naming it
        same = [kvq.LayerAttention(attn_scale=spec.head_dim ** -0.5) for _ in range(spec.n_layers)]
        with kvq.Engine(art, spec, layers=same) as eng:
            check(eng.layer_window(1) == 0, "per-layer description equal to the artifact's opens")
        other = [kvq.LayerAttention(window=16 if i == 2 else 0) for i in range(spec.n_layers)]
        try:
            kvq.Engine(art, spec, layers=other)
            check(False, "a windowed layer the artifact lacks refused")
        except kvq.MismatchError as e:
            check("layer 2" in str(e) and "window" in str(e), f"a windowed layer the artifact lacks refused ({e})")
        try:
            kvq.Engine(art, spec, layers=same[:1])
            check(False, "a layers list of the wrong length refused")
        except kvq.InvalidArgumentError as e:
            check("layers" in str(e), f"a layers list of the wrong length refused ({e})")
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("engine measure: all checks passed")


if __name__ == "__main__":
    main()
