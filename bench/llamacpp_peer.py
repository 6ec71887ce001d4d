#!/usr/bin/env python3
"""llamacpp_peer.py — llama.cpp's prefill and decode rates on the same tokens, for
bench/bench_model.c (which calls it and prints the ratios).

usage: llamacpp_peer.py MODEL.gguf IDS_FILE --threads N --prefill P --decode D [--rounds R]

IDS_FILE holds whitespace-separated token ids: the first P are the prompt, the next D
are fed one at a time after it. Per round: reset the context, evaluate the prompt as
one batch (prefill, logits of the last token only, as kvq's KVQ_LOGITS_LAST), then D
single-token evaluations (decode). Prints one JSON line with the best round's rates
(tokens per wall-clock second) and llama.cpp's version. n_threads and n_threads_batch
are both N; f32 logits; the KV cache in llama.cpp's default type (f16).

Only llama-cpp-python's public API is used: Llama.reset() rewinds the token count and
Llama.eval() drops the KV cache from there on before it evaluates. Install the pinned,
working version with scripts/install-llamacpp-peer.sh. Any failure (not installed, the
model does not load, eval fails) prints {"error": ...} and exits 1, so bench_model fails
the comparison instead of printing kvq's figures alone.
"""
import argparse
import json
import sys
import time


def rates(a: argparse.Namespace) -> dict:
    """Runs the rounds; returns the JSON record."""
    import llama_cpp

    with open(a.ids) as f:
        ids = [int(x) for x in f.read().split()]
    prompt, cont = ids[: a.prefill], ids[a.prefill: a.prefill + a.decode]
    if len(prompt) != a.prefill or len(cont) != a.decode:
        raise ValueError(f"{a.ids}: {len(ids)} ids, need {a.prefill + a.decode}")
    llm = llama_cpp.Llama(
        model_path=a.model,
        n_ctx=a.prefill + a.decode + 16,
        n_batch=max(a.prefill, 1),
        n_ubatch=max(a.prefill, 1),
        n_threads=a.threads,
        n_threads_batch=a.threads,
        logits_all=False,
        verbose=False,
    )
    best_p = best_d = 0.0
    for _ in range(a.rounds):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        for t in cont:
            llm.eval([t])
        t2 = time.perf_counter()
        if llm.n_tokens != len(prompt) + len(cont):
            raise RuntimeError(f"llama.cpp evaluated {llm.n_tokens} tokens, not "
                               f"{len(prompt) + len(cont)}")
        best_p = max(best_p, len(prompt) / (t1 - t0))
        best_d = max(best_d, len(cont) / (t2 - t1)) if cont else 0.0
    return {"prefill_tps": best_p, "decode_tps": best_d,
            "llama_cpp_python": llama_cpp.__version__, "threads": a.threads}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("ids")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--prefill", type=int, required=True)
    ap.add_argument("--decode", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    try:
        rec = rates(a)
    except ImportError as e:
        rec = {"error": f"llama_cpp (llama-cpp-python) is not installed "
                        f"(scripts/install-llamacpp-peer.sh): {e}"}
    except Exception as e:  # the peer's own failure, reported as a record
        rec = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.write(json.dumps(rec) + "\n")
    return 1 if "error" in rec else 0


if __name__ == "__main__":
    sys.exit(main())
