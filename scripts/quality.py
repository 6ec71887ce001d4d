#!/usr/bin/env python3
"""Retrieval quality tables of docs/QUALITY.md for any model and corpus.

Calibrates once (kvq calibrate --no-profile, reused on a second run) or takes
--artifact, runs `kvq eval --json` per configuration, keeps each JSON output in --work,
and prints markdown tables:

  ppl    per selector its bits per key, the perplexity increase over full attention at
         each budget, the KV bytes read at each budget, the ratio of each increase to
         the oracle's at the same budget (when the oracle ran), and the top-k recall
         and task answers at the middle budget;
  tasks  per selector the task prompts answered at each budget (passkey, multi-key),
         with full attention's answers first.

  scripts/quality.py --model M.gguf --calib DIR_OR_SPEC --eval SPEC [--tasks SPEC]
                     [--seq-len 2048] [--eval-tokens 4096] [--budgets 3%,6%,12%]
                     [--config LABEL='--positions rope --score-pos mean' ...] [--work DIR]
                     [--score last:256] [--table ppl|tasks|both]
  scripts/quality.py --from-json RUN.json [RUN.json ...] [--table ...]

--score last:N scores only the last N tokens of each sequence, each a one-token decode
step with retrieval after an exact prefill (the long-context protocol, e.g. 8K
sequences: kvq eval --help). --tasks takes generator specs (passkey:N,kv-recall:N) or a
jsonl file of prompts with answers (scripts/gen_tasks.py); its run scores no text
(--max-tokens 2: its perplexity is not reported), only the answers.
A --config may name its own --artifact (the last one given wins), for ablations of the
codebook.

Each --config adds one `kvq eval` run with those extra options (default: positions
rope with the rb, mean and bands scoring queries); its codebook rows are labelled
"selector/LABEL" (every row, when its options change the position mode). Every command
is printed before it runs (stderr), so a table can be reproduced by hand, and its JSON
is kept as WORK/eval-LABEL.json (WORK/tasks-LABEL.json for --tasks): --from-json
prints the tables again from such files, in the order given, without running kvq (a
file whose reference answered task prompts is read as a task run).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PLAIN = ("full", "oracle", "fier", "quest")

Row = Dict[str, Any]
Table = Dict[str, Dict[str, Row]]  # row name -> budget -> kvq eval row (merged)


class QualityError(Exception):
    pass


def run(cmd: List[str]) -> str:
    print("+ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE)
    if r.returncode:
        raise QualityError(f"quality: command failed with {r.returncode}: {cmd[0]} {cmd[1]}")
    return r.stdout.decode()


def kinds(d: Dict[str, Any]) -> Tuple[bool, bool]:
    """(scores text, answers tasks): a task run scores at most 2 tokens (--max-tokens 2)."""
    ref = d["reference"]
    return d["tokens"] > 2, ref["passkey"][1] + ref["kv_recall"][1] > 0


def row_name(r: Row, label: str, own_label: bool) -> str:
    if r["selector"] in PLAIN and not own_label:
        return r["selector"]
    return f'{r["selector"]}/{label}' if label else r["selector"]


def merge(rows: Table, d: Dict[str, Any], label: str, own_label: bool, tasks: bool) -> None:
    """Adds the rows of one kvq eval JSON: text figures, or a task run's answers."""
    for r in d["rows"]:
        row = rows.setdefault(row_name(r, label, own_label), {}).setdefault(r["budget"], {})
        if tasks:
            row["passkey"] = r["passkey"]
            row["kv_recall"] = r["kv_recall"]
            row.setdefault("bits_per_key", r["bits_per_key"])
        else:
            row.update({k: v for k, v in r.items() if k not in ("passkey", "kv_recall")
                        or k not in row})


def pct(x: Optional[float], signed: bool) -> str:
    if x is None:
        return "—"
    return f"{100 * x:+.2f}%" if signed else f"{100 * x:.1f}%"


def ppl_table(rows: Table, budgets: List[str], ref: Dict[str, Any]) -> List[str]:
    mid = budgets[len(budgets) // 2]
    has_oracle = any(n.split("/")[0] == "oracle" for n in rows)
    bl = " / ".join(budgets)
    head = "| selector (bits per key) | " + " | ".join(budgets) + f" | KV read {bl} |"
    if has_oracle:
        head += f" x oracle {bl} |"
    head += f" top-k recall at {mid} | tasks at {mid} |"
    out = [head, "|---" * (len(budgets) + 4 + has_oracle) + "|"]
    for name, by in rows.items():
        # the oracle of the same configuration (its own label under wrope), else the plain one
        label = name.partition("/")[2]
        oracle = rows.get(f"oracle/{label}", rows.get("oracle", {})) if label else rows.get("oracle", {})
        cells, reads, ratios = [], [], []
        for b in budgets:
            r = by.get(b) or by.get("all") or {}
            inc = r.get("perplexity_rel")
            cells.append(pct(inc, True))
            reads.append(pct(r.get("kv_read_fraction"), False) if r else "—")
            o = (oracle.get(b) or {}).get("perplexity_rel")
            plain = name.split("/")[0] == "full"
            ratios.append(f"{inc / o:.2f}x" if inc is not None and o and not plain else "—")
        r = by.get(mid) or by.get("all") or {}
        tasks = ""
        if r.get("passkey") and (r["passkey"][1] or r["kv_recall"][1]):
            tasks = f"{r['passkey'][0]}/{r['passkey'][1]}, {r['kv_recall'][0]}/{r['kv_recall'][1]}"
        rec = f"{r['recall_topk']:.2f}" if r.get("recall_topk") is not None else "—"
        bits = next((x["bits_per_key"] for x in by.values() if "bits_per_key" in x), 0)
        line = f"| {name} ({bits:g}) | " + " | ".join(cells) + f" | {' / '.join(reads)} |"
        if has_oracle:
            line += f" {' / '.join(ratios)} |"
        out.append(line + f" {rec} | {tasks} |")
    return out


def tasks_table(rows: Table, budgets: List[str], ref: Dict[str, Any]) -> List[str]:
    kinds = [("passkey", "passkey"), ("kv_recall", "multi-key")]
    z = [0, 0]
    head = "| correct answers | " + " | ".join(f"{k} {b}" for _, k in kinds for b in budgets) + " |"
    out = [head, "|---" * (1 + 2 * len(budgets)) + "|"]

    def frac(v: Optional[List[int]]) -> str:
        return f"{v[0]}/{v[1]}" if v and v[1] else "—"

    out.append("| full attention | " + " | ".join(
        frac(ref.get(k)) if i == 0 else "" for k, _ in kinds for i in range(len(budgets))) + " |")
    for name, by in rows.items():
        if not any((by.get(b) or {}).get(k, z)[1] for b in budgets for k, _ in kinds):
            continue
        out.append(f"| {name} | " + " | ".join(
            frac((by.get(b) or by.get("all") or {}).get(k)) for k, _ in kinds for b in budgets) + " |")
    return out


def print_tables(rows: Table, budgets: List[str], ref: Dict[str, Any], task_ref: Dict[str, Any],
                 what: str, title: str) -> None:
    if what in ("ppl", "both"):
        print(f"full attention perplexity {ref['perplexity']:.4f} ({title})\n")
        print("\n".join(ppl_table(rows, budgets, ref)))
    if what in ("tasks", "both"):
        if what == "both":
            print()
        if not task_ref:
            raise QualityError("quality: --table tasks needs a task run (--tasks, or its JSON)")
        print("\n".join(tasks_table(rows, budgets, task_ref)))


def from_json(paths: List[str], what: str) -> None:
    rows: Table = {}
    budgets: List[str] = []
    ref: Dict[str, Any] = {}
    task_ref: Dict[str, Any] = {}
    title = ""
    for p in paths:
        try:
            with open(p) as f:
                d = json.load(f)
            text, tasks = kinds(d)
            stem = os.path.splitext(os.path.basename(p))[0]
            label = stem.split("-", 1)[1] if stem.startswith(("eval-", "tasks-")) else ""
            own = d.get("positions") == "wrope" and label != ""
            if text:
                merge(rows, d, label, own, False)
            if tasks:
                merge(rows, d, label, own, True)
            for r in d["rows"]:
                if r["budget"] not in budgets and r["budget"] != "all":
                    budgets.append(r["budget"])
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            raise QualityError(f"quality: {p}: not a kvq eval --json output ({e})") from e
        if tasks and not task_ref:
            task_ref = d["reference"]
        if text and not ref:
            ref = d["reference"]
            title = (f"{d['corpus']}, {d['tokens']} tokens in sequences of {d['seq_len']}, "
                     f"scored: {d['scored']}")
    if what == "auto":
        what = "both" if ref and task_ref else "tasks" if task_ref else "ppl"
    if not ref and what in ("ppl", "both"):
        raise QualityError("quality: no text run among the JSON files (only task runs)")
    print_tables(rows, budgets, ref, task_ref, what, title)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvq", default=os.path.join(HERE, "..", "build", "kvq"))
    ap.add_argument("--model")
    ap.add_argument("--calib", help="calibration corpus spec")
    ap.add_argument("--eval", help="held-out text corpus spec")
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
    ap.add_argument("--table", choices=("ppl", "tasks", "both"), default="",
                    help="which tables (default: ppl, both with --tasks or a task run's JSON)")
    ap.add_argument("--from-json", nargs="+", metavar="FILE",
                    help="print the tables from kept kvq eval --json outputs, run nothing")
    a = ap.parse_args()
    what = a.table or ("both" if a.tasks else "ppl")
    if a.from_json:
        from_json(a.from_json, a.table or "auto")
        return
    if not a.model or not (a.calib or a.artifact) or not (a.eval or what == "tasks"):
        ap.error("--model, --eval and --calib (or --artifact) are required without --from-json")
    if what in ("tasks", "both") and not a.tasks:
        ap.error(f"--table {what} needs --tasks")
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
    rows: Table = {}
    ref: Dict[str, Any] = {}
    task_ref: Dict[str, Any] = {}
    for cfg in configs:
        label, _, opts = cfg.partition("=")
        corpora: List[Tuple[str, List[str], str]] = []
        if what != "tasks":
            corpora.append((a.eval, ["--max-tokens", str(a.eval_tokens)] +
                            (["--score", a.score] if a.score else []), "eval"))
        if a.tasks:
            corpora.append((a.tasks, ["--max-tokens", "2"], "tasks"))
        for spec, extra, kind in corpora:
            out = run([a.kvq, "eval", "--model", a.model, "--artifact", art, "--corpus", spec,
                       "--seq-len", str(a.seq_len), "--selectors", a.selectors, "--budgets",
                       a.budgets, "--threads", str(a.threads), "--json", "-q"] + extra +
                      shlex.split(opts))
            with open(os.path.join(a.work, f"{kind}-{label}.json"), "w") as f:
                f.write(out)
            d = json.loads(out)
            if kind == "eval":
                ref = ref or d["reference"]
            else:
                task_ref = task_ref or d["reference"]
            merge(rows, d, label, "wrope" in opts, kind == "tasks")
    title = (f"{a.eval}, {a.eval_tokens} tokens in sequences of {a.seq_len}"
             f"{', scored: ' + a.score if a.score else ''}")
    print_tables(rows, budgets, ref, task_ref, what, title)


if __name__ == "__main__":
    try:
        main()
    except QualityError as e:
        sys.exit(str(e))
