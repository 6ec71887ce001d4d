#!/usr/bin/env bash
# corrupt.sh — the corruption battery: a GGUF model, a safetensors file (moments), a
# capture directory's capture.json and one of its layer files, and a .kvq artifact,
# each truncated and with single bytes flipped at many points (tests/helpers/corrupt.py),
# read by the commands that take them. Every case must be refused (exit 1, one message
# naming the file) or accepted, never crash or hang. KVQ_CORRUPT_CASES (default 16 per
# file and command) and KVQ_CORRUPT_SEED set the size; `make fuzz` runs the long form.
# Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/corrupt
mkdir -p "$T"
N=${KVQ_CORRUPT_CASES:-16}
S=${KVQ_CORRUPT_SEED:-1}
# stories260K, else SmolLM2 (its capture of layers 0-1)
if ! real_model; then
  skip corrupt_battery "$no_model"; cli_done; exit
fi
echo "corrupt battery: $N cases per file and command, seed $S (KVQ_CORRUPT_SEED)"
battery() { "$PYTHON" tests/helpers/corrupt.py "$@" || cli_failures=$((cli_failures + 1)); }

# The inputs: a copy of the model, a small capture of it, its moments and an artifact.
cp "$M" "$T/m.gguf"
if ! "$KVQ" capture --model "$T/m.gguf" --corpus uuid:2 --seq-len 64 --max-tokens 256 \
       $([ "$IS_STORIES" = 1 ] || echo --layers 0-1) --threads 1 -q -o "$T/cap" 2>"$T/err" ||
   ! "$KVQ" moments --capture "$T/cap" -q -o "$T/mom.safetensors" 2>>"$T/err" ||
   ! "$KVQ" fit --capture "$T/cap" --moments "$T/mom.safetensors" --codebook 8 --iters 2 \
       --threads 1 -q -o "$T/a.kvq" 2>>"$T/err"; then
  fail corrupt_battery "capture, moments or fit failed:" "$(head -3 "$T/err")"; cli_done; exit
fi

battery corrupt_gguf_inspect "$T/m.gguf" "$N" "$S" -- "$KVQ" inspect "$T/m.gguf"
battery corrupt_gguf_run "$T/m.gguf" "$N" "$((S + 1))" -- \
  "$KVQ" run --model "$T/m.gguf" -n 2 --temp 0 --threads 1 -q
battery corrupt_safetensors_inspect "$T/mom.safetensors" "$N" "$((S + 2))" -- \
  "$KVQ" inspect "$T/mom.safetensors"
# The recorded checksums are XXH64 as the Python xxhash package computes it (an
# independent implementation): capture.json's per file, the moments file's of its data.
if "$PYTHON" -c 'import xxhash' 2>/dev/null; then
  if out=$("$PYTHON" - "$T/cap" "$T/mom.safetensors" <<'EOF' 2>&1
import json, os, struct, sys
import xxhash
cap, mom = sys.argv[1], sys.argv[2]
cj = json.load(open(os.path.join(cap, "capture.json")))
assert len(cj["checksums"]) == len(cj["files"])
for name, want in zip(cj["files"], cj["checksums"]):
    got = "xxh64:" + xxhash.xxh64(open(os.path.join(cap, name), "rb").read()).hexdigest()
    assert got == want, (name, got, want)
b = open(mom, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
meta = json.loads(b[8:8 + n])["__metadata__"]
got = "xxh64:" + xxhash.xxh64(b[8 + n:]).hexdigest()
assert meta["data.xxh64"] == got, (meta["data.xxh64"], got)
EOF
  ); then ok checksums_match_python_xxhash; else fail checksums_match_python_xxhash "$out"; fi
else
  skip checksums_match_python_xxhash "python module xxhash not installed (make deps installs it)"
fi
mom_data=$("$PYTHON" -c 'import struct, sys; print(8 + struct.unpack("<Q", open(sys.argv[1], "rb").read(8))[0])' "$T/mom.safetensors")
battery corrupt_safetensors_fit "$T/mom.safetensors" "$N" "$((S + 3))" --refuse-from "$mom_data" -- \
  "$KVQ" fit --capture "$T/cap" --moments "$T/mom.safetensors" --codebook 8 --iters 1 \
    --layers 1 --threads 1 -q --force -o "$T/f.kvq"
battery corrupt_capture_json_inspect "$T/cap/capture.json" "$N" "$((S + 4))" -- \
  "$KVQ" inspect "$T/cap"
battery corrupt_capture_json_moments "$T/cap/capture.json" "$N" "$((S + 5))" -- \
  "$KVQ" moments --capture "$T/cap" -q --force -o "$T/m2.safetensors"
# the layer files and the moments file carry checksums: every damage to what they cover
# is refused (a flip in tensor data included), never accepted silently
battery corrupt_capture_layer_fit "$T/cap/layer_000.safetensors" "$N" "$((S + 9))" \
  --refuse-from 0 -- \
  "$KVQ" fit --capture "$T/cap" --moments "$T/mom.safetensors" --codebook 8 --iters 1 \
    --threads 1 -q --force -o "$T/f2.kvq"
battery corrupt_capture_layer_moments "$T/cap/layer_001.safetensors" "$N" "$((S + 6))" \
  --refuse-from 0 -- \
  "$KVQ" moments --capture "$T/cap" -q --force -o "$T/m3.safetensors"
battery corrupt_artifact_inspect "$T/a.kvq" "$N" "$((S + 7))" -- "$KVQ" inspect "$T/a.kvq"
battery corrupt_artifact_run "$T/a.kvq" "$N" "$((S + 8))" -- \
  "$KVQ" run --model "$T/m.gguf" --artifact "$T/a.kvq" --budget 8 -n 2 --temp 0 --threads 1 -q
cli_done
