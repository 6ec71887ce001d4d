"""kvq.hf.capture: pre-RoPE Q, K and V from an HF transformers causal LM, taken from the
model's own attention code, written as kvq's capture directory (docs/capture.md)."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from .. import __version__
from ..capture_dir import LayerAccumulator, write_capture
from ..corpus import documents, pack
from ..errors import InvalidArgumentError, UnsupportedError
from .model import describe_model, fingerprint


def half_to_interleaved(x: np.ndarray) -> np.ndarray:
    """RoPE pairs (i, i + d/2) -> (2i, 2i + 1) along the last axis."""
    d = x.shape[-1]
    return np.ascontiguousarray(np.stack([x[..., :d // 2], x[..., d // 2:]], axis=-1).reshape(x.shape))


class _Recorder:
    """Hooks that record, per layer, the q and k given to apply_rotary_pos_emb (pre-RoPE)
    and the v given to the attention function, for one forward at a time."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.layer = -1
        self.q: Dict[int, Any] = {}
        self.k: Dict[int, Any] = {}
        self.v: Dict[int, Any] = {}

    @contextlib.contextmanager
    def active(self) -> Iterator["_Recorder"]:
        from transformers import AttentionInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        base = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
        attns = [l.self_attn for l in base.layers]
        mod = sys.modules[type(attns[0]).__module__]
        if not hasattr(mod, "apply_rotary_pos_emb"):
            raise UnsupportedError(f"{type(attns[0]).__name__}: its module has no apply_rotary_pos_emb "
                                   "to take pre-RoPE vectors from", 400)
        orig_rope = getattr(mod, "apply_rotary_pos_emb")
        orig_impl = self.model.config._attn_implementation
        eager = getattr(mod, "eager_attention_forward", None)
        inner: Any = ALL_ATTENTION_FUNCTIONS.get_interface(orig_impl, eager) if orig_impl != "eager" else eager  # type: ignore[arg-type]
        rec = self

        def rope(q, k, *a, **kw):
            rec.q[rec.layer] = q.detach()
            rec.k[rec.layer] = k.detach()
            return orig_rope(q, k, *a, **kw)

        def attention(module, query, key, value, *a, **kw):
            rec.v[module.layer_idx] = value.detach()
            return inner(module, query, key, value, *a, **kw)

        def pre(module, args, kwargs=None):
            rec.layer = module.layer_idx

        AttentionInterface.register("kvq_capture", attention)
        # the masks of the model's own implementation (an unknown name would get none)
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
        AttentionMaskInterface.register("kvq_capture", ALL_MASK_ATTENTION_FUNCTIONS[orig_impl])
        handles = [a.register_forward_pre_hook(pre) for a in attns]
        setattr(mod, "apply_rotary_pos_emb", rope)
        self.model.config._attn_implementation = "kvq_capture"
        for a in attns:
            if hasattr(a, "config"):
                a.config._attn_implementation = "kvq_capture"
        try:
            yield self
        finally:
            setattr(mod, "apply_rotary_pos_emb", orig_rope)
            self.model.config._attn_implementation = orig_impl
            for a in attns:
                if hasattr(a, "config"):
                    a.config._attn_implementation = orig_impl
            for h in handles:
                h.remove()


def redact_paths(spec: str) -> str:
    """The corpus spec with every path cut to its last component, as kvq records it
    ("dir:/home/u/text/,uuid:4" -> "dir:text,uuid:4")."""
    out = []
    for item in spec.split(","):
        slash, colon = item.find("/"), item.find(":")
        if slash < 0:
            out.append(item)
            continue
        keep = colon + 1 if 0 <= colon < slash else 0
        path = item[keep:].rstrip("/")
        out.append(item[:keep] + (path.rsplit("/", 1)[-1] if path else ""))
    return ",".join(out)


def _encoder(tokenizer: Any, why: str = "") -> Callable[[bytes, int], List[int]]:
    def encode(text: bytes, part: int) -> List[int]:
        if tokenizer is None:
            raise InvalidArgumentError("capture: a text corpus needs a tokenizer (without one, "
                                       "only ids: corpora can be read)" + (f": {why}" if why else ""), 500)
        return list(tokenizer(text.decode("utf-8", "replace"), add_special_tokens=False)["input_ids"])
    return encode


def _bos_rule(tokenizer: Any, config: Any = None):
    """(bos or None, separator or None) as kvq: BOS when the tokenizer adds one, then BOS
    between documents; else EOS between them. Without a tokenizer, as kvq reads a model
    without a vocabulary: the config's BOS starts every sequence and separates."""
    if tokenizer is None:
        bos = getattr(config, "bos_token_id", None)
        return bos, bos
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    probe = tokenizer("a")["input_ids"]
    add_bos = bos is not None and len(probe) > 0 and probe[0] == bos
    if add_bos:
        return bos, bos
    return None, eos


def capture(model: Any, tokenizer: Any, corpus: str, out_dir: str, seq_len: int = 256,
            max_tokens: int = 0, layers: Optional[Sequence[int]] = None, dtype: str = "f16",
            seed: int = 0, source: Optional[Dict[str, str]] = None, force: bool = False,
            has_values: bool = True, progress: bool = False,
            sequences: Optional[Sequence[Sequence[int]]] = None) -> Dict[str, Any]:
    """Runs ``model`` (an HF transformers causal LM, on whatever device it is) over the
    corpus ``corpus`` (a `kvq capture` spec: file:, dir:, jsonl:, ids:, uuid:N, ...;
    tokenized by ``tokenizer``, cut into sequences of ``seq_len`` tokens as kvq does) and
    writes kvq's capture directory ``out_dir``: per layer the pre-RoPE q, k and v the
    model's own attention computed (f32 states stored as ``dtype``), the query moments,
    the model description with its weight fingerprint, and the corpus hash. ``source``
    is what :func:`kvq.hf.load` returned (file name and gguf|hf). ``sequences`` (token
    ids) replaces the corpus when given. Returns the capture.json object written.

    Raises UnsupportedError naming the architecture for a model it cannot capture
    correctly; nothing is written on any error."""
    import torch

    describe_model(model, source)  # refuses what it cannot capture, before any work
    fp = fingerprint(model)
    desc = describe_model(model, source, fp)
    n_layers = desc["n_layers"]
    want = list(range(n_layers)) if layers is None else sorted(set(int(l) for l in layers))
    if any(l < 0 or l >= n_layers for l in want):
        raise InvalidArgumentError(f"capture: layers {want} outside [0, {n_layers})", 500)
    if seq_len < 2:
        raise InvalidArgumentError(f"capture: seq_len {seq_len} is less than 2", 500)
    if sequences is not None:
        seqs = [np.asarray(s, dtype=np.int32) for s in sequences]
        cinfo = {"spec": redact_paths(corpus), "seed": int(seed), "hash": "0" * 16, "n_documents": len(seqs)}
    else:
        bos, sep = _bos_rule(tokenizer, model.config)
        packed = pack(documents(corpus, seed), _encoder(tokenizer, (source or {}).get("tokenizer_error", "")), seq_len, max_tokens, bos, sep,
                      n_vocab=desc["vocab_size"])
        seqs = packed.sequences
        cinfo = {"spec": redact_paths(corpus), "seed": int(seed), "hash": packed.hash_hex, "n_documents": packed.n_docs}
    if not seqs:
        raise InvalidArgumentError(f"{corpus}: the corpus has no tokens", 500)
    interleave = desc["rope"]["layout"] == "interleaved"
    acc = {l: LayerAccumulator(desc["n_heads"], desc["head_dim"], dtype) for l in want}
    dev = next(model.parameters()).device
    rec = _Recorder(model)
    it = seqs
    if progress:
        try:
            from tqdm.auto import tqdm
            it = tqdm(seqs, desc="capture", unit="seq")
        except ImportError:
            pass
    with rec.active(), torch.no_grad():
        for s in it:
            rec.q.clear()
            rec.k.clear()
            rec.v.clear()
            ids = torch.as_tensor(np.asarray(s, dtype=np.int64), device=dev)[None]
            model(input_ids=ids, use_cache=False)
            for l in want:
                if l not in rec.q or l not in rec.v:
                    raise UnsupportedError(f"{type(model).__name__}: layer {l}'s attention did not go "
                                           "through apply_rotary_pos_emb and the attention interface; "
                                           "it cannot be captured", 400)
                # [1, heads, n, d] -> [n, heads, d]
                q, k, v = (x[0].transpose(0, 1).float().cpu().numpy() for x in (rec.q[l], rec.k[l], rec.v[l]))
                if interleave:
                    q, k = half_to_interleaved(q), half_to_interleaved(k)
                acc[l].add_sequence(q, k, v if has_values else None)
    tool = f"kvq-python {__version__}"
    write_capture(out_dir, desc, cinfo, seq_len, seqs, want, acc, dtype, tool, has_values, force)
    import json
    import os
    with open(os.path.join(out_dir, "capture.json")) as f:
        return json.load(f)
