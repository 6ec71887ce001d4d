#!/usr/bin/env bash
# Installs the Python packages bench/kmeans_peers.py compares against: faiss (CPU
# build) and scikit-learn. Safe to run again: only what is missing is installed.
set -euo pipefail
PYTHON=${PYTHON:-python3}
missing=()
"$PYTHON" -c "import numpy" 2>/dev/null || missing+=(numpy)
"$PYTHON" -c "import faiss" 2>/dev/null || missing+=(faiss-cpu)
"$PYTHON" -c "import sklearn" 2>/dev/null || missing+=(scikit-learn)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-bench-deps: pip install ${missing[*]}"
  "$PYTHON" -m pip install -q "${missing[@]}" 2>&1 | grep -v -i "running pip as the 'root'" || true
fi
"$PYTHON" -c "import faiss, sklearn; print('install-bench-deps: faiss', faiss.__version__, '/ scikit-learn', sklearn.__version__)"
