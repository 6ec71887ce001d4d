#!/usr/bin/env python3
"""hf_generate.py - greedy generation in HF transformers with kvq retrieval decoding.

    python3 examples/hf_generate.py MODEL ARTIFACT "PROMPT" [N] [engine|torch]

The prompt is attended densely; every generated token attends to the sinks, the recent
window and the tokens the artifact's codebooks select (6% of the cache) through the C
engine (kvq/engine.h, CPU) or the pure-torch back end (kvq.torch_engine: the same
selection, on the model's device: CUDA when available). Prints the text with retrieval
and with dense attention, and the tokens selected in layer 0 at the last step.
"""
import sys

import torch

import kvq.hf


def main() -> int:
    if len(sys.argv) not in (4, 5, 6):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    model_path, artifact, prompt = sys.argv[1:4]
    n = int(sys.argv[4]) if len(sys.argv) >= 5 else 32
    backend = sys.argv[5] if len(sys.argv) == 6 else "engine"
    device = "cuda" if backend == "torch" and torch.cuda.is_available() else "cpu"
    model, tok, src = kvq.hf.load(model_path, device=device)
    ids = tok(prompt, return_tensors="pt")["input_ids"].to(device)
    with torch.no_grad():
        with kvq.hf.retrieval(model, artifact, budget=0.06, source=src, backend=backend) as r:
            out = model.generate(ids, max_new_tokens=n, do_sample=False)
            selected = r.selected.get(0)
        dense = model.generate(ids, max_new_tokens=n, do_sample=False)
    print("retrieval:", tok.decode(out[0], skip_special_tokens=True))
    print("dense:    ", tok.decode(dense[0], skip_special_tokens=True))
    if selected is not None:
        print("layer 0, last step, selected per KV head:", [s.tolist() for s in selected])
    return 0


if __name__ == "__main__":
    sys.exit(main())
