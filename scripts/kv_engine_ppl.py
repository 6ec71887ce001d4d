#!/usr/bin/env python3
"""kv_engine_ppl.py - perplexity over a compressed KV cache through the Python package
(kvq.hf.retrieval over the C embedding API, kvq/engine.h), scored as `kvq eval --kv K
[--selectors codebook --budgets B]` scores it (docs/kvcache.md "With retrieval").

The model (an HF directory or a GGUF file, loaded by kvq.hf.load: transformers'
forward of the dequantized weights) reads the corpus's first sequence of --seq-len
tokens (libkvq's corpus reader, the model's tokenizer, packed as kvq packs them: the
tokens `kvq eval --corpus C --seq-len L --max-tokens L` reads). Its first
floor(L / 2) tokens are one prefill (attended densely by the model; their pre-RoPE
rows appended to the engine sequence), then each later token but the last is one
decode step (teacher forcing) whose logits predict the next: the L - 1 - L/2 tokens
kvq eval predicts. Rows (--rows, comma-separated KV:SELECTOR, SELECTOR full or
codebook; codebook at --budget):

  f16:full       full attention over the engine's f16 rows (the reference)
  f16:codebook   retrieval at the budget
  K:full         full attention over the compressed cache K (leankv, pats, leankv+pats)
  K:codebook     retrieval over it (needs a rope artifact)

The compressed caches take the artifact's profile (leankv.*, pats.*). Also printed: the
model's own dense attention over the same positions (one forward), a cross-check of the
f16:full row. Per row: perplexity, its change against f16:full, the bytes the engine
sequence held per cached token at the end (kvq_engine_seq_bytes over the tokens it
holds: with f16 the rows plus 2 bytes of code per token, layer and KV head), the
attended share (retrieval rows) and the seconds it took. Progress on stderr with -v.

  python3 scripts/kv_engine_ppl.py --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --artifact demo-out/model.kvq --corpus dir:/usr/share/doc/python3.11/html/_sources/tutorial \\
      --seq-len 2048 --threads 1 --json out.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402

ROWS = "f16:full,f16:codebook,leankv:full,pats:full,leankv+pats:full,leankv:codebook,pats:codebook," \
       "leankv+pats:codebook"


def tokens(model: Any, tok: Any, corpus: str, seq_len: int, source: Dict[str, str]) -> np.ndarray:
    """The first sequence of seq_len tokens, as kvq eval --max-tokens seq_len reads it."""
    from kvq.corpus import documents, pack
    from kvq.hf.capture import _bos_rule, _encoder
    from kvq.hf.model import describe_model
    bos, sep = _bos_rule(tok, model.config)
    packed = pack(documents(corpus, 0), _encoder(tok, source.get("tokenizer_error", "")), seq_len, seq_len,
                  bos, sep, n_vocab=describe_model(model, source)["vocab_size"])
    return np.asarray(packed.sequences[0], dtype=np.int64)


def nll_sum(logits: Any, targets: np.ndarray) -> float:
    import torch
    lp = torch.log_softmax(logits.double(), dim=-1)
    t = torch.as_tensor(targets, dtype=torch.long)
    return float(-lp[torch.arange(len(t)), t].sum())


def dense(model: Any, ids: np.ndarray, prompt: int) -> float:
    """Mean nll of ids[prompt + 1:] from the model's own attention (one forward)."""
    import torch
    out = model(input_ids=torch.as_tensor(ids, dtype=torch.long)[None], use_cache=False)
    return nll_sum(out.logits[0, prompt:-1], ids[prompt + 1:]) / (len(ids) - 1 - prompt)


def teacher_forced(model: Any, ids: np.ndarray, prompt: int, verbose: bool) -> float:
    """Prefill ids[:prompt], then ids[prompt], ..., ids[-2] one per call; mean nll of the
    tokens they predict."""
    import torch
    from transformers import DynamicCache
    from kvq.hf.eval import _cache_kw
    x = torch.as_tensor(ids, dtype=torch.long)[None]
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers 4.x
        cache = DynamicCache()
    kw = {_cache_kw(model): cache}
    model(input_ids=x[:, :prompt], use_cache=True, **kw)
    tot = 0.0
    for t in range(prompt, len(ids) - 1):
        out = model(input_ids=x[:, t:t + 1], use_cache=True, **kw)
        tot += nll_sum(out.logits[0, -1:], ids[t + 1:t + 2])
        if verbose and (t - prompt) % 128 == 0:
            print(f"  step {t - prompt} of {len(ids) - 1 - prompt}", file=sys.stderr)
    return tot / (len(ids) - 1 - prompt)


def run_row(model: Any, src: Dict[str, str], art: str, ids: np.ndarray, prompt: int, kv: str, sel: str,
            budget: float, threads: int, verbose: bool) -> Dict[str, Any]:
    from kvq.hf.retrieval import retrieval
    t0 = time.time()
    with retrieval(model, art, budget=budget, source=src, threads=threads, selector=sel, kv_cache=kv,
                   max_tokens=len(ids)) as r:
        nll = teacher_forced(model, ids, prompt, verbose)
        held = r.seq.length(0)
        nbytes = r.seq.nbytes
        st = r.seq.stats()
    return {"kv": kv, "selector": sel, "budget": budget if sel != "full" else "all", "nll": nll,
            "perplexity": math.exp(nll), "tokens_held": held, "bytes": nbytes,
            "bytes_per_token": nbytes / held, "attended": st["attended_fraction"],
            "seconds": round(time.time() - t0, 1)}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--artifact", required=True, help="a rope artifact with LeanKV / PATS settings")
    ap.add_argument("--corpus", required=True, help="kvq corpus spec")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--rows", default=ROWS, help=f"KV:SELECTOR,... (default {ROWS})")
    ap.add_argument("--budget", default="6%", help="codebook budget (default 6%%)")
    ap.add_argument("--threads", type=int, default=1, help="torch and engine threads (default 1)")
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(a.threads)
    import kvq.hf
    from kvq.hf.eval import parse_budget
    budget = float(parse_budget(a.budget))
    rows = [r.split(":") for r in a.rows.split(",")]
    for r in rows:
        if len(r) != 2 or r[1] not in ("full", "codebook"):
            ap.error(f"--rows: {':'.join(r)!r} is not KV:full or KV:codebook")
    t0 = time.time()
    model, tok, src = kvq.hf.load(a.model)
    ids = tokens(model, tok, a.corpus, a.seq_len, src)
    if len(ids) < a.seq_len:
        ap.error(f"{a.corpus}: {len(ids)} tokens, fewer than --seq-len {a.seq_len}")
    prompt = a.seq_len // 2
    out: Dict[str, Any] = {"model": os.path.basename(a.model), "artifact": a.artifact, "corpus": a.corpus,
                           "seq_len": a.seq_len, "prompt": prompt, "predicted": a.seq_len - 1 - prompt,
                           "threads": a.threads, "load_s": round(time.time() - t0, 1), "rows": []}
    with torch.no_grad():
        t0 = time.time()
        out["dense"] = {"nll": dense(model, ids, prompt), "seconds": round(time.time() - t0, 1)}
        out["dense"]["perplexity"] = math.exp(out["dense"]["nll"])
        for kv, sel in rows:
            row = run_row(model, src, a.artifact, ids, prompt, kv, sel, budget, a.threads, a.verbose)
            out["rows"].append(row)
            if a.verbose:
                print(json.dumps(row), file=sys.stderr)
    ref = next((r for r in out["rows"] if r["kv"] == "f16" and r["selector"] == "full"), None)
    print(f"dense (the model's own attention): ppl {out['dense']['perplexity']:.6f}")
    print(f"{'kv':12} {'selector':9} {'ppl':>10} {'dppl':>8} {'bytes/tok':>10} {'attended':>8} {'s':>7}")
    for r in out["rows"]:
        if ref is not None:
            r["dppl_pct"] = 100 * (r["perplexity"] / ref["perplexity"] - 1)
        att = "" if r["attended"] is None else f"{100 * r['attended']:.1f}%"
        print(f"{r['kv']:12} {r['selector']:9} {r['perplexity']:10.6f} {r.get('dppl_pct', 0):+7.2f}% "
              f"{r['bytes_per_token']:10.1f} {att:>8} {r['seconds']:7.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
