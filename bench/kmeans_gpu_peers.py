#!/usr/bin/env python3
"""GPU peers of kvq's k-means on the data that bench_kmeans dumped: PyTorch doing what
the a2ats reference does per Lloyd iteration (torch.cdist + argmin + index_add), the
cuBLAS SGEMM floor of the assignment (x @ c^T alone), flash-kmeans (batched Triton Lloyd)
when importable, and faiss's GPU k-means when the faiss package with GPU support is
importable. Same data, same initial centroids.

    ./build-cuda/bench/bench_kmeans --case big --n 81920 --d 128 --k 4096 --iters 25 \\
        --device cuda --dump /tmp/km
    python3 bench/kmeans_gpu_peers.py --dir /tmp/km --case big --iters 25

Prints, per peer, the mean and min seconds per iteration and the final inertia (the
objective at the last assignment, before its update, as kvq's inertia[t]). A peer that
is not installed prints "skip <peer>: <why>". Status: written for bench/bench_kmeans_gpu.sh
and never run (no GPU has been available to any session; docs/cuda.md).
"""
import argparse
import sys
import time


def torch_reference(np, torch, x_np, c_np, iters):
    """a2ats-style Lloyd: cdist, argmin, index_add sums, counts; empty clusters keep theirs."""
    dev = torch.device("cuda")
    x = torch.from_numpy(x_np).to(dev)
    c = torch.from_numpy(c_np).to(dev)
    k, d = c.shape
    times, inertia = [], None
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist = torch.cdist(x, c)                     # [n, k] euclidean
        best, a = dist.min(dim=1)
        sums = torch.zeros_like(c).index_add_(0, a, x)
        cnt = torch.zeros(k, device=dev, dtype=x.dtype).index_add_(
            0, a, torch.ones_like(a, dtype=x.dtype))
        nz = cnt > 0
        c = torch.where(nz[:, None], sums / cnt.clamp(min=1)[:, None], c)
        inertia = float((best.double() ** 2).sum())
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times, inertia


def sgemm_floor(torch, x_np, c_np, reps=10):
    """Seconds of x @ c^T in float32 with TF32 off: the assignment's cuBLAS floor."""
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.from_numpy(x_np).cuda()
    c = torch.from_numpy(c_np).cuda()
    torch.mm(x, c.t())
    torch.cuda.synchronize()
    best = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(x, c.t())
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def faiss_gpu(np, faiss, x_np, c_np, iters):
    k, d = c_np.shape
    km = faiss.Kmeans(d, k, niter=iters, gpu=True, verbose=False, max_points_per_centroid=1 << 30)
    t0 = time.perf_counter()
    km.train(x_np, init_centroids=c_np)
    wall = time.perf_counter() - t0
    obj = km.iteration_stats[-1]["obj"] if hasattr(km, "iteration_stats") else float("nan")
    return wall / iters, obj


def flash_kmeans_gpu(torch, fk, x_np, c_np, iters: int) -> tuple:
    """flash-kmeans' batched Triton Lloyd (batch of one head) from the same start: seconds
    per iteration (after a one-iteration warm-up that compiles its kernels) and the
    inertia of its returned centroids."""
    x = torch.from_numpy(x_np).cuda()[None]
    c = torch.from_numpy(c_np).cuda()[None]
    k = c.shape[1]
    fk.batch_kmeans_Euclid(x, k, max_iters=1, tol=0.0, init_centroids=c.clone())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    _, cent, n_it = fk.batch_kmeans_Euclid(x, k, max_iters=iters, tol=0.0,
                                          init_centroids=c.clone())
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    torch.backends.cuda.matmul.allow_tf32 = False
    d2 = (x[0] * x[0]).sum(1, keepdim=True) - 2 * x[0] @ cent[0].t() + (cent[0] * cent[0]).sum(1)
    inertia = float(d2.clamp(min=0).min(dim=1).values.double().sum())
    return wall / max(int(n_it), 1), int(n_it), inertia


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="directory written by bench_kmeans --dump")
    ap.add_argument("--case", default="big", choices=["small", "big"])
    ap.add_argument("--iters", type=int, default=25)
    a = ap.parse_args()
    import numpy as np

    x = np.ascontiguousarray(np.load(f"{a.dir}/kmeans_{a.case}_x.npy"), dtype=np.float32)
    c = np.ascontiguousarray(np.load(f"{a.dir}/kmeans_{a.case}_init.npy"), dtype=np.float32)
    n, d = x.shape
    k = c.shape[0]
    print(f"peers: n={n} d={d} k={k} iters={a.iters}")
    try:
        import torch
        if not torch.cuda.is_available():
            raise ImportError("torch has no CUDA device")
    except ImportError as e:
        print(f"skip torch: {e}")
        torch = None
    if torch is not None:
        print(f"  device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
        floor = sgemm_floor(torch, x, c)
        print(f"  cuBLAS sgemm floor (x @ c^T, fp32): {floor:.5f} s = "
              f"{2.0 * n * d * k / floor / 1e9:.0f} GFLOP/s")
        times, inertia = torch_reference(np, torch, x, c, a.iters)
        print(f"  torch cdist+argmin+index_add: mean {sum(times) / len(times):.5f} s, "
              f"min {min(times):.5f} s per iteration; final inertia {inertia:.6e}")
    try:
        if torch is None:
            raise ImportError("torch has no CUDA device")
        import flash_kmeans as fk
    except ImportError as e:
        print(f"skip flash-kmeans: {e}")
        fk = None
    if fk is not None:
        per, n_it, inertia = flash_kmeans_gpu(torch, fk, x, c, a.iters)
        print(f"  flash-kmeans {getattr(fk, '__version__', '?')} batch_kmeans_Euclid: {per:.5f} s "
              f"per iteration ({n_it} iterations); inertia of its centroids {inertia:.6e}")
    try:
        import faiss
        if faiss.get_num_gpus() < 1:
            raise ImportError("faiss has no GPU support or sees no GPU")
    except (ImportError, AttributeError) as e:
        print(f"skip faiss-gpu: {e}")
        faiss = None
    if faiss is not None:
        per, obj = faiss_gpu(np, faiss, x, c, a.iters)
        print(f"  faiss-gpu Kmeans: {per:.5f} s per iteration (train / iters); final obj {obj:.6e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
