#!/usr/bin/env bash
# kvq moments: options, exit codes, the per-layer summary, and the output read back by
# numpy (a second, independent safetensors reader). The capture directory is written
# here with numpy, following docs/capture.md.
set -u
KVQ=${KVQ:-build/kvq}
PYTHON=${PYTHON:-python3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok moments: $1"; }
fail() { echo "FAIL moments: $1"; }
check() { if eval "$2"; then ok "$1"; else fail "$1"; fi; }

if ! "$PYTHON" -c 'import numpy' 2>/dev/null; then
  echo "skip moments: numpy is not installed"; exit 0
fi

"$PYTHON" - "$tmp/cap" <<'EOF' || { fail "make capture"; exit 1; }
import json, os, struct, sys
import numpy as np

def write_st(path, tensors, meta):
    header, off, blobs = {}, 0, []
    for name, (dtype, arr) in tensors.items():
        b = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b); blobs.append(b)
    header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h)
        for b in blobs: f.write(b)

d = sys.argv[1]; os.makedirs(d)
n, nh, nkv, hd = 32, 4, 2, 8
rng = np.random.default_rng(0)
files = []
for layer in (0, 1):
    q = (rng.standard_normal((n, nh, hd)) * (0.5 + np.arange(hd))).astype(np.float16)
    qd = q.astype(np.float64)
    s = np.einsum("nga,ngb->gab", qd, qd)
    name = "layer_%03d.safetensors" % layer
    write_st(os.path.join(d, name), {
        "q": ("F16", q),
        "q_rows": ("I32", np.arange(n, dtype=np.int32)),
        "pos": ("I32", (np.arange(n) % 16).astype(np.int32)),
        "q_moment_sum": ("F64", s),
        "q_moment_count": ("F64", np.full(nh, float(n))),
    }, {"layer": str(layer), "format": "kvq-capture", "version": "1"})
    files.append(name)
cap = {"format": "kvq-capture", "version": 1, "tool": "test",
       "model": {"path": "x", "source": "gguf", "architecture": "llama", "n_layers": 2,
                 "dim": 32, "hidden_dim": 64, "n_heads": nh, "n_kv_heads": nkv,
                 "head_dim": hd, "vocab_size": 512, "context_length": 2048, "norm_eps": 1e-5,
                 "rope": {"base": 10000.0, "layout": "interleaved", "scaling": "none",
                          "factor": 1.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_pos": 8192.0}},
       "corpus": {"spec": "test", "seed": 0, "hash": "0123456789abcdef", "n_documents": 2},
       "dtype": "f16", "seq_len": 16, "n_tokens": n, "n_sequences": 2,
       "sequences": [[0, 16], [16, 16]], "layers": [0, 1], "files": files,
       "queries": "all", "has_values": False}
json.dump(cap, open(os.path.join(d, "capture.json"), "w"), indent=1)
EOF

"$KVQ" moments --help >"$tmp/help" 2>&1; rc=$?
check "--help" '[ $rc -eq 0 ] && grep -q -- "--capture DIR" "$tmp/help" && grep -q -- "--positions" "$tmp/help"'

"$KVQ" moments >"$tmp/o" 2>&1; rc=$?
check "missing arguments exit 2" '[ $rc -eq 2 ] && grep -q "required" "$tmp/o"'

"$KVQ" moments --capture "$tmp/cap" -o "$tmp/m" --positions sideways >"$tmp/o" 2>&1; rc=$?
check "bad --positions exit 2" '[ $rc -eq 2 ] && grep -q "sideways" "$tmp/o" && [ ! -e "$tmp/m" ]'

"$KVQ" moments --capture "$tmp/cap" -o "$tmp/m" --wrope-b 12x >"$tmp/o" 2>&1; rc=$?
check "bad --wrope-b exit 2" '[ $rc -eq 2 ] && grep -q "12x" "$tmp/o"'

"$KVQ" moments --capture "$tmp/nowhere" -o "$tmp/m" >"$tmp/o" 2>&1; rc=$?
check "missing capture exit 1" '[ $rc -eq 1 ] && grep -q "nowhere/capture.json" "$tmp/o"'

"$KVQ" moments --capture "$tmp/cap" -o "$tmp/m" >"$tmp/o" 2>&1; rc=$?
check "run" '[ $rc -eq 0 ] && [ -s "$tmp/m" ]'
check "per-layer summary" 'grep -q "^kvq: layer 0: 2 KV heads, 64 queries each, cond" "$tmp/o" && grep -q "^kvq: layer 1:" "$tmp/o" && grep -q "0 regularized" "$tmp/o"'

"$KVQ" moments --capture "$tmp/cap" -o "$tmp/m" >"$tmp/o" 2>&1; rc=$?
check "no overwrite without --force" '[ $rc -eq 1 ] && grep -q "$tmp/m" "$tmp/o"'

cp "$tmp/m" "$tmp/m.first"
"$KVQ" moments --capture "$tmp/cap" -o "$tmp/m" --force --device cuda -q >"$tmp/o" 2>&1; rc=$?
if "$KVQ" version | grep -q "^cuda: available"; then
  check "--device cuda" '[ $rc -eq 0 ]'
else
  check "--device cuda falls back with one warning" '[ $rc -eq 0 ] && [ "$(grep -c "warning:.*cuda" "$tmp/o")" -eq 1 ] && cmp -s "$tmp/m" "$tmp/m.first"'
fi

"$KVQ" moments --capture "$tmp/cap" -o "$tmp/r" --positions rope -q >"$tmp/o" 2>&1; rc=$?
check "--positions rope" '[ $rc -eq 0 ] && [ -s "$tmp/r" ] && ! cmp -s "$tmp/r" "$tmp/m"'

# numpy reads the file and checks the math against its own computation.
"$PYTHON" - "$tmp/m" "$tmp/r" "$tmp/cap" >"$tmp/o" 2>&1 <<'EOF'; rc=$?
import json, struct, sys
import numpy as np

def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); meta = h.pop("__metadata__", {})
    dt = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I32": np.int32}
    out = {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                            dtype=dt[v["dtype"]]).reshape(v["shape"]) for k, v in h.items()}
    return out, meta

def rope_matrix(p, d, base=10000.0):   # interleaved pairs (2m, 2m+1), x R_p
    R = np.eye(d)
    for m in range(d // 2):
        a = p * base ** (-2.0 * m / d)
        c, s = np.cos(a), np.sin(a)
        R[2*m:2*m+2, 2*m:2*m+2] = [[c, s], [-s, c]]
    return R

m, meta = read_st(sys.argv[1])
r, rmeta = read_st(sys.argv[2])
assert meta["format"] == "kvq-moments" and meta["positions"] == "wrope", meta
assert rmeta["positions"] == "rope"
assert meta["wrope_b"] == "2048" and meta["model.n_kv_heads"] == "2", meta
assert meta["corpus.hash"] == "0123456789abcdef"
for layer in (0, 1):
    cap, _ = read_st("%s/layer_%03d.safetensors" % (sys.argv[3], layer))
    q = cap["q"].astype(np.float64)                       # [n, 4, 8]
    Rb = rope_matrix(2048, 8)
    qr = np.stack([q[i] @ rope_matrix(i % 16, 8) for i in range(q.shape[0])])
    for h in range(2):
        g = q[:, 2*h:2*h+2].reshape(-1, 8) @ Rb             # GQA group of KV head h
        want = g.T @ g / g.shape[0]
        H = m["layer.%d.H" % layer][h]; L = m["layer.%d.L" % layer][h]
        Li = m["layer.%d.Linv" % layer][h]
        assert np.abs(H - want).max() < 1e-10 * np.abs(want).max(), (layer, h)
        assert np.abs(L @ L.T - H).max() < 1e-10 * np.abs(H).max()
        assert np.abs(L @ Li - np.eye(8)).max() < 1e-10
        assert np.allclose(np.triu(L, 1), 0)
        ev = np.linalg.eigvalsh(H)
        assert abs(m["layer.%d.eig_min" % layer][h] - ev[0]) < 1e-10 * ev[-1]
        assert m["layer.%d.count" % layer][h] == g.shape[0]
        gr = qr[:, 2*h:2*h+2].reshape(-1, 8)
        assert np.abs(r["layer.%d.H" % layer][h] - gr.T @ gr / gr.shape[0]).max() < 1e-10 * ev[-1]
print("numpy agrees")
EOF
check "numpy reads the file and agrees" '[ $rc -eq 0 ] || { cat "$tmp/o"; false; }'
