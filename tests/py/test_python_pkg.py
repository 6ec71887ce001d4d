#!/usr/bin/env python3
"""test_python_pkg.py - the Python package python/kvq (ctypes over libkvq) with numpy only.

Expected values come from outside the package: the closed-form tensors of
examples/write_artifact, the independent reader scripts/kvq_read.py, `kvq inspect
--json`, and a numpy attention over the indices the engine says it selected (RoPE and
the wrope rule written here from docs/runtime.md). Exit 0 pass, 77 skip (reason on the
last line), else fail.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "helpers"))

try:
    import numpy as np
    import zstandard  # noqa: F401  (kvq_read needs it)
except ImportError as e:
    print(f"needs numpy and zstandard ({e.name} missing; make deps installs them)")
    sys.exit(77)

import kvq_read  # noqa: E402
import pyref  # noqa: E402

BUILD = os.environ.get("KVQ_BUILD", os.path.join(ROOT, "build"))
os.environ.setdefault("KVQ_BUILD", BUILD)
KVQ = os.environ.get("KVQ", os.path.join(BUILD, "kvq"))
MODEL = os.environ.get("KVQ_TEST_MODEL", os.path.join(ROOT, "..", "shared", "models", "stories260K.gguf"))

import kvq  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what)


def raises(cls, fn, what, status=None, text=None):
    try:
        fn()
    except cls as e:
        check(status is None or e.status == status, f"{what}: status {e.status}, expected {status}")
        check(text is None or re.search(text, str(e)), f"{what}: message {str(e)!r} lacks {text!r}")
        return
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: raised {type(e).__name__}: {e}, expected {cls.__name__}")
        return
    check(False, f"{what}: no exception, expected {cls.__name__}")


def test_version():
    h = open(os.path.join(ROOT, "include", "kvq", "common.h")).read()
    want = re.search(r'#define KVQ_VERSION_STRING "([^"]+)"', h).group(1)
    check(kvq.library_version() == want, f"library_version {kvq.library_version()} != {want}")
    check(kvq.__version__ == want, f"kvq.__version__ {kvq.__version__} != {want}")
    pp = open(os.path.join(ROOT, "python", "pyproject.toml")).read()
    check(re.search(r'^version = "([^"]+)"', pp, re.M).group(1) == want, "pyproject version")


def test_closed_form(tmp):
    """examples/write_artifact's tensors, known in closed form (as test_artifact_reader)."""
    path = os.path.join(tmp, "closed.kvq")
    subprocess.run([os.path.join(BUILD, "examples", "write_artifact"), path], check=True,
                   stdout=subprocess.DEVNULL)
    a = kvq.Artifact(path)
    r = np.arange(4, dtype=np.float32)
    for l in range(2):
        for h in range(2):
            c = (np.float32(l) + np.float32(h) / 2 + r[:, None] / 4 + r[None, :] / 8).astype(np.float32)
            check(np.array_equal(a.codebook(l, h), c), f"codebook {l} {h}")
            check(np.array_equal(a.codebook_z(l, h), 2 * c), f"Cz {l} {h}")
            L, Li = a.cholesky(l, h)
            check(np.array_equal(L, 2 * np.eye(4, dtype=np.float32)), f"L {l} {h}")
            check(np.array_equal(Li, 0.5 * np.eye(4, dtype=np.float32)), f"Linv {l} {h}")
    th = a.thresholds()
    check(np.array_equal(th["thresholds.leankv.alpha_h"], np.array([[1, 1.5], [2, 2.5]], np.float32)),
          "alpha_h")
    m = a.model
    check((m.n_layers, m.n_heads, m.n_kv_heads, m.head_dim, m.rope_interleaved) == (2, 4, 2, 4, True),
          f"model spec {m}")
    check(a.method == "qavq" and a.codebook_size == 4 and a.layers == [0, 1], "method keys")
    return path


def test_vs_reader_and_inspect(path):
    a = kvq.Artifact(path)
    ref = kvq_read.read_artifact(path)
    check(a.metadata == ref.metadata, "metadata equals kvq_read's")
    check(sorted(a.tensor_names()) == sorted(ref.tensors), "tensor names equal kvq_read's")
    for n, t in ref.tensors.items():
        check(np.array_equal(a.tensor(n), t) and a.tensor(n).dtype == t.dtype, f"tensor {n} equals kvq_read's")
    check(a.payload == ref.payload, "payload bytes equal kvq_read's")
    ins = json.loads(subprocess.run([KVQ, "inspect", "--json", path], check=True,
                                    capture_output=True, text=True).stdout)
    d = a.describe()
    for key in ("path", "format", "file_size", "version", "major", "minor", "payload_size", "valid",
                "model", "method", "provenance", "metadata", "tensors"):
        check(d.get(key) == ins.get(key), f"describe()[{key!r}] differs from kvq inspect --json: "
              f"{str(d.get(key))[:200]} vs {str(ins.get(key))[:200]}")


def test_bad_files(tmp, good):
    raises(kvq.errors.KvqIOError, lambda: kvq.Artifact(os.path.join(tmp, "absent.kvq")), "missing file",
           101, "absent.kvq")
    junk = os.path.join(tmp, "junk.kvq")
    open(junk, "wb").write(b"this is not an artifact at all")
    raises(kvq.FormatError, lambda: kvq.Artifact(junk), "junk file", 200, "junk.kvq")
    data = open(good, "rb").read()
    cut = os.path.join(tmp, "cut.kvq")
    open(cut, "wb").write(data[:len(data) // 2])
    raises(kvq.FormatError, lambda: kvq.Artifact(cut), "truncated file", 202, "cut.kvq")
    flip = os.path.join(tmp, "flip.kvq")
    b = bytearray(data)
    b[len(b) - 10] ^= 0x55
    open(flip, "wb").write(bytes(b))
    raises(kvq.KvqError, lambda: kvq.Artifact(flip), "damaged file", None, "flip.kvq")
    empty = os.path.join(tmp, "empty.kvq")
    open(empty, "wb").close()
    raises(kvq.FormatError, lambda: kvq.Artifact(empty), "empty file", 201)


def test_engine(tmp):
    cap, art = pyref.fitted_artifact(KVQ, MODEL, tmp)
    a = kvq.Artifact(art)
    spec = a.model
    check(a.fingerprint is not None and len(a.fingerprint) == 32, "fitted artifact has a fingerprint")
    check(a.codebook(0, 0).shape == (16, spec.head_dim), "codebook shape")
    ref = kvq_read.read_artifact(art)
    check(np.array_equal(a.cholesky(2, 1)[0], ref.tensors["layer.2.head.1.L"]), "L equals kvq_read's")

    # the model checks, as kvq_engine_open makes them
    check(a.check_model(spec) == "", "same weights: empty note")
    raises(kvq.MismatchError, lambda: a.check_model("0" * 32), "other fingerprint", 501, "0" * 32)
    check(a.check_model("0" * 32, accept_mismatch=True) != "", "accepted mismatch has a note")
    bad = kvq.ModelSpec(**{**spec.__dict__, "n_heads": spec.n_heads * 2})
    raises(kvq.MismatchError, lambda: kvq.Engine(art, bad), "other n_heads", 501, "n_heads")
    odd = kvq.ModelSpec(**{**spec.__dict__, "head_dim": 7})
    raises(kvq.InvalidArgumentError, lambda: kvq.Engine(art, odd), "odd head_dim", 500, "head_dim")
    raises(kvq.errors.KvqIOError, lambda: kvq.Engine(os.path.join(tmp, "none.kvq"), spec), "no artifact", 101)

    # a real sequence of the capture: 255 rows appended, the last one decoded
    import struct
    raw = open(os.path.join(cap, "layer_001.safetensors"), "rb").read()
    n = struct.unpack_from("<Q", raw)[0]
    head = json.loads(raw[8:8 + n])

    def t(name):
        e = head[name]
        lo, hi = e["data_offsets"]
        dt = {"F32": "<f4", "I32": "<i4"}[e["dtype"]]
        return np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype=dt).reshape(e["shape"])

    seq = t("seq")
    rows = np.flatnonzero(seq == 0)[:256]
    q, k, v = t("q")[rows], t("k")[rows], t("v")[rows]
    N = len(rows)
    check(N == 256, f"capture sequence of 256 rows, got {N}")
    w, b = a.wrope
    S, budget = 4, 12
    with kvq.Engine(art, spec) as eng:
        s = eng.sequence(budget=budget, cache_f16=False)
        raises(kvq.InvalidArgumentError, lambda: s.append(1, k[:3, :2], v[:3, :2]), "k of wrong shape", None, "shape")
        raises(kvq.InvalidArgumentError, lambda: s.append(spec.n_layers, k[:3], v[:3]), "layer out of range",
               None, "layer")
        for layer in range(spec.n_layers):  # only layer 1 is checked; every layer gets the rows
            s.append(layer, k[:N - 1], v[:N - 1])
        out, sel = s.decode(1, q[N - 1], k[N - 1], v[N - 1])
        check(s.length(1) == N, "length after decode")
        check(s.nbytes > 0, "sequence bytes")
    g = spec.n_heads // spec.n_kv_heads
    worst = 0.0
    for kh in range(spec.n_kv_heads):
        chosen = sel[kh]
        check(len(chosen) == budget, f"KV head {kh}: {len(chosen)} selected, budget {budget}")
        check(np.all(chosen >= S) and np.all(chosen < N - w) and np.all(np.diff(chosen) > 0),
              f"KV head {kh}: selection {chosen} outside the candidates [{S}, {N - w}) or unsorted")
        far = np.concatenate([np.arange(S), chosen])
        near = np.arange(N - w, N)
        for qh in range(kh * g, (kh + 1) * g):
            qq = q[N - 1, qh]
            lf = pyref.rope(qq, b, spec.rope_base, spec.rope_interleaved) @ k[far, kh].astype(np.float64).T
            ln = pyref.rope(qq, N - 1, spec.rope_base, spec.rope_interleaved) @ \
                np.stack([pyref.rope(k[j, kh], j, spec.rope_base, spec.rope_interleaved) for j in near]).T
            logit = np.concatenate([lf, ln]) / np.sqrt(spec.head_dim)
            p = np.exp(logit - logit.max())
            p /= p.sum()
            want = p @ v[np.concatenate([far, near]), kh].astype(np.float64)
            err = np.abs(out[qh] - want).max() / max(np.abs(want).max(), 1e-30)
            worst = max(worst, err)
    check(worst < 1e-5, f"engine output vs numpy attention over its selection: rel err {worst:.3g} >= 1e-5")


def test_capture_writer(tmp):
    """kvq.capture_dir writes capture.json version 2 that kvq's own reader takes: the
    model.attention of a gemma2-like config (windows on even layers, softcap, scale; the
    reader derives each layers[] entry from the fields and refuses a contradiction), the
    XXH64 checksums (the reader hashes each layer file; a flipped byte is refused)."""
    from types import SimpleNamespace

    from kvq.capture_dir import LayerAccumulator, write_capture
    from kvq.hf.model import attention
    rope = {"base": 10000.0, "layout": "half", "scaling": "none", "factor": 1.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_pos": 8192.0}
    cfg = SimpleNamespace(model_type="gemma2", sliding_window=16, query_pre_attn_scalar=8.0,
                          attn_logit_softcapping=50.0, layer_types=["sliding_attention", "full_attention"] * 2)
    att = attention(cfg, rope, 4, 8)
    check([e["window"] for e in att["layers"]] == [16, 0, 16, 0] and att["sliding_period"] == 2
          and att["scale"] == 1 / np.sqrt(8.0) and att["softcap"] == 50.0, f"gemma2 attention {att}")
    model = {"path": "tiny", "source": "hf", "name": "tiny", "architecture": "gemma2", "n_layers": 4, "dim": 32,
             "hidden_dim": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "vocab_size": 100,
             "context_length": 128, "norm_eps": 1e-6, "rope": rope, "attention": att}
    rng = np.random.RandomState(4)
    seqs = [rng.randint(0, 100, size=40), rng.randint(0, 100, size=25)]
    acc = {}
    for layer in range(4):
        acc[layer] = LayerAccumulator(4, 8, "f16")
        for sq in seqs:
            acc[layer].add_sequence(rng.randn(len(sq), 4, 8), rng.randn(len(sq), 2, 8), rng.randn(len(sq), 2, 8))
    cap = os.path.join(tmp, "pycap")
    corpus = {"spec": "ids:x", "seed": 0, "hash": "0" * 16, "n_documents": 2}
    write_capture(cap, model, corpus, 40, seqs, list(range(4)), acc, "f16", "kvq-python test")
    r = subprocess.run([KVQ, "inspect", "--json", cap], capture_output=True, text=True)
    check(r.returncode == 0, f"kvq inspect takes the Python capture ({r.stderr.strip()[-300:]})")
    j = json.load(open(os.path.join(cap, "capture.json")))
    check(j["version"] == 2 and len(j["checksums"]) == 4, "capture.json version 2 with 4 checksums")
    r = subprocess.run([KVQ, "moments", "--capture", cap, "-o", os.path.join(tmp, "pycap.mom"), "-q"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"kvq moments takes the Python capture ({r.stderr.strip()[-300:]})")
    f = os.path.join(cap, "layer_002.safetensors")
    raw = bytearray(open(f, "rb").read())
    raw[-3] ^= 0x10
    open(f, "wb").write(bytes(raw))
    r = subprocess.run([KVQ, "moments", "--capture", cap, "-o", os.path.join(tmp, "pycap2.mom"), "-q"],
                       capture_output=True, text=True)
    check(r.returncode != 0 and "checksum" in r.stderr, f"a flipped byte is refused by its checksum ({r.stderr.strip()[-200:]})")
    # a layers[] entry that contradicts the fields is refused by kvq's reader (the
    # derivation above is what the reader checks, not a copy of it)
    bad = json.loads(json.dumps(j))
    bad["model"]["attention"]["layers"][1]["window"] = 16
    cap2 = os.path.join(tmp, "pycap_bad")
    os.makedirs(cap2)
    json.dump(bad, open(os.path.join(cap2, "capture.json"), "w"))
    r = subprocess.run([KVQ, "inspect", "--json", cap2], capture_output=True, text=True)
    check(r.returncode != 0 and "layers[1]" in r.stderr, f"a contradicting layers[1] is refused ({r.stderr.strip()[-200:]})")


def main():
    test_version()
    with tempfile.TemporaryDirectory() as tmp:
        test_capture_writer(tmp)
        good = test_closed_form(tmp)
        test_vs_reader_and_inspect(good)
        test_bad_files(tmp, good)
        if not os.path.exists(MODEL):
            print(f"engine part: model {MODEL} not found")
            sys.exit(77 if not failures else 1)
        test_engine(tmp)
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("python package: all checks passed")


if __name__ == "__main__":
    main()
