"""python -m kvq: the command line of the Python package.

    python -m kvq capture --model M --corpus SPEC -o CAP [--seq-len N] [--max-tokens N]
                          [--layers LIST] [--dtype f16|bf16|f32] [--device cpu|cuda]
                          [--torch-dtype float32|bfloat16|float16] [--seed S] [--force] [-q]
    python -m kvq generate --model M --artifact A [--budget 6%] --prompt TEXT [-n N]
                                              greedy text with kvq retrieval decoding
    python -m kvq generate ... [--backend engine|torch] [--device D]
    python -m kvq generate ... [--selector full|codebook|...] [--kv f16|leankv|pats|leankv+pats]
                       [--alpha-h X] [--alpha-l X] [--kv-window N] [--pats-schedule S] [--pats-b MIN:MAX]
                                              the C engine over a compressed KV cache
    python -m kvq eval --model M --artifact A --corpus SPEC [--seq-len N] [--budgets LIST]
                       [--selectors full,codebook,oracle,fier,quest,mass] [--backend engine|torch] [--json]
                                              kvq eval's retrieval perplexity rows
    python -m kvq inspect ARTIFACT            the artifact's description as JSON
    python -m kvq report --work W [--eval E.json ...] -o R.html   one HTML report (docs/report.md)
    python -m kvq version                     package and library versions

Errors print one line "kvq: MESSAGE" on stderr and exit 1 (2 for usage)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional


def _layers(spec: Optional[str]) -> Optional[List[int]]:
    if not spec:
        return None
    out: List[int] = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def _quiet_transformers() -> None:
    import os
    os.environ["TQDM_DISABLE"] = "1"  # transformers' GGUF loader's own bars
    try:
        import transformers
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except Exception:  # noqa: BLE001
        pass


def cmd_capture(a: argparse.Namespace) -> int:
    from . import hf
    if a.quiet:
        _quiet_transformers()
    model, tok, src = hf.load(a.model, device=a.device, dtype=a.torch_dtype)
    doc = hf.capture(model, tok, a.corpus, a.output, seq_len=a.seq_len, max_tokens=a.max_tokens,
                     layers=_layers(a.layers), dtype=a.dtype, seed=a.seed, source=src, force=a.force,
                     has_values=not a.no_values, progress=not a.quiet)
    if not a.quiet:
        print(f"capture: {a.output}: {doc['n_tokens']} tokens in {doc['n_sequences']} sequences, "
              f"{len(doc['layers'])} layers, fingerprint {doc['model'].get('fingerprint', '-')}",
              file=sys.stderr)
    return 0


def _kv_options(a: argparse.Namespace) -> Dict[str, Any]:
    """The engine sequence's selector and compressed-cache settings from --selector,
    --kv, --alpha-h, --alpha-l, --kv-window, --pats-schedule, --pats-b (kvq run's names)."""
    kv: Dict[str, Any] = {"selector": a.selector, "kv_cache": a.kv}
    if a.alpha_h is not None:
        kv["kv_alpha_h"] = a.alpha_h
    if a.alpha_l is not None:
        kv["kv_alpha_l"] = a.alpha_l
    if a.kv_window is not None:
        kv["kv_window"] = a.kv_window
    if a.pats_schedule is not None:
        kv["kv_pats_schedule"] = a.pats_schedule
    if a.pats_b is not None:
        lo, sep, hi = a.pats_b.partition(":")
        if not sep or not lo.isdigit() or not hi.isdigit():
            raise ValueError(f"--pats-b {a.pats_b!r}: expected MIN:MAX, e.g. 2:8")
        kv["kv_pats_b_min"], kv["kv_pats_b_max"] = int(lo), int(hi)
    return kv


def _add_kv_arguments(g: argparse.ArgumentParser) -> None:
    g.add_argument("--selector", default="codebook", choices=["codebook", "full", "oracle", "fier", "quest", "mass"],
                   help="who picks the attended tokens (default codebook; full: every token)")
    g.add_argument("--kv", default="f16", choices=["f16", "leankv", "pats", "leankv+pats"],
                   help="the engine's KV cache (docs/kvcache.md; default f16); compressed caches take the "
                        "artifact's profile unless the options below say otherwise; with a selector other "
                        "than full they need a rope artifact")
    g.add_argument("--alpha-h", type=float, help="LeanKV alpha_h")
    g.add_argument("--alpha-l", type=float, help="LeanKV alpha_l (<= alpha_h)")
    g.add_argument("--kv-window", type=int, help="LeanKV recent window")
    g.add_argument("--pats-schedule", choices=["old-heavy", "new-heavy", "middle-heavy"], help="PATS schedule")
    g.add_argument("--pats-b", metavar="MIN:MAX", help="PATS truncated bits, 0 <= MIN <= MAX <= 10")


def cmd_generate(a: argparse.Namespace) -> int:
    import torch

    from . import hf
    from .hf.eval import parse_budget
    from .hf.retrieval import retrieval
    kv = _kv_options(a) if a.backend == "engine" else {}
    _quiet_transformers()
    model, tok, src = hf.load(a.model, device=a.device, dtype="float32")
    if tok is None:
        raise ValueError(f"{a.model}: no tokenizer: {src.get('tokenizer_error', 'no tokenizer files')}")
    ids = tok(a.prompt, add_special_tokens=True, return_tensors="pt")["input_ids"].to(a.device)
    if ids.shape[1] == 0:
        raise ValueError("--prompt: empty prompts are not supported")
    if a.backend == "engine":
        kv["max_tokens"] = int(ids.shape[1]) + a.n  # PATS lays its schedule over the sequence
    with retrieval(model, a.artifact, budget=parse_budget(a.budget), source=src, backend=a.backend,
                   accept_model_mismatch=a.accept_model_mismatch, **kv) as r, torch.no_grad():
        if r.engine.weights_note:
            print(f"kvq: warning: {r.engine.weights_note}", file=sys.stderr)
        out = model.generate(ids, max_new_tokens=a.n, do_sample=False, num_beams=1,
                             pad_token_id=tok.eos_token_id)
    new = out[0, ids.shape[1]:]
    sys.stdout.write(a.prompt + tok.decode(new, skip_special_tokens=True) + "\n")
    return 0


def cmd_eval(a: argparse.Namespace) -> int:
    from . import hf
    from .hf.eval import evaluate
    _quiet_transformers()
    model, tok, src = hf.load(a.model, device=a.device, dtype="float32")
    doc = evaluate(model, tok, a.corpus, a.artifact, seq_len=a.seq_len, budgets=a.budgets.split(","),
                   selectors=a.selectors.split(","), source=src, max_tokens=a.max_tokens, seed=a.seed,
                   backend=a.backend, progress=not a.quiet and not a.json)
    if a.json:
        import shlex
        cmd = "python -m kvq " + " ".join(shlex.quote(x) for x in sys.argv[1:])
        json.dump({"command": cmd, **doc}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    ref = doc["reference"]

    def col(v: Optional[float], w: int, p: int, pct: bool = False) -> str:
        if v is None:
            return f"{'-':>{w}}"
        return f"{100 * v:>{w - 1}.{p}f}%" if pct else f"{v:>{w}.{p}f}"
    print(f"reference   full attention: nll {ref['nll']:.6f} nats/token, perplexity {ref['perplexity']:.4f}")
    print(f"\n{'selector':<12} {'budget':<7} {'bits':>6} {'ppl':>10} {'d_ppl':>9} {'d_ppl%':>8} {'recall':>7} "
          f"{'mass':>7} {'out_err':>8} {'kv_read':>8}")
    for r in doc["rows"]:
        print(f"{r['selector']:<12} {r['budget']:<7} {r['bits_per_key']:>6.1f} {r['perplexity']:>10.4f} "
              f"{r['perplexity_delta']:>+9.4f} {100 * r['perplexity_rel']:>+7.2f}% {col(r['recall_topk'], 7, 3)} "
              f"{col(r['recall_mass'], 7, 3)} {col(r['out_rel_err'], 8, 4)} {col(r['kv_read_fraction'], 8, 2, True)}")
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    from .artifact import Artifact
    json.dump(Artifact(a.artifact, validate=False).describe(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def cmd_version(a: argparse.Namespace) -> int:
    from . import __version__, library_path, library_version
    print(f"kvq-python {__version__}, libkvq {library_version()} ({library_path()})")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvq", description="kvq from Python")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture", help="capture pre-RoPE q, k, v of an HF model into kvq's capture directory")
    c.add_argument("--model", required=True, help="HF directory or GGUF file")
    c.add_argument("--corpus", required=True, help="corpus spec, as kvq capture (uuid:64,file:a.txt, ...)")
    c.add_argument("-o", "--output", required=True, help="capture directory to write")
    c.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default 256)")
    c.add_argument("--max-tokens", type=int, default=0, help="stop after N tokens (default: all)")
    c.add_argument("--layers", help="layers to store, e.g. 0,2,5-7 (default all)")
    c.add_argument("--dtype", default="f16", choices=["f16", "bf16", "f32"], help="storage of q, k, v")
    c.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    c.add_argument("--torch-dtype", default="float32", help="model dtype: float32 | bfloat16 | float16")
    c.add_argument("--seed", type=int, default=0, help="seed of the synthetic corpora (default 0)")
    c.add_argument("--no-values", action="store_true", help="do not store v")
    c.add_argument("--force", action="store_true", help="replace OUTPUT if it is a capture directory")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress or summary")
    c.set_defaults(fn=cmd_capture)
    g = sub.add_parser("generate", help="greedy generation in HF transformers with kvq retrieval decoding")
    g.add_argument("--model", required=True, help="HF directory or GGUF file")
    g.add_argument("--artifact", required=True, help="the model's .kvq artifact")
    g.add_argument("--budget", default="6%", help="a count, a fraction (0.06) or a percentage (6%%)")
    g.add_argument("--backend", default="engine", choices=["engine", "torch"], help="selection back end")
    g.add_argument("--prompt", required=True, help="text to continue")
    g.add_argument("-n", type=int, default=64, help="tokens to generate (default 64)")
    g.add_argument("--device", default="cpu", help="torch device of the model (the torch back end stays on it)")
    g.add_argument("--accept-model-mismatch", action="store_true",
                   help="use an artifact fitted on other weights (with a warning)")
    _add_kv_arguments(g)
    g.set_defaults(fn=cmd_generate)
    e = sub.add_parser("eval", help="kvq eval's retrieval perplexity rows of an HF model")
    e.add_argument("--model", required=True, help="HF directory or GGUF file")
    e.add_argument("--artifact", required=True, help="the model's .kvq artifact")
    e.add_argument("--corpus", required=True, help="corpus spec, as kvq eval")
    e.add_argument("--seq-len", type=int, default=512, help="tokens per sequence (default 512)")
    e.add_argument("--max-tokens", type=int, default=0, help="stop after N tokens (default: all)")
    e.add_argument("--budgets", default="6%", help="comma-separated budgets: count, fraction or percentage")
    e.add_argument("--selectors", default="full,codebook",
                   help="comma-separated: full, codebook (or the method's name), oracle, fier, quest, mass "
                        "(the torch back end: full and codebook)")
    e.add_argument("--backend", default="engine", choices=["engine", "torch"], help="selection back end")
    e.add_argument("--device", default="cpu", help="torch device of the model")
    e.add_argument("--seed", type=int, default=0, help="seed of the synthetic corpora (default 0)")
    e.add_argument("--json", action="store_true", help="print kvq eval's JSON object")
    e.add_argument("-q", "--quiet", action="store_true", help="no progress")
    e.set_defaults(fn=cmd_eval)
    i = sub.add_parser("inspect", help="an artifact's description as JSON")
    i.add_argument("artifact")
    i.set_defaults(fn=cmd_inspect)
    v = sub.add_parser("version", help="package and library versions")
    v.set_defaults(fn=cmd_version)
    from .report.cli import add_parser as add_report  # python -m kvq report (docs/report.md)
    add_report(sub)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except (KeyboardInterrupt, BrokenPipeError):
        return 130
    except Exception as e:  # noqa: BLE001  (one line for the user, not a traceback)
        from .errors import KvqError
        kind = "" if isinstance(e, KvqError) else type(e).__name__ + ": "
        print(f"kvq: {kind}{e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
