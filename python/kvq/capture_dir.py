"""Writing kvq's capture directory (docs/capture.md, version 2: ``model.attention`` and
the per-file XXH64 ``checksums``) from numpy arrays: ``capture.json`` plus one
safetensors file per layer, written to a temporary directory renamed into place when
complete (nothing is left behind on failure)."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import struct
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .errors import InvalidArgumentError, KvqIOError

_ST_DTYPE = {"f32": ("F32", np.float32), "f16": ("F16", np.float16), "bf16": ("BF16", None)}
BLOCK = 256  # rows per moment block (docs/capture.md "Moments")


def _to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bf16":  # round to nearest even, as kvq_f32_to_bf16
        u = x.view(np.uint32).astype(np.uint64)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        nan = np.isnan(x)
        r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
        return r
    return x.astype(_ST_DTYPE[dtype][1])


def write_safetensors(path: str, tensors: Sequence[tuple], metadata: Dict[str, str]) -> None:
    """tensors: (name, safetensors dtype, array) in file order."""
    head: Dict[str, Any] = {"__metadata__": metadata}
    off = 0
    blobs = []
    for name, dt, a in tensors:
        b = np.ascontiguousarray(a).tobytes()
        head[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def _meta_value(v: Any) -> str:
    if isinstance(v, float):  # as kvq writes metadata numbers: "%.17g"
        return "%.17g" % v
    return str(v)


def model_meta(model: Dict[str, Any]) -> Dict[str, str]:
    """The ``model.*`` keys of a layer file (the model object, keys joined by dots), as
    kvq_model_id_set_meta writes them: ``attention.*`` only when not 0, without the
    per-layer list (derived from the fields)."""
    out: Dict[str, str] = {}
    for k, v in model.items():
        if k == "attention":
            for k2, v2 in v.items():
                if k2 != "layers" and v2:
                    out[f"model.attention.{k2}"] = _meta_value(v2)
        elif isinstance(v, dict):
            for k2, v2 in v.items():
                out[f"model.{k}.{k2}"] = _meta_value(v2)
        else:
            out[f"model.{k}"] = _meta_value(v)
    return out


class LayerAccumulator:
    """Rows of one layer, in order, plus its query moments."""

    def __init__(self, n_heads: int, head_dim: int, dtype: str) -> None:
        self.dtype = dtype
        self.q: List[np.ndarray] = []
        self.k: List[np.ndarray] = []
        self.v: List[np.ndarray] = []
        self.moment = np.zeros((n_heads, head_dim, head_dim), dtype=np.float64)
        self.count = 0

    def add_sequence(self, q: np.ndarray, k: np.ndarray, v: Optional[np.ndarray]) -> None:
        """One whole sequence: q [n, n_heads, d], k, v [n, n_kv, d] (float32, pre-RoPE)."""
        q = np.asarray(q, dtype=np.float32)
        seq = np.zeros_like(self.moment)
        for s in range(0, len(q), BLOCK):
            b = q[s:s + BLOCK].astype(np.float64)
            seq += np.einsum("rhi,rhj->hij", b, b)
        self.moment += seq
        self.count += len(q)
        self.q.append(_to_storage(q, self.dtype))
        self.k.append(_to_storage(k, self.dtype))
        if v is not None:
            self.v.append(_to_storage(v, self.dtype))


def file_checksum(path: str) -> str:
    """"xxh64:" and the 16 hex digits of XXH64 (seed 0) of the file's bytes, computed by
    libkvq (kvq_xxh64), as capture.json records each layer file."""
    import ctypes

    from ._lib import lib
    with open(path, "rb") as f:
        data = f.read()
    return "xxh64:%016x" % lib().kvq_xxh64(ctypes.c_char_p(data), len(data), 0)


def write_capture(out_dir: str, model: Dict[str, Any], corpus: Dict[str, Any], seq_len: int,
                  sequences: Sequence[np.ndarray], layers: Sequence[int],
                  acc: Dict[int, LayerAccumulator], dtype: str, tool: str,
                  has_values: bool = True, force: bool = False) -> None:
    """Writes the capture directory atomically. sequences: the token ids of each sequence
    in order (positions restart at 0 in each)."""
    if dtype not in _ST_DTYPE:
        raise InvalidArgumentError(f"capture: dtype {dtype!r} is not f32, f16 or bf16")
    out_dir = os.path.normpath(out_dir)
    if os.path.lexists(out_dir):
        if not force:
            raise KvqIOError(f"{out_dir}: exists (pass force=True / --force to replace a capture)", 102)
        if not os.path.isfile(os.path.join(out_dir, "capture.json")):
            raise KvqIOError(f"{out_dir}: exists and is not a kvq capture directory; not replaced", 102)
    tmp = f"{out_dir}.tmp.{os.getpid()}.{secrets.token_hex(4)}"
    os.makedirs(tmp)
    try:
        starts, n = [], 0
        for s in sequences:
            starts.append([n, int(len(s))])
            n += len(s)
        tokens = np.concatenate([np.asarray(s, np.int32) for s in sequences])
        pos = np.concatenate([np.arange(len(s), dtype=np.int32) for s in sequences])
        seq = np.concatenate([np.full(len(s), i, np.int32) for i, s in enumerate(sequences)])
        st_dt = _ST_DTYPE[dtype][0]
        files = []
        for layer in layers:
            a = acc[layer]
            q, k = np.concatenate(a.q), np.concatenate(a.k)
            if len(k) != n:
                raise InvalidArgumentError(f"capture: layer {layer} has {len(k)} rows, expected {n}")
            t = [("k", st_dt, k)]
            if has_values:
                t.append(("v", st_dt, np.concatenate(a.v)))
            t += [("q", st_dt, q), ("q_rows", "I32", np.arange(n, dtype=np.int32)), ("pos", "I32", pos),
                  ("seq", "I32", seq), ("tokens", "I32", tokens),
                  ("q_moment_sum", "F64", a.moment),
                  ("q_moment_count", "F64", np.full(a.moment.shape[0], float(a.count)))]
            meta = {"format": "kvq-capture", "layer": str(layer), "version": "1", **model_meta(model)}
            name = "layer_%03d.safetensors" % layer
            write_safetensors(os.path.join(tmp, name), t, meta)
            files.append(name)
        doc = {"format": "kvq-capture", "version": 2, "tool": tool, "model": model, "corpus": corpus,
               "dtype": dtype, "seq_len": int(seq_len), "n_tokens": int(n),
               "n_sequences": len(sequences), "sequences": starts, "layers": list(layers),
               "files": files, "checksums": [file_checksum(os.path.join(tmp, f)) for f in files],
               "queries": "all", "has_values": bool(has_values)}
        with open(os.path.join(tmp, "capture.json"), "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        old = None
        if os.path.lexists(out_dir):
            old = f"{out_dir}.old.{os.getpid()}.{secrets.token_hex(4)}"
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
