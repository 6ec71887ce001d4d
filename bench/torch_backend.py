#!/usr/bin/env python3
"""torch_backend.py - the torch back end's decode step (kvq.torch_engine) against the C
engine's (kvq.Engine), on the same rows, in one run.

    python3 bench/torch_backend.py --artifact A [--context 4096] [-n 8] [--reps 3]
        [--device cpu|cuda] [--threads T] [--impl FILE.py ...]

Synthetic pre-RoPE rows of the artifact's model shape (seeded): a prompt of --context
tokens appended to every layer, then -n decode steps over every layer. Each engine runs
its steps alternated with the others --reps times; prints the best milliseconds per
token (all layers) of each and the ratio torch / C engine (prompt excluded). --impl
adds other implementations of kvq.torch_engine (a file defining TorchEngine, e.g. an
older revision from `git show REV:python/kvq/torch_engine.py`), timed the same way.
The selections of every implementation are compared with the C engine's (count of
differing (step, layer, head) selections printed). Timings on a shared machine are
noisy: read the ratio. Never asserted.
"""
import argparse
import importlib.util
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvq  # noqa: E402
import kvq.torch_engine  # noqa: E402


def load_impl(path):
    spec = importlib.util.spec_from_file_location(f"kvq._bench_{abs(hash(path))}", path,
                                                  submodule_search_locations=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "kvq"
    spec.loader.exec_module(mod)
    return mod.TorchEngine


def rows(spec, context, n, seed=0):
    rs = np.random.RandomState(seed)
    H, d = spec.n_kv_heads, spec.head_dim
    sc = rs.uniform(0.5, 2.0, size=(H, d)).astype(np.float32)
    kp = (rs.randn(context, H, d) * sc).astype(np.float32)
    vp = rs.randn(context, H, d).astype(np.float32)
    steps = [[((2 * rs.randn(spec.n_heads, d)).astype(np.float32), (rs.randn(H, d) * sc).astype(np.float32),
               rs.randn(H, d).astype(np.float32)) for _ in range(spec.n_layers)] for _ in range(n)]
    return kp, vp, steps


def run(make_seq, spec, kp, vp, steps, device):
    """(ms per token, selections [step][layer][head] as numpy)."""
    seq = make_seq()
    conv = (lambda x: torch.as_tensor(x, device=device)) if device else (lambda x: x)
    for l in range(spec.n_layers):
        seq.append(l, conv(kp), conv(vp))
    sels = []
    if device and device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    for st in steps:
        out = []
        for l, (q, k, v) in enumerate(st):
            o, s = seq.decode(l, conv(q), conv(k), conv(v))
            out.append(s)
        sels.append(out)
    if device and device.startswith("cuda"):
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t) * 1e3 / len(steps)
    sels = [[[np.asarray(x.cpu().numpy() if hasattr(x, "cpu") else x) for x in s] for s in st] for st in sels]
    seq.close()
    return ms, sels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--impl", action="append", default=[], help="another kvq.torch_engine file")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    art = kvq.Artifact(a.artifact)
    spec = art.model
    kp, vp, steps = rows(spec, a.context, a.n)
    eng = kvq.Engine(a.artifact, spec)
    impls = [("C engine", lambda: eng.sequence(budget=0.06), None),
             ("torch", lambda: kvq.torch_engine.TorchEngine(art, spec, device=a.device).sequence(budget=0.06),
              a.device)]
    for path in a.impl:
        te = load_impl(path)
        impls.append((os.path.basename(path), lambda te=te: te(art, spec, device=a.device).sequence(budget=0.06),
                      a.device))
    best = {name: float("inf") for name, _, _ in impls}
    ref = None
    diff = {name: 0 for name, _, _ in impls}
    for rep in range(a.reps):
        for name, make, dev in impls:
            ms, sels = run(make, spec, kp, vp, steps, dev)
            best[name] = min(best[name], ms)
            if ref is None:
                ref = sels
            diff[name] = sum(not np.array_equal(x, y) for s1, s2 in zip(ref, sels)
                             for l1, l2 in zip(s1, s2) for x, y in zip(l1, l2))
            print(f"rep {rep + 1}: {name}: {ms:.1f} ms/token", flush=True)
    print(f"context {a.context}, {a.n} steps x {spec.n_layers} layers, device {a.device}, "
          f"torch threads {torch.get_num_threads()}, best of {a.reps}:")
    for name, _, _ in impls:
        print(f"  {name:24s} {best[name]:8.1f} ms/token  ({best[name] / best['C engine']:.2f}x the C engine; "
              f"{diff[name]} selections differ from it)")


if __name__ == "__main__":
    main()
