"""Retrieval decoding inside HF transformers with kvq's C engine (kvq/engine.h) or its
pure-torch back end (kvq.torch_engine: the same selection on any torch device).

    with kvq.hf.retrieval(model, "model.kvq", budget=0.06) as r:
        out = model.generate(ids, max_new_tokens=64, do_sample=False)
        r.selected[layer]      # the last step's selected token indices per KV head

While active, every attention module of the model runs through an attention function
("kvq_retrieval", transformers.AttentionInterface): a chunk of more than one query
(the prefill) is attended densely by the model's own implementation and its pre-RoPE
keys and values are appended to a kvq engine sequence; a single-query step (decode) is
attended by the engine: sinks, recent window and the artifact's codebook selection,
exact attention over them. Pre-RoPE q and k come from the module's own
apply_rotary_pos_emb, wrapped while active. Batch size 1; the C engine takes CPU
arrays (other devices are copied), the torch back end stays on the model's device. A new sequence starts whenever a forward begins at
position 0 (a new generate() call)."""
from __future__ import annotations

import contextlib
import math
import sys
from typing import Any, Dict, Iterator, List, Optional, Union

import numpy as np

from ..artifact import Artifact
from ..engine import Engine
from ..errors import InvalidArgumentError, UnsupportedError
from ..model import ModelSpec

#: the compressed KV cache's settings kvq.Engine.sequence takes (forwarded by retrieval())
KV_OPTIONS = ("kv_alpha_h", "kv_alpha_l", "kv_window", "kv_pats_schedule", "kv_pats_b_min", "kv_pats_b_max")
from .model import describe_model, fingerprint


def engine_model(model: Any, source: Optional[Dict[str, str]] = None,
                 fingerprint_hex: Optional[str] = None) -> ModelSpec:
    """The ModelSpec of an HF model (the layout of its source: a GGUF llama interleaved)."""
    d = describe_model(model, source, fingerprint_hex)
    r = d["rope"]
    return ModelSpec(n_layers=d["n_layers"], n_heads=d["n_heads"], n_kv_heads=d["n_kv_heads"],
                     head_dim=d["head_dim"], rope_base=r["base"],
                     rope_interleaved=r["layout"] == "interleaved", rope_scaling=r["scaling"],
                     rope_factor=r["factor"], rope_low_freq_factor=r["low_freq_factor"],
                     rope_high_freq_factor=r["high_freq_factor"],
                     rope_original_max_pos=r["original_max_pos"], fingerprint=fingerprint_hex,
                     architecture=d["architecture"])


class Retrieval:
    """The state of retrieval decoding for one model (see the module's docstring)."""

    def __init__(self, model: Any, artifact: str, budget: Union[int, float] = 0.06,
                 source: Optional[Dict[str, str]] = None, accept_model_mismatch: bool = False,
                 sink: Optional[int] = None, window: int = 0, threads: int = 1,
                 backend: str = "engine", selector: str = "codebook", kv_cache: str = "f16",
                 max_tokens: Optional[int] = None, **kv: Any) -> None:
        cfg = model.config
        bad = sorted(set(kv) - set(KV_OPTIONS))
        if bad:
            raise InvalidArgumentError(f"kvq retrieval: unknown option {bad[0]!r} (the kv options are "
                                       f"{', '.join(KV_OPTIONS)})", 500)
        if backend == "torch" and (kv_cache != "f16" or kv or selector != "codebook"):
            raise UnsupportedError("kvq retrieval: the torch back end runs the codebook selector over f16 "
                                   "rows only (selector and kv_cache need backend 'engine')", 400)
        desc = describe_model(model, source)
        att = desc["attention"]
        windowed = [l for l, e in enumerate(att["layers"]) if e["window"] > 0]
        if windowed:
            raise UnsupportedError(f"{desc['architecture']}: sliding-window attention ({att['sliding_window']} "
                                   f"tokens) on layers {windowed}: the kvq engine selects over every "
                                   "cached token and would attend outside the window", 400)
        if att["softcap"] or getattr(cfg, "final_logit_softcapping", None):
            raise UnsupportedError(f"{desc['architecture']}: attention logit soft-capping is not what "
                                   "the kvq engine computes", 400)
        if att["scale"] and abs(att["scale"] * math.sqrt(desc["head_dim"]) - 1) > 1e-12:
            raise UnsupportedError(f"{desc['architecture']}: attention scale {att['scale']} is not "
                                   "1/sqrt(head_dim), what the kvq engine computes", 400)
        self.model = model
        self.fp = fingerprint(model)
        self.spec = engine_model(model, source, self.fp)
        self.interleave = self.spec.rope_interleaved
        self.backend = backend
        self.engine: Any
        if backend == "engine":
            self.engine = Engine(artifact, self.spec, accept_model_mismatch=accept_model_mismatch)
        elif backend == "torch":
            from ..torch_engine import TorchEngine
            dev = next(model.parameters()).device
            self.engine = TorchEngine(artifact, self.spec, device=dev, accept_model_mismatch=accept_model_mismatch)
        else:
            raise InvalidArgumentError(f"kvq retrieval: backend {backend!r} is not engine or torch", 500)
        self.seq_args: Dict[str, Any] = dict(budget=budget, sink=sink, window=window, threads=threads)
        if backend == "engine":
            self.seq_args.update(selector=selector, kv_cache=kv_cache, max_tokens=max_tokens, **kv)
        self.seq: Any = self.engine.sequence(**self.seq_args)
        self.layer = -1
        self.pre: Dict[int, Any] = {}
        self._sel: Dict[int, List[Any]] = {}
        self.steps = 0
        # kvq eval's step statistics: (layer, KV head) steps with candidates beyond sinks
        # and window, the tokens they saw and attended
        self.stats: Dict[str, int] = {"steps": 0, "visible": 0, "attended": 0}
        self.sink = 4 if sink is None else int(sink)
        self.window = window or (self.engine.window if backend == "torch" else Artifact(artifact).wrope[0])

    @property
    def selected(self) -> Dict[int, List[np.ndarray]]:
        """Per layer, the last decode step's selected token indices per KV head (int32)."""
        return {l: [np.asarray(x.cpu().numpy() if hasattr(x, "cpu") else x, dtype=np.int32) for x in sel]
                for l, sel in self._sel.items()}

    def _rows(self, x: Any, rope: bool = True) -> Any:
        """[1, heads, n, d] torch -> [n, heads, d] float32 (numpy for the C engine, a
        torch tensor on the model's device for the torch back end); q and k (rope) in the
        engine's pair layout."""
        import torch
        a = x[0].transpose(0, 1).detach().to(dtype=torch.float32)
        if rope and self.interleave:
            d = a.shape[-1]
            a = torch.stack([a[..., :d // 2], a[..., d // 2:]], dim=-1).reshape(a.shape)
        if self.backend == "torch":
            return a.contiguous()
        return np.ascontiguousarray(a.cpu().numpy())

    def attend(self, module: Any, query: Any, key: Any, value: Any, mask: Any, inner: Any,
               *a: Any, **kw: Any):
        import torch
        layer = module.layer_idx
        if query.shape[0] != 1:
            raise InvalidArgumentError(f"kvq retrieval: batch size {query.shape[0]}; only 1 is supported", 500)
        scale = kw.get("scaling", getattr(module, "scaling", None))
        if scale is not None and abs(scale * self.spec.head_dim ** 0.5 - 1) > 1e-6:
            raise UnsupportedError(f"{type(module).__name__}: attention scale {scale} is not "
                                   "1/sqrt(head_dim), what the kvq engine computes", 400)
        q_pre, k_pre = self.pre.pop(layer)
        n = q_pre.shape[2]
        v_new = value[:, :, -n:]  # the cache has appended this chunk's rows
        if layer == 0 and self.seq.length(0) > 0 and key.shape[2] == n:
            self.seq.reset()  # a forward from position 0: a new sequence
        if n > 1 or self.seq.length(layer) == 0:
            out = inner(module, query, key, value, mask, *a, **kw)
            self.seq.append(layer, self._rows(k_pre), self._rows(v_new, rope=False))
            return out
        o, sel = self.seq.decode(layer, self._rows(q_pre)[0], self._rows(k_pre)[0],
                                 self._rows(v_new, rope=False)[0])
        self._sel[layer] = sel  # read back (a device sync for the torch back end) only when asked
        if layer == self.spec.n_layers - 1:
            self.steps += 1
        nv = self.seq.length(layer)
        s_end = min(self.sink, nv)
        w_beg = max(nv - self.window, s_end)
        if w_beg > s_end:
            self.stats["steps"] += len(sel)
            self.stats["visible"] += nv * len(sel)
            self.stats["attended"] += sum(s_end + len(x) + nv - w_beg for x in sel)
        res = torch.as_tensor(o).to(query.device, query.dtype)  # [heads, d]
        return res.view(1, 1, *res.shape), None

    def close(self) -> None:
        self.seq.close()
        self.engine.close()


@contextlib.contextmanager
def retrieval(model: Any, artifact: str, budget: Union[int, float] = 0.06,
              source: Optional[Dict[str, str]] = None, accept_model_mismatch: bool = False,
              sink: Optional[int] = None, window: int = 0, threads: int = 1,
              backend: str = "engine", selector: str = "codebook", kv_cache: str = "f16",
              max_tokens: Optional[int] = None, **kv: Any) -> Iterator[Retrieval]:
    """Makes the model attend by kvq retrieval at each single-token step while active (a
    context manager yielding the Retrieval state). ``budget``: a count or a fraction of
    the visible tokens (default 6%); ``source`` from kvq.hf.load; ``backend`` "engine"
    (the C engine, CPU) or "torch" (kvq.torch_engine on the model's device, the same
    selection).

    With the C engine, ``selector`` (kvq eval's names, default "codebook"; "full" attends
    every token) and a compressed KV cache: ``kv_cache`` "f16" (default), "leankv",
    "pats" or "leankv+pats" with its settings ``kv_alpha_h``, ``kv_alpha_l``,
    ``kv_window``, ``kv_pats_schedule``, ``kv_pats_b_min``, ``kv_pats_b_max`` (default:
    the artifact's profile) and ``max_tokens`` (the sequence's length, over which PATS
    lays its schedule), as :meth:`kvq.Engine.sequence` takes them: selector "full" runs
    full attention over the compressed cache, any other retrieval over it (a rope
    artifact). The prompt's rows are appended as the engine's prompt rows (they enter
    the compressed cache as generated tokens do). ``r.seq.nbytes`` is the cache's size.
    Raises MismatchError when
    the artifact was made for other weights or another shape, UnsupportedError for a model
    the engine cannot reproduce (sliding windows, soft-capping, another attention scale)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    r = Retrieval(model, artifact, budget, source, accept_model_mismatch, sink, window, threads, backend,
                  selector, kv_cache, max_tokens, **kv)
    base = model.get_decoder()
    attns = [l.self_attn for l in base.layers]
    mod = sys.modules[type(attns[0]).__module__]
    orig_rope = getattr(mod, "apply_rotary_pos_emb")
    orig_impl = model.config._attn_implementation
    eager = getattr(mod, "eager_attention_forward", None)
    inner: Any = ALL_ATTENTION_FUNCTIONS.get_interface(orig_impl, eager) if orig_impl != "eager" else eager  # type: ignore[arg-type]

    def rope(q, k, *a, **kw):
        r.pre[r.layer] = (q.detach(), k.detach())
        return orig_rope(q, k, *a, **kw)

    def attention(module, query, key, value, mask, *a, **kw):
        return r.attend(module, query, key, value, mask, inner, *a, **kw)

    def pre(module, args, kwargs=None):
        r.layer = module.layer_idx

    AttentionInterface.register("kvq_retrieval", attention)
    AttentionMaskInterface.register("kvq_retrieval", ALL_MASK_ATTENTION_FUNCTIONS[orig_impl])
    handles = [a.register_forward_pre_hook(pre) for a in attns]
    setattr(mod, "apply_rotary_pos_emb", rope)
    model.config._attn_implementation = "kvq_retrieval"
    try:
        yield r
    finally:
        setattr(mod, "apply_rotary_pos_emb", orig_rope)
        model.config._attn_implementation = orig_impl
        for h in handles:
            h.remove()
        r.close()
