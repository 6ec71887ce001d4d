"""`python -m kvq report`: the command line of kvq.report (docs/report.md)."""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import List


def add_parser(sub: "argparse._SubParsersAction") -> None:
    """Registers the report subcommand on python -m kvq's subparsers."""
    r = sub.add_parser("report", help="one self-contained HTML report of a calibration and its evaluations",
                       description="One HTML file (no network: CSS inline, figures as inline SVG) from a "
                       "kvq calibrate work directory, its artifact and any number of kvq eval --json results.")
    r.add_argument("--work", help="kvq calibrate's work directory (OUT.kvq.work; default: ARTIFACT.work)")
    r.add_argument("--artifact", help="the artifact (default: the work directory's OUT.kvq, else its last stage's)")
    r.add_argument("--eval", action="append", default=[], metavar="JSON", nargs="+",
                   help="kvq eval --json results (repeatable; each adds its rows)")
    r.add_argument("-o", "--output", required=True, help="the HTML file to write")
    r.add_argument("--title", help="the page's title")
    r.add_argument("--check-text", metavar="TXT",
                   help="also check that this text report (kvq calibrate's summary, kvq eval's table, "
                   "the demo's report.txt) agrees with the page on every number they share")
    r.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")
    r.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    r.set_defaults(fn=cmd_report)


def cmd_report(a: argparse.Namespace) -> int:
    import os

    from ..errors import KvqError
    from . import build, compare_text, write
    evals: List[str] = [p for group in a.eval for p in group]
    out = os.path.abspath(a.output)
    for p in evals + [x for x in (a.work, a.artifact, a.check_text) if x]:
        if os.path.exists(p) and os.path.exists(out) and os.path.samefile(p, out):
            raise KvqError(f"{a.output}: is one of the report's inputs")
        if os.path.isdir(p) and out.startswith(os.path.abspath(p) + os.sep):
            raise KvqError(f"{a.output}: is inside the input directory {p}")
    cmd = "python -m kvq " + " ".join(shlex.quote(x) for x in sys.argv[1:]) if sys.argv[1:2] == ["report"] else ""
    page = build(work=a.work, artifact=a.artifact, evals=evals, title=a.title, command=cmd)
    if a.check_text:
        try:
            with open(a.check_text, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise KvqError(f"{a.check_text}: cannot read: {e.strerror}") from None
        ag = compare_text(text, page)
        if not ag.ok:
            bad = "; ".join(f"{k}: text {t}, report {v:.6g}" for k, t, v, _ in ag.mismatches[:5])
            raise KvqError(f"{a.check_text}: disagrees with the report on {len(ag.mismatches)} of "
                           f"{len(ag.compared)} numbers ({bad or 'no number shared'})")
    write(a.output, page, force=a.force)
    if not a.quiet:
        extra = f"; {len(ag.compared)} numbers of {a.check_text} agree" if a.check_text else ""
        print(f"report: wrote {a.output}{extra}", file=sys.stderr)
    return 0
