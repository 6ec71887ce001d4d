"""Loading libkvq with ctypes and declaring the functions of its stable headers
(kvq/common.h, kvq/artifact.h, kvq/engine.h). Nothing else of the library is bound."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path
from typing import List, Optional

from .errors import LibraryNotFoundError, error_for_status

_NAMES = ("libkvq.so", "libkvq.so.0", "libkvq.dylib")


class KvqErr(ctypes.Structure):
    """struct kvq_err: the status and a one-line message."""

    _fields_ = [("status", ctypes.c_int), ("msg", ctypes.c_char * 512)]


class EngineModelC(ctypes.Structure):
    """struct kvq_engine_model."""

    _fields_ = [
        ("n_layers", ctypes.c_int32),
        ("n_heads", ctypes.c_int32),
        ("n_kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("rope_base", ctypes.c_double),
        ("rope_interleaved", ctypes.c_int),
        ("rope_scaling", ctypes.c_char_p),
        ("rope_factor", ctypes.c_double),
        ("rope_low_freq_factor", ctypes.c_double),
        ("rope_high_freq_factor", ctypes.c_double),
        ("rope_original_max_pos", ctypes.c_double),
        ("fingerprint", ctypes.c_char_p),
        # per-layer attention (kvq/engine.h): left 0 / NULL, the artifact's description
        ("attn_scale", ctypes.c_double),
        ("attn_softcap", ctypes.c_double),
        ("sliding_window", ctypes.c_int32),
        ("layers", ctypes.c_void_p),
    ]


class SeqParamsC(ctypes.Structure):
    """struct kvq_engine_seq_params."""

    _fields_ = [
        ("budget_tokens", ctypes.c_int64),
        ("budget_fraction", ctypes.c_double),
        ("sink", ctypes.c_int32),
        ("window", ctypes.c_int32),
        ("cache_f16", ctypes.c_int),
        ("max_tokens", ctypes.c_int64),
        ("threads", ctypes.c_int32),
        # the compressed KV caches (kvq/engine.h: kv_cache 0 = the codebook selection)
        ("kv_cache", ctypes.c_int32),
        ("kv_alpha_h", ctypes.c_double),
        ("kv_alpha_l", ctypes.c_double),
        ("kv_window", ctypes.c_int32),
        ("kv_pats_schedule", ctypes.c_int32),
        ("kv_pats_b_min", ctypes.c_int32),
        ("kv_pats_b_max", ctypes.c_int32),
        # selectors and measurement (kvq/engine.h: 0 keeps the defaults)
        ("selector", ctypes.c_int32),
        ("tau", ctypes.c_double),
        ("fier_group", ctypes.c_int32),
        ("quest_page", ctypes.c_int32),
        ("measure", ctypes.c_int),
    ]


class EngineLayerC(ctypes.Structure):
    """struct kvq_engine_layer."""

    _fields_ = [
        ("window", ctypes.c_int32),
        ("no_rope", ctypes.c_int),
        ("rope_base", ctypes.c_double),
        ("rope_scaling", ctypes.c_char_p),
        ("rope_factor", ctypes.c_double),
        ("attn_scale", ctypes.c_double),
        ("attn_softcap", ctypes.c_double),
    ]


class EngineStatsC(ctypes.Structure):
    """struct kvq_engine_stats."""

    _fields_ = [
        ("steps", ctypes.c_uint64),
        ("visible", ctypes.c_double),
        ("attended", ctypes.c_double),
        ("bytes_read", ctypes.c_double),
        ("bytes_full", ctypes.c_double),
        ("measured", ctypes.c_uint64),
        ("recall_topk", ctypes.c_double),
        ("recall_mass", ctypes.c_double),
        ("out_rel_err", ctypes.c_double),
    ]


def candidates() -> List[str]:
    """The paths tried, in order: KVQ_LIB, KVQ_BUILD, the build/ folder of the checkout
    this package or the current folder is in, that of the checkout it was installed
    from, then the system's library path."""
    out: List[str] = []
    env = os.environ.get("KVQ_LIB")
    if env:
        out.append(env)
    b = os.environ.get("KVQ_BUILD")
    if b:
        out += [str(Path(b) / n) for n in _NAMES]
    for start in (Path(__file__).resolve().parent, Path.cwd().resolve()):
        for d in (start, *start.parents):
            if (d / "include" / "kvq" / "common.h").is_file():
                out += [str(d / "build" / n) for n in _NAMES]
                break
    try:
        from ._checkout import ROOT  # written at install time by setup.py
        out += [str(Path(ROOT) / "build" / n) for n in _NAMES]
    except ImportError:
        pass
    found = ctypes.util.find_library("kvq")
    if found:
        out.append(found)
    out += list(_NAMES)
    return out


_LIB: Optional[ctypes.CDLL] = None


def _declare(lib: ctypes.CDLL) -> None:
    P, I32, I64, U32, U64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32, ctypes.c_uint64
    E = ctypes.POINTER(KvqErr)
    sigs = {
        "kvq_version": (ctypes.c_char_p, []),
        "kvq_status_str": (ctypes.c_char_p, [ctypes.c_int]),
        "kvq_artifact_open": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(P), E]),
        "kvq_artifact_close": (None, [P]),
        "kvq_artifact_major": (U32, [P]),
        "kvq_artifact_minor": (U32, [P]),
        "kvq_artifact_payload_data": (P, [P]),
        "kvq_artifact_payload_size": (ctypes.c_size_t, [P]),
        "kvq_artifact_validate": (ctypes.c_int, [P, E]),
        "kvq_engine_open": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(EngineModelC),
                                            ctypes.c_uint, ctypes.POINTER(P), E]),
        "kvq_engine_close": (None, [P]),
        "kvq_engine_weights_note": (ctypes.c_char_p, [P]),
        "kvq_engine_artifact_fingerprint": (ctypes.c_char_p, [P]),
        "kvq_engine_artifact_model_name": (ctypes.c_char_p, [P]),
        "kvq_engine_bytes": (U64, [P]),
        "kvq_engine_seq_params_default": (SeqParamsC, []),
        "kvq_engine_seq_create": (ctypes.c_int, [P, ctypes.POINTER(SeqParamsC), ctypes.POINTER(P), E]),
        "kvq_engine_seq_free": (None, [P]),
        "kvq_engine_seq_reset": (None, [P]),
        "kvq_engine_seq_length": (I64, [P, I32]),
        "kvq_engine_seq_bytes": (U64, [P]),
        "kvq_engine_seq_append": (ctypes.c_int, [P, I32, I32, ctypes.POINTER(I64), P, P, ctypes.c_int, E]),
        "kvq_engine_seq_decode": (ctypes.c_int, [P, I32, I64, ctypes.POINTER(ctypes.c_float), P, P,
                                                 ctypes.c_int, ctypes.POINTER(ctypes.c_float), E]),
        "kvq_engine_seq_last_selection": (ctypes.POINTER(I32), [P, I32, I32, ctypes.POINTER(I64)]),
        "kvq_engine_seq_stats": (None, [P, ctypes.POINTER(EngineStatsC)]),
        "kvq_engine_layer_window": (I32, [P, I32]),
        # kvq/util.h: the checksum capture.json records per layer file (docs/capture.md)
        "kvq_xxh64": (U64, [ctypes.c_char_p, ctypes.c_size_t, U64]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


def lib() -> ctypes.CDLL:
    """libkvq, loaded on first use (LibraryNotFoundError names every path tried)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    tried = candidates()
    errors = []
    for path in tried:
        if os.sep in path and not os.path.exists(path):
            continue
        try:
            handle = ctypes.CDLL(path)
            _declare(handle)
        except (OSError, AttributeError) as e:
            errors.append(f"{path}: {e}")
            continue
        _LIB = handle
        return handle
    raise LibraryNotFoundError(
        "libkvq not found (build it with `make -j2 all`, or set KVQ_LIB to the path of "
        "libkvq.so); tried: " + ", ".join(tried) + ("; " + "; ".join(errors) if errors else ""))


def check(status: int, err: KvqErr) -> None:
    """Raises the exception of a non-zero kvq_status with kvq's message."""
    if status == 0:
        return
    msg = err.msg.decode("utf-8", "replace") or lib().kvq_status_str(status).decode()
    raise error_for_status(status, msg)
