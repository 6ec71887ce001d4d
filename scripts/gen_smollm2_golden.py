#!/usr/bin/env python3
"""Golden logits and greedy continuations of SmolLM2-135M-Instruct Q4_1, from two
independent implementations: a plain numpy forward pass and llama.cpp.

What it makes
    tests/data/smollm2_q41_golden.json with, for each of 3 prompts:
      "text", "special" (whether special-token text was parsed), "ids": the prompt's
          ids as llama.cpp tokenizes them (add_bos as the model says: false, no BOS);
      "numpy": per prompt position p (row p = the logits after reading ids[0..p]):
          "logsumexp"[p], "top5_ids"[p][5], "top5_logits"[p][5] and
          "probe_logits"[p][64] = logits at the 64 vocabulary ids in "probe_ids"
          (top-level; numpy.random.default_rng(PROBE_SEED).choice(n_vocab, 64,
          replace=False), sorted); numbers rounded to 6 decimals;
      "llamacpp_greedy": 32 ids, llama.cpp's greedy continuation (prompt evaluated,
          then argmax over the last logits, feed, repeat; no sampler, no penalties),
          with its decoded "text";
      "greedy_check": the numpy forward run over prompt + continuation (teacher forced):
          whether numpy's argmax agrees at each generated step, numpy's top1 - top2 logit
          "margins" per step and their minimum (how close llama.cpp's choices are to a tie);
          generation does not stop at EOS ("first_eos_step" says where one was chosen);
    and top-level "checks": max |numpy - llama.cpp| over all prompt logits (llama.cpp on
    the Q4_1 file quantizes activations to 8 bits for its quantized dot products and keeps
    an f16 KV cache: about 1 logit of difference), max |numpy f32 - numpy f64|, argmax
    agreement, and the check that validates the numpy forward itself: llama.cpp run on an
    F32 copy of the dequantized weights (same metadata, temporary file) with an F32 KV
    cache agrees with numpy f64 to ~1e-4 (--skip-f32-check skips it).

    The numpy forward (float64): weights dequantized with gguf.quants.dequantize (Q4_1,
    Q8_0 token embeddings, F32 norms); llama architecture: x = token_embd[ids]; per layer
    h = rmsnorm(x) * attn_norm (eps = llama.attention.layer_norm_rms_epsilon);
    q, k, v = h Wq^T, h Wk^T, h Wv^T; RoPE on q and k with base llama.rope.freq_base,
    rotating ADJACENT pairs (2i, 2i+1) by pos * base^(-2i/64) (llama.cpp's normal rope
    mode for arch llama: the HF->GGUF converter permuted Wq/Wk rows so that this equals HF's
    rotate-half); causal softmax(q k^T / 8) v with 9 query heads sharing 3 KV heads
    (query head h uses KV head h // 3); x += attn Wo^T; h = rmsnorm(x) * ffn_norm;
    x += (silu(h Wg^T) * (h Wu^T)) Wd^T; logits = (rmsnorm(x) * output_norm) token_embd^T
    (tied embeddings: the file has no output.weight).

From what
    The GGUF (default .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf, fetched by
    scripts/fetch-model.sh), numpy, gguf (PyPI) and llama-cpp-python (0.3.16 tested).
    Never from kvq.

How to rerun
    python3 scripts/gen_smollm2_golden.py [--model PATH] [-o tests/data/smollm2_q41_golden.json]
    About a minute on 2 cores. Deterministic (llama.cpp on CPU, fixed threads).
"""
import argparse
import json
import os

import numpy as np

DEFAULT_MODEL = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
PROBE_SEED = 20241124
N_PROBE = 64
N_GEN = 32
PROMPTS = [
    {"text": "Once upon a time, in a small village by the sea, there lived an old fisherman who",
     "special": False},
    {"text": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number (fibonacci(10) == 55).\"\"\"\n",
     "special": False},
    {"text": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
     "special": True},
]


class Model:
    def __init__(self, path, dtype):
        import gguf
        from gguf.quants import dequantize
        r = gguf.GGUFReader(path)
        f = r.fields
        if f["general.architecture"].contents() != "llama":
            raise SystemExit(f"{path}: not a llama-architecture GGUF")
        self.n_layer = int(f["llama.block_count"].contents())
        self.n_head = int(f["llama.attention.head_count"].contents())
        self.n_kv = int(f["llama.attention.head_count_kv"].contents())
        self.d = int(f["llama.embedding_length"].contents())
        self.hd = self.d // self.n_head
        self.eps = float(f["llama.attention.layer_norm_rms_epsilon"].contents())
        self.base = float(f["llama.rope.freq_base"].contents())
        self.meta = {"n_layer": self.n_layer, "n_head": self.n_head, "n_head_kv": self.n_kv,
                     "n_embd": self.d, "head_dim": self.hd, "rms_eps": self.eps, "rope_base": self.base}
        self.w = {}
        self.types = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type)
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))   # numpy order: (rows, row length)
            self.w[t.name] = np.asarray(a, dtype=dtype).reshape(shape)
            self.types[t.tensor_type.name] = self.types.get(t.tensor_type.name, 0) + 1
        self.tied = "output.weight" not in self.w
        self.out = self.w["token_embd.weight"] if self.tied else self.w["output.weight"]
        self.dtype = dtype

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        # x: (T, H, hd); adjacent pairs (2i, 2i+1)
        i = np.arange(self.hd // 2, dtype=np.float64)
        theta = pos[:, None].astype(np.float64) * self.base ** (-2.0 * i / self.hd)   # (T, hd/2)
        c = np.cos(theta).astype(self.dtype)[:, None, :]
        s = np.sin(theta).astype(self.dtype)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def forward(self, ids, act=None):
        """Logits (T, n_vocab); act, when given, maps every quantized product's input
        (scripts/gen_smollm2_q8_golden.py quantizes it to 8 bits)."""
        A = act if act is not None else (lambda h: h)
        T = len(ids)
        pos = np.arange(T)
        x = self.w["token_embd.weight"][np.asarray(ids)].astype(self.dtype)
        mask = np.triu(np.full((T, T), -np.inf, dtype=self.dtype), 1)
        g = self.n_head // self.n_kv
        for L in range(self.n_layer):
            p = f"blk.{L}."
            h = A(self.rmsnorm(x, self.w[p + "attn_norm.weight"]))
            q = (h @ self.w[p + "attn_q.weight"].T).reshape(T, self.n_head, self.hd)
            k = (h @ self.w[p + "attn_k.weight"].T).reshape(T, self.n_kv, self.hd)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(T, self.n_kv, self.hd)
            q, k = self.rope(q, pos), self.rope(k, pos)
            o = np.empty((T, self.n_head, self.hd), dtype=self.dtype)
            for hh in range(self.n_head):
                kv = hh // g
                sc = (q[:, hh, :] @ k[:, kv, :].T) / np.sqrt(self.hd).astype(self.dtype) + mask
                sc = sc - sc.max(axis=1, keepdims=True)
                pr = np.exp(sc)
                pr /= pr.sum(axis=1, keepdims=True)
                o[:, hh, :] = pr @ v[:, kv, :]
            x = x + A(o.reshape(T, self.d)) @ self.w[p + "attn_output.weight"].T
            h = A(self.rmsnorm(x, self.w[p + "ffn_norm.weight"]))
            gt = h @ self.w[p + "ffn_gate.weight"].T
            up = h @ self.w[p + "ffn_up.weight"].T
            x = x + A((gt / (1 + np.exp(-gt))) * up) @ self.w[p + "ffn_down.weight"].T
        h = A(self.rmsnorm(x, self.w["output_norm.weight"]))
        return h @ self.out.T                                            # (T, n_vocab)


def logsumexp(z):
    m = z.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True)))[..., 0]


def r6(a):
    return [round(float(x), 6) for x in np.ravel(a)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("-o", "--out", default="tests/data/smollm2_q41_golden.json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-f32-check", action="store_true",
                    help="skip writing a temporary F32 copy of the model for llama.cpp (540 MB)")
    a = ap.parse_args()

    import llama_cpp
    llm = llama_cpp.Llama(a.model, n_ctx=256, n_batch=256, n_threads=a.threads,
                          n_threads_batch=a.threads, logits_all=True, verbose=False, seed=0)
    vocab = llama_cpp.llama_cpp.llama_model_get_vocab(llm._model.model)
    add_bos = bool(llama_cpp.llama_cpp.llama_vocab_get_add_bos(vocab))

    m64 = Model(a.model, np.float64)
    n_vocab = m64.out.shape[0]
    probe = _probe_ids(n_vocab)

    out_prompts = []
    max_diff_lc = 0.0
    argmax_agree = [0, 0]
    for P in PROMPTS:
        ids = llm.tokenize(P["text"].encode("utf-8"), add_bos=True, special=P["special"])
        # llama.cpp: logits of the prompt, then greedy argmax continuation
        llm.reset()
        llm.eval(ids)
        lc_logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
        gen = []
        for _ in range(N_GEN):
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            gen.append(nxt)
            llm.eval([nxt])
        # numpy
        z = m64.forward(ids)
        d = float(np.max(np.abs(z - lc_logits)))
        max_diff_lc = max(max_diff_lc, d)
        argmax_agree[0] += int(np.sum(z.argmax(1) == lc_logits.argmax(1)))
        argmax_agree[1] += len(ids)
        top5 = np.argsort(-z, axis=1, kind="stable")[:, :5]
        # teacher-forced check of the greedy continuation
        full = ids + gen
        zf = m64.forward(full)
        steps = range(len(ids) - 1, len(full) - 1)
        agree = [int(np.argmax(zf[t])) == full[t + 1] for t in steps]
        srt = np.sort(zf[list(steps)], axis=1)
        margins = srt[:, -1] - srt[:, -2]
        first_dis = next((i for i, ok in enumerate(agree) if not ok), None)
        out_prompts.append({
            "text": P["text"], "special": P["special"], "ids": [int(x) for x in ids],
            "numpy": {
                "logsumexp": r6(logsumexp(z)),
                "top5_ids": [[int(x) for x in row] for row in top5],
                "top5_logits": [r6(z[t, top5[t]]) for t in range(len(ids))],
                "probe_logits": [r6(z[t, probe]) for t in range(len(ids))],
            },
            "llamacpp_greedy": {
                "ids": gen,
                "first_eos_step": next((i for i, t in enumerate(gen) if t == int(llm.token_eos())), None),
                "text": llm.detokenize(gen).decode("utf-8", "replace"),
            },
            "greedy_check": {
                "numpy_argmax_agrees": f"{sum(agree)} of {len(agree)}",
                "first_disagreement": first_dis,
                "min_top1_top2_margin": round(float(margins.min()), 6),
                "min_margin_step": int(np.argmin(margins)),
                "margins": r6(margins),
            },
            "max_abs_diff_numpy_vs_llamacpp": round(d, 6),
        })
        print(f"prompt {len(out_prompts)}: {len(ids)} ids, max|numpy-llama.cpp| = {d:.4g}, "
              f"greedy agree {sum(agree)}/{len(agree)}, min margin {margins.min():.4g}")
        print("   ->", repr(out_prompts[-1]["llamacpp_greedy"]["text"]))

    # float32 numpy forward, for the tolerance a float32 implementation should meet
    del m64
    m32 = Model(a.model, np.float32)
    max_f32 = 0.0
    m64 = None
    for P, op in zip(PROMPTS, out_prompts):
        z32 = m32.forward(op["ids"]).astype(np.float64)
        lse = np.array(op["numpy"]["logsumexp"])
        probe_ref = np.array(op["numpy"]["probe_logits"])
        max_f32 = max(max_f32, float(np.max(np.abs(z32[:, probe] - probe_ref))),
                      float(np.max(np.abs(logsumexp(z32) - lse))))
    print(f"max |numpy f32 - numpy f64| (probe logits, logsumexp) = {max_f32:.3g}")
    print(f"max |numpy f64 - llama.cpp| = {max_diff_lc:.4g}; argmax agree {argmax_agree[0]}/{argmax_agree[1]}")

    f32_check = None
    if not a.skip_f32_check:
        f32_check = f32_gguf_check(a.model, m32.w, [op["ids"] for op in out_prompts], out_prompts, a.threads)
        print(f"max |numpy f64 - llama.cpp on the F32-dequantized GGUF, F32 KV cache| = {f32_check:.3g}")

    import importlib.metadata as md
    doc = {
        "what": "SmolLM2-135M-Instruct Q4_1: numpy float64 forward logits (compact) and llama.cpp "
                "greedy continuations; made by scripts/gen_smollm2_golden.py, never by kvq",
        "model": {"file": os.path.basename(a.model), "sha256": _sha256(a.model),
                  "tensor_types": m32.types, "tied_embeddings": m32.tied, **m32.meta,
                  "add_bos": add_bos, "bos_id": int(llm.token_bos()), "eos_id": int(llm.token_eos())},
        "versions": {"llama_cpp_python": llama_cpp.__version__, "gguf": md.version("gguf"),
                     "numpy": np.__version__},
        "rope": "adjacent pairs (2i, 2i+1), theta = pos * base^(-2i/head_dim) (llama.cpp normal mode)",
        "probe_seed": PROBE_SEED,
        "probe_ids": [int(x) for x in probe],
        "checks": {
            "max_abs_logit_diff_numpy_f64_vs_llamacpp": round(max_diff_lc, 6),
            "max_abs_diff_numpy_f32_vs_f64": float(f"{max_f32:.3g}"),
            "prompt_argmax_agreement_numpy_vs_llamacpp": f"{argmax_agree[0]} of {argmax_agree[1]}",
            "max_abs_logit_diff_numpy_f64_vs_llamacpp_f32_gguf": f32_check,
        },
        "prompts": out_prompts,
    }
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        json.dump(doc, fh, ensure_ascii=False, separators=(",", ":"))
        fh.write("\n")
    os.replace(tmp, a.out)
    print(f"{a.out}: {os.path.getsize(a.out)} bytes")


def f32_gguf_check(model, weights32, idlists, out_prompts, threads):
    """Validate the numpy forward itself: write the gguf-dequantized weights as an F32 GGUF
    (same metadata) in a temporary directory, run llama.cpp on it with an F32 KV cache (no
    quantized activations anywhere) and return max |logits - numpy f64 logits| over the
    probe ids and the top-5 ids of every prompt position."""
    import tempfile
    import gguf
    import llama_cpp
    r = gguf.GGUFReader(model)
    with tempfile.TemporaryDirectory() as td:
        dst = os.path.join(td, "f32.gguf")
        w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
        for k, f in r.fields.items():
            if k.startswith("GGUF.") or k == "general.architecture":
                continue
            if k == "general.file_type":
                w.add_key_value(k, 0, gguf.GGUFValueType.UINT32)     # ALL_F32
                continue
            vt = f.types[0]
            w.add_key_value(k, f.contents(), vt, sub_type=f.types[1] if vt == gguf.GGUFValueType.ARRAY else None)
        for t in r.tensors:
            w.add_tensor(t.name, np.ascontiguousarray(weights32[t.name], dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        del r
        llm = llama_cpp.Llama(dst, n_ctx=256, n_batch=256, n_threads=threads, n_threads_batch=threads,
                              logits_all=True, verbose=False, type_k=0, type_v=0, flash_attn=False)
        worst = 0.0
        probe = None
        for ids, op in zip(idlists, out_prompts):
            llm.reset()
            llm.eval(ids)
            z = np.array(llm.scores[: len(ids)], dtype=np.float64)
            for t in range(len(ids)):
                top = np.array(op["numpy"]["top5_ids"][t])
                worst = max(worst, float(np.max(np.abs(z[t, top] - np.array(op["numpy"]["top5_logits"][t])))))
            if probe is None:
                probe = _probe_ids(z.shape[1])
            worst = max(worst, float(np.max(np.abs(z[:, probe] - np.array(op["numpy"]["probe_logits"])))))
        del llm
    return float(f"{worst:.3g}")


def _probe_ids(n_vocab):
    return np.sort(np.random.default_rng(PROBE_SEED).choice(n_vocab, N_PROBE, replace=False))


def _sha256(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


if __name__ == "__main__":
    main()
