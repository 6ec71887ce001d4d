#!/usr/bin/env bash
# bench_kmeans_gpu.sh — the GPU k-means benchmark of issue 15, in one run on a GPU
# machine: one KV head of a 7B-shaped layer (n 81920 points, d 128, K 4096, 25 Lloyd
# iterations from the same seeded start) fitted by
#   1. kvq's CUDA backend        (build-cuda/bench/bench_kmeans --device cuda)
#   2. kvq's CPU backend         (same binary, --device cpu, all cores, fewer iterations:
#                                 the per-iteration time is what is compared)
#   3. PyTorch as the a2ats reference does it (torch.cdist + argmin + index_add), and the
#      cuBLAS SGEMM floor of the assignment (x @ c^T)      (bench/kmeans_gpu_peers.py)
#   4. faiss's GPU k-means, when the faiss package with GPU support is installed
# A layer is 8 such heads (x 8); a 7B model's 256 heads are x 256 (the target: under a
# minute for the whole fit; per iteration at least 5x faster than PyTorch and within 2x of
# the SGEMM floor for the assignment).
#
#   bash bench/bench_kmeans_gpu.sh [N] [D] [K] [ITERS] [CPU_ITERS]
#   defaults: 81920 128 4096 25 3.  JOBS: make -j (default nproc). CUDA_SMS: the
#   architectures to build (e.g. 90 for an H100 only: a much shorter build).
#
# STATUS: written without a GPU and NEVER RUN: no session has had one (docs/cuda.md).
# Expect to fix it on first use; record the figures in docs/BENCHMARKS.md with the
# command line and the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-81920}
D=${2:-128}
K=${3:-4096}
ITERS=${4:-25}
CPU_ITERS=${5:-3}
make -j"${JOBS:-$(nproc)}" CUDA=1 all bench
B=./build-cuda/bench/bench_kmeans
./build-cuda/kvq version
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
echo "== kvq cuda: n $N d $D K $K, $ITERS iterations"
"$B" --case big --n "$N" --d "$D" --k "$K" --iters "$ITERS" --device cuda --dump "$T" | tee "$T/gpu.txt"
grep -q '^  backend: cuda' "$T/gpu.txt" || { echo "bench_kmeans_gpu: the fit did not run on the GPU" >&2; exit 1; }
echo "== kvq cpu: $(nproc) threads, $CPU_ITERS iterations"
"$B" --case big --n "$N" --d "$D" --k "$K" --iters "$CPU_ITERS" --device cpu --threads "$(nproc)"
echo "== peers (same data, same start)"
python3 bench/kmeans_gpu_peers.py --dir "$T" --case big --iters "$ITERS"
