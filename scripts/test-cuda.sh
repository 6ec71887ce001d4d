#!/usr/bin/env bash
# test-cuda.sh — builds kvq with the CUDA backend (CUDA=1, warnings as errors, in
# build-cuda/) and runs tests/cuda/test_cuda_paths: every CUDA path (k-means distances +
# argmin, update, seeding, whole fit; the batched Cholesky; the retrieval LUT, score
# gather and top-k kernels) against its CPU reference. `make test-cuda` runs this.
#
#   scripts/test-cuda.sh          the build and the CUDA check (seconds on a GPU)
#   scripts/test-cuda.sh --all    then the whole suite on the CUDA build (make CUDA=1
#                                 test): test_kmeans, test_moments and test_runtime take
#                                 their device paths where a GPU is present
#
# Without a GPU every case is skipped with its reason ("no CUDA device ...") and the
# script exits 0: CI (nvcc, no GPU) runs it to keep the CUDA sources building. A skip
# for any other reason counts as a failure. Prints one line at the end:
#   test-cuda: N passed, N failed, N skipped
# Knobs: JOBS (make -j, default 2); CUDA_SMS (e.g. "90" to build for the H100 only, much
# faster than the default list of every architecture nvcc supports from sm_70 up).
set -uo pipefail
cd "$(dirname "$0")/.."
all=0
case "${1:-}" in
  --all) all=1;;
  "") ;;
  *) echo "usage: scripts/test-cuda.sh [--all]" >&2; exit 2;;
esac
make -j"${JOBS:-2}" CUDA=1 WERROR=1 cuda-tests || { echo "test-cuda: the CUDA build failed" >&2; exit 1; }
out=$(mktemp); trap 'rm -f "$out"' EXIT
./build-cuda/tests/test_cuda_paths >"$out" 2>&1; rc=$?
cat "$out"
p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
p=${p:-0}; f=${f:-0}; s=${s:-0}
if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "test-cuda: test_cuda_paths exited $rc"; fi
# a skip is only for a missing GPU
while IFS= read -r r; do
  if ! printf '%s\n' "$r" | grep -q 'no CUDA device'; then
    echo "FAIL test_cuda_paths: a skip that is not a missing GPU: $r"; f=$((f + 1))
  fi
done < <(sed -n 's/^\[  SKIP    \] //p' "$out")
echo "test-cuda: $p passed, $f failed, $s skipped"
[ "$f" -eq 0 ] || exit 1
if [ $all = 1 ]; then
  make CUDA=1 test
fi
