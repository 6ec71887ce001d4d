"""kvq.Artifact: a .kvq artifact read through libkvq (kvq/artifact.h), its tensors as
numpy arrays."""
from __future__ import annotations

import ctypes
import os
import re
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _lib
from ._safetensors import SafeTensors
from .errors import KvqError, MismatchError
from .model import ModelSpec

PathLike = Union[str, "os.PathLike[str]"]

_METHOD_KEYS = ("method", "codebook_size", "groups", "wrope.w", "wrope.b", "seed", "layers")
_METHOD_PREFIXES = ("kmeans.", "leankv.", "pats.")


def _parse_layers(spec: Optional[str], n_layers: int) -> List[int]:
    if not spec:
        return list(range(n_layers))
    out: List[int] = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


class Artifact:
    """A .kvq artifact (docs/format.md), read and checked by libkvq.

    >>> a = kvq.Artifact("model.kvq")
    >>> a.codebook(0, 0).shape          # [codebook_size, head_dim] (one group)
    >>> a.describe()["model"]["n_layers"]

    Raises a KvqError subclass carrying kvq's message for a missing, damaged or
    invalid file (``validate=False`` skips the version-1 content rules only)."""

    def __init__(self, path: PathLike, validate: bool = True) -> None:
        self.path = os.fspath(path)
        lib = _lib.lib()
        err = _lib.KvqErr()
        h = ctypes.c_void_p()
        _lib.check(lib.kvq_artifact_open(self.path.encode(), ctypes.byref(h), ctypes.byref(err)), err)
        try:
            self.major = int(lib.kvq_artifact_major(h))
            self.minor = int(lib.kvq_artifact_minor(h))
            ve = _lib.KvqErr()
            st = lib.kvq_artifact_validate(h, ctypes.byref(ve))
            self.problem: Optional[str] = ve.msg.decode("utf-8", "replace") if st else None
            if st and validate:
                _lib.check(st, ve)
            size = lib.kvq_artifact_payload_size(h)
            self.payload: bytes = ctypes.string_at(lib.kvq_artifact_payload_data(h), size)
        finally:
            lib.kvq_artifact_close(h)
        self._st = SafeTensors(self.payload, self.path)
        self.metadata: Dict[str, str] = self._st.metadata

    # ---- identity and settings -------------------------------------------------------
    @property
    def model(self) -> ModelSpec:
        """The model the artifact was made for (its ``model.*`` metadata)."""
        return ModelSpec.from_metadata(self.metadata, self.path)

    @property
    def fingerprint(self) -> Optional[str]:
        """The weight fingerprint recorded (32 hex digits), or None."""
        return self.metadata.get("model.fingerprint") or None

    @property
    def method(self) -> str:
        return self.metadata.get("method", "")

    @property
    def codebook_size(self) -> int:
        return int(self.metadata.get("codebook_size", "0"))

    @property
    def groups(self) -> int:
        return int(self.metadata.get("groups", "1"))

    @property
    def layers(self) -> List[int]:
        """The layers that have codebooks."""
        return _parse_layers(self.metadata.get("layers"), self.model.n_layers)

    @property
    def wrope(self) -> Tuple[int, int]:
        """(w, b): the recent window and the position distance of the scoring query."""
        return int(self.metadata.get("wrope.w", "64")), int(self.metadata.get("wrope.b", "2048"))

    # ---- tensors ---------------------------------------------------------------------
    def tensor_names(self) -> List[str]:
        return self._st.names()

    def tensor(self, name: str) -> np.ndarray:
        """A tensor of the payload by name (read-only numpy array)."""
        return self._st.tensor(name)

    def _per_head(self, what: str, layer: int, head: int) -> np.ndarray:
        one = f"layer.{layer}.head.{head}.{what}"
        if one in self._st:
            return self._st.tensor(one)
        g = [f"layer.{layer}.head.{head}.group.{i}.{what}" for i in range(self.groups)]
        if all(n in self._st for n in g):
            return np.stack([self._st.tensor(n) for n in g])
        raise KeyError(f"{self.path}: no {what} for layer {layer}, KV head {head}")

    def codebook(self, layer: int, head: int) -> np.ndarray:
        """Centroids of (layer, KV head) in key space: [K, d], or [G, K, d/G] with groups."""
        return self._per_head("codebook", layer, head)

    def codebook_z(self, layer: int, head: int) -> np.ndarray:
        """Centroids in z = k L space (qavq): [K, d] or [G, K, d/G]."""
        return self._per_head("Cz", layer, head)

    def cholesky(self, layer: int, head: int) -> Tuple[np.ndarray, np.ndarray]:
        """(L, L^-1) of (layer, KV head), each [d, d]: the Cholesky factor of the query
        moments the fit used (identity for plain vq)."""
        return self._per_head("L", layer, head), self._per_head("Linv", layer, head)

    def codebooks(self) -> Dict[Tuple[int, int], np.ndarray]:
        """Every codebook, keyed by (layer, KV head)."""
        return {(l, h): self.codebook(l, h) for l in self.layers for h in range(self.model.n_kv_heads)}

    def profile_tables(self) -> List[str]:
        """Names of the profile result tables (``profile.NAME`` tensors)."""
        out = []
        for n in self._st.names():
            m = re.fullmatch(r"profile\.([^.]+)", n)
            if m:
                out.append(m.group(1))
        return out

    def profile(self, table: str) -> Dict[str, Any]:
        """A profile table: ``rows`` (the tensor), ``columns`` (names, when recorded),
        ``err_ci95`` and ``job_sampled`` (when present)."""
        out: Dict[str, Any] = {"rows": self.tensor(f"profile.{table}")}
        cols = self.metadata.get(f"profile.{table}.columns")
        out["columns"] = cols.split(",") if cols else None
        for extra in ("err_ci95", "job_sampled"):
            n = f"profile.{table}.{extra}"
            out[extra] = self.tensor(n) if n in self._st else None
        return out

    def thresholds(self) -> Dict[str, np.ndarray]:
        """The ``thresholds.*`` tensors (budget per layer and head, mass tau, LeanKV)."""
        return {n: self.tensor(n) for n in self._st.names() if n.startswith("thresholds.")}

    # ---- description and checks ------------------------------------------------------
    def describe(self) -> Dict[str, Any]:
        """The artifact's description: the keys of ``kvq inspect --json`` for the header,
        validity, metadata groups and tensors (its ``fit`` and ``thresholds`` summaries
        are not computed here; the raw tensors are available through ``tensor``)."""
        meta = self.metadata

        def group(prefix: Optional[str], pred) -> Dict[str, str]:
            return {(k[len(prefix):] if prefix else k): v for k, v in sorted(meta.items()) if pred(k)}

        is_method = (lambda k: k in _METHOD_KEYS or k.startswith(_METHOD_PREFIXES))
        doc: Dict[str, Any] = {
            "path": self.path, "format": "kvq", "file_size": os.path.getsize(self.path),
            "version": f"{self.major}.{self.minor}", "major": self.major, "minor": self.minor,
            "payload_size": len(self.payload), "valid": self.problem is None,
        }
        if self.problem:
            doc["problem"] = self.problem
        doc["model"] = group("model.", lambda k: k.startswith("model."))
        doc["method"] = group(None, is_method)
        doc["provenance"] = group("provenance.", lambda k: k.startswith("provenance."))
        doc["metadata"] = dict(sorted(meta.items()))
        doc["tensors"] = [{"name": n, "dtype": self._st.dtype(n), "shape": self._st.shape(n),
                           "offset": self._st.span(n)[0], "nbytes": self._st.span(n)[1]}
                          for n in self._st.names()]
        return doc

    def check_model(self, model: Union[ModelSpec, str], accept_mismatch: bool = False) -> str:
        """Checks the artifact against a model as kvq_engine_open does: a ModelSpec (shape,
        RoPE and fingerprint) or a fingerprint string (shape taken from the artifact).
        Raises MismatchError naming the field or both fingerprints; returns "" when the
        weights match, else the note saying why they were not checked."""
        if isinstance(model, str):
            spec = self.model
            spec.fingerprint = model
            model = spec
        from .engine import Engine  # the check is the engine's
        with Engine(self.path, model, accept_model_mismatch=accept_mismatch) as e:
            return e.weights_note

    def __repr__(self) -> str:
        m = self.model
        return (f"kvq.Artifact({self.path!r}, method={self.method!r}, layers={m.n_layers}, "
                f"kv_heads={m.n_kv_heads}, head_dim={m.head_dim}, K={self.codebook_size})")


__all__ = ["Artifact", "KvqError", "MismatchError"]
