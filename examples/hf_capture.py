#!/usr/bin/env python3
"""hf_capture.py - calibrate kvq codebooks for an HF transformers model, from Python.

    python3 examples/hf_capture.py MODEL CORPUS OUT_DIR

MODEL is an HF directory or a GGUF file (transformers loads it with gguf_file=; needs
accelerate and gguf), CORPUS a `kvq capture` spec (uuid:64,file:a.txt, ...). Writes
OUT_DIR/capture (kvq's capture directory, version 2 with per-file checksums: pre-RoPE
q, k, v from the model's own attention code; llama, mistral, qwen2, qwen3, gemma2,
gemma3 text, phi3), then runs `kvq moments` and `kvq fit` on it and reads the artifact
back with kvq.Artifact. Needs `pip install ./python` (or PYTHONPATH=python) and
build/kvq.
"""
import os
import subprocess
import sys

import kvq
import kvq.hf


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    model_path, corpus, out = sys.argv[1:]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    kvq_bin = os.environ.get("KVQ", os.path.join(root, "build", "kvq"))
    model, tok, src = kvq.hf.load(model_path, device="cuda" if _cuda() else "cpu")
    cap = os.path.join(out, "capture")
    doc = kvq.hf.capture(model, tok, corpus, cap, seq_len=256, max_tokens=16384, source=src,
                         progress=True)
    print(f"captured {doc['n_tokens']} tokens of {doc['model']['architecture']} "
          f"(fingerprint {doc['model']['fingerprint']})")
    mom = os.path.join(out, "moments.safetensors")
    art = os.path.join(out, "model.kvq")
    subprocess.run([kvq_bin, "moments", "--capture", cap, "-o", mom, "--force"], check=True)
    subprocess.run([kvq_bin, "fit", "--capture", cap, "--moments", mom, "-o", art, "--force"], check=True)
    a = kvq.Artifact(art)
    print(a)
    print("layer 0, KV head 0 codebook:", a.codebook(0, 0).shape)
    return 0


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    sys.exit(main())
