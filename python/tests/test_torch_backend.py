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
step). Position modes and scoring queries (wrope | rope x rb | mean | bands), which
kvq/engine.h does not take as parameters: against the C runtime (kvq/runtime.h) in a
helper compiled here, the same indices. Refusals: an unknown position mode, a softcap,
sliding windows. Exit 0 pass, 77 skip (reason on the last line), else fail.
"""
import os
import shutil
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
import kvq.hf  # noqa: E402
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


# The C runtime's selections under a position mode and scoring query (kvq/runtime.h, the
# unstable tier: kvq/engine.h takes the engine's defaults), compiled by the test.
HELPER_C = r"""/* The C runtime's selections (kvq/runtime.h) under the given position mode and scoring
 * query: helper ARTIFACT POSITIONS SCORE BUDGET ROWS. ROWS: int32 n0, steps; f32 prompt
 * k, v [n0, H, d]; per step and layer q [nh, d], k, v [H, d]. Prints per (step, layer,
 * head) the selection, then per (step, layer) the output. */
#define KVQ_UNSTABLE_API
#include <stdio.h>
#include <stdlib.h>
#include "kvq/artifact.h"
#include "kvq/model_id.h"
#include "kvq/runtime.h"

static int die(const char *what, const kvq_err *e) { fprintf(stderr, "%s: %s\n", what, e->msg); return 1; }

int main(int argc, char **argv)
{
    kvq_err e = {0};
    kvq_artifact *a = NULL;
    kvq_model_id id;
    kvq_codebook_set *set = NULL;
    kvq_retrieval *r = NULL;
    if (argc != 6)
        return 2;
    if (kvq_artifact_open(argv[1], &a, &e) ||
        kvq_model_id_from_meta(kvq_artifact_payload(a), KVQ_META_MODEL_PREFIX, argv[1], &id, &e) ||
        kvq_codebook_set_open(argv[1], &id, "helper", &set, &e))
        return die("open", &e);
    kvq_model_config cfg = kvq_model_config_from_id(&id);
    kvq_retrieval_params p = kvq_retrieval_params_default();
    if (kvq_positions_parse(argv[2], &p.positions) || kvq_score_pos_parse(argv[3], &p.score_pos))
        return 2;
    p.budget.fraction = atof(argv[4]);
    if (kvq_retrieval_create(&cfg, set, &p, &r, &e))
        return die("create", &e);
    const int L = cfg.n_layers, H = cfg.n_kv_heads, nh = cfg.n_heads, d = cfg.head_dim;
    FILE *f = fopen(argv[5], "rb");
    int32_t hdr[2];
    if (!f || fread(hdr, 4, 2, f) != 2)
        return 3;
    const int n0 = hdr[0], steps = hdr[1];
    float *k = malloc(sizeof(float) * (size_t)n0 * H * d), *v = malloc(sizeof(float) * (size_t)n0 * H * d);
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)n0);
    float q[4096], out[4096];
    if (fread(k, sizeof(float), (size_t)n0 * H * d, f) != (size_t)n0 * H * d ||
        fread(v, sizeof(float), (size_t)n0 * H * d, f) != (size_t)n0 * H * d)
        return 3;
    for (int i = 0; i < n0; i++)
        pos[i] = i;
    for (int l = 0; l < L; l++)
        if (kvq_retrieval_append(r, l, n0, pos, k, v, &e))
            return die("append", &e);
    kvq_attn_backend be = kvq_retrieval_backend(r);
    for (int s = 0; s < steps; s++)
        for (int l = 0; l < L; l++) {
            const int64_t ps = n0 + s;
            if (fread(q, sizeof(float), (size_t)nh * d, f) != (size_t)nh * d ||
                fread(k, sizeof(float), (size_t)H * d, f) != (size_t)H * d ||
                fread(v, sizeof(float), (size_t)H * d, f) != (size_t)H * d)
                return 3;
            const kvq_attn_call c = {.layer = l, .n = 1, .pos = &ps, .q = q, .k = k, .v = v, .out = out};
            if (be.attend(be.user, &c, &e))
                return die("attend", &e);
            for (int h = 0; h < H; h++) {
                int64_t n = 0;
                const int32_t *sel = kvq_retrieval_last_selection(r, l, h, &n);
                printf("s");
                for (int64_t j = 0; j < n; j++)
                    printf(" %d", (int)sel[j]);
                printf("\n");
            }
            printf("o");
            for (int t = 0; t < nh * d; t++)
                printf(" %.9g", out[t]);
            printf("\n");
        }
    kvq_retrieval_free(r);
    kvq_codebook_set_close(set);
    kvq_artifact_close(a);
    free(k);
    free(v);
    free(pos);
    return 0;
}
"""


def build_helper(tmp):
    src, exe = os.path.join(tmp, "helper.c"), os.path.join(tmp, "helper")
    with open(src, "w") as f:
        f.write(HELPER_C)
    cc = os.environ.get("CC", "cc")
    if not shutil.which(cc):
        return None
    # the library under its soname too (a lone libkvq.so, as the device kit carries it)
    lib = os.path.join(tmp, "lib")
    os.makedirs(lib, exist_ok=True)
    os.symlink(os.path.realpath(os.path.join(BUILD, "libkvq.so")), os.path.join(lib, "libkvq.so.0"))
    subprocess.run([cc, "-O1", "-I", os.path.join(ROOT, "include"), src, "-L", BUILD, "-lkvq",
                    "-Wl,-rpath," + os.path.abspath(BUILD) + ":" + lib, "-lm", "-o", exe,
                    *os.environ.get("LDFLAGS", "").split()], check=True)
    return exe


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


def compare_runtime(helper, tmp, path, positions, score, n0=240, steps=4, budget=0.06, seed=1):
    """The C runtime (helper) against TorchEngine.sequence(positions=, score_pos=): (selections,
    mismatches, largest rel output error)."""
    art = kvq.Artifact(path)
    spec = art.model
    rows = Rows(spec, seed)
    kp, vp = rows.kv(n0)
    st = [[(rows.q(), *rows.kv(1)) for _ in range(spec.n_layers)] for _ in range(steps)]
    fn = os.path.join(tmp, "rows.bin")
    with open(fn, "wb") as f:
        f.write(np.array([n0, steps], np.int32).tobytes() + kp.tobytes() + vp.tobytes())
        for s in st:
            for q, k, v in s:
                f.write(q.tobytes() + k.tobytes() + v.tobytes())
    r = subprocess.run([helper, path, positions, score, str(budget), fn], capture_output=True, text=True,
                       check=True)
    lines = iter(r.stdout.split("\n"))
    seq = TorchEngine(art, spec).sequence(budget=budget, positions=positions, score_pos=score)
    for l in range(spec.n_layers):
        seq.append(l, kp, vp)
    n = bad = 0
    err = 0.0
    for s in st:
        for l, (q, k, v) in enumerate(s):
            o, sel = seq.decode(l, q, k[0], v[0])
            for h in range(spec.n_kv_heads):
                want = np.array([int(x) for x in next(lines).split()[1:]], dtype=np.int64)
                n += 1
                bad += not np.array_equal(want, sel[h].numpy())
            oc = np.array([float(x) for x in next(lines).split()[1:]])
            err = max(err, float(np.abs(o.numpy().ravel() - oc).max() / np.abs(oc).max()))
    return n, bad, err


def test_modes(arts, tmp):
    helper = build_helper(tmp)
    if helper is None:
        print(f"skip position modes: no C compiler ({os.environ.get('CC', 'cc')}) to build the C runtime's helper")
        return
    for name in ("qavq", "vq", "pq", "vq-postrope", "qavq-512"):
        for pm, ps in (("wrope", "rb"), ("wrope", "bands"), ("rope", "mean"), ("rope", "bands")):
            n, bad, err = compare_runtime(helper, tmp, arts[name], pm, ps, n0=200 if name == "qavq-512" else 400)
            check(bad == 0 and err <= 1e-5, f"{name} positions {pm}, score {ps}: the torch back end selects "
                  f"the C runtime's indices in {n - bad}/{n} selections, outputs within rel {err:.2g} <= 1e-5")


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


def test_topk():
    """The top-k rule (kvq_rk_topk: the k largest, equal scores to the earlier index,
    ascending) against numpy's stable argsort, on scores with many ties."""
    from kvq.torch_engine import _topk_earliest
    rs = np.random.RandomState(4)
    ok = True
    for n, k, levels in ((50, 7, 3), (300, 40, 5), (1000, 999, 2), (64, 64, 4), (513, 1, 1)):
        sc = rs.randint(0, levels, size=(3, n)).astype(np.float32)
        got = _topk_earliest(torch.as_tensor(sc), k).numpy()
        want = np.sort(np.argsort(-sc, axis=1, kind="stable")[:, :k], axis=1)
        ok &= np.array_equal(got, want)
    check(ok, "top-k: the k largest, ties to the earlier index, as numpy's stable argsort")


def test_refusals(arts):
    for key, val, what in (("positions.mode", "exact", "position mode"), ("model.attention.softcap", "50", "softcap"),
                           ("model.attention.sliding_window", "128", "sliding")):
        a = kvq.Artifact(arts["qavq"])
        a.metadata[key] = val
        a.metadata.setdefault("positions.score", "mean")
        try:
            TorchEngine(a, a.model)
            check(False, f"an artifact with {key} {val} is refused")
        except kvq.UnsupportedError as e:
            check(what in str(e), f"an artifact with {key} {val} is refused ({e})")
    a = kvq.Artifact(arts["qavq"])
    a.metadata["positions.mode"], a.metadata["positions.score"] = "rope", "bands"
    s = TorchEngine(a, a.model).sequence()
    check(s.rope and s.score_pos == "bands", "an artifact recording (rope, bands) is decoded with them (as kvq run)")
    try:
        TorchEngine(a, a.model).sequence(score_pos="exact")
        check(False, "score_pos 'exact' is refused")
    except kvq.InvalidArgumentError as e:
        check("score_pos" in str(e), f"score_pos 'exact' is refused ({e})")


class Tee:
    """The torch back end's sequence (whose outputs go on) shadowed by the C engine's, fed
    the same rows (copied to the host for it); every decode step's selections compared."""

    def __init__(self, eng, tor):
        self.a, self.b, self.n, self.bad, self.err = eng, tor, 0, 0, 0.0

    def length(self, layer):
        return self.b.length(layer)

    def reset(self):
        self.a.reset()
        self.b.reset()

    def append(self, layer, k, v):
        self.a.append(layer, k.cpu().numpy(), v.cpu().numpy())
        self.b.append(layer, k, v)

    def decode(self, layer, q, k, v):
        oa, sa = self.a.decode(layer, q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy())
        ob, sb = self.b.decode(layer, q, k, v)
        for x, y in zip(sa, sb):
            self.n += 1
            self.bad += not np.array_equal(x, y.cpu().numpy())
        self.err = max(self.err, float(np.abs(ob.cpu().numpy() - oa).max() / np.abs(oa).max()))
        return ob, sb

    def close(self):
        self.a.close()
        self.b.close()


def test_hf_generate(tmp, devices):
    """Greedy generate() of tiny random llama (8 heads over 2 KV heads: the rerank's
    summed logits) and qwen2 (6 over 2, head dim 16) models at 6%, with the torch back end
    on each device, shadowed step by step by the C engine: the same selections, and the
    same tokens as generate() with the C engine back end on the CPU."""
    try:
        import transformers
    except ImportError:
        print("skip generate(): transformers is not installed")
        return
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    ids = os.path.join(tmp, "ids_gen.bin")
    np.random.RandomState(5).randint(3, 300, size=1200).astype("<i4").tofile(ids)
    common = dict(vocab_size=300, intermediate_size=96, num_hidden_layers=2, num_key_value_heads=2,
                  max_position_embeddings=512, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    for arch, cfg, hidden, heads in (("llama", transformers.LlamaConfig, 64, 8),
                                     ("qwen2", transformers.Qwen2Config, 96, 6)):
        torch.manual_seed(7)
        cls = transformers.LlamaForCausalLM if arch == "llama" else transformers.Qwen2ForCausalLM
        m = cls(cfg(hidden_size=hidden, num_attention_heads=heads, **common)).eval()
        d = os.path.join(tmp, "gen_" + arch)
        m.save_pretrained(d)
        cap = os.path.join(tmp, "gencap_" + arch)
        kvq_run("capture", "--model", d, "--corpus", "ids:" + ids, "--seq-len", "250", "-q", "-o", cap)
        kvq_run("moments", "--capture", cap, "-o", cap + ".mom", "-q")
        kvq_run("fit", "--capture", cap, "--moments", cap + ".mom", "--codebook", "16", "--iters", "4", "-q",
                "--no-checkpoint", "-o", cap + ".kvq")
        prompt = torch.as_tensor(np.random.RandomState(9).randint(3, 300, size=240))[None]
        with torch.no_grad(), kvq.hf.retrieval(m, cap + ".kvq", budget=0.06) as r:
            want = m.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False)[0].tolist()
        for dev in devices:
            md = m.to(dev)
            with torch.no_grad(), kvq.hf.retrieval(md, cap + ".kvq", budget=0.06, backend="torch") as r:
                eng = kvq.Engine(cap + ".kvq", r.spec)
                r.seq = Tee(eng.sequence(budget=0.06), r.seq)
                got = md.generate(prompt.to(dev), max_new_tokens=12, min_new_tokens=12, do_sample=False)[0].tolist()
                t = r.seq
            check(got == want and t.n == 11 * 2 * 2 and t.bad == 0 and t.err <= 1e-4,
                  f"{dev}: tiny {arch} ({heads} heads, 2 KV heads): generate() with the torch back end "
                  f"gives the C engine back end's tokens ({got[-12:] == want[-12:]}), its selections in "
                  f"{t.n - t.bad}/{t.n} steps, outputs within rel {t.err:.2g} <= 1e-4")
            m = md.to("cpu")


def main():
    if not os.path.exists(MODEL):
        print(f"needs the tiny model {MODEL} (set KVQ_TEST_MODEL)")
        sys.exit(77)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        arts = artifacts(tmp)
        test_kinds(arts)
        test_topk()
        test_modes(arts, tmp)
        test_devices(arts)
        test_refusals(arts)
        test_hf_generate(tmp, ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("kvq.torch_engine: all checks passed")


if __name__ == "__main__":
    main()
