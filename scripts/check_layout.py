#!/usr/bin/env python3
"""check_layout.py — the architecture rules of CONTRIBUTING.md, checked on the tree git tracks.

  1. functions: none longer than --max-func lines in the library and the CLI
     (generated tables, recognised by a "generated" mark in their file's first lines,
     are exempt);
  2. files: no library or CLI source longer than --max-file lines, except the files
     named in ONE_CONCEPT below with the reason they stay whole;
  3. folders: the graph of which folder includes which (quoted includes "dir/x.h" and
     public headers "kvq/x.h", mapped to the folder that implements them) only goes
     downwards in LAYERS (so it has no cycle), and LAYERS is the order CONTRIBUTING.md
     draws (its first code block, top to bottom = last to first);
  4. runtime/'s parts: a file in one of RUNTIME_PARTS includes from runtime/ only what
     its part may (the kernels nothing else of runtime/, the cache no selector, a
     selector no other selector: CONTRIBUTING.md "The runtime"), except the pairs named
     in RUNTIME_EXCEPT with the reason; every runtime/ file sits in a part.

Prints one line per violation and exits 1 when there is any; prints a summary and
exits 0 otherwise. Used by `make test` (tests/py/test_layout.py).
"""
import argparse
import os
import re
import subprocess
import sys

# Bottom to top: a folder may include only itself and folders before it.
LAYERS = ["common", "formats", "model", "calib", "cholesky", "codebook", "kmeans",
          "runtime", "eval", "thresholds", "pipeline", "cli"]

# Public headers that a folder other than their name implements.
HEADER_HOME = {
    "kvq.h": "cli",              # the umbrella header: for users of the library only
    "model_id.h": "model",
    "common.h": "common", "util.h": "common", "dist.h": "common",
    "half.h": "formats", "safetensors.h": "formats", "gguf.h": "formats",
    "artifact.h": "formats", "artifact_summary.h": "formats", "quant.h": "formats",
    "rope.h": "model", "model.h": "model", "tokenizer.h": "model",
    "perplexity.h": "model",
    "corpus.h": "calib", "capture.h": "calib", "capture_dir.h": "calib",
    "moments.h": "cholesky",
    "codebook.h": "codebook",
    "kmeans.h": "kmeans", "fit.h": "kmeans",
    "runtime.h": "runtime", "retrieval.h": "runtime", "engine.h": "runtime",
    "eval.h": "eval",
    "kvcache.h": "runtime",
    "thresholds.h": "thresholds", "summary.h": "thresholds",
    "calibrate.h": "pipeline",
}

# Files over the limit that are one concept each.
ONE_CONCEPT: dict[str, str] = {}

# runtime/'s parts (CONTRIBUTING.md "The runtime") and what each may include from
# runtime/: parts (a folder: its files, not its sub-folders' unless listed) or single
# files. A part always includes its own files.
RUNTIME_PARTS = {
    "runtime/kernels": [],  # the kernels per ISA: nothing else of runtime/
    "runtime/cuda": ["runtime/kernels"],
    "runtime/cache": ["runtime/kernels", "runtime", "runtime/select/selector.h"],
    "runtime/select": ["runtime/kernels", "runtime"],
    "runtime/select/codebook": ["runtime/kernels", "runtime", "runtime/select",
                                "runtime/cuda"],
    "runtime": ["runtime/kernels", "runtime/select/selector.h"],
}
RUNTIME_EXCEPT = {
    ("runtime/select/mass.c", "runtime/select/codebook/codes.h"):
        "the mass selector shares the codebook selector's codes and first stage (codes.h)",
    ("runtime/probe.c", "runtime/select/codebook/codebook.h"):
        "the probe measures the codebook selector's stages (its rerank memo)",
    ("runtime/probe.c", "runtime/select/mass.h"):
        "the probe shares the mass selector's score memo across taus",
    ("runtime/diag_needle.c", "runtime/select/codebook/codebook.h"):
        "a diagnostic build of the codebook selector's stages",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def tracked(patterns):
    out = subprocess.check_output(["git", "ls-files", "--"] + patterns, text=True)
    return [f for f in out.split("\n") if f and os.path.exists(f)]


def functions(lines):
    """(first line, length, name) of each top-level function: a body opened by '{' in
    column 0 and closed by '}' in column 0, with its signature above it."""
    start = None
    for i, line in enumerate(lines):
        if start is None and line.startswith("{"):
            j = i
            while j > 0 and lines[j - 1].strip() and not lines[j - 1].rstrip().endswith(
                    (";", "}", "*/")) and not lines[j - 1].startswith("#"):
                j -= 1
            start = j
        elif start is not None and line.startswith("}"):
            m = re.search(r"([A-Za-z_]\w*)\s*\(", " ".join(lines[start:start + 3]))
            yield start + 1, i - start + 1, m.group(1) if m else "?"
            start = None


def folder_of(path):
    top = path.split("/")[0]
    return top if top in LAYERS else None


def public_closure(header, seen=None):
    """The folders that public header kvq/HEADER stands for: its home and, through the
    public headers it includes, theirs."""
    seen = set() if seen is None else seen
    if header in seen:
        return set()
    seen.add(header)
    out = {HEADER_HOME.get(header, "?")}
    for line in open(os.path.join("include", "kvq", header), encoding="utf-8"):
        m = INCLUDE.match(line)
        if m and m.group(1).startswith("kvq/"):
            out |= public_closure(m.group(1)[4:], seen)
    return out


def runtime_part(path):
    """The part of RUNTIME_PARTS that runtime/ path belongs to (its folder), or None."""
    folder = os.path.dirname(path)
    return folder if folder in RUNTIME_PARTS else None


def runtime_problems(src):
    """Rule 4 on the runtime/ files of src."""
    bad = []
    for f in src:
        if not f.startswith("runtime/"):
            continue
        me = runtime_part(f)
        if me is None:
            bad.append(f"{f}: in no part of check_layout.py's RUNTIME_PARTS")
            continue
        for line in open(f, encoding="utf-8", errors="replace"):
            m = INCLUDE.match(line)
            if not m or not m.group(1).startswith("runtime/"):
                continue
            inc = m.group(1)
            part = os.path.dirname(inc)
            if part == me or part in RUNTIME_PARTS[me] or inc in RUNTIME_PARTS[me]:
                continue
            if (f, inc) in RUNTIME_EXCEPT:
                continue
            bad.append(f"{f}: {me}/ includes {inc}, which its part may not (RUNTIME_PARTS)")
    return bad


def contributing_order():
    """The folders of CONTRIBUTING.md's first code block, bottom to top."""
    text = open("CONTRIBUTING.md", encoding="utf-8").read()
    block = text.split("```")[1]
    names = [m.group(1) for m in re.finditer(r"^(\w+)/", block, re.M)]
    return list(reversed(names))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-func", type=int, default=150)
    ap.add_argument("--max-file", type=int, default=1000)
    ap.add_argument("--report", action="store_true", help="also list the longest functions")
    ap.add_argument("--graph", action="store_true", help="print which folders each folder uses")
    a = ap.parse_args()
    bad = []
    src = [f for f in tracked(["*.c", "*.h", "*.cu", "*.cuh"]) if folder_of(f)]
    longest = []
    for f in src:
        lines = open(f, encoding="utf-8", errors="replace").read().split("\n")
        generated = any("generated" in l.lower() for l in lines[:12])
        if len(lines) > a.max_file and f not in ONE_CONCEPT and not generated:
            bad.append(f"{f}: {len(lines)} lines (over {a.max_file}; split it by concept "
                       "or name it in ONE_CONCEPT with the reason)")
        if generated:
            continue
        for first, n, name in functions(lines):
            longest.append((n, f, first, name))
            if n > a.max_func:
                bad.append(f"{f}:{first}: {name} is {n} lines (over {a.max_func})")
    # folder graph
    edges = {}
    for f in src:
        me = folder_of(f)
        for line in open(f, encoding="utf-8", errors="replace"):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            if inc.startswith("kvq/"):
                if inc[4:] not in HEADER_HOME:
                    bad.append(f"{f}: includes {inc}, which check_layout.py's HEADER_HOME "
                               "does not place in a folder")
                    continue
                deps = public_closure(inc[4:])
            elif inc == "kvq.h":
                deps = {"cli"}
            else:
                deps = {inc.split("/")[0] if "/" in inc else me}
            for dep in deps & set(LAYERS):
                if dep != me:
                    edges.setdefault((me, dep), f)
    for (me, dep), f in sorted(edges.items()):
        if LAYERS.index(dep) > LAYERS.index(me):
            bad.append(f"{f}: {me}/ includes {dep}/, which sits above it")
    bad += runtime_problems(src)
    drawn = contributing_order()
    if drawn != LAYERS:
        bad.append(f"CONTRIBUTING.md draws the folders bottom-up as {drawn}, "
                   f"check_layout.py's LAYERS is {LAYERS}")
    if a.graph:
        for me in LAYERS:
            deps = sorted({d for (m, d) in edges if m == me}, key=LAYERS.index)
            print(f"{me:12s} -> {' '.join(deps) if deps else '(nothing)'}")
    for line in bad:
        print("layout:", line)
    if a.report:
        for n, f, first, name in sorted(longest, reverse=True)[:10]:
            print(f"  {n:4d} lines  {f}:{first} {name}")
    print(f"layout: {len(src)} files, {len(longest)} functions, {len(edges)} folder edges, "
          f"{len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
