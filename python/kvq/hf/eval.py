"""kvq.hf.evaluate: `kvq eval`'s retrieval perplexity (``--score all``) of an HF
transformers model: every predicted position of every sequence attended by kvq
retrieval over the tokens before it (docs/runtime.md "How kvq eval counts perplexity":
``prefill_full = 0``), against the model's own dense attention as the reference.

Selectors, by kvq eval's names: ``full`` (every token, under the artifact's position
mode: kvq's ``full`` row), ``codebook`` (the artifact's, named by its method as kvq
names the row), ``oracle``, ``fier``, ``quest`` and ``mass``. The C engine runs them
all; the torch back end runs ``full`` and ``codebook``. The rows carry kvq eval's
fields: selector, budget, bits_per_key, nll, perplexity, perplexity_delta,
perplexity_rel, steps, the figures kvq eval measures per step against exact attention
over every visible token (recall_topk, recall_mass, out_rel_err: the C engine's
``measure``, kvq_rt_measure_output's definitions; kv_read_fraction), attended_fraction,
and the task fields passkey, kv_recall ([correct, count]: [0, 0], as kvq eval prints
them when the corpus has no task document) and answers (""). The measured figures are
null where kvq eval prints null (a row without steps) and, with the torch back end,
where it does not measure (it has no exact-attention pass): recall_topk, recall_mass,
out_rel_err and kv_read_fraction are then null. Corpora with task documents
(``passkey:``, ``kv-recall:``) are refused: kvq eval scores their answers, this does
not."""
from __future__ import annotations

import inspect
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..artifact import Artifact
from ..corpus import documents, pack
from ..engine import SELECTORS
from ..errors import InvalidArgumentError, UnsupportedError
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


def _cache_kw(model: Any) -> str:
    """The forward's keyword for the KV cache: ``cache`` (transformers 5.x, where
    ``past_key_values`` is deprecated) or ``past_key_values`` (older versions)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _retrieval_nll(model: Any, seq: np.ndarray) -> float:
    """Token by token: each position a decode step by retrieval over the tokens before.
    The last token runs too (kvq eval's forward covers the whole sequence, so its step
    counts in steps and attended_fraction), its logits unused."""
    import torch
    from transformers import DynamicCache
    dev = next(model.parameters()).device
    ids = torch.as_tensor(seq, dtype=torch.long, device=dev)[None]
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers 4.x
        cache = DynamicCache()
    kw = {_cache_kw(model): cache}
    rows = []
    for i in range(len(seq)):
        out = model(input_ids=ids[:, i:i + 1], use_cache=True, **kw)
        rows.append(out.logits[0, -1])
    return _nll(torch.stack(rows[:-1]), seq)


def _bits_per_key(sel: str, art: Artifact, d: int) -> float:
    """kvq_selector_bits_per_key at kvq eval's defaults (residual 1 bit, fier groups of
    32, quest pages of 16): the selector metadata per cached key and KV head."""
    gk = art.groups * math.log2(art.codebook_size)
    return {"full": 0.0, "oracle": 16.0 * d, "codebook": gk + d * 1 + 32, "mass": gk,
            "fier": d + 2 * d * 32 / 32, "quest": 2 * d * 32 / 16}[sel]


def _row_metrics(st: Dict[str, Any], measured: bool) -> Dict[str, Any]:
    """kvq eval's per-step figures (eval/metrics.c) from the summed statistics: null
    without steps, as kvq eval prints them; the measured ones null when not measured."""
    n, m = st["steps"], st.get("measured", 0)

    def mean(key: str) -> Optional[float]:
        return round(st[key] / m, 6) if measured and n and m else None
    return {"recall_topk": mean("recall_topk"), "recall_mass": mean("recall_mass"),
            "out_rel_err": mean("out_rel_err"),
            "kv_read_fraction": round(st["bytes_read"] / st["bytes_full"], 6)
            if measured and n and st.get("bytes_full") else None,
            "attended_fraction": round(st["attended"] / st["visible"], 6) if n and st["visible"] else None}


def _selectors(selectors: Sequence[str], art: Artifact, backend: str) -> List[str]:
    """kvq eval's selector names, the artifact's method standing for codebook."""
    out = []
    for s in selectors:
        s = "codebook" if s in ("artifact", art.method) else s
        if s not in SELECTORS:
            raise InvalidArgumentError(f"selector {s!r}: kvq eval's selectors are {', '.join(SELECTORS)} "
                                       f"(or the artifact's method, {art.method})", 500)
        if backend == "torch" and s not in ("full", "codebook"):
            raise UnsupportedError(f"selector {s}: the torch back end runs full and codebook "
                                   "(--backend engine runs every selector)", 400)
        out.append(s)
    return out


def _run_row(model: Any, artifact: str, sel: str, budget: Union[int, float], seqs: List[np.ndarray],
             source: Optional[Dict[str, str]], backend: str, bar: Any) -> Tuple[float, Dict[str, Any]]:
    """Sum of the retrieval nll over seqs, and the row's step statistics."""
    with retrieval(model, artifact, budget=budget, source=source, backend=backend) as r:
        if backend == "engine":
            # the C engine's sequence with this row's selector, measured as kvq eval's
            r.seq.close()
            r.seq_args.update(selector=sel, measure=True)
            r.seq = r.engine.sequence(**r.seq_args)
        tot = 0.0
        for s in seqs:
            tot += _retrieval_nll(model, s)
            if bar is not None:
                bar.update(len(s) - 1)
        st: Dict[str, Any] = r.seq.stats() if backend == "engine" else dict(r.stats)
    return tot, st


def _positions(art: Artifact) -> Tuple[str, str]:
    """The position mode and scoring query the engine applies: the artifact's
    (positions.mode / positions.score, kvq calibrate's choice), else wrope and mean."""
    m, sc = art.metadata.get("positions.mode"), art.metadata.get("positions.score")
    return (m, sc) if m and sc else ("wrope", "mean")


def evaluate(model: Any, tokenizer: Any, corpus: str, artifact: str, seq_len: int = 512,
             budgets: Sequence[Union[str, int, float]] = ("6%",), selectors: Sequence[str] = ("full", "codebook"),
             source: Optional[Dict[str, str]] = None, max_tokens: int = 0, seed: int = 0,
             backend: str = "engine", progress: bool = False,
             sequences: Optional[Sequence[Sequence[int]]] = None) -> Dict[str, Any]:
    """The JSON object of `kvq eval --json` (the fields named in the module's docstring)
    for ``model`` (an HF causal LM) with the artifact ``artifact``. ``corpus`` is a kvq
    corpus spec (tokenized by ``tokenizer``, cut into sequences of ``seq_len`` tokens as
    kvq capture cuts them); ``sequences`` (token ids) replaces it when given.
    ``selectors``: kvq eval's names (full, codebook or the artifact's method, oracle,
    fier, quest, mass), each with every budget (full once, budget "all"), in the order
    given. Raises InvalidArgumentError for an unknown selector or an empty corpus,
    UnsupportedError for a selector the back end lacks or a corpus with task documents,
    and the errors of :func:`kvq.hf.retrieval` (MismatchError for another model's
    artifact, ...)."""
    import torch

    desc = describe_model(model, source)
    art = Artifact(artifact)
    if sequences is not None:
        seqs = [np.asarray(s, dtype=np.int64) for s in sequences]
        chash = "0" * 16
    else:
        tasks = [x for x in corpus.split(",") if x.split(":", 1)[0] in ("passkey", "kv-recall")]
        if tasks:
            raise UnsupportedError(f"{corpus}: task documents ({', '.join(tasks)}) are scored by "
                                   "kvq eval only (their answers decoded greedily)", 400)
        bos, sep = _bos_rule(tokenizer, model.config)
        packed = pack(documents(corpus, seed), _encoder(tokenizer, (source or {}).get("tokenizer_error", "")),
                      seq_len, max_tokens, bos, sep, n_vocab=desc["vocab_size"])
        seqs = [np.asarray(s, dtype=np.int64) for s in packed.sequences]
        chash = packed.hash_hex
    seqs = [s for s in seqs if len(s) >= 2]
    if not seqs:
        raise InvalidArgumentError(f"{corpus}: no sequence of 2 or more tokens to score", 500)
    sels = _selectors(selectors, art, backend)
    n_pred = sum(len(s) - 1 for s in seqs)
    jobs = [(s, "all" if s == "full" else b) for s in sels for b in (["all"] if s == "full" else budgets)]
    bar = None
    if progress:
        try:
            from tqdm.auto import tqdm
            bar = tqdm(total=n_pred * (len(jobs) + 1), desc="eval", unit="tok")
        except ImportError:
            bar = None
    d = desc["head_dim"]
    task0 = [0, 0]
    with torch.no_grad():
        ref = 0.0
        for s in seqs:
            ref += _dense_nll(model, s)
            if bar is not None:
                bar.update(len(s) - 1)
        ref_nll = ref / n_pred
        rows: List[Dict[str, Any]] = []
        for sel, b in jobs:
            tot, st = _run_row(model, artifact, sel, parse_budget(b), seqs, source, backend, bar)
            nll = tot / n_pred
            rows.append({"selector": art.method if sel == "codebook" else sel,
                         "budget": "all" if sel == "full" else str(b),
                         "bits_per_key": round(_bits_per_key(sel, art, d), 4), "nll": round(nll, 6),
                         "perplexity": round(math.exp(nll), 6),
                         "perplexity_delta": round(math.exp(nll) - math.exp(ref_nll), 6),
                         "perplexity_rel": round(math.exp(nll) / math.exp(ref_nll) - 1, 6),
                         "steps": int(st["steps"]), **_row_metrics(st, backend == "engine"),
                         "passkey": list(task0), "kv_recall": list(task0), "answers": ""})
    if bar is not None:
        bar.close()
    w, _ = art.wrope
    pos, score = _positions(art)
    return {"model": (source or {}).get("file", desc["path"]), "corpus": redact_paths(corpus),
            "corpus_hash": chash, "attention": "retrieval", "artifact": artifact, "method": art.method,
            "score": score, "rerank": 0, "rerank_extra": 0.08, "resid_bits": 1, "resid_wide": 64,
            "resid_group": "max", "resid_share": 1, "local_layers": [], "positions": pos, "sink": 4,
            "window": w, "cache": "f16", "group": "sum", "tau": 0.9, "seq_len": seq_len, "scored": "all",
            "sequences": len(seqs), "tokens": int(sum(len(s) for s in seqs)), "predicted": n_pred,
            "backend": backend,
            "reference": {"nll": round(ref_nll, 6), "perplexity": round(math.exp(ref_nll), 6),
                          "passkey": list(task0), "kv_recall": list(task0), "answers": ""},
            "rows": rows}
