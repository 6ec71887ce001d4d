#!/usr/bin/env python3
"""Retrieval quality table of docs/QUALITY.md for any model and corpus.

Calibrates once (kvq calibrate --no-profile, reused on a second run), then runs
`kvq eval --json` per configuration and prints a markdown table: per selector its bits
per key, the perplexity increase over full attention at each budget, the top-k recall
and the KV bytes read at the middle budget, and (with the oracle) the ratio of each
increase to the oracle's at the same budget.

  scripts/quality.py --model M.gguf --calib DIR_OR_SPEC --eval SPEC [--tasks SPEC]
                     [--seq-len 2048] [--eval-tokens 4096] [--budgets 3%,6%,12%]
                     [--config LABEL='--positions rope --score-pos mean' ...] [--work DIR]
                     [--score last:256]

--score last:N scores only the last N tokens of each sequence, each a one-token decode
step with retrieval after an exact prefill (the long-context protocol, e.g. 8K
sequences: kvq eval --help). --tasks takes generator specs (passkey:N,kv-recall:N) or a
jsonl file of prompts with answers (scripts/gen_tasks.py); its run scores no text
(--max-tokens 2: its perplexity is not reported), only the answers.
A --config may name its own --artifact (the last one given wins), for ablations of the
codebook.

Each --config adds one `kvq eval` run with those extra options (default: positions
rope with the rb, mean and bands scoring queries); its rows are labelled
"selector/LABEL". Every command is printed before it runs (stderr), so a table can be
reproduced by hand.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    print("+ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE)
    if r.returncode:
        sys.exit(f"quality: command failed with {r.returncode}")
    return r.stdout.decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvq", default=os.path.join(HERE, "..", "build", "kvq"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--calib", required=True, help="calibration corpus spec")
    ap.add_argument("--eval", required=True, help="held-out text corpus spec")
    ap.add_argument("--tasks", default="", help="task corpus (passkey:N,kv-recall:N), own run")
    ap.add_argument("--artifact", help="use this artifact instead of calibrating")
    ap.add_argument("--work", default="quality-out")
    ap.add_argument("--method", default="qavq")
    ap.add_argument("--codebook", type=int, default=0, help="K (0: calibrate's choice)")
    ap.add_argument("--calib-tokens", type=int, default=16384)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--eval-tokens", type=int, default=4096)
    ap.add_argument("--budgets", default="3%,6%,12%")
    ap.add_argument("--selectors", default="full,oracle,codebook,fier,quest")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--score", default="", help="kvq eval --score of the text run (last:N)")
    ap.add_argument("--config", action="append", default=[],
                    help="LABEL=OPTIONS: extra kvq eval options of one run")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    art = a.artifact
    if not art:
        art = os.path.join(a.work, f"{a.method}-k{a.codebook or 'auto'}.kvq")
        cmd = [a.kvq, "calibrate", "--model", a.model, "-o", art, "--corpus", a.calib,
               "--seq-len", str(a.seq_len), "--max-tokens", str(a.calib_tokens),
               "--method", a.method, "--no-profile", "--threads", str(a.threads), "-q"]
        if a.codebook:
            cmd += ["--codebook", str(a.codebook)]
        run(cmd)
    configs = a.config or ["rb=--positions rope --score-pos rb", "mean=--positions rope --score-pos mean",
                           "bands=--positions rope --score-pos bands"]
    budgets = a.budgets.split(",")
    mid = budgets[len(budgets) // 2]
    rows = {}  # label -> budget -> row
    ref = None
    for cfg in configs:
        label, _, opts = cfg.partition("=")
        corpora = [(a.eval, ["--max-tokens", str(a.eval_tokens)] +
                    (["--score", a.score] if a.score else []))]
        if a.tasks:
            corpora.append((a.tasks, ["--max-tokens", "2"]))
        for ci, (spec, extra) in enumerate(corpora):
            out = run([a.kvq, "eval", "--model", a.model, "--artifact", art, "--corpus", spec,
                       "--seq-len", str(a.seq_len), "--selectors", a.selectors, "--budgets",
                       a.budgets, "--threads", str(a.threads), "--json", "-q"] + extra +
                      shlex.split(opts))
            d = json.loads(out)
            if ci == 0:
                ref = d["reference"]
            for r in d["rows"]:
                name = r["selector"] if r["selector"] in ("full", "oracle", "fier", "quest") \
                    else f'{r["selector"]}/{label}'
                if r["selector"] in ("fier", "quest", "oracle", "full"):
                    name = f'{r["selector"]}/{label}' if "wrope" in opts else r["selector"]
                row = rows.setdefault(name, {}).setdefault(r["budget"], {})
                if ci == 0:
                    row.update(r)
                else:
                    row["passkey"] = r["passkey"]
                    row["kv_recall"] = r["kv_recall"]
    print(f"full attention perplexity {ref['perplexity']:.4f} ({a.eval}, "
          f"{a.eval_tokens} tokens in sequences of {a.seq_len}"
          f"{', scored: ' + a.score if a.score else ''})\n")
    head = "| selector (bits per key) | " + " | ".join(budgets) + \
        f" | top-k recall at {mid} | KV read at {mid} | tasks at {mid} |"
    print(head)
    print("|---" * (len(budgets) + 4) + "|")
    for name, by in rows.items():
        any_row = next(iter(by.values()))
        cells = []
        for b in budgets:
            r = by.get(b) or by.get("all")
            cells.append(f"{100 * r['perplexity_rel']:+.1f}%" if r else "")
        r = by.get(mid) or by.get("all")
        tasks = ""
        if r and "passkey" in r and (r["passkey"][1] or r["kv_recall"][1]):
            tasks = f"{r['passkey'][0]}/{r['passkey'][1]}, {r['kv_recall'][0]}/{r['kv_recall'][1]}"
        rec = f"{r['recall_topk']:.2f}" if r and r.get("recall_topk") is not None else "-"
        kv = f"{100 * r['kv_read_fraction']:.1f}%" if r and r.get("kv_read_fraction") else "-"
        print(f"| {name} ({any_row['bits_per_key']:g}) | " + " | ".join(cells) +
              f" | {rec} | {kv} | {tasks} |")


if __name__ == "__main__":
    main()
