#!/usr/bin/env bash
# capture.sh — `kvq capture`: options and exit codes, the capture directory read back by
# numpy (an independent safetensors reader), the merge property through the CLI, and
# the errors that must leave nothing behind. Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/cap
mkdir -p "$T"

# Entries next to $1 whose name starts with its basename (the output and temporaries).
leftovers() { ls -a "$(dirname "$1")" | grep -cE "^$(basename "$1")(\.tmp\..*)?$" ; }

# ---- options that need no model ------------------------------------------------------
_cli_run "$KVQ" capture --help
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && grep -q -- '--merge A B' "$CLI_TMP/stdout"; then
  ok capture_help
else
  fail capture_help "exit $(cat "$CLI_TMP/rc")"
fi
expect_error capture_bad_dtype 2 "dtype must be f16, bf16 or f32" -- \
  "$KVQ" capture --model x --corpus uuid:1 --dtype f8 -o "$T/x"
expect_error capture_bad_queries 2 "queries" -- \
  "$KVQ" capture --model x --corpus uuid:1 --queries some -o "$T/x"
expect_error capture_bad_seq_len 2 "seq-len" -- \
  "$KVQ" capture --model x --corpus uuid:1 --seq-len 1 -o "$T/x"
expect_error capture_missing_model 1 "nothing-here" -- \
  "$KVQ" capture --model "$T/nothing-here" --corpus uuid:1 -o "$T/x"

if ! real_model; then
  for n in capture_stories capture_readback capture_log capture_exists capture_force \
           capture_unwritable capture_empty capture_context_warning capture_merge \
           capture_merge_mismatch capture_merge_exists; do
    skip "$n" "$no_model"
  done
  cli_done; exit
fi
run_cap() { "$KVQ" capture --model "$M" --threads 1 "$@"; }

# ---- a capture, read back with numpy ----------------------------------------------------
_cli_run run_cap --corpus uuid:2 --seq-len 32 --max-tokens 64 --dtype f32 --layers 0,2 \
  --queries 16 --seed 5 -q -o "$T/a"
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ ! -s "$CLI_TMP/stdout" ] && [ ! -s "$CLI_TMP/stderr" ] &&
   [ "$(ls "$T/a" | tr '\n' ' ')" = "capture.json layer_000.safetensors layer_002.safetensors " ]
then
  ok capture_stories
else
  fail capture_stories "exit $(cat "$CLI_TMP/rc")" "$(head -3 "$CLI_TMP/stderr")" "$(ls "$T/a")"
fi

if ! "$PYTHON" -c 'import numpy' 2>/dev/null; then
  skip capture_readback "numpy is not installed"
elif out=$("$PYTHON" - "$T/a" "$M" <<'EOF' 2>&1
import json, struct, sys
import gguf
import numpy as np
d = sys.argv[1]
# the expected shape and BOS rule, from the GGUF file read by the gguf package
g = gguf.GGUFReader(sys.argv[2])
f = lambda k, dflt=None: g.fields[k].contents() if k in g.fields else dflt
H = f("llama.attention.head_count"); KV = f("llama.attention.head_count_kv")
HD = f("llama.embedding_length") // H
BOS = f("tokenizer.ggml.add_bos_token", f("tokenizer.ggml.model") == "llama")
c = json.load(open(d + "/capture.json"))
assert c["format"] == "kvq-capture" and c["version"] == 2, c["format"]
assert c["model"]["architecture"] == "llama" and c["model"]["rope"]["layout"] == "interleaved"
assert c["model"]["n_heads"] == H and c["model"]["head_dim"] == HD
assert (c["dtype"], c["seq_len"], c["n_tokens"], c["n_sequences"]) == ("f32", 32, 64, 2), c
assert c["sequences"] == [[0, 32], [32, 32]] and c["layers"] == [0, 2]
assert c["queries"] == 16 and c["seed"] == 5 and c["has_values"] is True
assert c["corpus"]["spec"] == "uuid:2" and len(c["corpus"]["hash"]) == 16
DT = {"F32": np.float32, "F64": np.float64, "I32": np.int32}
for layer, name in zip(c["layers"], c["files"]):
    b = open(d + "/" + name, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    assert h["__metadata__"]["layer"] == str(layer)
    t = {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                          dtype=DT[v["dtype"]]).reshape(v["shape"])
         for k, v in h.items() if k != "__metadata__"}
    assert t["k"].shape == (64, KV, HD) and t["v"].shape == (64, KV, HD)
    assert t["q"].shape == (16, H, HD)
    rows = t["q_rows"]
    assert (np.diff(rows) > 0).all() and rows[0] >= 0 and rows[-1] < 64
    assert (t["pos"] == np.tile(np.arange(32), 2)).all() and (t["seq"] == np.repeat([0, 1], 32)).all()
    assert (t["tokens"][0] == f("tokenizer.ggml.bos_token_id")) == bool(BOS)
    assert (t["tokens"][32] == f("tokenizer.ggml.bos_token_id")) == bool(BOS)
    assert (t["q_moment_count"] == 64).all()
    s = t["q_moment_sum"]
    assert s.shape == (H, HD, HD) and (s == s.transpose(0, 2, 1)).all()
    assert (np.einsum("hii->hi", s) > 0).all()
EOF
); then
  ok capture_readback
else
  fail capture_readback "$(printf '%s' "$out" | tail -3)"
fi

# Without -q: what the run needs, progress, and where it wrote.
_cli_run run_cap --corpus uuid:1 --seq-len 16 --max-tokens 32 -o "$T/b"
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && grep -q 'MiB of memory' "$CLI_TMP/stderr" &&
   grep -q 'MiB of disk' "$CLI_TMP/stderr" && grep -q 'capture 32/32' "$CLI_TMP/stderr" &&
   grep -q "wrote $T/b" "$CLI_TMP/stderr"; then
  ok capture_log
else
  fail capture_log "$(head -5 "$CLI_TMP/stderr")"
fi

# ---- errors leave nothing behind --------------------------------------------------------
expect_error capture_exists 1 "already exists" -- \
  run_cap --corpus uuid:1 --seq-len 16 --max-tokens 32 -q -o "$T/b"
_cli_run run_cap --corpus uuid:1 --seq-len 16 --max-tokens 48 -q --force -o "$T/b"
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && grep -q '"n_tokens": 48' "$T/b/capture.json" &&
   [ "$(leftovers "$T/b")" = 1 ]; then
  ok capture_force
else
  fail capture_force "$(head -3 "$CLI_TMP/stderr")"
fi
echo x >"$T/file"
expect_error capture_unwritable 1 "file/out: cannot create" -- \
  run_cap --corpus uuid:1 --seq-len 16 -q -o "$T/file/out"
: >"$T/empty.ids"
expect_error capture_empty 1 "no text" -- run_cap --corpus "ids:$T/empty.ids" -q -o "$T/e"
[ "$(leftovers "$T/e")" = 0 ] || fail capture_empty_leftovers "$(ls "$T")"
_cli_run run_cap --corpus uuid:1 --seq-len $((MI_CTX + 952)) --max-tokens 24 -o "$T/w"
if [ "$(cat "$CLI_TMP/rc")" = 0 ] &&
   grep -q "warning: capture: sequences of $((MI_CTX + 952)) tokens exceed the model's context length $MI_CTX" \
     "$CLI_TMP/stderr"; then
  ok capture_context_warning
else
  fail capture_context_warning "$(head -3 "$CLI_TMP/stderr")"
fi

# ---- merge: capture(X) + capture(Y) == capture(X, Y) ------------------------------------
# X holds 2 * (seq_len - 1) ids, so it fills whole sequences and the concatenated corpus
# splits exactly like the parts; Y is one (partial) sequence, so even the float64 moment
# sums add up bit for bit and the layer files are byte-identical.
# (A model without BOS, e.g. SmolLM2: X holds 2 * seq_len ids.)
"$PYTHON" -c '
import struct, sys
nx = 2 * (16 - int(sys.argv[3]))
ids = [3 + (i * 97) % 500 for i in range(60)]
open(sys.argv[1], "wb").write(struct.pack("<%di" % nx, *ids[:nx]))
open(sys.argv[2], "wb").write(struct.pack("<9i", *ids[nx:nx + 9]))
' "$T/x.ids" "$T/y.ids" "$MI_ADD_BOS"
run_cap --corpus "ids:$T/x.ids" --seq-len 16 -q -o "$T/mx" &&
run_cap --corpus "ids:$T/y.ids" --seq-len 16 -q -o "$T/my" &&
run_cap --corpus "ids:$T/x.ids,ids:$T/y.ids" --seq-len 16 -q -o "$T/mxy"
_cli_run "$KVQ" capture --merge "$T/mx" "$T/my" -q -o "$T/merged"
same=1
for f in "$T"/mxy/layer_*.safetensors; do
  cmp -s "$f" "$T/merged/$(basename "$f")" || same=0
done
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ "$same" = 1 ] &&
   grep -q "\"sequences\": \\[\\[0, 16\\], \\[16, 16\\], \\[32, $((9 + MI_ADD_BOS))\\]\\]" "$T/merged/capture.json"; then
  ok capture_merge
else
  fail capture_merge "exit $(cat "$CLI_TMP/rc"), same files: $same" "$(head -3 "$CLI_TMP/stderr")"
fi
run_cap --corpus "ids:$T/y.ids" --seq-len 16 --dtype bf16 -q -o "$T/mybf"
expect_error capture_merge_mismatch 1 "dtype differs \(f16 vs bf16\)" -- \
  "$KVQ" capture --merge "$T/mx" "$T/mybf" -o "$T/merged2"
[ "$(leftovers "$T/merged2")" = 0 ] || fail capture_merge_mismatch_leftovers "$(ls "$T")"
expect_error capture_merge_exists 1 "already exists" -- \
  "$KVQ" capture --merge "$T/mx" "$T/my" -q -o "$T/merged"

cli_done
