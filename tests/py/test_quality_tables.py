#!/usr/bin/env python3
"""scripts/quality.py --from-json: the tables of docs/QUALITY.md from kept `kvq eval
--json` outputs. The inputs are hand-written JSON in kvq eval's layout, and every
expected cell below was worked out by hand from them (increase = perplexity_rel in %,
x oracle = the row's increase over the same configuration's oracle's), not taken from
the script's output."""
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
script = os.path.join(root, "scripts", "quality.py")


def row(sel: str, budget: str, bits: float, rel: float, kv: Optional[float], recall: Optional[float],
        pk: List[int], kvr: List[int]) -> Dict[str, Any]:
    return {"selector": sel, "budget": budget, "bits_per_key": bits, "nll": 0.0, "perplexity": 0.0,
            "perplexity_delta": 0.0, "perplexity_rel": rel, "steps": 1 if kv is not None else 0,
            "recall_topk": recall, "recall_mass": None, "out_rel_err": None,
            "kv_read_fraction": kv, "attended_fraction": None, "passkey": pk, "kv_recall": kvr,
            "answers": ""}


def run_json(positions: str, tokens: int, ref_pk: List[int], ref_kv: List[int],
             rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    return {"model": "m.gguf", "corpus": "dir:text", "corpus_hash": "0", "attention": "retrieval",
            "artifact": "a.kvq", "method": "qavq", "score": "bands", "positions": positions,
            "seq_len": 2048, "scored": "all", "sequences": 1, "tokens": tokens, "predicted": tokens,
            "reference": {"nll": 2.302585, "perplexity": 10.0, "passkey": ref_pk,
                          "kv_recall": ref_kv, "answers": ""}, "rows": rows}


z = [0, 0]
text = run_json("rope", 2048, z, z, [
    row("full", "all", 0, 0.0, 1.0, 1.0, z, z),
    row("oracle", "3%", 1024, 0.04, 0.56, 1.0, z, z),
    row("oracle", "6%", 1024, 0.02, 0.59, 1.0, z, z),
    row("qavq", "3%", 104, 0.05, 0.176, 0.70, z, z),
    row("qavq", "6%", 104, 0.03, 0.206, 0.75, z, z),
    row("fier", "3%", 192, 0.09, 0.184, 0.50, z, z),
    row("fier", "6%", 192, 0.06, 0.214, 0.51, z, z)])
wrope = run_json("wrope", 2048, z, z, [
    row("oracle", "3%", 1024, 0.10, 0.56, 1.0, z, z),
    row("oracle", "6%", 1024, 0.08, 0.59, 1.0, z, z),
    row("qavq", "3%", 8, 0.15, 0.10, 0.40, z, z),
    row("qavq", "6%", 8, 0.04, 0.13, 0.45, z, z)])
tasks = run_json("rope", 2, [3, 4], [2, 4], [
    row("oracle", "3%", 1024, 0.0, None, None, [4, 4], [4, 4]),
    row("oracle", "6%", 1024, 0.0, None, None, [4, 4], [3, 4]),
    row("qavq", "3%", 104, 0.0, None, None, [3, 4], [4, 4]),
    row("qavq", "6%", 104, 0.0, None, None, [4, 4], [4, 4]),
    row("fier", "3%", 192, 0.0, None, None, [4, 4], [1, 4]),
    row("fier", "6%", 192, 0.0, None, None, [4, 4], [2, 4])])

want_ppl = [
    "| selector (bits per key) | 3% | 6% | KV read 3% / 6% | x oracle 3% / 6% | top-k recall at 6% | tasks at 6% |",
    "| full (0) | +0.00% | +0.00% | 100.0% / 100.0% | — / — | 1.00 |  |",
    "| oracle (1024) | +4.00% | +2.00% | 56.0% / 59.0% | 1.00x / 1.00x | 1.00 | 4/4, 3/4 |",
    "| qavq/bands (104) | +5.00% | +3.00% | 17.6% / 20.6% | 1.25x / 1.50x | 0.75 | 4/4, 4/4 |",
    "| fier (192) | +9.00% | +6.00% | 18.4% / 21.4% | 2.25x / 3.00x | 0.51 | 4/4, 2/4 |",
    "| oracle/wr (1024) | +10.00% | +8.00% | 56.0% / 59.0% | 1.00x / 1.00x | 1.00 |  |",
    "| qavq/wr (8) | +15.00% | +4.00% | 10.0% / 13.0% | 1.50x / 0.50x | 0.45 |  |",
]
want_tasks = [
    "| correct answers | passkey 3% | passkey 6% | multi-key 3% | multi-key 6% |",
    "| full attention | 3/4 |  | 2/4 |  |",
    "| oracle | 4/4 | 4/4 | 4/4 | 3/4 |",
    "| qavq/bands | 3/4 | 4/4 | 4/4 | 4/4 |",
    "| fier | 4/4 | 4/4 | 1/4 | 2/4 |",
]

failed = 0


def check(name: str, cond: bool, detail: str = "") -> None:
    global failed
    if cond:
        print(f"ok {name}")
    else:
        failed += 1
        print(f"FAIL {name}: {detail}")


with tempfile.TemporaryDirectory() as d:
    paths = []
    for name, obj in (("eval-bands", text), ("eval-wr", wrope), ("tasks-bands", tasks)):
        paths.append(os.path.join(d, name + ".json"))
        with open(paths[-1], "w") as f:
            json.dump(obj, f)
    r = subprocess.run([sys.executable, script, "--from-json"] + paths, capture_output=True, text=True)
    lines = [x for x in r.stdout.splitlines() if x.startswith("| ")]
    check("quality_from_json_exit", r.returncode == 0, r.stderr)
    check("quality_title", r.stdout.startswith("full attention perplexity 10.0000 (dir:text"),
          r.stdout[:80])
    for w in want_ppl + want_tasks:
        check(f"quality_line {w[:40]}", w in lines, "\n".join(lines))
    check("quality_line_count", len(lines) == len(want_ppl) + len(want_tasks), "\n".join(lines))

    r = subprocess.run([sys.executable, script, "--from-json", paths[2], "--table", "ppl"],
                       capture_output=True, text=True)
    check("quality_tasks_only_refused", r.returncode != 0 and "no text run" in r.stderr and
          not r.stdout, r.stderr)

    bad = os.path.join(d, "eval-bad.json")
    with open(bad, "w") as f:
        f.write('{"rows": ')
    r = subprocess.run([sys.executable, script, "--from-json", paths[0], bad],
                       capture_output=True, text=True)
    check("quality_bad_json_names_file", r.returncode != 0 and bad in r.stderr and not r.stdout,
          r.stderr)

sys.exit(1 if failed else 0)
