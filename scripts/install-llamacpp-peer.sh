#!/usr/bin/env bash
# Installs llama-cpp-python, the llama.cpp peer of bench/bench_model (through
# bench/llamacpp_peer.py), at a pinned version built from source on this machine, then
# checks that it runs: an unpinned `pip install llama-cpp-python` builds 0.3.36 today,
# whose eval segfaults on Intel Xeon with AVX-512 VNNI / BF16 / AMX; 0.3.16 works.
#
#   scripts/install-llamacpp-peer.sh [--check MODEL.gguf]
#
# Environment: PYTHON (default python3), LLAMA_CPP_PYTHON_VERSION (default 0.3.16),
# CMAKE_ARGS (default -DGGML_NATIVE=ON: kernels for the CPU it is built on). Needs cmake
# and a C/C++ compiler (Debian: apt-get install cmake g++) and pip reaching PyPI (the
# source and its Python dependencies: numpy, typing-extensions, diskcache, jinja2).
# Safe to run again: a matching installed version is kept. With --check, runs the peer
# on MODEL.gguf for a few tokens and fails if it gives no result.
#
# As a new user, in a virtual environment of its own, then the comparison with the same
# interpreter (checked so on 2026-12-07 in a fresh `python3 -m venv`: the build took an
# hour at nice 10 on the shared 2-core machine under a load average of 10-29; 8 minutes
# or more on 2 idle cores, by an earlier estimate not re-measured):
#
#   python3 -m venv ~/peer-venv
#   PYTHON=~/peer-venv/bin/python scripts/install-llamacpp-peer.sh \
#       --check .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
#   make bench && PYTHON=~/peer-venv/bin/python ./build/bench/bench_model
#
# bench_model runs bench/llamacpp_peer.py with $PYTHON (default python3); a peer that
# fails (not installed, a crash, an error record) makes bench_model exit 1 with the
# peer's message instead of printing kvq's figures alone.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.16}
here=$(cd "$(dirname "$0")/.." && pwd)
have=$("$PYTHON" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)
if [ "$have" != "$VERSION" ]; then
  for tool in cmake cc c++; do
    command -v "$tool" >/dev/null || { echo "install-llamacpp-peer: $tool not found" >&2; exit 1; }
  done
  echo "install-llamacpp-peer: building llama-cpp-python $VERSION (installed: ${have:-none}; compiles llama.cpp: many minutes on 2 cores)"
  log=$(mktemp)
  if ! CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON}" "$PYTHON" -m pip install -q \
      --no-cache-dir "llama-cpp-python==$VERSION" >"$log" 2>&1; then
    echo "install-llamacpp-peer: pip install llama-cpp-python==$VERSION failed with" \
         "$PYTHON; the end of its log ($log):" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  rm -f "$log"
fi
got=$("$PYTHON" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)
if [ "$got" != "$VERSION" ]; then
  echo "install-llamacpp-peer: llama_cpp is ${got:-not importable} with $PYTHON after" \
       "the install, not $VERSION" >&2
  exit 1
fi
echo "install-llamacpp-peer: llama-cpp-python $got"
if [ "${1:-}" = "--check" ]; then
  model=${2:?--check needs MODEL.gguf}
  ids=$(mktemp)
  trap 'rm -f "$ids"' EXIT
  seq 100 140 | tr '\n' ' ' >"$ids"
  "$PYTHON" "$here/bench/llamacpp_peer.py" "$model" "$ids" --threads 1 --prefill 16 \
    --decode 8 --rounds 1
fi
