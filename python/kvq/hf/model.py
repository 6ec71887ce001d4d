"""The model side of kvq.hf: loading, the description kvq records (docs/capture.md
"capture.json" model object) and the weight fingerprint (docs/format.md)."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ..errors import UnsupportedError
from ..fingerprint import FingerprintHasher

# model_type -> what kvq records as the architecture. These run their attention through
# the module-level apply_rotary_pos_emb with one RoPE for every layer.
SUPPORTED = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
             "gemma2": "gemma2", "phi3": "phi3"}
_WHY_NOT = {
    "gemma3": "its local and global layers use different RoPE bases (kvq records one)",
    "gemma3_text": "its local and global layers use different RoPE bases (kvq records one)",
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
        tok = AutoTokenizer.from_pretrained(d, **kw)
    m: Any = AutoModelForCausalLM.from_pretrained(d, dtype=td, **kw)
    m = m.to(device)
    m.eval()
    return m, tok, src


def _rope(cfg: Any) -> Dict[str, Any]:
    rp = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(rp, dict) and "full_attention" in rp:  # per-layer-type parameters
        vals = list(rp.values())
        if any(v != vals[0] for v in vals):
            raise UnsupportedError(f"{cfg.model_type}: layers with different RoPE parameters {rp} "
                                   "(kvq records one RoPE for every layer)", 400)
        rp = vals[0]
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


def describe_model(model: Any, source: Optional[Dict[str, str]] = None,
                   fingerprint_hex: Optional[str] = None) -> Dict[str, Any]:
    """The ``model`` object of capture.json for an HF model (UnsupportedError naming the
    architecture for one kvq cannot capture correctly). A llama loaded from a GGUF file
    is described (and captured) in that file's interleaved pair layout, as kvq does."""
    cfg = model.config
    mt = getattr(cfg, "model_type", "?")
    if mt not in SUPPORTED:
        why = _WHY_NOT.get(mt, "not a llama-family architecture this package has verified")
        raise UnsupportedError(f"architecture {mt!r} ({type(model).__name__}) cannot be captured: {why}; "
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
    h = FingerprintHasher()
    h.words([0x4B565146, 1, int(cfg.num_hidden_layers), n_heads, n_kv, d])
    h.matrix(_np(base.embed_tokens.weight))
    for layer in base.layers:
        a = layer.self_attn
        h.matrix(_np(layer.input_layernorm.weight).ravel())
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
