#!/usr/bin/env python3
"""Golden perplexity of SmolLM2-135M-Instruct on a short text, computed by llama.cpp
(llama-cpp-python) exactly as llama.cpp's perplexity tool (llama-perplexity, default
mode) counts it. Never from kvq.

What it makes
    tests/data/ppl_text.txt: the text (the "py/" documents of tests/data/tok_corpus.jsonl,
        in order, joined by a blank line, until N_DOCS of them);
    tests/data/ppl_golden.json: for n_ctx = N_CTX and each variant of the model
        ("as_is": the file's own tokenizer.ggml.add_bos_token = false; "add_bos": the
        same file with add_bos_token = true):
          "n_tokens" (the text's tokens, BOS included when the model adds one),
          "n_chunks" = n_tokens // n_ctx, "count" (tokens scored), "nll" (mean, nats),
          "ppl" = exp(nll), "chunk_nll" (the summed nll of each chunk),
        from llama.cpp on an F32 copy of the gguf-dequantized weights with an F32 KV
        cache (exact: no quantized activations), and for reference "q41_ppl", llama.cpp
        on the Q4_1 file itself (8-bit activations in its quantized dot products, f16 KV
        cache: a different number at the 1e-3 level, which is why the golden is F32).

What llama-perplexity does (tools/perplexity/perplexity.cpp, perplexity()):
    tokens = common_tokenize(text, add_special = true): BOS first only when the model
    adds one; n_chunk = len(tokens) / n_ctx (the tail is dropped; it refuses fewer than
    2 n_ctx tokens); each chunk tokens[i n_ctx, (i + 1) n_ctx) is evaluated from an empty
    KV cache with its first token replaced by BOS when the model adds one; of its logits
    only positions first = n_ctx / 2 .. n_ctx - 2 are scored against the next token:
    n_ctx - first - 1 tokens per chunk; ppl = exp(sum nll / count). This script does the
    same with Llama.eval and Llama.scores, the NLL in float64 from the float32 logits.

How to rerun
    python3 scripts/gen_ppl_golden.py [--model PATH]
    (default .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf, scripts/fetch-model.sh;
    writes two ~540 MB F32 copies in a temporary directory; about a minute on 2 cores.)
"""
import argparse
import json
import math
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_copy  # noqa: E402

DEFAULT_MODEL = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
N_CTX = 128
N_DOCS = 3


def perplexity(llm, text, n_ctx):
    import llama_cpp
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    bos = llama_cpp.llama_vocab_bos(vocab)
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    assert (tokens[0] == bos) == add_bos, (tokens[:3], bos, add_bos)
    n_chunk = len(tokens) // n_ctx
    assert len(tokens) >= 2 * n_ctx, len(tokens)
    first = n_ctx // 2
    chunk_nll, count = [], 0
    for i in range(n_chunk):
        toks = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if add_bos:
            toks[0] = bos
        llm.reset()
        llm.eval(toks)
        z = np.array(llm.scores[:n_ctx], dtype=np.float64)
        s = 0.0
        for j in range(first, n_ctx - 1):
            m = z[j].max()
            s += m + math.log(np.exp(z[j] - m).sum()) - z[j, toks[j + 1]]
            count += 1
        chunk_nll.append(s)
    nll = sum(chunk_nll) / count
    return {"add_bos": add_bos, "n_tokens": len(tokens), "n_chunks": n_chunk, "count": count,
            "nll": round(nll, 8), "ppl": round(math.exp(nll), 6),
            "chunk_nll": [round(x, 6) for x in chunk_nll]}


def load(path, threads):
    import llama_cpp
    return llama_cpp.Llama(path, n_ctx=N_CTX, n_batch=N_CTX, n_threads=threads,
                           n_threads_batch=threads, logits_all=True, verbose=False,
                           type_k=0, type_v=0, flash_attn=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--data", default="tests/data")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    docs = [json.loads(l) for l in open(os.path.join(a.data, "tok_corpus.jsonl"), encoding="utf-8")]
    text = "\n\n".join([d["text"] for d in docs if d["id"].startswith("py/")][:N_DOCS]) + "\n"
    with open(os.path.join(a.data, "ppl_text.txt"), "w", encoding="utf-8") as fh:
        fh.write(text)
    import llama_cpp
    out = {"model": os.path.basename(a.model), "n_ctx": N_CTX, "text": "ppl_text.txt",
           "llama_cpp_python": llama_cpp.__version__, "variants": {}}
    with tempfile.TemporaryDirectory() as td:
        for name, sets in (("as_is", []), ("add_bos", [("tokenizer.ggml.add_bos_token", "true")])):
            q = os.path.join(td, "q.gguf")
            f = os.path.join(td, "f32.gguf")
            gguf_copy.copy(a.model, q, False, sets)
            gguf_copy.copy(a.model, f, True, sets)
            llm = load(f, a.threads)
            v = perplexity(llm, text, N_CTX)
            del llm
            llm = load(q, a.threads)
            v["q41_ppl"] = perplexity(llm, text, N_CTX)["ppl"]
            del llm
            out["variants"][name] = v
            print(name, {k: v[k] for k in ("add_bos", "n_tokens", "n_chunks", "count", "ppl", "q41_ppl")})
    dst = os.path.join(a.data, "ppl_golden.json")
    with open(dst + ".tmp", "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    os.replace(dst + ".tmp", dst)
    print(dst)


if __name__ == "__main__":
    main()
