#!/usr/bin/env bash
# fit.sh — `kvq fit` on the real tiny model: capture -> moments -> fit for each method,
# options and errors, identical bytes across thread counts, no checkpoint left behind,
# and the artifact read back by the independent Python reader (scripts/kvq_read.py),
# which checks the codebooks against the moments file. Run by tests/run-tests.sh.
. tests/helpers/clitest.sh

T=$CLI_TMP/fit
mkdir -p "$T"

expect_output_help() {
  _cli_run "$KVQ" fit --help
  if [ "$(cat "$CLI_TMP/rc")" = 0 ] && grep -q -- "--capture DIR" "$CLI_TMP/stdout" &&
     grep -q -- "--no-reference" "$CLI_TMP/stdout"; then ok fit_help; else fail fit_help; fi
}
expect_output_help
expect_error fit_missing_args 2 'required' -- "$KVQ" fit --capture x
expect_error fit_bad_method 2 "unknown method 'opq'" -- "$KVQ" fit --method opq
expect_error fit_bad_holdout 2 'holdout' -- "$KVQ" fit --holdout 1.5
expect_error fit_bad_codebook 2 'codebook' -- "$KVQ" fit --codebook 12x
expect_error fit_no_capture 1 'nowhere/capture.json' -- \
  "$KVQ" fit --capture "$T/nowhere" --moments "$T/m" -o "$T/x.kvq"

# stories260K, else SmolLM2 (its layers 0-4 only, for time); the shape from the file.
if ! real_model; then
  skip fit_stories260K "$no_model"; cli_done; exit
fi
export MI_KV_HEADS MI_HEAD_DIM
if ! "$KVQ" capture --model "$M" --corpus uuid:8 --seq-len 64 --max-tokens 4096 \
     --layers 0-4 --threads 1 -q -o "$T/cap" 2>"$T/err" ||
   ! "$KVQ" moments --capture "$T/cap" -o "$T/mom" -q 2>>"$T/err"; then
  fail fit_stories260K "capture or moments failed:" "$(head -3 "$T/err")"; cli_done; exit
fi

fit() { "$KVQ" fit --capture "$T/cap" --moments "$T/mom" --codebook 32 --iters 5 -q "$@"; }

for m in qavq qapq vq pq vq-postrope; do
  case $m in qa*) sel=0-4;; *) sel=1,2;; esac   # the baselines on two layers, for time
  _cli_run fit --method "$m" --threads 1 --layers "$sel" -o "$T/$m.kvq"
  if [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ -s "$T/$m.kvq" ] && [ ! -e "$T/$m.kvq.ckpt" ] &&
     [ ! -s "$CLI_TMP/stdout" ]; then
    ok "fit_$m"
  else
    fail "fit_$m" "exit $(cat "$CLI_TMP/rc")" "$(head -3 "$CLI_TMP/stderr")"
  fi
done

_cli_run fit --method qapq --threads 2 -o "$T/qapq2.kvq"
if [ "$(cat "$CLI_TMP/rc")" = 0 ] && cmp -s "$T/qapq.kvq" "$T/qapq2.kvq"; then
  ok fit_same_bytes_any_threads
else
  fail fit_same_bytes_any_threads "exit $(cat "$CLI_TMP/rc")" "$(head -3 "$CLI_TMP/stderr")"
fi

expect_error fit_exists 1 "qavq.kvq: already exists" -- fit -o "$T/qavq.kvq"
expect_error fit_groups 1 "3 groups do not divide head dim $MI_HEAD_DIM" -- fit --groups 3 -o "$T/g.kvq"
expect_error fit_codebook_too_large 1 'codebook size 65536 is larger than the [0-9]+ training keys' -- \
  "$KVQ" fit --capture "$T/cap" --moments "$T/mom" --codebook 65536 -q -o "$T/k.kvq"
expect_error fit_layer_missing 1 'layer 9 is not in' -- fit --layers 9 -o "$T/l.kvq"

# --force, --layers, --no-reference, --holdout 0 together.
_cli_run fit --method qavq --threads 1 --layers 1,3 --no-reference --holdout 0 --force -o "$T/qavq.kvq"
[ "$(cat "$CLI_TMP/rc")" = 0 ] && ok fit_force_layers || fail fit_force_layers "$(head -3 "$CLI_TMP/stderr")"

_cli_run "$KVQ" inspect "$T/qapq.kvq"
[ "$(cat "$CLI_TMP/rc")" = 0 ] && ok fit_inspect || fail fit_inspect "$(head -3 "$CLI_TMP/stderr")"

if ! "$PYTHON" -c 'import numpy, zstandard' 2>/dev/null; then
  skip fit_python_reader "numpy or zstandard is not installed"; cli_done; exit
fi
out=$("$PYTHON" - "$T" <<'EOF' 2>&1
import json, os, struct, sys
import numpy as np
sys.path.insert(0, "scripts")
KV, HD = (int(os.environ[k]) for k in ("MI_KV_HEADS", "MI_HEAD_DIM"))
G = 4  # the default groups of pq and qapq
from kvq_read import read_artifact

T = sys.argv[1]
b = open(T + "/mom", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n]); hdr.pop("__metadata__", None)
mom = {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                        dtype={"F64": "<f8", "F32": "<f4"}[v["dtype"]]).reshape(v["shape"])
       for k, v in hdr.items()}

a = read_artifact(T + "/qavq.kvq")           # --layers 1,3, no reference, no holdout
m = a.metadata
assert m["method"] == "qavq" and m["fit.method"] == "qavq" and m["layers"] == "1,3", m
assert m["fit.reference"] == "none" and "diag.fit.score_mse" not in m
assert "layer.0.head.0.Cz" not in a.tensors and "layer.3.head.%d.Cz" % (KV - 1) in a.tensors

a = read_artifact(T + "/qapq.kvq")
m, t = a.metadata, a.tensors
assert m["method"] == "qavq" and m["groups"] == str(G) and m["codebook_size"] == "32", m
assert m["fit.method"] == "qapq" and m["fit.reference"] == "pq" and m["layers"] == "0-4"
assert m["model.n_kv_heads"] == str(KV) and m["model.rope.layout"] == "interleaved"
assert m["provenance.backend"] == "cpu" and m["wrope.b"] == "2048"
for layer in range(5):
    for h in range(KV):
        p = "layer.%d.head.%d." % (layer, h)
        L, Li = t[p + "L"], t[p + "Linv"]
        assert np.array_equal(L, mom["layer.%d.L_f32" % layer][h]), p
        assert np.array_equal(Li, mom["layer.%d.Linv_f32" % layer][h]), p
        for g in range(G):
            assert t[p + "group.%d.Cz" % g].shape == (32, HD // G)
        sizes = t["diag." + p + "cluster_size"]
        assert sizes.shape == (G, 32) and (sizes.sum(1) == int(m["fit.n_train"])).all()
        assert t["diag." + p + "score_mse"] > 0
mse, ref = float(m["diag.fit.score_mse"]), float(m["diag.fit.score_mse_ref"])
assert mse < ref, (mse, ref)
assert t["diag.fit.score_mse"].shape == (5, KV)

a = read_artifact(T + "/vq.kvq")
c = a.tensors["layer.2.head.1.codebook"]
assert c.shape == (32, HD) and a.metadata["method"] == "vq"

print("python reader agrees: qapq score MSE %.4g vs pq %.4g" % (mse, ref))
EOF
); rc=$?
if [ $rc -eq 0 ]; then ok "fit_python_reader ($out)"; else fail fit_python_reader "$out"; fi

# The key-space codebook of qavq is Cz L^-1.
_cli_run fit --method qavq --threads 1 --layers 2 -o "$T/qavq2.kvq"
out=$("$PYTHON" - "$T/qavq2.kvq" <<'EOF' 2>&1
import os, sys
import numpy as np
sys.path.insert(0, "scripts")
from kvq_read import read_artifact
t = read_artifact(sys.argv[1]).tensors
for h in range(int(os.environ["MI_KV_HEADS"])):
    p = "layer.2.head.%d." % h
    want = t[p + "Cz"].astype(np.float64) @ t[p + "Linv"].astype(np.float64)
    got = t[p + "codebook"]
    assert np.abs(got - want).max() <= 1e-6 * (1 + np.abs(want).max()), p
EOF
); rc=$?
if [ $rc -eq 0 ]; then ok fit_codebook_is_Cz_Linv; else fail fit_codebook_is_Cz_Linv "$out"; fi

# --device cuda: on a machine without a usable GPU, one warning and the CPU's bytes.
_cli_run fit --method qavq --threads 1 --layers 2 --device cuda -o "$T/qavq_cuda.kvq"
if "$KVQ" version | grep -q '^cuda: available'; then
  [ "$(cat "$CLI_TMP/rc")" = 0 ] && ok fit_device_cuda || fail fit_device_cuda "$(head -3 "$CLI_TMP/stderr")"
elif [ "$(cat "$CLI_TMP/rc")" = 0 ] && [ "$(grep -c 'warning:.*CUDA' "$CLI_TMP/stderr")" = 1 ] &&
     cmp -s "$T/qavq2.kvq" "$T/qavq_cuda.kvq"; then
  ok fit_device_cuda_falls_back
else
  fail fit_device_cuda_falls_back "exit $(cat "$CLI_TMP/rc")" "$(head -3 "$CLI_TMP/stderr")"
fi

cli_done
