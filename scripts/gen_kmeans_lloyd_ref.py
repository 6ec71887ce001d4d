#!/usr/bin/env python3
"""Writes tests/data/kmeans_lloyd_ref.bin: plain Lloyd's k-means computed with numpy, the
independent reference of tests/test_kmeans_bounds.c (kvq's bounded Lloyd must give the
same assignment at every iteration).

    python3 scripts/gen_kmeans_lloyd_ref.py [-o tests/data/kmeans_lloyd_ref.bin]

Data: integer-valued points (blobs of integer centers plus integer noise, some rows
repeated), so the first iteration's distances, from centroids that are data points, are
exact in float32 too and its ties (several of them, checked) must go to the lower index
as in kvq. Later iterations use float32 centroids (the float64 mean rounded, as kvq
stores them) and distances in float64; the script refuses a data set where any later
decision is closer than a relative 2.5e-5 (2.6 times 2 eta, the bound on the error of
the difference of two of kvq's distances, eta = 1.25 (2 d + 16) 2^-24: see
kmeans/kmeans_bounds.c), so float32 rounding cannot flip it, or where a cluster empties
(kvq's repair draws from its own generator).

Format (little-endian): int32 n, d, k, iters; float32 x[n, d]; float32 init[k, d];
int32 assign[iters, n]; float64 inertia[iters] (the sum of squared distances at each
iteration's assignment, before its update).
"""
import argparse
import struct
import sys

import numpy as np


def lloyd(x: np.ndarray, init: np.ndarray, iters: int):
    c = init.astype(np.float32).copy()
    x64 = x.astype(np.float64)
    assigns, inertias = [], []
    ties = 0
    for it in range(iters):
        c64 = c.astype(np.float64)
        d2 = ((x64[:, None, :] - c64[None, :, :]) ** 2).sum(axis=2)
        a = np.argmin(d2, axis=1)  # first minimum: ties to the lower index
        srt = np.sort(d2, axis=1)
        gap = srt[:, 1] - srt[:, 0]
        scale = (x64 ** 2).sum(axis=1) + (c64 ** 2).sum(axis=1).max()
        if it == 0:
            ties += int((gap == 0).sum())
            bad = (gap > 0) & (gap < 2.5e-5 * scale)
        else:
            bad = gap < 2.5e-5 * scale
        if bad.any():
            raise ValueError(f"iteration {it}: {int(bad.sum())} near-ties")
        assigns.append(a.astype(np.int32))
        inertias.append(float(d2[np.arange(len(x)), a].sum()))
        counts = np.bincount(a, minlength=len(c))
        if (counts == 0).any():
            raise ValueError(f"iteration {it}: an empty cluster")
        for j in range(len(c)):
            c[j] = x64[a == j].mean(axis=0).astype(np.float32)
    return np.stack(assigns), np.array(inertias), ties


def make(seed: int, n: int, d: int, k: int, blobs: int):
    rng = np.random.default_rng(seed)
    centers = rng.integers(-12, 13, size=(blobs, d))
    lab = rng.integers(0, blobs, size=n)
    x = centers[lab] + rng.integers(-3, 4, size=(n, d))
    dup = rng.choice(n, size=n // 20, replace=False)
    h = len(dup) // 2
    x[dup[:h]] = x[dup[h:2 * h]]  # repeated rows
    x = x.astype(np.float32)
    # initial centroids: distinct data points
    idx = rng.choice(n, size=k, replace=False)
    init = x[idx].copy()
    return x, init


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", default="tests/data/kmeans_lloyd_ref.bin")
    a = ap.parse_args()
    n, d, k, iters, blobs = 1500, 24, 32, 8, 20
    for seed in range(100):
        x, init = make(seed, n, d, k, blobs)
        if len(np.unique(init, axis=0)) < k:
            continue
        try:
            assign, inertia, ties = lloyd(x, init, iters)
        except ValueError:
            continue
        if ties < 3:
            continue
        with open(a.out, "wb") as f:
            f.write(struct.pack("<4i", n, d, k, iters))
            f.write(x.astype("<f4").tobytes())
            f.write(init.astype("<f4").tobytes())
            f.write(assign.astype("<i4").tobytes())
            f.write(inertia.astype("<f8").tobytes())
        sys.stderr.write(f"seed {seed}: {ties} exact ties at iteration 0; "
                         f"inertia {inertia[0]:.1f} -> {inertia[-1]:.1f}; wrote {a.out}\n")
        return 0
    sys.stderr.write("no seed gave a data set without near-ties or empty clusters\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
