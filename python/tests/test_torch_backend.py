#!/usr/bin/env python3
"""test_torch_backend.py - kvq.torch_engine (the pure-torch back end) against the C engine
(kvq/engine.h through kvq.Engine), step by step (`make test-python`).

Artifacts of every codebook kind the C engine decodes are fitted by `kvq fit` from a
`kvq capture` of the tiny model (stories260K: 5 layers, 8 heads, 4 KV heads, head dim 8;
else its committed stand-in tests/data/tiny_spm.gguf):
vq, qavq, pq (4 groups), qapq (4 and 2 groups), vq-postrope, qavq fitted on some layers
only (the others attend every token), and qavq with 512 centroids (more than the
engine's scratch holds at first: the residual stage's reconstruction rule, then its
LUT rule once the scratch has grown). Both engines get the same seeded rows (a prompt,
then decode steps over every layer) and must select the same token indices at every
(step, layer, KV head), with attention outputs within rel 1e-5. The selection must be
a real one (fewer tokens than the candidates). Then, per device (cpu, and cuda when a
GPU is present; skipped otherwise, saying so): the same on that device; on torch's
meta device the whole step runs (shapes only: no value is read back to the host per
step). Refusals: an artifact recording positions other than (wrope, mean), a
softcap, sliding windows. Exit 0 pass, 77 skip (reason on the last line), else fail.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
BUILD = os.environ.get("KVQ_BUILD", os.path.join(ROOT, "build"))
os.environ.setdefault("KVQ_BUILD", BUILD)
KVQ = os.environ.get("KVQ", os.path.join(BUILD, "kvq"))
# the tiny model (KVQ_TEST_MODEL, as `make test` sets it), else its committed stand-in of the
# same shape (tests/data/tiny_spm.gguf: 4 layers, 2 KV heads, head dim 8), so this never skips
MODEL = os.environ.get("KVQ_TEST_MODEL", os.path.join(ROOT, "..", "shared", "models", "stories260K.gguf"))
if not os.path.exists(MODEL):
    MODEL = os.path.join(ROOT, "tests", "data", "tiny_spm.gguf")

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"needs torch ({e.name} not installed; make test-python installs it)")
    sys.exit(77)

import kvq  # noqa: E402
from kvq.torch_engine import TorchEngine  # noqa: E402

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def kvq_run(*args):
    r = subprocess.run([KVQ, *args], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"kvq {' '.join(args)}: {r.stderr.strip()}")


def artifacts(tmp):
    """The artifacts: name -> path."""
    cap, mom = os.path.join(tmp, "cap"), os.path.join(tmp, "mom.st")
    kvq_run("capture", "--model", MODEL, "--corpus", "uuid:16", "-o", cap, "--seq-len", "128",
            "--threads", "1", "-q")
    kvq_run("moments", "--capture", cap, "-o", mom, "-q")
    kinds = {"vq": [], "qavq": [], "pq": [], "qapq": [], "qapq-g2": ["--groups", "2"],
             "vq-postrope": [], "qavq-layers": ["--layers", "0,2"], "qavq-512": ["--codebook", "512"]}
    out = {}
    for name, extra in kinds.items():
        path = os.path.join(tmp, name + ".kvq")
        method = name.split("-g2")[0].split("-layers")[0].split("-512")[0]
        opts = ["--codebook", "16"] if "--codebook" not in extra else []
        kvq_run("fit", "--capture", cap, "--moments", mom, "-o", path, "--method", method, "--iters", "4",
                "--threads", "1", "-q", "--no-reference", "--no-checkpoint", *opts, *extra)
        out[name] = path
    return out


class Rows:
    """Seeded synthetic pre-RoPE rows: keys with a per-channel scale, queries larger."""

    def __init__(self, spec, seed):
        self.rs = np.random.RandomState(seed)
        self.spec = spec
        self.scale = self.rs.uniform(0.5, 2.0, size=(spec.n_kv_heads, spec.head_dim)).astype(np.float32)

    def kv(self, n):
        s = self.spec
        k = (self.rs.randn(n, s.n_kv_heads, s.head_dim) * self.scale).astype(np.float32)
        return k, self.rs.randn(n, s.n_kv_heads, s.head_dim).astype(np.float32)

    def q(self):
        return (2 * self.rs.randn(self.spec.n_heads, self.spec.head_dim)).astype(np.float32)


def compare(path, device="cpu", n0=240, steps=6, budget=0.06, seed=0):
    """(selections, mismatches, real selections, largest rel output error)."""
    art = kvq.Artifact(path)
    spec, layers = art.model, set(art.layers)
    rows = Rows(spec, seed)
    with kvq.Engine(path, spec) as eng:
        s1 = eng.sequence(budget=budget)
        s2 = TorchEngine(path, spec, device=device).sequence(budget=budget)
        k, v = rows.kv(n0)
        for l in range(spec.n_layers):
            s1.append(l, k, v)
            s2.append(l, torch.as_tensor(k, device=device), torch.as_tensor(v, device=device))
        n = bad = real = 0
        err = 0.0
        for _ in range(steps):
            for l in range(spec.n_layers):
                q = rows.q()
                k, v = rows.kv(1)
                o1, x1 = s1.decode(l, q, k[0], v[0])
                o2, x2 = s2.decode(l, torch.as_tensor(q, device=device), k[0], v[0])
                cand = s1.length(l) - 4 - 64
                for a, b in zip(x1, x2):
                    n += 1
                    bad += not np.array_equal(a, b.cpu().numpy())
                    # a real cut, or every candidate on a layer without codebooks
                    real += 0 < len(a) < cand if l in layers else len(a) == cand
                o2 = o2.cpu().numpy()
                err = max(err, float(np.abs(o2 - o1).max() / np.abs(o1).max()))
        s1.close()
    return n, bad, real, err


def test_kinds(arts):
    for name, path in arts.items():
        for budget in ((0.06, 9) if name in ("qavq", "pq") else (0.06,)):
            n, bad, real, err = compare(path, budget=budget, n0=200 if name == "qavq-512" else 240)
            check(bad == 0 and real == n and err <= 1e-5,
                  f"{name} budget {budget}: the torch back end selects the C engine's indices in "
                  f"{n - bad}/{n} selections ({real} as expected: cut below the candidates, or all "
                  f"of them on a layer without codebooks), outputs within rel "
                  f"{err:.2g} <= 1e-5")


def test_devices(arts):
    for dev in ("cpu", "cuda"):
        if dev == "cuda" and not torch.cuda.is_available():
            print("skip cuda: no GPU (torch.cuda.is_available() is False)")
            continue
        for name in ("qavq", "qapq", "vq-postrope"):
            n, bad, real, err = compare(arts[name], device=dev, steps=4)
            check(bad == 0 and real == n and err <= 1e-5,
                  f"{dev}: {name}: the same indices as the C engine in {n - bad}/{n} selections, "
                  f"outputs within rel {err:.2g}")
    # meta: the step runs with shapes only (no host read of a value per step)
    for name in ("qavq", "pq", "qavq-layers"):
        spec = kvq.Artifact(arts[name]).model
        H, d = spec.n_kv_heads, spec.head_dim
        try:
            s = TorchEngine(arts[name], spec, device="meta").sequence(budget=0.06)
            k = torch.empty(300, H, d, device="meta")
            for l in range(spec.n_layers):
                s.append(l, k, k)
            o, sel = s.decode(1, torch.empty(spec.n_heads, d, device="meta"), k[0], k[0])
            ok = o.device.type == "meta" and tuple(o.shape) == (spec.n_heads, d) and \
                [tuple(x.shape) for x in sel] == [(19 if name != "qavq-layers" else 301 - 68,)] * H
            check(ok, f"meta device: {name}: a decode step runs on shapes alone "
                      f"(out {tuple(o.shape)}, selections {[tuple(x.shape) for x in sel]})")
        except Exception as e:  # noqa: BLE001
            check(False, f"meta device: {name}: {type(e).__name__}: {e}")


def test_refusals(arts):
    for key, val, what in (("positions.mode", "rope", "positions"), ("positions.score", "bands", "positions"),
                           ("model.attention.softcap", "50", "softcap"),
                           ("model.attention.sliding_window", "128", "sliding")):
        a = kvq.Artifact(arts["qavq"])
        a.metadata[key] = val
        if key == "positions.score":
            a.metadata["positions.mode"] = "wrope"
        try:
            TorchEngine(a, a.model)
            check(False, f"an artifact with {key} {val} is refused")
        except kvq.UnsupportedError as e:
            check(what in str(e), f"an artifact with {key} {val} is refused ({e})")
    a = kvq.Artifact(arts["qavq"])
    a.metadata["positions.mode"], a.metadata["positions.score"] = "wrope", "mean"
    check(TorchEngine(a, a.model).method == "qavq", "an artifact recording (wrope, mean) is taken")


def main():
    if not os.path.exists(MODEL):
        print(f"needs the tiny model {MODEL} (set KVQ_TEST_MODEL)")
        sys.exit(77)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        arts = artifacts(tmp)
        test_kinds(arts)
        test_devices(arts)
        test_refusals(arts)
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("kvq.torch_engine: all checks passed")


if __name__ == "__main__":
    main()
