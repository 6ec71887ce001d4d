#!/usr/bin/env python3
"""Runs faiss and scikit-learn k-means on the data that bench_kmeans dumped, from the
same initial centroids, and prints their per-iteration time and inertia.

    ./build/bench/bench_kmeans --case small --dump /tmp/km
    python3 bench/kmeans_peers.py --dir /tmp/km --case small --iters 10 --threads 2

Inputs: DIR/kmeans_<case>_x.npy [n, d] float32 and DIR/kmeans_<case>_init.npy [k, d].
Install the peers with scripts/install-bench-deps.sh.

faiss runs twice: from kvq's initial centroids (per-iteration speed, same start) and
from its own seeding (random points; the final inertia to compare seedings with).
Times are wall clock and, in brackets, process CPU time.

Inertia conventions: faiss's per-iteration objective is, like kvq's inertia[t], the
sum of squared distances at the assignment step of iteration t (before that
iteration's update); scikit-learn's inertia_ is measured after a final assignment
to the final centroids, so it is slightly lower for the same number of updates.
"""
import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="directory written by bench_kmeans --dump")
    ap.add_argument("--case", default="small", choices=["small", "big", "both"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["faiss", "sklearn"], help="run one peer only")
    a = ap.parse_args()

    # thread counts must be fixed before numpy/faiss/sklearn start their pools
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = str(a.threads)
    import numpy as np

    cases = ["small", "big"] if a.case == "both" else [a.case]
    rc = 0
    for case in cases:
        xp = os.path.join(a.dir, f"kmeans_{case}_x.npy")
        ip = os.path.join(a.dir, f"kmeans_{case}_init.npy")
        if not (os.path.exists(xp) and os.path.exists(ip)):
            print(f"kmeans_peers: {xp} or {ip} missing: run bench_kmeans --dump {a.dir}",
                  file=sys.stderr)
            rc = 1
            continue
        x = np.ascontiguousarray(np.load(xp), dtype=np.float32)
        init = np.ascontiguousarray(np.load(ip), dtype=np.float32)
        n, d = x.shape
        k = init.shape[0]
        print(f"case {case}: n={n} d={d} k={k} threads={a.threads} iters={a.iters}")
        if a.only in (None, "faiss"):
            rc |= run_faiss(x, init, a.iters, a.threads)
        if a.only in (None, "sklearn"):
            rc |= run_sklearn(x, init, a.iters, a.threads)
    return rc


def run_faiss(x, init, iters, threads):
    try:
        import faiss
    except ImportError:
        print("  faiss: not installed (scripts/install-bench-deps.sh)")
        return 0
    faiss.omp_set_num_threads(threads)
    n, d = x.shape
    k = init.shape[0]
    # no subsampling and no warning threshold, as the kvq benchmark runs; first from
    # kvq's initial centroids, then from faiss's own (random) seeding
    for label, start in (("from kvq's seeds", init), ("own random seeding", None)):
        km = faiss.Kmeans(d, k, niter=iters, seed=1, verbose=False,
                          max_points_per_centroid=(n + k - 1) // k + 1,
                          min_points_per_centroid=1)
        t0, c0 = time.perf_counter(), time.process_time()
        if start is None:
            km.train(x)
        else:
            km.train(x, init_centroids=start)
        t, c = time.perf_counter() - t0, time.process_time() - c0
        st = km.iteration_stats
        objs = [s["obj"] for s in st]
        it = max(len(st), 1)
        print(f"  faiss {faiss.__version__} {label}: {t:.3f} s for {len(st)} iterations = "
              f"{t / it:.4f} s/iter [cpu {c / it:.4f} s/iter]; inertia first {objs[0]:.6e} "
              f"last {objs[-1]:.6e}")
    return 0


def run_sklearn(x, init, iters, threads):
    try:
        import sklearn
        from sklearn.cluster import KMeans
        from threadpoolctl import threadpool_limits
    except ImportError:
        print("  scikit-learn: not installed (scripts/install-bench-deps.sh)")
        return 0
    k = init.shape[0]
    km = KMeans(n_clusters=k, init=init, n_init=1, max_iter=iters, tol=0.0,
                algorithm="lloyd", random_state=0)
    with threadpool_limits(limits=threads):
        t0, c0 = time.perf_counter(), time.process_time()
        km.fit(x)
        t, c = time.perf_counter() - t0, time.process_time() - c0
    it = max(km.n_iter_, 1)
    print(f"  scikit-learn {sklearn.__version__}: {t:.3f} s for {km.n_iter_} iterations = "
          f"{t / it:.4f} s/iter [cpu {c / it:.4f} s/iter]; inertia_ (after final e-step) "
          f"{km.inertia_:.6e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
