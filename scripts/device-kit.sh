#!/usr/bin/env bash
# device-kit.sh — run HERE (a development machine with nvcc, no GPU needed) before a GPU
# window: builds kvq for the H100/H200 (CUDA=1, sm_90 only) and collects into one
# git-ignored folder, .device-kit/, everything a bare GPU machine (CUDA 13, nvcc, PyTorch,
# Triton; no OpenBLAS, LAPACKE, zstd, cJSON, cmocka, no package registry) lacks to run
# scripts/device-run.sh there:
#
#   .device-kit/bin/      kvq, test_cuda_paths, the CPU suite's test binaries with device
#                         branches (test_kmeans, test_moments, test_runtime), bench_kmeans,
#                         bench_lloyd_batched, libkvq.so (debug info stripped; the GPU code kept)
#   .device-kit/lib.tar.xz  lib/: every shared library those binaries load that is neither
#                         glibc nor the CUDA toolkit (found with ldd, copied under its
#                         soname), packed: 52 MiB of libraries (OpenBLAS alone is 36) are
#                         9 MiB in xz; device-run.sh unpacks it into /tmp there
#   .device-kit/whl/      Python wheels the device run needs and the machine lacks
#                         (flash-kmeans, zstandard) when pip can fetch them here
#   .device-kit/models/   the tiny real model the CLI device cases run (stories260K.gguf)
#   .device-kit/MANIFEST  what was built, with which compiler and C library, the newest
#                         GLIBC_x.y any file needs, the size
#
# The machine's C library must be at least what each carried file needs (MANIFEST:
# glibc_per_file): 2.34 for kvq's binaries and the Debian 12 libraries, 2.35 / 2.36 for
# libgcc_s / libstdc++, which device-run.sh replaces by the machine's own copies where its
# glibc is older (the binaries need only GLIBCXX_3.4.21). device-run.sh checks this before
# anything else and fails loudly below 2.34. Binaries, not a rebuild there: building on the
# GPU machine would link the same Debian libraries (glibc >= 2.34 again), so it would add
# no reach to an older C library, and it would cost minutes of the window.
#
#   scripts/device-kit.sh            build + collect; prints the size (limit 60 MiB)
#   JOBS=2 (make -j), KIT=.device-kit, BUILD=build-kit (kept between runs: sm_90 only,
#   MPI off, warnings as errors), NOWHEELS=1 (skip pip), NOBUILD=1 (collect only)
#
# The device command and its carry list are in docs/cuda.md.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${KIT:-.device-kit}
BUILD=${BUILD:-build-kit}
JOBS=${JOBS:-2}
SMS=90
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
LIMIT_MIB=60

echo "== device-kit: this machine"
echo "glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version | head -1)"
echo "cc: $(${CC:-cc} --version | head -1)"
echo "nvcc: $("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\).*/\1 (\2)/p')"
echo "arch: $(uname -m); target GPUs: sm_$SMS (H100, H200), SASS + PTX, CUDA_SMS=$SMS"
[ "$(uname -m)" = x86_64 ] || { echo "device-kit: the GPU machine is x86-64; build the kit on one" >&2; exit 1; }

# libkvq.so: the Python package's library (kvq.Engine, kvq.Artifact) for the torch back
# end's check on the GPU (device-run.sh, python/tests/test_torch_backend.py)
BINS=${KIT_BINS:-kvq tests/test_cuda_paths tests/test_kmeans tests/test_moments tests/test_runtime
      bench/bench_kmeans bench/bench_lloyd_batched libkvq.so}
if [ "${NOBUILD:-0}" != 1 ]; then
  # make does not track flags: a build folder made with other CUDA_SMS starts over
  if [ -f "$BUILD/.kit-sms" ] && [ "$(cat "$BUILD/.kit-sms")" != "$SMS" ]; then rm -rf "$BUILD"; fi
  mkdir -p "$BUILD" && echo "$SMS" >"$BUILD/.kit-sms"
  echo "== device-kit: make -j$JOBS CUDA=1 CUDA_SMS=$SMS MPI=0 WERROR=1 BUILD=$BUILD BENCH_MARCH=-march=x86-64-v3"
  # the benchmarks are rebuilt: -march=native ones from another build would not do
  rm -f "$BUILD"/bench/*
  make -j"$JOBS" CUDA=1 CUDA_SMS="$SMS" MPI=0 WERROR=1 BUILD="$BUILD" BENCH_MARCH=-march=x86-64-v3 \
    $(for b in $BINS; do printf '%s/%s ' "$BUILD" "$b"; done)
fi

rm -rf "$KIT"
LIBDIR=$BUILD/kit-lib   # the libraries before packing (lib.tar.xz holds lib/)
rm -rf "$LIBDIR"
mkdir -p "$KIT/bin" "$LIBDIR/lib" "$KIT/whl" "$KIT/models"
for b in $BINS; do
  [ -x "$BUILD/$b" ] || { echo "device-kit: $BUILD/$b was not built" >&2; exit 1; }
  cp "$BUILD/$b" "$KIT/bin/"
  strip --strip-debug "$KIT/bin/$(basename "$b")"
done

# Libraries: what ldd resolves outside glibc and the CUDA toolkit (the machine has both).
# SYSTEM_RE is the list the kit test (scripts/test-device-kit.sh) allows outside the kit.
SYSTEM_RE='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libcusolver\.so|libcusparse\.so|libnvJitLink\.so|libcuda\.so)'
for f in "$KIT"/bin/*; do
  ldd "$f" | awk '/=>/ { print $1, $3 }' | while read -r soname path; do
    if printf '%s\n' "$soname" | grep -Eq "$SYSTEM_RE"; then continue; fi
    [ -f "$path" ] || { echo "device-kit: $f needs $soname, not found here" >&2; exit 1; }
    [ -f "$LIBDIR/lib/$soname" ] || cp -L "$path" "$LIBDIR/lib/$soname"
  done
done
# Fortran runtimes and friends are dlopen'ed by nothing here, but check the copies' own
# dependencies too (ldd above is already transitive; this catches a library we copied
# whose dependency resolved through an rpath of its own)
for f in "$LIBDIR"/lib/*; do
  ldd "$f" | awk '/=>/ { print $1, $3 }' | while read -r soname path; do
    if printf '%s\n' "$soname" | grep -Eq "$SYSTEM_RE"; then continue; fi
    [ -f "$LIBDIR/lib/$soname" ] || cp -L "$path" "$LIBDIR/lib/$soname"
  done
done

# Python: flash-kmeans (pure Python, Triton kernels; its torch, triton, numpy and tqdm are
# on the machine) for the peers' benchmark, zstandard for the CLI tests' artifact reader.
# faiss-gpu is not carried: faiss-gpu-cu12 (48 MB) needs CUDA 12's cuBLAS and runtime
# wheels (hundreds of MB; the machine has CUDA 13), and PyPI has no faiss-gpu build for
# CUDA 13 and Python 3.12 (faiss-gpu-cu13-cuvs: no matching distribution).
WHEELS="flash-kmeans==0.3.1 zstandard==0.25.0"
if [ "${NOWHEELS:-0}" != 1 ]; then
  for w in $WHEELS; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform any -d "$KIT/whl" "$w" >/dev/null 2>&1 ||
      echo "device-kit: warning: pip could not fetch $w; device-run.sh will report it missing"
  done
fi

# the model: KVQ_TEST_MODEL, or shared/ beside this checkout or beside the main checkout
model=${KVQ_TEST_MODEL:-../shared/models/stories260K.gguf}
common=$(git rev-parse --git-common-dir 2>/dev/null || true)
for m in "$model" ${common:+"$common/../../shared/models/stories260K.gguf"}; do
  if [ -f "$m" ]; then model=$m; break; fi
done
if [ -f "$model" ]; then cp "$model" "$KIT/models/stories260K.gguf"
else echo "device-kit: warning: $model not found; the CLI device cases will report it missing"; fi

# The newest symbol version of the C library any carried file needs.
glibc_of() { objdump -T "$@" 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1; }
need_bin=$(glibc_of "$KIT"/bin/*)
need_lib=$(glibc_of "$LIBDIR"/lib/*)
echo "== device-kit: packing $(du -sk "$LIBDIR/lib" | cut -f1) KiB of libraries (xz)"
# (xz takes a minute or two on 2 cores: the same libraries reuse the last packing)
sum=$(cd "$LIBDIR" && find lib -type f | sort | xargs sha256sum | sha256sum | cut -c1-16)
if [ -f "$BUILD/kit-lib-$sum.tar.xz" ]; then
  cp "$BUILD/kit-lib-$sum.tar.xz" "$KIT/lib.tar.xz"
else
  rm -f "$BUILD"/kit-lib-*.tar.xz
  tar -C "$LIBDIR" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - lib |
    xz -T"$JOBS" -6 >"$BUILD/kit-lib-$sum.tar.xz"
  cp "$BUILD/kit-lib-$sum.tar.xz" "$KIT/lib.tar.xz"
fi
need=$(printf '%s\n%s\n' "$need_bin" "$need_lib" | sort -V | tail -1)
size_k=$(du -sk "$KIT" | cut -f1)
{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo '+changes')"
  echo "build_glibc: $(getconf GNU_LIBC_VERSION | sed 's/glibc //')"
  echo "build_cc: $(${CC:-cc} --version | head -1)"
  echo "build_nvcc: $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')"
  echo "cuda_sms: $SMS"
  echo "glibc_needed: $need"
  echo "glibc_needed_bin: $need_bin"
  echo "glibc_needed_lib: $need_lib"
  echo "glibc_per_file: $(for f in "$KIT"/bin/* "$LIBDIR"/lib/*; do printf '%s=%s ' "$(basename "$f")" "$(glibc_of "$f")"; done)"
  echo "size_kib: $size_k"
  echo "bin: $(cd "$KIT/bin" && ls | tr '\n' ' ')"
  echo "lib: $(cd "$LIBDIR/lib" && ls | tr '\n' ' ')"
  echo "whl: $(cd "$KIT/whl" && ls | tr '\n' ' ')"
  echo "models: $(cd "$KIT/models" && ls | tr '\n' ' ')"
} >"$KIT/MANIFEST"
cat "$KIT/MANIFEST"
echo "== device-kit: contents (KiB)"
du -sk "$KIT"/* | sort -k2
size_m=$(awk -v k="$size_k" 'BEGIN { printf "%.1f", k / 1024 }')
echo "device-kit: $KIT is $size_m MiB (limit $LIMIT_MIB MiB; the whole tree travels with it, 64 MiB)"
if [ "$size_k" -gt $((LIMIT_MIB * 1024)) ]; then
  echo "device-kit: the kit is over $LIMIT_MIB MiB" >&2; exit 1
fi
