"""kvq.hf.evaluate: `kvq eval`'s retrieval perplexity (``--score all``) of an HF
transformers model: every predicted position of every sequence attended by kvq
retrieval over the tokens before it (docs/runtime.md "How kvq eval counts perplexity":
``prefill_full = 0``), against the model's own dense attention as the reference.

Selectors: ``full`` (every token, under wrope: R_b outside the window, as kvq's
``full`` row) and the artifact's codebook (named by its method, as kvq names the row),
through the C engine or the torch back end. Row fields: those kvq eval computes from
the losses and the selections (selector, budget, bits_per_key, nll, perplexity,
perplexity_delta, perplexity_rel, steps, attended_fraction); kvq eval's measured
fields (recall_topk, recall_mass, out_rel_err, kv_read_fraction) and task scores
(passkey, kv_recall) are not computed here and left out."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from ..artifact import Artifact
from ..corpus import documents, pack
from ..errors import InvalidArgumentError
from .capture import _bos_rule, _encoder, redact_paths
from .model import describe_model
from .retrieval import retrieval


def parse_budget(s: Union[str, int, float]) -> Union[int, float]:
    """"6%" -> 0.06, "0.06" -> 0.06, "100" -> 100, "all" -> 1.0 (as kvq's --budget)."""
    if not isinstance(s, str):
        return s
    t = s.strip()
    if t == "all":
        return 1.0
    if t.endswith("%"):
        return float(t[:-1]) / 100
    if "." in t or "e" in t.lower():
        return float(t)
    return int(t)


def _nll(logits: Any, ids: np.ndarray) -> float:
    """Sum over positions of -log p(next token), float64."""
    import torch
    lp = torch.log_softmax(logits.double(), dim=-1)
    tgt = torch.as_tensor(ids[1:], dtype=torch.long, device=lp.device)
    return float(-lp[torch.arange(len(tgt)), tgt].sum())


def _dense_nll(model: Any, seq: np.ndarray) -> float:
    import torch
    dev = next(model.parameters()).device
    out = model(input_ids=torch.as_tensor(seq, dtype=torch.long, device=dev)[None], use_cache=False)
    return _nll(out.logits[0, :-1], seq)


def _retrieval_nll(model: Any, seq: np.ndarray, r: Any) -> float:
    """Token by token: each position a decode step by retrieval over the tokens before.
    The last token runs too (kvq eval's forward covers the whole sequence, so its step
    counts in steps and attended_fraction), its logits unused."""
    import torch
    dev = next(model.parameters()).device
    ids = torch.as_tensor(seq, dtype=torch.long, device=dev)[None]
    cache = None
    rows = []
    for i in range(len(seq)):
        out = model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0, -1])
    return _nll(torch.stack(rows[:-1]), seq)


def evaluate(model: Any, tokenizer: Any, corpus: str, artifact: str, seq_len: int = 512,
             budgets: Sequence[Union[str, int, float]] = ("6%",), selectors: Sequence[str] = ("full", "codebook"),
             source: Optional[Dict[str, str]] = None, max_tokens: int = 0, seed: int = 0,
             backend: str = "engine", progress: bool = False,
             sequences: Optional[Sequence[Sequence[int]]] = None) -> Dict[str, Any]:
    """The JSON object of `kvq eval --json` (the fields named in the module's docstring)
    for ``model`` (an HF causal LM) with the artifact ``artifact``. ``corpus`` is a kvq
    corpus spec (tokenized by ``tokenizer``, cut into sequences of ``seq_len`` tokens as
    kvq capture cuts them); ``sequences`` (token ids) replaces it when given."""
    import torch

    desc = describe_model(model, source)
    art = Artifact(artifact)
    if sequences is not None:
        seqs = [np.asarray(s, dtype=np.int64) for s in sequences]
        chash = "0" * 16
    else:
        bos, sep = _bos_rule(tokenizer, model.config)
        packed = pack(documents(corpus, seed), _encoder(tokenizer, (source or {}).get("tokenizer_error", "")),
                      seq_len, max_tokens, bos, sep, n_vocab=desc["vocab_size"])
        seqs = [np.asarray(s, dtype=np.int64) for s in packed.sequences]
        chash = packed.hash_hex
    seqs = [s for s in seqs if len(s) >= 2]
    if not seqs:
        raise InvalidArgumentError(f"{corpus}: no sequence of 2 or more tokens to score", 500)
    unknown = [s for s in selectors if s not in ("full", "codebook", art.method)]
    if unknown:
        raise InvalidArgumentError(f"selectors {unknown}: this evaluation has full and codebook "
                                   f"({art.method})", 500)
    n_pred = sum(len(s) - 1 for s in seqs)
    jobs = [("full", "all")] if "full" in selectors else []
    if any(s != "full" for s in selectors):
        jobs += [(art.method, b) for b in budgets]
    bar = None
    if progress:
        try:
            from tqdm.auto import tqdm
            bar = tqdm(total=n_pred * (len(jobs) + 1), desc="eval", unit="tok")
        except ImportError:
            bar = None
    with torch.no_grad():
        ref = 0.0
        for s in seqs:
            ref += _dense_nll(model, s)
            if bar is not None:
                bar.update(len(s) - 1)
        ref_nll = ref / n_pred
        rows: List[Dict[str, Any]] = []
        for sel, b in jobs:
            budget = parse_budget(b)
            with retrieval(model, artifact, budget=budget, source=source, backend=backend) as r:
                tot = 0.0
                for s in seqs:
                    tot += _retrieval_nll(model, s, r)
                    if bar is not None:
                        bar.update(len(s) - 1)
                st = r.stats
            nll = tot / n_pred
            d = desc["head_dim"]
            bits = 0.0 if sel == "full" else art.groups * math.log2(art.codebook_size) + d * 1 + 32
            rows.append({"selector": sel, "budget": "all" if sel == "full" else str(b),
                         "bits_per_key": round(bits, 4), "nll": round(nll, 6),
                         "perplexity": round(math.exp(nll), 6),
                         "perplexity_delta": round(math.exp(nll) - math.exp(ref_nll), 6),
                         "perplexity_rel": round(math.exp(nll) / math.exp(ref_nll) - 1, 6),
                         "steps": st["steps"],
                         "attended_fraction": round(st["attended"] / st["visible"], 6) if st["visible"] else 1.0})
    if bar is not None:
        bar.close()
    w, _ = art.wrope
    return {"model": (source or {}).get("file", desc["path"]), "corpus": redact_paths(corpus),
            "corpus_hash": chash, "attention": "retrieval", "artifact": artifact, "method": art.method,
            "score": "mean", "rerank": 0, "rerank_extra": 0.08, "resid_bits": 1, "resid_wide": 64,
            "resid_group": "max", "resid_share": 1, "positions": "wrope", "sink": 4, "window": w,
            "cache": "f16", "group": "sum", "seq_len": seq_len, "scored": "all", "sequences": len(seqs),
            "tokens": int(sum(len(s) for s in seqs)), "predicted": n_pred, "backend": backend,
            "reference": {"nll": round(ref_nll, 6), "perplexity": round(math.exp(ref_nll), 6)},
            "rows": rows}
