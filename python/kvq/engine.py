"""kvq.Engine: the embedding API of kvq/engine.h (retrieval attention for an engine with
its own forward pass) over numpy arrays."""
from __future__ import annotations

import ctypes
import os
import weakref
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence as Seq, Tuple, Union

import numpy as np

from . import _lib
from .errors import InvalidArgumentError, KvqError
from .model import ModelSpec

_F32, _F16 = 0, 1
ACCEPT_MODEL_MISMATCH = 1

#: kvq_engine_seq_params.selector (KVQ_ENGINE_SELECT_*), by kvq eval's selector names
SELECTORS: Dict[str, int] = {"codebook": 0, "full": 1, "oracle": 2, "fier": 3, "quest": 4, "mass": 5}
#: kvq_engine_seq_params.kv_cache: the f16 rows, or a compressed cache (with selector
#: "full" attended in full, else retrieval over it; docs/kvcache.md)
KV_CACHES: Dict[str, int] = {"f16": 0, "leankv": 1, "pats": 2, "leankv+pats": 3}
#: PATS schedules (kv_pats_schedule)
PATS_SCHEDULES: Dict[str, int] = {"old-heavy": 0, "new-heavy": 1, "middle-heavy": 2}


@dataclass
class LayerAttention:
    """How one layer attends (struct kvq_engine_layer), for models whose layers differ
    (Gemma 2/3's local layers, Qwen 2's max_window_layers). 0 / None: the model's."""

    window: int = 0                     # > 0: only the last `window` tokens (a local layer)
    no_rope: bool = False               # kvq refuses such a layer (UnsupportedError)
    rope_base: float = 0.0              # 0: the model's
    rope_scaling: Optional[str] = None  # None: the model's; "none", "linear", "llama3"
    rope_factor: float = 0.0            # 0: the model's
    attn_scale: float = 0.0             # 0: 1/sqrt(head_dim)
    attn_softcap: float = 0.0           # > 0: scores c tanh(s / c)


def _model_c(m: ModelSpec, attn_scale: float = 0.0, attn_softcap: float = 0.0, sliding_window: int = 0,
             layers: Optional[Seq[LayerAttention]] = None) -> Tuple[_lib.EngineModelC, list]:
    keep: list = [m.rope_scaling.encode() if m.rope_scaling else None,
                  m.fingerprint.encode() if m.fingerprint else None]
    c = _lib.EngineModelC(int(m.n_layers), int(m.n_heads), int(m.n_kv_heads), int(m.head_dim),
                          float(m.rope_base), 1 if m.rope_interleaved else 0, keep[0],
                          float(m.rope_factor), float(m.rope_low_freq_factor),
                          float(m.rope_high_freq_factor), float(m.rope_original_max_pos), keep[1],
                          float(attn_scale), float(attn_softcap), int(sliding_window), None)
    if layers is not None:
        if len(layers) != m.n_layers:
            raise InvalidArgumentError(f"kvq.Engine: layers has {len(layers)} entries, the model "
                                       f"{m.n_layers} layers")
        arr = (_lib.EngineLayerC * m.n_layers)()
        for i, L in enumerate(layers):
            sc = L.rope_scaling.encode() if L.rope_scaling else None
            keep.append(sc)
            arr[i] = _lib.EngineLayerC(int(L.window), 1 if L.no_rope else 0, float(L.rope_base), sc,
                                       float(L.rope_factor), float(L.attn_scale), float(L.attn_softcap))
        keep.append(arr)
        c.layers = ctypes.cast(arr, ctypes.c_void_p)
    return c, keep


def _named(value: Union[str, int], names: Dict[str, int], what: str) -> int:
    if isinstance(value, str):
        if value not in names:
            raise InvalidArgumentError(f"kvq.Engine.sequence: {what} {value!r} is not one of "
                                       f"{', '.join(names)}")
        return names[value]
    return int(value)


class Engine:
    """An artifact opened for a model (kvq_engine_open): checks the attention shape, RoPE
    and, unless ``accept_model_mismatch``, the weight fingerprint (MismatchError naming
    the field or both fingerprints). Sequences come from :meth:`sequence`.

    Usable as a context manager; :meth:`close` frees it (after its sequences)."""

    def __init__(self, artifact: Union[str, "os.PathLike[str]"], model: ModelSpec,
                 accept_model_mismatch: bool = False, attn_scale: float = 0.0,
                 attn_softcap: float = 0.0, sliding_window: int = 0,
                 layers: Optional[Seq[LayerAttention]] = None) -> None:
        """``attn_scale``, ``attn_softcap``, ``sliding_window`` (every layer alike) or
        ``layers`` (one :class:`LayerAttention` per layer) describe how the model's layers
        attend; all left at 0 / None, the artifact's description is taken as it is.
        Given, kvq_engine_open compares them with the artifact's layer by layer
        (MismatchError naming the layer and field)."""
        self._h: Optional[ctypes.c_void_p] = None
        self.model = model
        self.artifact_path = os.fspath(artifact)
        lib = _lib.lib()
        c, keep = _model_c(model, attn_scale, attn_softcap, sliding_window, layers)
        err = _lib.KvqErr()
        h = ctypes.c_void_p()
        flags = ACCEPT_MODEL_MISMATCH if accept_model_mismatch else 0
        _lib.check(lib.kvq_engine_open(self.artifact_path.encode(), ctypes.byref(c), flags,
                                       ctypes.byref(h), ctypes.byref(err)), err)
        del keep
        self._h = h
        self._seqs: "weakref.WeakSet[Sequence]" = weakref.WeakSet()

    def _handle(self) -> ctypes.c_void_p:
        if self._h is None:
            raise InvalidArgumentError("kvq.Engine: used after close()")
        return self._h

    @property
    def weights_note(self) -> str:
        """"" when the weights were checked and match; else why they were not."""
        return _lib.lib().kvq_engine_weights_note(self._handle()).decode()

    @property
    def artifact_fingerprint(self) -> str:
        return _lib.lib().kvq_engine_artifact_fingerprint(self._handle()).decode()

    @property
    def artifact_model_name(self) -> str:
        return _lib.lib().kvq_engine_artifact_model_name(self._handle()).decode()

    @property
    def nbytes(self) -> int:
        """Codebook memory held by the engine."""
        return int(_lib.lib().kvq_engine_bytes(self._handle()))

    def layer_window(self, layer: int) -> int:
        """W > 0 when ``layer`` is a local (sliding-window) layer attended exactly over
        its last W tokens (kvq_engine_layer_window); 0 for a retrieval layer."""
        return int(_lib.lib().kvq_engine_layer_window(self._handle(), int(layer)))

    def sequence(self, budget: Union[int, float, None] = None, sink: Optional[int] = None,
                 window: int = 0, cache_f16: bool = True, max_tokens: Optional[int] = None,
                 threads: int = 1, selector: Union[str, int] = "codebook", tau: float = 0.0,
                 fier_group: int = 0, quest_page: int = 0, measure: bool = False,
                 kv_cache: Union[str, int] = "f16", kv_alpha_h: float = -1.0,
                 kv_alpha_l: float = -1.0, kv_window: int = -1,
                 kv_pats_schedule: Union[str, int] = -1, kv_pats_b_min: int = -1,
                 kv_pats_b_max: int = -1) -> "Sequence":
        """A new decoding sequence (kvq_engine_seq_params).

        ``budget``: candidates selected per step, as a count (int >= 1) or a fraction of
        the visible tokens (float in (0, 1]); None = the default 6%. ``sink`` first
        tokens and ``window`` recent tokens (0 = the artifact's) are always attended.
        ``cache_f16``: cache rows in f16 (else f32).

        ``selector``: who picks the candidates, by kvq eval's names: "codebook" (the
        artifact's, default), "full", "oracle", "fier", "quest", "mass" (``tau``: its
        mass share, 0 = 0.9; ``fier_group``, ``quest_page``: 0 = 32, 16). The position
        mode and scoring query are the artifact's (kvq calibrate's choice, as kvq run
        applies it). ``measure``: each step also attends exactly over every visible token
        and sums kvq eval's quality figures (:meth:`Sequence.stats`; slow).

        ``kv_cache``: "f16" (default: the rows as ``cache_f16`` says, with the
        selection), "leankv", "pats" or "leankv+pats" (LeanKV over PATS-truncated rows,
        both kinds' settings; docs/kvcache.md), attended as ``selector`` says: "full" runs
        full attention over the compressed cache (budget, sink and window unused); any
        other selector (the default "codebook" included) runs retrieval over it as kvq
        run --kv does (the rerank and attention read the compressed rows), which needs
        the artifact's positions mode rope (wrope raises InvalidArgumentError naming
        positions rope). Set ``max_tokens`` to the sequence's length for PATS. Its settings where >= 0, else the artifact's profile:
        ``kv_alpha_h``, ``kv_alpha_l``, ``kv_window`` (LeanKV), ``kv_pats_schedule``
        ("old-heavy", "new-heavy", "middle-heavy" or 0..2), ``kv_pats_b_min``,
        ``kv_pats_b_max`` (PATS). A setting in neither raises InvalidArgumentError naming
        it. :attr:`Sequence.nbytes` is then the compressed cache's bytes, plus with a
        selection other than full the retrieval context's (selector data, positions, RoPE
        table: it keeps no rows of its own)."""
        p = _lib.lib().kvq_engine_seq_params_default()
        if budget is not None:
            if isinstance(budget, (int, np.integer)) and not isinstance(budget, bool):
                if budget < 1:
                    raise InvalidArgumentError(f"kvq.Engine.sequence: budget {budget}: a count must be >= 1")
                p.budget_tokens = int(budget)
            else:
                p.budget_tokens = 0
                p.budget_fraction = float(budget)
        if sink is not None:
            p.sink = int(sink)
        p.window = int(window)
        p.cache_f16 = 1 if cache_f16 else 0
        if max_tokens is not None:
            p.max_tokens = int(max_tokens)
        p.threads = int(threads)
        p.selector = _named(selector, SELECTORS, "selector")
        p.tau = float(tau)
        p.fier_group = int(fier_group)
        p.quest_page = int(quest_page)
        p.measure = 1 if measure else 0
        p.kv_cache = _named(kv_cache, KV_CACHES, "kv_cache")
        p.kv_alpha_h, p.kv_alpha_l = float(kv_alpha_h), float(kv_alpha_l)
        p.kv_window = int(kv_window)
        p.kv_pats_schedule = _named(kv_pats_schedule, PATS_SCHEDULES, "kv_pats_schedule")
        p.kv_pats_b_min, p.kv_pats_b_max = int(kv_pats_b_min), int(kv_pats_b_max)
        s = Sequence(self, p)
        self._seqs.add(s)
        return s

    def close(self) -> None:
        """Frees the engine (its sequences first)."""
        if self._h is None:
            return
        for s in list(self._seqs):
            s.close()
        _lib.lib().kvq_engine_close(self._h)
        self._h = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


def _rows(x: np.ndarray, shape: Tuple[int, ...], what: str) -> Tuple[np.ndarray, int]:
    a = np.asarray(x)
    if a.dtype == np.float16:
        dt = _F16
    else:
        a = a.astype(np.float32, copy=False)
        dt = _F32
    if tuple(a.shape) != shape:
        raise InvalidArgumentError(f"kvq.Sequence: {what} has shape {tuple(a.shape)}, expected {shape}")
    return np.ascontiguousarray(a), dt


class Sequence:
    """One sequence of an Engine (kvq_engine_seq): feed prompt rows with :meth:`append`,
    then one :meth:`decode` per layer and generated token. Vectors are pre-RoPE."""

    def __init__(self, engine: Engine, params: "_lib.SeqParamsC") -> None:
        self._h: Optional[ctypes.c_void_p] = None
        self.engine = engine
        self.params = params
        err = _lib.KvqErr()
        h = ctypes.c_void_p()
        _lib.check(_lib.lib().kvq_engine_seq_create(engine._handle(), ctypes.byref(params),
                                                   ctypes.byref(h), ctypes.byref(err)), err)
        self._h = h
        m = engine.model
        self._len = [0] * m.n_layers

    def _handle(self) -> ctypes.c_void_p:
        if self._h is None:
            raise InvalidArgumentError("kvq.Sequence: used after close()")
        return self._h

    def _layer(self, layer: int) -> int:
        n = self.engine.model.n_layers
        if not 0 <= int(layer) < n:
            raise InvalidArgumentError(f"kvq.Sequence: layer {layer} is outside [0, {n})")
        return int(layer)

    def length(self, layer: int = 0) -> int:
        """Tokens cached in a layer."""
        return self._len[self._layer(layer)]

    @property
    def nbytes(self) -> int:
        """Bytes the sequence holds for its KV (kvq_engine_seq_bytes): cached rows and
        codes; under a compressed kv_cache its bytes, plus with a selection the retrieval
        context's (codes, residuals, positions, RoPE table)."""
        return int(_lib.lib().kvq_engine_seq_bytes(self._handle()))

    def stats(self) -> Dict[str, float]:
        """kvq eval's statistics since the sequence was created (kept across
        :meth:`reset`; kvq_engine_seq_stats): the sums ``steps``, ``visible``,
        ``attended``, ``bytes_read``, ``bytes_full``, ``measured``, ``recall_topk``,
        ``recall_mass``, ``out_rel_err``, and kvq eval's row figures from them:
        ``attended_fraction``, ``kv_read_fraction`` (None without steps) and, with
        ``measure``, the means ``recall_topk_mean``, ``recall_mass_mean``,
        ``out_rel_err_mean`` (None without measured steps). One step is one (decode
        token, layer, KV head) with candidates beyond sinks and window."""
        st = _lib.EngineStatsC()
        _lib.lib().kvq_engine_seq_stats(self._handle(), ctypes.byref(st))
        out: Dict[str, float] = {f: getattr(st, f) for f, _ in _lib.EngineStatsC._fields_}
        n, m = st.steps, st.measured
        out["attended_fraction"] = st.attended / st.visible if st.visible > 0 else None  # type: ignore[assignment]
        out["kv_read_fraction"] = st.bytes_read / st.bytes_full if n else None  # type: ignore[assignment]
        for f in ("recall_topk", "recall_mass", "out_rel_err"):
            out[f + "_mean"] = getattr(st, f) / m if m else None  # type: ignore[assignment]
        return out

    def append(self, layer: int, k: np.ndarray, v: np.ndarray,
               pos: Optional[Seq[int]] = None) -> None:
        """Appends n prompt rows of a layer: k, v [n, n_kv_heads, head_dim] (float32 or
        float16), at positions ``pos`` (default: following the layer's cached tokens)."""
        layer = self._layer(layer)
        m = self.engine.model
        n = int(np.shape(k)[0]) if np.ndim(k) else 0
        kk, dt = _rows(k, (n, m.n_kv_heads, m.head_dim), "k")
        vv = np.ascontiguousarray(np.asarray(v, dtype=kk.dtype))
        if vv.shape != kk.shape:
            raise InvalidArgumentError(f"kvq.Sequence: v has shape {vv.shape}, expected {kk.shape}")
        p = np.arange(self._len[layer], self._len[layer] + n, dtype=np.int64) if pos is None \
            else np.ascontiguousarray(np.asarray(pos, dtype=np.int64))
        if p.shape != (n,):
            raise InvalidArgumentError(f"kvq.Sequence: pos has shape {p.shape}, expected ({n},)")
        err = _lib.KvqErr()
        _lib.check(_lib.lib().kvq_engine_seq_append(
            self._handle(), layer, n, p.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
            kk.ctypes.data, vv.ctypes.data, dt, ctypes.byref(err)), err)
        self._len[layer] += n

    def decode(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray,
               pos: Optional[int] = None) -> Tuple[np.ndarray, List[np.ndarray]]:
        """One decode step of one layer: appends the token's k, v ([n_kv_heads, head_dim])
        at ``pos`` (default: next) and attends q [n_heads, head_dim] over the layer's
        cache by retrieval. Returns (out [n_heads, head_dim] float32, selected): selected
        holds per KV head the candidate token indices the selector chose (ascending;
        sinks and window, always attended, not included; empty when every token was
        attended)."""
        layer = self._layer(layer)
        m = self.engine.model
        qq = np.ascontiguousarray(np.asarray(q, dtype=np.float32))
        if qq.shape != (m.n_heads, m.head_dim):
            raise InvalidArgumentError(f"kvq.Sequence: q has shape {qq.shape}, expected {(m.n_heads, m.head_dim)}")
        kk, dt = _rows(k, (m.n_kv_heads, m.head_dim), "k")
        vv = np.ascontiguousarray(np.asarray(v, dtype=kk.dtype))
        if vv.shape != kk.shape:
            raise InvalidArgumentError(f"kvq.Sequence: v has shape {vv.shape}, expected {kk.shape}")
        out = np.empty((m.n_heads, m.head_dim), dtype=np.float32)
        p = self._len[layer] if pos is None else int(pos)
        err = _lib.KvqErr()
        fp = ctypes.POINTER(ctypes.c_float)
        _lib.check(_lib.lib().kvq_engine_seq_decode(
            self._handle(), layer, p, qq.ctypes.data_as(fp), kk.ctypes.data, vv.ctypes.data, dt,
            out.ctypes.data_as(fp), ctypes.byref(err)), err)
        self._len[layer] += 1
        return out, [self._selection(layer, h) for h in range(m.n_kv_heads)]

    def _selection(self, layer: int, head: int) -> np.ndarray:
        n = ctypes.c_int64()
        ptr = _lib.lib().kvq_engine_seq_last_selection(self._handle(), layer, head, ctypes.byref(n))
        if not ptr or n.value <= 0:
            return np.zeros(0, dtype=np.int32)
        return np.ctypeslib.as_array(ptr, shape=(n.value,)).copy()

    def reset(self) -> None:
        """Forgets the tokens (the sequence can be reused)."""
        _lib.lib().kvq_engine_seq_reset(self._handle())
        self._len = [0] * self.engine.model.n_layers

    def close(self) -> None:
        if self._h is not None:
            _lib.lib().kvq_engine_seq_free(self._h)
            self._h = None

    def __enter__(self) -> "Sequence":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


__all__ = ["Engine", "Sequence", "LayerAttention", "SELECTORS", "KV_CACHES", "PATS_SCHEDULES", "KvqError"]
