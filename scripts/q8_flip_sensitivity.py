#!/usr/bin/env python3
"""How far one f32 ulp in the quantizer's inputs moves SmolLM2's 8-bit-activation logits
(decision 019, "Open"): the float64 numpy q8 forward of scripts/gen_smollm2_q8_golden.py
at the first position of the first golden prompt, once as it is and then with every
quantized product's input moved by -1, 0 or +1 f32 ulp at random (seeded) before the
quantizer, as f32 arithmetic elsewhere than numpy may move it. Writes one JSON line per
trial: the first probe's logit and the largest and mean |change| over the 64 probes.

usage: python3 scripts/q8_flip_sensitivity.py [--model PATH] [--trials N] [--seed S]
Needs numpy and gguf; a few minutes on 2 cores. Never reads kvq's output.
"""
import argparse
import json
import os
import sys
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_smollm2_golden import Model  # noqa: E402
from gen_smollm2_q8_golden import DEFAULT_MODEL, q8  # noqa: E402

GOLDEN = "tests/data/smollm2_q41_q8_golden.json"


def jitter(rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
    """The quantizer with each input first moved by a random -1 / 0 / +1 f32 ulp."""
    def act(h: np.ndarray) -> np.ndarray:
        h32 = np.asarray(h, np.float32)
        k = rng.integers(-1, 2, size=h32.shape)
        up = np.nextafter(h32, np.float32(np.inf))
        down = np.nextafter(h32, np.float32(-np.inf))
        return q8(np.where(k > 0, up, np.where(k < 0, down, h32)).astype(np.float64))
    return act


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    with open(GOLDEN) as f:
        g = json.load(f)
    probe = g["probe_ids"]
    ids = g["prompts"][0]["ids"][:1]
    m = Model(a.model, np.float64)
    base = m.forward(ids, act=q8)[0]
    sys.stdout.write(json.dumps({"trial": None, "probe0": float(base[probe[0]])}) + "\n")
    rng = np.random.default_rng(a.seed)
    for t in range(a.trials):
        z = m.forward(ids, act=jitter(rng))[0]
        d = np.abs(z[probe] - base[probe])
        sys.stdout.write(json.dumps({"trial": t, "probe0": round(float(z[probe[0]]), 4),
                                     "max": round(float(d.max()), 4),
                                     "mean": round(float(d.mean()), 4)}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
