"""ModelSpec: a model's attention shape, RoPE and weight fingerprint (kvq_engine_model)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional

from .errors import FormatError


@dataclass
class ModelSpec:
    """What the engine and the artifact checks know of a model.

    ``rope_interleaved``: True for RoPE pairs (2i, 2i+1) (GGUF llama rows), False for
    pairs (i, i + d/2) (HF checkpoints, GGUF qwen2). ``fingerprint``: the weights' 32 hex
    digits (``kvq inspect MODEL``, kvq.fingerprint) or None when unknown."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_base: float = 10000.0
    rope_interleaved: bool = False
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_pos: float = 8192.0
    fingerprint: Optional[str] = None
    architecture: str = "llama"
    extra: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, str], label: str = "artifact") -> "ModelSpec":
        """From an artifact's or capture layer's ``model.*`` metadata keys."""
        def get(key: str, conv, default=None, required: bool = True):
            v = meta.get("model." + key)
            if v is None:
                if required:
                    raise FormatError(f"{label}: metadata model.{key} missing")
                return default
            try:
                return conv(v)
            except ValueError:
                raise FormatError(f"{label}: metadata model.{key} = {v!r} is malformed") from None
        return cls(
            n_layers=get("n_layers", int), n_heads=get("n_heads", int),
            n_kv_heads=get("n_kv_heads", int), head_dim=get("head_dim", int),
            rope_base=get("rope.base", float),
            rope_interleaved=get("rope.layout", str, "interleaved") == "interleaved",
            rope_scaling=get("rope.scaling", str, "none", False),
            rope_factor=get("rope.factor", float, 1.0, False),
            rope_low_freq_factor=get("rope.low_freq_factor", float, 1.0, False),
            rope_high_freq_factor=get("rope.high_freq_factor", float, 4.0, False),
            rope_original_max_pos=get("rope.original_max_pos", float, 8192.0, False),
            fingerprint=get("fingerprint", str, None, False) or None,
            architecture=get("architecture", str, "llama", False),
        )
