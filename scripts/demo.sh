#!/usr/bin/env bash
# make demo: runs kvq on the bundled default model and says where the outputs are.
set -euo pipefail
BUILD=${BUILD:-build}
KVQ="$BUILD/kvq"
MODEL=${KVQ_TEST_MODEL:-../shared/models/stories260K.gguf}
OUT=demo-out
mkdir -p "$OUT"
if [ ! -f "$MODEL" ]; then
  echo "demo: $MODEL not found (set KVQ_TEST_MODEL to a GGUF or HF model)" >&2
  exit 1
fi
echo "== kvq inspect $MODEL"
"$KVQ" inspect "$MODEL" | head -40
