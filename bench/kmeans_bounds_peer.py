#!/usr/bin/env python3
"""kvq's whole k-means fit with exact bounds against faiss's Kmeans from the same initial
centroids, alternated, best of N, in one run.

    python3 bench/kmeans_bounds_peer.py [--reps 3] [--space keys|qa] [--init k-means++]
        [--n 81920] [--d 128] [--k 4096] [--iters 25] [--threads 2]
        [--bench build/bench/bench_kmeans_bounds]

Each repetition runs bench_kmeans_bounds once (a whole kvq fit: seeding + Lloyd with
bounds; it also prints its SGEMM floor) and then faiss.Kmeans(niter=iters).train from the
seeding's centroids (dumped by the first repetition), with the same thread count. Prints
both times per repetition, the best of each and the ratio kvq / faiss. Install faiss with
scripts/install-bench-deps.sh. Exits non-zero when either side fails.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time


def say(line: str) -> None:
    """One line of the report on stdout."""
    sys.stdout.write(line + "\n")


def run_kvq(cmd: list) -> tuple:
    """Runs bench_kmeans_bounds; returns (seconds, cpu seconds, floor ratio, output)."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    tot = re.search(r"bounded fit: ([0-9.]+) s total \[cpu ([0-9.]+) s\]", out)
    flo = re.search(r"fit / SGEMM floor: ([0-9.]+)", out)
    if not tot or not flo:
        raise RuntimeError("bench_kmeans_bounds printed no total:\n" + out)
    return float(tot.group(1)), float(tot.group(2)), float(flo.group(1)), out


def run_faiss(x: "np.ndarray", init: "np.ndarray", iters: int, threads: int) -> tuple:
    """faiss Kmeans from init; returns (seconds, cpu seconds, last objective)."""
    import faiss

    faiss.omp_set_num_threads(threads)
    n, d = x.shape
    k = init.shape[0]
    km = faiss.Kmeans(d, k, niter=iters, seed=1, verbose=False,
                      max_points_per_centroid=(n + k - 1) // k + 1, min_points_per_centroid=1)
    t0, c0 = time.perf_counter(), time.process_time()
    km.train(x, init_centroids=init)
    t, c = time.perf_counter() - t0, time.process_time() - c0
    return t, c, km.iteration_stats[-1]["obj"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--space", default="keys", choices=["keys", "qa"])
    ap.add_argument("--init", default=None)
    ap.add_argument("--n", type=int, default=81920)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bench", default="build/bench/bench_kmeans_bounds")
    a = ap.parse_args()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = str(a.threads)
    import numpy as np

    try:
        import faiss  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"kmeans_bounds_peer: faiss is not installed "
                         f"(scripts/install-bench-deps.sh): {e}")
    base = [a.bench, "--n", str(a.n), "--d", str(a.d), "--k", str(a.k), "--iters",
            str(a.iters), "--threads", str(a.threads), "--space", a.space]
    if a.init:
        base += ["--init", a.init]
    kvq_t, faiss_t, floors, kvq_c, faiss_c = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        x = init = None
        for rep in range(a.reps):
            cmd = base + (["--dump", tmp] if rep == 0 else [])
            t, tc, floor, out = run_kvq(cmd)
            if rep == 0:
                sys.stdout.write(out)
                x = np.ascontiguousarray(np.load(os.path.join(tmp, "x.npy")), dtype=np.float32)
                init = np.ascontiguousarray(np.load(os.path.join(tmp, "init.npy")),
                                            dtype=np.float32)
            ft, fc, fobj = run_faiss(x, init, a.iters, a.threads)
            kvq_t.append(t)
            faiss_t.append(ft)
            kvq_c.append(tc)
            faiss_c.append(fc)
            floors.append(floor)
            say(f"rep {rep}: kvq whole fit {t:.3f} s [cpu {tc:.3f} s]   faiss Kmeans "
                  f"({a.iters} iterations from kvq's seeds) {ft:.3f} s [cpu {fc:.3f} s]   "
                  f"faiss last objective {fobj:.9e}")
    kb, fb = min(kvq_t), min(faiss_t)
    say(f"best of {a.reps} (machine shared, alternated): kvq {kb:.3f} s, faiss "
          f"{fb:.3f} s ({faiss.__version__}, {a.threads} threads): kvq / faiss = {kb / fb:.3f}")
    say(f"process CPU time, best of {a.reps}: kvq {min(kvq_c):.3f} s, faiss "
          f"{min(faiss_c):.3f} s: kvq / faiss = {min(kvq_c) / min(faiss_c):.3f}")
    say(f"kvq fit / its SGEMM floor (best rep): {min(floors):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
