#!/usr/bin/env python3
"""gen_stories260K_nll.py - llama.cpp's mean NLL of one short story, for tests/cli/run.sh.

The text is stories260K's own greedy continuation (the golden text of run.sh) followed by
a newline, as `kvq eval --corpus file:story.txt` reads it. llama.cpp (llama-cpp-python)
tokenizes it with BOS, evaluates it with every position's logits, and the NLL is the
mean over predicted tokens of -log softmax (float64 over llama.cpp's float32 logits).
Two cuts: one sequence of at most 64 tokens, and sequences of at most 32 tokens where
each later sequence starts again with BOS (what `kvq eval --seq-len 32` does); and of
those, only the last 8 predictions of each sequence (`kvq eval --seq-len 32 --score
last:8`). The values go to tests/data/stories260K_nll.json. Never regenerate it with kvq.

  python3 scripts/gen_stories260K_nll.py [--model ../shared/models/stories260K.gguf]
"""
import argparse
import json
import os

import numpy as np
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
        "in the park. One day, she saw a big, red ball. She wanted to\n")


def nll_sum(m, toks, last=0):
    """Summed NLL of the next-token predictions (only the last `last` when > 0)."""
    m.reset()
    m.eval(toks)
    lg = np.array(m.scores[:len(toks)], dtype=np.float64)
    lg -= lg.max(axis=1, keepdims=True)
    ls = lg - np.log(np.exp(lg).sum(axis=1, keepdims=True))
    first = max(0, len(toks) - 1 - last) if last else 0
    return -sum(ls[i, toks[i + 1]] for i in range(first, len(toks) - 1)), len(toks) - 1 - first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models", "stories260K.gguf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "stories260K_nll.json"))
    a = ap.parse_args()
    m = Llama(a.model, n_ctx=128, logits_all=True, verbose=False, n_threads=1)
    toks = m.tokenize(TEXT.encode("utf-8"), add_bos=True, special=False)
    out = {"text": TEXT, "tokens": len(toks), "bos": toks[0]}
    for seq_len in (64, 32):
        seqs, rest = [], toks[1:]
        while rest:  # each sequence: BOS + up to seq_len - 1 tokens of the text
            seqs.append([toks[0]] + rest[:seq_len - 1])
            rest = rest[seq_len - 1:]
        s = [nll_sum(m, q) for q in seqs]
        tot, n = sum(x[0] for x in s), sum(x[1] for x in s)
        out[f"seq_len_{seq_len}"] = {"sequences": len(seqs), "tokens": sum(map(len, seqs)),
                                     "predicted": n, "nll": round(tot / n, 6)}
        if seq_len == 32:
            s = [nll_sum(m, q, last=8) for q in seqs]
            tot, n = sum(x[0] for x in s), sum(x[1] for x in s)
            out["seq_len_32_last_8"] = {"sequences": len(seqs), "predicted": n,
                                        "nll": round(tot / n, 6)}
    import llama_cpp
    out["source"] = f"llama-cpp-python {llama_cpp.__version__}, scripts/gen_stories260K_nll.py"
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
