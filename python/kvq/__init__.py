"""kvq: Python bindings of libkvq (KV-cache retrieval codebooks).

- :class:`kvq.Artifact` reads a .kvq artifact (description, codebooks, Cholesky factors,
  profile tables as numpy arrays) and checks it against a model;
- :class:`kvq.Engine` is the embedding API (kvq/engine.h): retrieval attention for a
  forward pass of your own, numpy in and out;
- :mod:`kvq.hf` captures pre-RoPE Q/K/V from HF transformers models into kvq's capture
  directory (needs torch and transformers);
- errors are :class:`kvq.KvqError` subclasses carrying kvq's message.

libkvq is loaded on first use: ``KVQ_LIB``, ``KVQ_BUILD``, the checkout's ``build/``,
then the system (see :func:`kvq._lib.candidates`).
"""
from __future__ import annotations

from . import errors
from .artifact import Artifact
from .engine import Engine, LayerAttention, Sequence
from .errors import (FormatError, InvalidArgumentError, KvqError, LibraryNotFoundError,
                     MismatchError, UnsupportedError, VersionError)
from .fingerprint import weight_fingerprint
from .model import ModelSpec

__version__ = "0.1.0"  # = the library's KVQ_VERSION_STRING (checked by the tests)


def library_version() -> str:
    """The loaded libkvq's version (kvq_version())."""
    from . import _lib
    return _lib.lib().kvq_version().decode()


def library_path() -> str:
    """The path of the loaded libkvq."""
    from . import _lib
    return str(_lib.lib()._name)


__all__ = ["Artifact", "Engine", "LayerAttention", "Sequence", "ModelSpec", "KvqError", "FormatError",
           "InvalidArgumentError", "LibraryNotFoundError", "MismatchError", "UnsupportedError",
           "VersionError", "errors", "library_version", "library_path", "weight_fingerprint",
           "__version__"]
