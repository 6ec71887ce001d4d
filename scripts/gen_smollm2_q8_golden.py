#!/usr/bin/env python3
"""Expected logits of kvq's 8-bit activation path (kvq_forward_params.act_q8, decision
018) for SmolLM2-135M-Instruct Q4_1 on the golden prompts, from two implementations
other than kvq:

  "numpy_q8": the float64 numpy forward of scripts/gen_smollm2_golden.py (weights
      dequantized by the `gguf` package) with every product of a Q4_1 / Q8_0 weight
      taking its input quantized as model/q8dot.h specifies: per 32 values, in float32,
      d = amax / 127, id = 1 / d (0 if d is 0), q = round-half-even(x * id); the input
      replaced by d * q, the product then exact (float64).
  "llamacpp": llama.cpp's logits (llama-cpp-python), which quantize the activations
      the same way but keep d in f16 and the KV cache in f16.

Per prompt (the ids of tests/data/smollm2_q41_golden.json, in its order), for each of
the two: "logsumexp"[p] per position p and "probe_logits"[p * 64 + k] (flat: the
logit of the golden file's k-th probe id at position p), rounded to 6 decimals. Never
from kvq.

How to rerun
    python3 scripts/gen_smollm2_q8_golden.py [--model PATH] [-o OUT]
    Needs numpy, gguf and llama-cpp-python (scripts/install-llamacpp-peer.sh: 0.3.16).
    A minute or two on 2 cores; deterministic.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_smollm2_golden import Model, logsumexp, r6  # noqa: E402

DEFAULT_MODEL = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
GOLDEN = "tests/data/smollm2_q41_golden.json"


def q8(x: np.ndarray) -> np.ndarray:
    """Rows of x quantized to 8 bits per 32 values (float32 steps) and dequantized."""
    xf = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(xf).max(axis=1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.rint((xf * idv).astype(np.float32))          # numpy rint: half to even
    return (d.astype(np.float64) * q).reshape(x.shape)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("-o", "--out", default="tests/data/smollm2_q41_q8_golden.json")
    a = ap.parse_args()
    import llama_cpp

    with open(GOLDEN) as f:
        golden = json.load(f)
    probe = golden["probe_ids"]
    llm = llama_cpp.Llama(a.model, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=1,
                          n_threads_batch=1, logits_all=True, verbose=False, seed=0)
    m = Model(a.model, np.float64)
    prompts = []
    for p in golden["prompts"]:
        ids = p["ids"]
        llm.reset()
        llm.eval(ids)
        lc = np.array(llm.scores[: len(ids)], dtype=np.float64)
        z = m.forward(ids, act=q8)
        prompts.append({
            "ids": ids,
            "numpy_q8": {"logsumexp": r6(logsumexp(z)), "probe_logits": r6(z[:, probe])},
            "llamacpp": {"logsumexp": r6(logsumexp(lc)), "probe_logits": r6(lc[:, probe])},
            "max_abs_diff_numpy_q8_vs_llamacpp": round(float(np.max(np.abs(z - lc))), 6),
        })
    out = {
        "what": "SmolLM2-135M-Instruct Q4_1 logits with 8-bit activations: a float64 numpy "
                "forward quantizing every quantized product's input as model/q8dot.h says, "
                "and llama.cpp; scripts/gen_smollm2_q8_golden.py",
        "model": a.model.rsplit("/", 1)[-1],
        "versions": {"llama_cpp_python": llama_cpp.__version__, "numpy": np.__version__},
        "probe_ids": probe,
        "prompts": prompts,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
