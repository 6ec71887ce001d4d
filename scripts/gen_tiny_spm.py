#!/usr/bin/env python3
"""tiny-spm: a small stand-in for stories260K (a llama with a SentencePiece vocabulary,
in GGUF and in llama2.c's formats), so that the SPM / llama2.c tests run on a machine
without ../shared, with golden values from independent implementations.

What it makes (tests/data/, about 0.4 MB in all)
    tiny_spm.gguf      a llama (arch "llama"): dim 32, 4 layers, 4 query heads sharing
                       2 KV heads (head dim 8, as stories260K), FFN 64, context 256,
                       rope base 10000, eps 1e-5, tied embeddings (no output.weight),
                       all tensors F32; tokenizer.ggml.model "llama" (SPM): <unk> <s>
                       </s> (ids 0..2, types 2 3 3), the 256 byte-fallback tokens
                       <0x00>..<0xFF> (ids 3..258, type 6, score 0), then 125 pieces
                       (type 1) learned by byte-pair merges on STORY below, the merges
                       in order with scores -0, -1, -2, ..., then the single characters
                       with the scores that follow (as sentencepiece's BPE trainer and
                       stories260K's tok512 lay them out); bos 1, eos 2, unk 0,
                       add_bos_token true, add_eos_token false.
    tiny_spm.bin       the same weights as a llama2.c "legacy" checkpoint: 7 int32
                       (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size > 0 =
                       shared classifier, seq_len), then token_embedding, rms_att, wq,
                       wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis_real,
                       freq_cis_imag (f32, row-major [out][in]); Wq/Wk rows are NOT
                       permuted between the two files (both rotate adjacent pairs, as
                       stories260K's two files do).
    tiny_spm_tok.bin   the vocabulary in llama2.c's tokenizer.bin format (int32
                       max_token_length; per token f32 score, int32 length, bytes; "\u2581"
                       written as " ", <s> / </s> as "\\n<s>\\n" / "\\n</s>\\n").
    tiny_spm_golden.json
                       "texts": strings and their ids as llama.cpp tokenizes them
                       (vocab_only, no BOS, special tokens not parsed);
                       "greedy": llama.cpp's greedy continuation of BOS alone (48 ids,
                       argmax of the last logits, fed back; no sampler) and its text
                       (llama.cpp's detokenize, without the leading space SPM decoding
                       drops) and "text_16", that of its first 16 ids, checked against a numpy float64 forward over the
                       gguf-read tensors (same argmax at every step; "min_margin" =
                       the smallest top1 - top2 logit gap, far from a tie);
                       "logits_bos": numpy's logits after BOS alone (first 16 ids),
                       max |numpy - llama.cpp| in "checks".

The weights are random (numpy default_rng(SEED)) but shaped so that greedy text and
attention are not degenerate: Wq/Wk with std 0.3 (peaked attention), embeddings std 1
except the byte and control tokens (scaled by 0.05: with tied embeddings they are
rarely the argmax, so the greedy text is printable pieces), RMSNorm weights
1 + 0.1 N(0, 1). A model for checking code paths and formats, not language.

From what
    numpy, gguf (PyPI; the writer and GGUFReader) and llama-cpp-python (0.3.16 tested).
    Never from kvq.

How to rerun
    python3 scripts/gen_tiny_spm.py [-o tests/data]     (a few seconds)
    Deterministic: the same bytes each run.
"""
import argparse
import json
import os
import struct
from collections import Counter

import numpy as np

SEED = 6  # of seeds 1..40: a varied greedy text (33 distinct ids of 48), margin >= 0.1
DIM, HIDDEN, N_LAYERS, N_HEADS, N_KV, SEQ_LEN = 32, 64, 4, 4, 2, 256
HEAD_DIM = DIM // N_HEADS
N_MERGES = 80
ROPE_BASE, EPS = 10000.0, 1e-5
SP = "\u2581"

# Original text (written for this script) that the merges are learned on.
STORY = """Once upon a time there was a little fox who lived at the edge of a green wood.
Every morning the fox ran to the river to drink and to look at the fish. One day the fox
saw a small bird sitting on a stone in the water. The bird was sad because it could not
fly home. The fox said to the bird: do not be sad, I will help you. The fox carried the
bird on its back across the river and up the hill to the old tree where the bird lived.
The bird sang a happy song and the fox smiled. From that day the fox and the bird were
friends, and every evening they sat together and looked at the stars over the wood.
The children of the village liked to hear this story. They asked their mother to tell
it again and again, and she always said the same thing at the end: a good friend is
the best thing you can have. Then the children went to sleep and dreamed of the fox,
the bird, the river and the stars."""

# Strings whose llama.cpp ids are the golden ids (the tests encode each and compare).
TEXTS = [
    "Once upon a time there was a little fox.",
    "The bird sang a happy song and the fox smiled.",
    "Hello world",
    "  two leading spaces",
    "tabs\tand\nnewlines\n",
    "caf\u00e9 na\u00efve \u65e5\u672c",
    "emoji \U0001F600 ok",
    "x",
    " ",
    "12345 67",
    "the the the thethe",
    "Every evening they sat together and looked at the stars over the wood.",
]


def learn_pieces():
    """Byte-pair merges over the words of STORY (each word with the SPM prefix)."""
    words = Counter(SP + w for w in STORY.split())
    segs = {w: list(w) for w in words}
    merges = []
    for _ in range(N_MERGES):
        pairs = Counter()
        for w, n in words.items():
            s = segs[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += n
        # most frequent pair; ties broken by the pair's text, so the result is fixed
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0][0] + kv[0][1]))
        merges.append(a + b)
        for w in words:
            s, out, i = segs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            segs[w] = out
    chars = sorted(set("".join(words)), key=lambda c: (-sum(n * w.count(c) for w, n in words.items()), c))
    pieces = []
    for p in merges + chars:
        if p not in pieces:
            pieces.append(p)
    return pieces


def vocab():
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(toks)
    for i, p in enumerate(learn_pieces()):
        toks.append(p)
        types.append(1)
        scores.append(-float(i))
    return toks, scores, types


def weights(n_vocab):
    rng = np.random.default_rng(SEED)
    f = lambda *shape, std=1.0: (rng.standard_normal(shape) * std).astype(np.float32)
    out = f(n_vocab, DIM)
    out[:259] *= np.float32(0.05)
    w = {"emb": f(n_vocab, DIM), "out": out, "layers": []}
    for _ in range(N_LAYERS):
        w["layers"].append({
            "attn_norm": (1 + f(DIM, std=0.1)).astype(np.float32),
            "wq": f(N_HEADS * HEAD_DIM, DIM, std=0.3),
            "wk": f(N_KV * HEAD_DIM, DIM, std=0.3),
            "wv": f(N_KV * HEAD_DIM, DIM, std=DIM ** -0.5),
            "wo": f(DIM, N_HEADS * HEAD_DIM, std=0.5 * DIM ** -0.5),
            "ffn_norm": (1 + f(DIM, std=0.1)).astype(np.float32),
            "w1": f(HIDDEN, DIM, std=DIM ** -0.5),      # gate
            "w2": f(DIM, HIDDEN, std=0.5 * HIDDEN ** -0.5),  # down
            "w3": f(HIDDEN, DIM, std=DIM ** -0.5),      # up
        })
    w["norm"] = (1 + f(DIM, std=0.1)).astype(np.float32)
    return w


def write_gguf(path, toks, scores, types, w):
    import gguf
    g = gguf.GGUFWriter(path, "llama")
    g.add_name("tiny-spm")
    g.add_context_length(SEQ_LEN)
    g.add_embedding_length(DIM)
    g.add_feed_forward_length(HIDDEN)
    g.add_block_count(N_LAYERS)
    g.add_head_count(N_HEADS)
    g.add_head_count_kv(N_KV)
    g.add_rope_dimension_count(HEAD_DIM)
    g.add_rope_freq_base(ROPE_BASE)
    g.add_layer_norm_rms_eps(EPS)
    g.add_file_type(0)
    g.add_tokenizer_model("llama")
    g.add_token_list(toks)
    g.add_token_scores(scores)
    g.add_token_types(types)
    g.add_bos_token_id(1)
    g.add_eos_token_id(2)
    g.add_unk_token_id(0)
    g.add_add_bos_token(True)
    g.add_add_eos_token(False)
    g.add_tensor("token_embd.weight", w["emb"])
    g.add_tensor("output_norm.weight", w["norm"])
    g.add_tensor("output.weight", w["out"])
    for i, L in enumerate(w["layers"]):
        for name, key in [("attn_norm", "attn_norm"), ("attn_q", "wq"), ("attn_k", "wk"),
                          ("attn_v", "wv"), ("attn_output", "wo"), ("ffn_norm", "ffn_norm"),
                          ("ffn_gate", "w1"), ("ffn_down", "w2"), ("ffn_up", "w3")]:
            g.add_tensor("blk.%d.%s.weight" % (i, name), L[key])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


def write_llama2c(path, n_vocab, w):
    L = w["layers"]
    parts = [w["emb"]] + [l["attn_norm"] for l in L]
    for key in ("wq", "wk", "wv", "wo"):
        parts += [l[key] for l in L]
    parts += [l["ffn_norm"] for l in L]
    for key in ("w1", "w2", "w3"):
        parts += [l[key] for l in L]
    parts.append(w["norm"])
    freqs = 1.0 / (ROPE_BASE ** (np.arange(0, HEAD_DIM, 2)[: HEAD_DIM // 2] / HEAD_DIM))
    ang = np.outer(np.arange(SEQ_LEN), freqs)
    parts += [np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32), w["out"]]
    with open(path, "wb") as f:  # vocab_size < 0: a classifier of its own, at the end
        f.write(struct.pack("<7i", DIM, HIDDEN, N_LAYERS, N_HEADS, N_KV, -n_vocab, SEQ_LEN))
        for p in parts:
            f.write(np.ascontiguousarray(p, dtype="<f4").tobytes())


def write_tokenizer_bin(path, toks, scores):
    enc = []
    for t in toks:
        if t in ("<s>", "</s>"):
            t = "\n" + t + "\n"
        enc.append(t.replace(SP, " ").encode("utf-8"))
    with open(path, "wb") as f:
        f.write(struct.pack("<i", max(len(b) for b in enc)))
        for b, s in zip(enc, scores):
            f.write(struct.pack("<fi", s, len(b)) + b)


def numpy_logits(gpath, ids):
    """float64 forward over the tensors as GGUFReader reads them; logits at each row."""
    import gguf
    r = gguf.GGUFReader(gpath)
    T = {t.name: np.array(t.data, dtype=np.float64).reshape([int(x) for x in t.shape[::-1]])
         for t in r.tensors}
    rms = lambda x, wt: x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * wt
    n = len(ids)
    x = T["token_embd.weight"][ids]
    inv = ROPE_BASE ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    ang = np.outer(np.arange(n), inv)
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(m):  # [n, heads, hd], adjacent pairs (2i, 2i+1)
        a, b = m[..., 0::2], m[..., 1::2]
        out = np.empty_like(m)
        out[..., 0::2] = a * cos[:, None] - b * sin[:, None]
        out[..., 1::2] = a * sin[:, None] + b * cos[:, None]
        return out

    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(N_LAYERS):
        p = "blk.%d." % l
        h = rms(x, T[p + "attn_norm.weight"])
        q = rope((h @ T[p + "attn_q.weight"].T).reshape(n, N_HEADS, HEAD_DIM))
        k = rope((h @ T[p + "attn_k.weight"].T).reshape(n, N_KV, HEAD_DIM))
        v = (h @ T[p + "attn_v.weight"].T).reshape(n, N_KV, HEAD_DIM)
        o = np.empty((n, N_HEADS, HEAD_DIM))
        for hh in range(N_HEADS):
            kv = hh // (N_HEADS // N_KV)
            s = q[:, hh] @ k[:, kv].T / np.sqrt(HEAD_DIM) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + o.reshape(n, -1) @ T[p + "attn_output.weight"].T
        h = rms(x, T[p + "ffn_norm.weight"])
        g = h @ T[p + "ffn_gate.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ T[p + "ffn_up.weight"].T)) @ T[p + "ffn_down.weight"].T
    return rms(x, T["output_norm.weight"]) @ T["output.weight"].T


def golden(gpath, n_gen=48):
    from llama_cpp import Llama
    voc = Llama(model_path=gpath, vocab_only=True, verbose=False)
    texts = [{"text": t, "ids": voc.tokenize(t.encode(), add_bos=False, special=False)}
             for t in TEXTS]
    llm = Llama(model_path=gpath, n_ctx=128, n_threads=1, n_batch=64, logits_all=True,
                verbose=False)
    ids = [1]
    llm.eval(ids)
    lc_first = np.array(llm.scores[0], dtype=np.float64)
    for _ in range(n_gen):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        ids.append(nxt)
        llm.eval([nxt])
    gen = ids[1:]
    text = llm.detokenize(gen).decode("utf-8")
    head = llm.detokenize(gen[:16]).decode("utf-8")
    lg = numpy_logits(gpath, ids)
    agree = [int(np.argmax(lg[i])) == ids[i + 1] for i in range(n_gen)]
    top2 = np.sort(lg[:n_gen], axis=-1)[:, -2:]
    checks = {
        "numpy_argmax_agrees": all(agree),
        "min_margin": round(float((top2[:, 1] - top2[:, 0]).min()), 4),
        "max_abs_numpy_vs_llamacpp_bos_logits": float(np.abs(lg[0] - lc_first).max()),
        "eos_in_greedy": 2 in gen,
    }
    assert checks["numpy_argmax_agrees"], agree
    return {
        "texts": texts,
        "greedy": {"ids": gen, "text": text[1:] if text.startswith(" ") else text,
                   "text_16": head[1:] if head.startswith(" ") else head},
        "logits_bos": [round(float(v), 6) for v in lg[0][:16]],
        "checks": checks,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--outdir", default="tests/data")
    a = ap.parse_args()
    toks, scores, types = vocab()
    assert len(toks) <= 384, len(toks)
    w = weights(len(toks))
    gp = os.path.join(a.outdir, "tiny_spm.gguf")
    write_gguf(gp, toks, scores, types, w)
    write_llama2c(os.path.join(a.outdir, "tiny_spm.bin"), len(toks), w)
    write_tokenizer_bin(os.path.join(a.outdir, "tiny_spm_tok.bin"), toks, scores)
    gold = golden(gp)
    gold["vocab"] = {"n_vocab": len(toks), "n_pieces": len(toks) - 259}
    with open(os.path.join(a.outdir, "tiny_spm_golden.json"), "w") as f:
        json.dump(gold, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(json.dumps(gold["checks"]), gold["greedy"]["text"][:120])


if __name__ == "__main__":
    main()
