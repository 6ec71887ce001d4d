"""kvq with HF transformers (needs torch and transformers; accelerate and gguf to load
GGUF files): :func:`capture` writes kvq's capture directory from any supported causal
LM, :func:`load` loads an HF directory or a GGUF file, :func:`retrieval` makes
generate() decode by kvq retrieval (the C engine or the torch back end), :func:`evaluate`
gives kvq eval's retrieval perplexity rows, :func:`describe_model` and
:func:`fingerprint` give the model description and weight fingerprint kvq records."""
from .capture import capture
from .eval import evaluate
from .model import SUPPORTED, describe_model, fingerprint, load
from .retrieval import Retrieval, engine_model, retrieval

__all__ = ["capture", "evaluate", "describe_model", "engine_model", "fingerprint", "load", "retrieval", "Retrieval",
           "SUPPORTED"]
