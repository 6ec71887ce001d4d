"""kvq.report: one self-contained HTML page from a `kvq calibrate` work directory, its
artifact and any number of `kvq eval --json` results (docs/report.md).

>>> from kvq import report
>>> page = report.build(work="out.kvq.work", evals=["e.json"])
>>> report.write("report.html", page)            # refuses to replace a file unless force

The page has no script and fetches nothing: the figures are matplotlib's SVG inline, the
CSS is in the page. Every figure's numbers are also a table whose number cells carry
``data-key`` (a stable name) and ``data-value`` (the exact value); :func:`compare_text`
checks a text report (`kvq calibrate`'s summary, `kvq eval`'s table, the demo's
report.txt) against them. Errors are :class:`kvq.KvqError` subclasses naming the file."""
from __future__ import annotations

import errno
import os
from typing import List, Optional, Sequence, Tuple

from ..errors import KvqError, KvqIOError
from . import html as H
from .data import ArtifactInfo, EvalFile, WorkDir, check_inputs, read_artifact, read_eval, read_work
from .textcheck import Agreement, compare_text, html_values

__all__ = ["build", "write", "resolve_inputs", "compare_text", "html_values", "Agreement"]

_STAGE_ARTIFACTS = ("positions.kvq", "profile.kvq", "fit.kvq")


def resolve_inputs(work: Optional[str], artifact: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """The work directory and artifact to read: an artifact's default work directory is
    ARTIFACT.work (kvq calibrate's), a work directory's artifact is the path without
    '.work', else its last stage's artifact (positions.kvq, profile.kvq, fit.kvq)."""
    if work is None and artifact is None:
        raise KvqError("report: give a calibrate work directory (--work) or an artifact (--artifact)")
    if work is None and os.path.isdir(f"{artifact}.work"):
        work = f"{artifact}.work"
    if artifact is None and work is not None:
        base = work.rstrip("/")
        if base.endswith(".work") and os.path.isfile(base[:-5]):
            artifact = base[:-5]
        else:
            artifact = next((os.path.join(work, n) for n in _STAGE_ARTIFACTS
                             if os.path.isfile(os.path.join(work, n))), None)
            if artifact is None and os.path.isdir(work):
                raise KvqIOError(f"{work}: no artifact found ({os.path.basename(base[:-5]) if base.endswith('.work') else 'OUT.kvq'} "
                                 "beside it, or a stage's in it): pass --artifact")
    return work, artifact


def build(work: Optional[str] = None, artifact: Optional[str] = None, evals: Sequence[str] = (),
          title: Optional[str] = None, command: str = "") -> str:
    """The report's HTML. `command` (the command that makes the report) is shown with
    the inputs' commands. Reads every input before rendering anything."""
    if work is None and artifact is None and not evals:
        raise KvqError("report: give a calibrate work directory (--work), an artifact (--artifact) "
                       "or kvq eval --json results (--eval)")
    w: Optional[WorkDir] = read_work(work) if work is not None else None
    if work is not None or artifact is not None:
        work, artifact = resolve_inputs(work, artifact)
    if w is None and work is not None:
        w = read_work(work)
    a: Optional[ArtifactInfo] = read_artifact(artifact) if artifact is not None else None
    labels = _labels(evals)
    ev: List[EvalFile] = [read_eval(p, labels[i]) for i, p in enumerate(evals)]
    check_inputs(ev)
    return _render(w, a, ev, title, command)


def _labels(paths: Sequence[str]) -> List[str]:
    base = [os.path.basename(p) for p in paths]
    return [b if base.count(b) == 1 else p for b, p in zip(base, paths)]


def _render(w: Optional[WorkDir], a: Optional[ArtifactInfo], ev: List[EvalFile], title: Optional[str],
            command: str) -> str:
    from .sections_calib import heatmap_section, profile_section, stages_and_size_section, summary_rows
    from .sections_eval import eval_sections
    model = (a.metadata.get("model.name") or a.metadata.get("model.path")) if a else None
    title = title or "kvq calibration report" + (f": {model}" if model else "")
    lead = []
    if a is not None:
        lead.append(f"artifact {a.path} ({a.method}, {a.file_size:,} bytes)")
    if w is not None:
        lead.append(f"work directory {w.path}")
    lead.append(f"{len(ev)} kvq eval result{'s' if len(ev) != 1 else ''}")
    sections: List[str] = []
    nav: List[Tuple[str, str]] = []
    sections += eval_sections(ev)
    nav += [("eval", "Perplexity"), ("tasks", "Tasks")]
    if a is not None:
        sections.append(profile_section(a))
        sections.append(heatmap_section(a, w))
        nav += [("profile", "LeanKV & PATS"), ("heads", "Per head")]
    if a is not None or w is not None:
        sections.append(stages_and_size_section(a, w))
        nav.append(("calibrate", "Stages & size"))
    if a is not None:
        sections.append(H.section("summary", "Summary", [H.table(
            ["quantity", "value"], summary_rows(a), "What kvq calibrate reports, read from the artifact",
            tid="summary-table")]))
        nav.append(("summary", "Summary"))
    sections.append(H.section("commands", "The commands that made the inputs", [_commands(w, ev, command)]))
    nav.append(("commands", "Commands"))
    return H.page(title, "; ".join(lead) + ".", nav, sections)


def _commands(w: Optional[WorkDir], ev: List[EvalFile], command: str) -> str:
    from .sections_eval import eval_commands
    out: List[str] = []
    if w is not None:
        cmds = w.commands()
        if cmds:
            for c, stages in cmds:
                out.append(H.note(f"kvq calibrate (stages {stages}):"))
                out.append(H.code(c))
        else:
            out.append(H.note(f"{w.path}: the calibrate command is not recorded (STAGE.run.json is written "
                              "by kvq calibrate from this version on).", "missing"))
    for path, c in eval_commands(ev):
        out.append(H.note(f"kvq eval ({path}):"))
        out.append(H.code(c))
    if command:
        out.append(H.note("This report:"))
        out.append(H.code(command))
    return "\n".join(out)


def write(path: str, page: str, force: bool = False) -> None:
    """Writes the page to `path` whole or not at all: a temporary beside it, then a rename.
    An existing file is replaced only with force (else KvqIOError naming it)."""
    d = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise KvqIOError(f"{path}: is a directory")
    if os.path.lexists(path) and not force:
        raise KvqIOError(f"{path}: exists; pass --force to replace it")
    if not os.path.isdir(d):
        raise KvqIOError(f"{path}: its directory {d} does not exist")
    tmp = f"{path}.tmp.{os.getpid()}.{os.urandom(4).hex()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)
        if force:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    except FileExistsError:
        _unlink(tmp)
        raise KvqIOError(f"{path}: exists; pass --force to replace it") from None
    except OSError as e:
        _unlink(tmp)
        raise KvqIOError(f"{path}: write failed: {e.strerror}") from None


def _link_new(tmp: str, path: str) -> None:
    """Moves tmp to a path that must not exist: a hard link, which fails if the path
    appeared meanwhile (never replaced), or a rename where the file system has no links."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        if os.path.lexists(path):
            raise FileExistsError(path) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _unlink(p: str) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass
