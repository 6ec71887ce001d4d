#!/usr/bin/env python3
"""hf_python.py - the Python package's HF paths against their baselines, in one run.

    python3 bench/hf_python.py decode  --model M --artifact A [--context 8192] [-n 32] [--reps 2]
    python3 bench/hf_python.py capture --model M [--tokens 4096] [--seq-len 512] [--reps 2]

decode: HF transformers greedy decoding on the CPU after a prompt of --context tokens
(uuid corpus text), with kvq retrieval (kvq.hf.retrieval at 6%: the C engine, or
--backend torch|both the torch back end) and with HF's
dense attention (sdpa), alternated --reps times; prints the decode tokens/s of each
(best of the reps, prefill excluded) and their ratio.
capture: kvq.hf.capture (torch forward with the hooks) against `kvq capture` of the same
ids corpus, alternated; prints tokens/s of each (best of the reps, model load excluded
for Python, included for kvq: its load is a few hundred ms) and the ratio.
Timings on a shared machine are noisy: run --reps >= 2 and read the ratio.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvq.hf  # noqa: E402
from kvq.corpus import documents  # noqa: E402

KVQ = os.environ.get("KVQ", os.path.join(ROOT, "build", "kvq"))


def prompt_ids(tok, n):
    ids = []
    for d in documents("uuid:200"):
        ids += tok(d.text.decode(), add_special_tokens=False)["input_ids"]
        if len(ids) >= n:
            break
    return torch.as_tensor(ids[:n])[None]


def timed_decode(model, ids, n, tok):
    """(prefill seconds, decode seconds for n - 1 tokens after the first)."""
    from transformers import StoppingCriteria, StoppingCriteriaList
    stamps = []

    class Clock(StoppingCriteria):
        def __call__(self, input_ids, scores, **kw):
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       stopping_criteria=StoppingCriteriaList([Clock()]), pad_token_id=tok.eos_token_id)
    return stamps[0] - t0, stamps[-1] - stamps[0]


def bench_decode(a):
    model, tok, src = kvq.hf.load(a.model)
    ids = prompt_ids(tok, a.context)
    backends = ["engine", "torch"] if a.backend == "both" else [a.backend]
    modes = [f"retrieval-{b}" for b in backends] + ["dense"]
    best = {m: 0.0 for m in modes}
    for rep in range(a.reps):
        for mode in modes:
            if mode != "dense":
                with kvq.hf.retrieval(model, a.artifact, budget=0.06, source=src, threads=a.threads,
                                      backend=mode.split("-")[1]):
                    pre, dec = timed_decode(model, ids, a.n, tok)
            else:
                pre, dec = timed_decode(model, ids, a.n, tok)
            tps = (a.n - 1) / dec
            best[mode] = max(best[mode], tps)
            print(f"rep {rep} {mode:16s}: prefill {ids.shape[1]} tokens {pre:.1f} s, decode {tps:.2f} tok/s",
                  flush=True)
    for m in modes[:-1]:
        print(f"decode at {ids.shape[1]} tokens, CPU, torch threads {torch.get_num_threads()}: {m} "
              f"{best[m]:.2f} tok/s, dense {best['dense']:.2f} tok/s, ratio {best[m] / best['dense']:.2f}x")


def bench_capture(a):
    model, tok, src = kvq.hf.load(a.model)
    with tempfile.TemporaryDirectory() as tmp:
        ids_file = os.path.join(tmp, "ids.bin")
        np.asarray(prompt_ids(tok, a.tokens)[0].numpy(), dtype="<i4").tofile(ids_file)
        best = {"python": 0.0, "kvq": 0.0}
        for rep in range(a.reps):
            t = time.perf_counter()
            doc = kvq.hf.capture(model, tok, "ids:" + ids_file, os.path.join(tmp, "py"), seq_len=a.seq_len,
                                 source=src, force=True)
            py = doc["n_tokens"] / (time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run([KVQ, "capture", "--model", a.model, "--corpus", "ids:" + ids_file, "--seq-len",
                            str(a.seq_len), "-q", "--force", "-o", os.path.join(tmp, "c")], check=True)
            kv = doc["n_tokens"] / (time.perf_counter() - t)
            best["python"], best["kvq"] = max(best["python"], py), max(best["kvq"], kv)
            print(f"rep {rep}: python {py:.0f} tok/s, kvq capture {kv:.0f} tok/s", flush=True)
    print(f"capture of {doc['n_tokens']} tokens (seq-len {a.seq_len}, f16), CPU: kvq.hf.capture "
          f"{best['python']:.0f} tok/s, kvq capture {best['kvq']:.0f} tok/s, ratio "
          f"{best['python'] / best['kvq']:.2f}x")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    d = sub.add_parser("decode")
    d.add_argument("--model", required=True)
    d.add_argument("--artifact", required=True)
    d.add_argument("--context", type=int, default=8192 - 64)
    d.add_argument("-n", type=int, default=32)
    d.add_argument("--reps", type=int, default=2)
    d.add_argument("--threads", type=int, default=1, help="engine threads (KV heads in parallel)")
    d.add_argument("--backend", default="engine", choices=["engine", "torch", "both"],
                   help="retrieval back end(s): the C engine, the torch back end, or both")
    c = sub.add_parser("capture")
    c.add_argument("--model", required=True)
    c.add_argument("--tokens", type=int, default=4096)
    c.add_argument("--seq-len", type=int, default=512)
    c.add_argument("--reps", type=int, default=2)
    a = p.parse_args()
    (bench_decode if a.what == "decode" else bench_capture)(a)


if __name__ == "__main__":
    main()
