"""pyref.py - numpy references and fixtures shared by the Python tests in tests/py
(test_python_pkg.py, test_engine_measure.py): RoPE written from docs/design.md, and a
small artifact fitted on a real model through the kvq binary."""
import os
import subprocess

import numpy as np


def rope(x, pos, base, interleaved):
    """x [..., d] rotated to position pos (docs/design.md RoPE; float64; pos a scalar, or
    an array [n] of the positions of x's first axis)."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    theta = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    pos = np.asarray(pos, dtype=np.float64)
    ang = np.multiply.outer(pos, theta)
    if pos.ndim:
        ang = ang.reshape((pos.shape[0],) + (1,) * (x.ndim - 2) + (d // 2,))
    c, s = np.cos(ang), np.sin(ang)
    out = np.empty_like(x)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., :d // 2], x[..., d // 2:]
        out[..., :d // 2], out[..., d // 2:] = a * c - b * s, a * s + b * c
    return out


def fitted_artifact(kvq_bin, model, tmp):
    """A capture of model (two synthetic sequences of 256 tokens, f32) in tmp/cap and the
    artifact fitted on it (16 centroids, 3 iterations) at tmp/fit.kvq: (cap, art)."""
    cap, mom, art = (os.path.join(tmp, x) for x in ("cap", "mom.safetensors", "fit.kvq"))
    subprocess.run([kvq_bin, "capture", "--model", model, "--corpus", "uuid:2", "--seq-len", "256",
                    "--dtype", "f32", "-q", "-o", cap], check=True)
    subprocess.run([kvq_bin, "moments", "--capture", cap, "-o", mom, "-q"], check=True)
    subprocess.run([kvq_bin, "fit", "--capture", cap, "--moments", mom, "--codebook", "16",
                    "--iters", "3", "-q", "-o", art], check=True)
    return cap, art
