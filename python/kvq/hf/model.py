"""The model side of kvq.hf: loading, the description kvq records (docs/capture.md
"capture.json" model object) and the weight fingerprint (docs/format.md)."""
from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..errors import UnsupportedError
from ..fingerprint import FingerprintHasher

# model_type -> what kvq records as the architecture. These run their attention through
# the module-level apply_rotary_pos_emb with one RoPE for every layer.
SUPPORTED = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
             "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3"}
_WHY_NOT = {
    "gemma3": "the multimodal Gemma3 model; load its text model (Gemma3ForCausalLM, model_type "
              "gemma3_text)",
    "phi": "partial rotary embeddings (kvq rotates the whole head)",
    "gpt2": "learned absolute positions, no RoPE",
    "gpt_neox": "partial rotary embeddings and a fused QKV kvq does not split",
    "falcon": "not a llama-family attention",
    "mixtral": "not verified (mixture of experts)",
}


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load(model: str, device: str = "cpu", dtype: str = "float32") -> Tuple[Any, Any, Dict[str, str]]:
    """Loads a causal LM and its tokenizer from an HF directory or a GGUF file (needs the
    accelerate and gguf packages). Returns (model, tokenizer, source): tokenizer None for
a directory without tokenizer files (then only ids: corpora can be read); source says
    {"path": file or directory name, "source": "gguf"|"hf", "file": the full path}."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    td = {"float32": torch.float32, "f32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "f16": torch.float16}.get(dtype)
    if td is None:
        raise ValueError(f"--torch-dtype {dtype!r}: expected float32, bfloat16 or float16")
    if not os.path.exists(model):
        raise FileNotFoundError(f"{model}: no such file or directory")
    kw: Dict[str, Any] = {}
    if os.path.isfile(model):
        if not model.endswith(".gguf"):
            raise ValueError(f"{model}: a model is an HF directory or a .gguf file")
        d, f = os.path.split(os.path.abspath(model))
        kw["gguf_file"] = f
        src = {"path": f, "source": "gguf", "file": os.path.abspath(model)}
    else:
        d = model
        src = {"path": os.path.basename(os.path.normpath(os.path.abspath(model))), "source": "hf",
               "file": os.path.abspath(model)}
    tok = None  # without tokenizer files: ids: corpora only, as kvq reads such a model
    if kw or any(os.path.exists(os.path.join(d, f)) for f in _TOKENIZER_FILES):
        try:
            tok = AutoTokenizer.from_pretrained(d, **kw)
        except (ValueError, OSError, ImportError) as e:  # ids: corpora still read; a text one says why
            src["tokenizer_error"] = f"{model}: its tokenizer does not load ({e})"
    m: Any = AutoModelForCausalLM.from_pretrained(d, dtype=td, **kw)
    m = m.to(device)
    m.eval()
    return m, tok, src


def _rope(cfg: Any) -> Dict[str, Any]:
    """model.rope: the RoPE of the global (full-attention) layers."""
    rp = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(rp, dict) and ("full_attention" in rp or "sliding_attention" in rp):
        rp = rp.get("full_attention") or {}  # per layer type (gemma3): the local one is attention's
    theta = rp.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    kind = rp.get("rope_type", rp.get("type", "default")) or "default"
    out = {"base": float(theta), "layout": "half", "scaling": "none", "factor": 1.0,
           "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_pos": 8192.0}
    if kind == "default":
        return out
    if kind == "linear":
        out.update(scaling="linear", factor=float(rp["factor"]))
        return out
    if kind == "llama3":
        out.update(scaling="llama3", factor=float(rp["factor"]),
                   low_freq_factor=float(rp["low_freq_factor"]),
                   high_freq_factor=float(rp["high_freq_factor"]),
                   original_max_pos=float(rp["original_max_position_embeddings"]))
        return out
    raise UnsupportedError(f"{cfg.model_type}: RoPE scaling {kind!r} is not one kvq implements "
                           "(none, linear, llama3)", 400)


def _sliding_from(mt: str, types: Optional[List[str]], cfg: Any) -> Tuple[int, bool]:
    """(first sliding layer, any sliding layer) for the llama family: a layer_types list
    must be full attention then sliding attention, as kvq reads it."""
    if not types:
        return (int(getattr(cfg, "max_window_layers", 28) or 0) if mt in ("qwen2", "qwen3") else 0), True
    first = -1
    for i, t in enumerate(types):
        if t not in ("sliding_attention", "full_attention"):
            raise UnsupportedError(f"{mt}: layer_types[{i}] {t!r} is not full_attention or "
                                   "sliding_attention", 400)
        if t == "sliding_attention" and first < 0:
            first = i
        if t == "full_attention" and first >= 0:
            raise UnsupportedError(f"{mt}: layer_types: full attention after sliding attention "
                                   f"(layer {i}) is not supported", 400)
    return max(first, 0), first >= 0


def _gemma_period(mt: str, types: Optional[List[str]], n_layers: int, cfg: Any) -> int:
    """The sliding period P of gemma (layer l slides iff (l + 1) % P != 0)."""
    if not types:
        return 2 if mt == "gemma2" else int(getattr(cfg, "sliding_window_pattern", 6) or 6)
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    period = full[0] + 1 if full else n_layers + 1
    for i, t in enumerate(types):
        if (t == "full_attention") != ((i + 1) % period == 0) or t not in ("sliding_attention",
                                                                            "full_attention"):
            raise UnsupportedError(f"{mt}: layer_types[{i}]: the layers do not repeat one "
                                   f"sliding/full pattern (period {period})", 400)
    return period


def attention(cfg: Any, rope: Dict[str, Any], n_layers: int, head_dim: int) -> Dict[str, Any]:
    """model.attention of capture.json version 2 (kvq_model_attn, docs/capture.md) from an
    HF config, as transformers attends it: sliding windows and which layers have them, the
    local RoPE base (gemma3), the score scale and softcap (gemma), and the per-layer list."""
    mt = cfg.model_type
    w = int(getattr(cfg, "sliding_window", None) or 0)
    types = getattr(cfg, "layer_types", None)
    a: Dict[str, Any] = {"sliding_window": 0, "sliding_from": 0, "sliding_period": 0,
                         "rope_local_base": 0.0, "scale": 0.0, "softcap": 0.0}
    if mt.startswith("gemma"):
        qpas = float(getattr(cfg, "query_pre_attn_scalar", None) or head_dim)
        a["scale"] = 1.0 / math.sqrt(qpas)
        a["softcap"] = float(getattr(cfg, "attn_logit_softcapping", None) or 0.0)
        if w > 0:
            a["sliding_window"] = w
            a["sliding_period"] = _gemma_period(mt, types, n_layers, cfg)
            if mt != "gemma2":
                rp = getattr(cfg, "rope_parameters", None) or {}
                local = rp.get("sliding_attention") if isinstance(rp, dict) else None
                base = getattr(cfg, "rope_local_base_freq", None) or 10000.0
                if local:
                    if (local.get("rope_type") or "default") != "default":
                        raise UnsupportedError(f"{mt}: scaled RoPE on sliding-window layers", 400)
                    base = local.get("rope_theta", base)
                a["rope_local_base"] = float(base)
    else:
        use = {"qwen2": bool(getattr(cfg, "use_sliding_window", False)),
               "qwen3": bool(getattr(cfg, "use_sliding_window", False)),
               "mistral": getattr(cfg, "use_sliding_window", True) is not False,
               "phi3": True}.get(mt, False)
        if w > 0 and use:
            first, any_sliding = _sliding_from(mt, types, cfg)
            if any_sliding:
                a["sliding_window"], a["sliding_from"] = w, first
    layers = []
    for l in range(n_layers):
        slides = a["sliding_window"] > 0 and ((l + 1) % a["sliding_period"] != 0 if a["sliding_period"] > 0
                                              else l >= a["sliding_from"])
        local = slides and a["rope_local_base"] > 0
        layers.append({"rope_base": a["rope_local_base"] if local else rope["base"],
                       "rope_scaling": "none" if local else rope["scaling"],
                       "rope_factor": 1.0 if local else rope["factor"], "rope": True,
                       "scale": a["scale"] if a["scale"] > 0 else 1.0 / math.sqrt(head_dim),
                       "softcap": a["softcap"], "window": a["sliding_window"] if slides else 0})
    a["layers"] = layers
    return a


def describe_model(model: Any, source: Optional[Dict[str, str]] = None,
                   fingerprint_hex: Optional[str] = None) -> Dict[str, Any]:
    """The ``model`` object of capture.json for an HF model (UnsupportedError naming the
    architecture for one kvq cannot capture correctly). A llama loaded from a GGUF file
    is described (and captured) in that file's interleaved pair layout, as kvq does."""
    cfg = model.config
    mt = getattr(cfg, "model_type", "?")
    if mt not in SUPPORTED:
        why = _WHY_NOT.get(mt, "not a llama-family architecture this package has verified")
        raise UnsupportedError(f"architecture {mt!r} ({type(model).__name__}) is not supported by kvq "
                               f"(capture, retrieval): {why}; "
                               f"supported: {', '.join(sorted(SUPPORTED))}", 400)
    if float(getattr(cfg, "partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise UnsupportedError(f"architecture {mt!r}: partial_rotary_factor "
                               f"{cfg.partial_rotary_factor} (kvq rotates the whole head)", 400)
    n_heads = int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)
    rope = _rope(cfg)
    src = source or {"path": os.path.basename(str(getattr(cfg, "_name_or_path", "") or "model")),
                     "source": "hf"}
    if src["source"] == "gguf" and mt == "llama":
        rope["layout"] = "interleaved"  # llama.cpp's converter permutes llama Q/K rows
    name = str(getattr(cfg, "_model_name_or_path", "") or "")  # GGUF general.name
    if src["source"] != "gguf" or not name or os.sep in name:
        name = src["path"]
    out: Dict[str, Any] = {"path": src["path"], "source": src["source"], "name": name}
    if fingerprint_hex:
        out["fingerprint"] = fingerprint_hex
    out.update({
        "architecture": SUPPORTED[mt], "n_layers": int(cfg.num_hidden_layers),
        "dim": int(cfg.hidden_size), "hidden_dim": int(cfg.intermediate_size),
        "n_heads": n_heads, "n_kv_heads": int(getattr(cfg, "num_key_value_heads", None) or n_heads),
        "head_dim": head_dim, "vocab_size": int(cfg.vocab_size),
        "context_length": int(getattr(cfg, "max_position_embeddings", 0) or 0),
        "norm_eps": float(getattr(cfg, "rms_norm_eps", getattr(cfg, "layer_norm_eps", 1e-5))),
        "rope": rope,
    })
    out["attention"] = attention(cfg, rope, out["n_layers"], head_dim)
    return out


def _np(t: Any) -> np.ndarray:
    return t.detach().to("cpu").float().numpy()


def fingerprint(model: Any) -> str:
    """The weight fingerprint of docs/format.md from the model's torch tensors (HF row
    order already): for a GGUF file it equals what `kvq inspect FILE` prints."""
    cfg = model.config
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    n_heads = int(cfg.num_attention_heads)
    d = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)
    n_kv = int(getattr(cfg, "num_key_value_heads", None) or n_heads)
    gemma = str(getattr(cfg, "model_type", "")).startswith("gemma")
    h = FingerprintHasher()
    h.words([0x4B565146, 1, int(cfg.num_hidden_layers), n_heads, n_kv, d])
    h.matrix(_np(base.embed_tokens.weight))
    for layer in base.layers:
        a = layer.self_attn
        norm = _np(layer.input_layernorm.weight).ravel()
        if gemma:  # Gemma's RMSNorm scales by (1 + w): the values are 1 + w, as a GGUF file stores them
            norm = norm + np.float32(1.0)
        h.matrix(norm)
        if hasattr(a, "qkv_proj"):  # phi3: fused rows q, k, v
            w = _np(a.qkv_proj.weight)
            b = _np(a.qkv_proj.bias) if a.qkv_proj.bias is not None else None
            parts = [(w[:n_heads * d], None if b is None else b[:n_heads * d]),
                     (w[n_heads * d:(n_heads + n_kv) * d], None if b is None else b[n_heads * d:(n_heads + n_kv) * d])]
        else:
            parts = [(_np(p.weight), _np(p.bias) if p.bias is not None else None) for p in (a.q_proj, a.k_proj)]
        for w, b in parts:
            h.matrix(w)
            if b is not None:
                h.matrix(b.ravel())
    return h.digest()
