"""The report's inputs read into plain Python structures: a `kvq calibrate` work
directory (its stages' parameter and run records, the moments file), the artifact (through
:class:`kvq.Artifact`) and any number of `kvq eval --json` results.

Every reader raises a :class:`kvq.KvqError` subclass whose message names the file and the
problem; nothing here prints."""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._safetensors import SafeTensors
from ..errors import FormatError, KvqError, KvqIOError

STAGES = ("capture", "moments", "fit", "heldout", "profile", "positions")
PATS_SCHEDULES = ("old-heavy", "new-heavy", "middle-heavy")  # runtime/cache/pats.c
WORK_MARK = ".kvq-work"


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise KvqIOError(f"{path}: No such file or directory") from None
    except IsADirectoryError:
        raise KvqIOError(f"{path}: is a directory, not a JSON file") from None
    except OSError as e:
        raise KvqIOError(f"{path}: cannot read: {e.strerror}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError(f"{path}: not valid JSON: {e}") from None


def _num(v: Any) -> float:
    """A JSON value as a float (NaN for null, strings that are not numbers, lists)."""
    if isinstance(v, bool) or v is None:
        return math.nan
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


# ---- the work directory -------------------------------------------------------------------

@dataclass
class StageRun:
    """One calibrate stage: its parameter record and, when recorded, its run."""
    name: str
    params: Optional[Dict[str, Any]]
    seconds: float = math.nan          # wall time of the run that made its output
    finished: str = ""                 # UTC end of that run
    command: str = ""                  # the command line of that run


@dataclass
class WorkDir:
    """What a `kvq calibrate` work directory holds for the report."""
    path: str
    stages: List[StageRun]
    lambdas: Optional[np.ndarray] = None   # [n_layers, n_kv] Cholesky ridge (moments)
    eps: Optional[np.ndarray] = None       # lambda / (tr H / d): the ridge relative to H
    moment_layers: List[int] = field(default_factory=list)

    def commands(self) -> List[Tuple[str, str]]:
        """(command, the stages it ran) for every distinct recorded command, oldest first."""
        out: Dict[str, List[str]] = {}
        for s in sorted((s for s in self.stages if s.command), key=lambda s: s.finished):
            out.setdefault(s.command, []).append(s.name)
        return [(c, ", ".join(v)) for c, v in out.items()]


def read_work(path: str) -> WorkDir:
    """Reads a calibrate work directory; raises KvqIOError / FormatError naming the file."""
    if not os.path.isdir(path):
        if os.path.exists(path):
            raise KvqIOError(f"{path}: not a directory (a kvq calibrate work directory is expected)")
        raise KvqIOError(f"{path}: No such file or directory")
    if not os.path.isfile(os.path.join(path, WORK_MARK)):
        raise FormatError(f"{path}: not a kvq calibrate work directory (no {WORK_MARK} mark)")
    stages: List[StageRun] = []
    for name in STAGES:
        rec = os.path.join(path, f"{name}.params.json")
        if not os.path.exists(rec):
            continue
        params = _read_json(rec)
        if not isinstance(params, dict):
            raise FormatError(f"{rec}: not a JSON object")
        s = StageRun(name, params)
        run = os.path.join(path, f"{name}.run.json")
        if os.path.exists(run):
            r = _read_json(run)
            if not isinstance(r, dict):
                raise FormatError(f"{run}: not a JSON object")
            s.seconds = _num(r.get("seconds"))
            s.finished = str(r.get("finished") or "")
            s.command = str(r.get("command") or "")
        stages.append(s)
    if not stages:
        raise FormatError(f"{path}: no stage records (*.params.json): calibrate has not run here")
    w = WorkDir(path, stages)
    mom = os.path.join(path, "moments.safetensors")
    if os.path.isfile(mom):
        _read_moments(w, mom)
    return w


def _read_moments(w: WorkDir, path: str) -> None:
    with open(path, "rb") as f:
        st = SafeTensors(f.read(), path)
    layers = sorted(int(m.group(1)) for n in st.names() for m in [re.fullmatch(r"layer\.(\d+)\.lambda", n)] if m)
    if not layers:
        return
    lam = [np.asarray(st.tensor(f"layer.{l}.lambda"), dtype=np.float64).reshape(-1) for l in layers]
    if len({a.size for a in lam}) != 1:
        raise FormatError(f"{path}: layer.N.lambda tensors of different sizes")
    w.moment_layers = layers
    w.lambdas = np.stack(lam)
    eps = np.full_like(w.lambdas, np.nan)
    for i, l in enumerate(layers):
        name = f"layer.{l}.H"
        if name in st:
            h = np.asarray(st.tensor(name), dtype=np.float64)
            if h.ndim == 3 and h.shape[0] == w.lambdas.shape[1]:
                mean_eig = np.trace(h, axis1=1, axis2=2) / h.shape[1]
                with np.errstate(divide="ignore", invalid="ignore"):
                    eps[i] = np.where(mean_eig > 0, w.lambdas[i] / mean_eig, np.nan)
    w.eps = eps


# ---- the artifact --------------------------------------------------------------------------

@dataclass
class Knob:
    """A profile table (profile.NAME) with its chosen row."""
    name: str
    columns: List[str]
    rows: np.ndarray                    # [n_rows, n_cols]
    chosen: int = -1                    # index of the chosen row, -1: none
    chosen_values: Dict[str, float] = field(default_factory=dict)
    met: int = -1                       # thresholds.NAME.met: 1, 0, -1 absent
    skipped: str = ""

    def col(self, name: str) -> np.ndarray:
        return self.rows[:, self.columns.index(name)] if name in self.columns else np.full(len(self.rows), np.nan)


@dataclass
class ArtifactInfo:
    """What the report shows of an artifact."""
    path: str
    file_size: int
    payload_size: int
    metadata: Dict[str, str]
    layers: List[int]
    n_kv: int
    method: str
    grids: Dict[str, np.ndarray]        # score_mse, score_mse_ref, score_power: [n_fit, n_kv]
    k: np.ndarray                       # [n_fit, n_kv] centroids per codebook
    k_used: np.ndarray                  # [n_fit, n_kv] non-empty clusters (mean over groups)
    knobs: Dict[str, Knob]
    tolerance: float
    metric: str
    sizes: List[Tuple[str, int, int]]   # (category, tensors, bytes)

    def meta_num(self, key: str) -> float:
        return _num(self.metadata.get(key))


_SIZE_CATEGORIES = (
    ("codebooks (key space)", re.compile(r"layer\.\d+\.head\.\d+\.(group\.\d+\.)?codebook$")),
    ("codebooks (z space)", re.compile(r"layer\.\d+\.head\.\d+\.(group\.\d+\.)?Cz$")),
    ("Cholesky factors L, L^-1", re.compile(r"layer\.\d+\.head\.\d+\.(L|Linv)$")),
    ("other per-head tensors", re.compile(r"layer\.")),
    ("thresholds", re.compile(r"thresholds\.")),
    ("profile tables", re.compile(r"profile\.")),
    ("fit diagnostics", re.compile(r"diag\.")),
)


def _size_breakdown(names: Sequence[str], spans: Dict[str, int]) -> List[Tuple[str, int, int]]:
    acc: Dict[str, List[int]] = {}
    for n in names:
        cat = next((c for c, rx in _SIZE_CATEGORIES if rx.match(n)), "other tensors")
        a = acc.setdefault(cat, [0, 0])
        a[0] += 1
        a[1] += spans[n]
    order = [c for c, _ in _SIZE_CATEGORIES] + ["other tensors"]
    return [(c, acc[c][0], acc[c][1]) for c in order if c in acc]


def _chosen_row(knob: Knob, meta: Dict[str, str]) -> None:
    """The first row equal to the chosen values diag.profile.NAME.COLUMN (as kvq inspect)."""
    vals = {c: _num(meta.get(f"diag.profile.{knob.name}.{c}")) for c in knob.columns}
    knob.chosen_values = {c: v for c, v in vals.items() if not math.isnan(v)}
    if not knob.chosen_values or not len(knob.rows):
        return
    for i, row in enumerate(knob.rows):
        if all(c in knob.columns and row[knob.columns.index(c)] == v for c, v in knob.chosen_values.items()):
            knob.chosen = i
            return


def read_artifact(path: str) -> ArtifactInfo:
    """Reads an artifact through kvq.Artifact (libkvq checks it); raises a KvqError naming
    the file."""
    from ..artifact import Artifact
    if not os.path.exists(path):
        raise KvqIOError(f"{path}: No such file or directory")
    try:
        a = Artifact(path)
    except KeyError as e:
        raise FormatError(f"{path}: {e}") from None
    desc = a.describe()
    meta = a.metadata
    try:
        spec = a.model
        n_kv = spec.n_kv_heads
        layers = a.layers
    except (KeyError, ValueError) as e:
        raise FormatError(f"{path}: model description unreadable: {e}") from None
    names = a.tensor_names()
    spans = {t["name"]: int(t["nbytes"]) for t in desc["tensors"]}
    grids = _fit_grids(a, names, layers, n_kv)
    k, used = _codebook_sizes(a, names, layers, n_kv)
    knobs: Dict[str, Knob] = {}
    for name in a.profile_tables():
        p = a.profile(name)
        rows = np.asarray(p["rows"], dtype=np.float64)
        if rows.ndim != 2:
            continue
        cols = p["columns"] or [f"c{i}" for i in range(rows.shape[1])]
        met = meta.get(f"thresholds.{name}.met")
        knob = Knob(name, cols, rows, met=int(met) if met in ("0", "1") else -1,
                    skipped=meta.get(f"profile.{name}.skipped", ""))
        _chosen_row(knob, meta)
        knobs[name] = knob
    return ArtifactInfo(path=path, file_size=int(desc["file_size"]), payload_size=int(desc["payload_size"]),
                        metadata=dict(meta), layers=list(layers), n_kv=n_kv, method=a.method,
                        grids=grids, k=k, k_used=used, knobs=knobs,
                        tolerance=_num(meta.get("thresholds.tolerance")),
                        metric=meta.get("thresholds.metric", ""), sizes=_size_breakdown(names, spans))


def _fit_grids(a: Any, names: Sequence[str], layers: List[int], n_kv: int) -> Dict[str, np.ndarray]:
    out: Dict[str, np.ndarray] = {}
    per_head = {"score_mse": "score_mse", "score_mse_ref": "ref.score_mse", "score_power": "score_power"}
    for key, suffix in per_head.items():
        g = np.full((len(layers), n_kv), np.nan)
        grid = f"diag.fit.{key}"
        if grid in names:
            t = np.asarray(a.tensor(grid), dtype=np.float64)
            if t.shape == g.shape:
                g = t.copy()
        else:
            for i, l in enumerate(layers):
                for h in range(n_kv):
                    n = f"diag.layer.{l}.head.{h}.{suffix}"
                    if n in names:
                        g[i, h] = float(np.asarray(a.tensor(n)).reshape(-1)[0])
        out[key] = g
    return out


def _codebook_sizes(a: Any, names: Sequence[str], layers: List[int], n_kv: int) -> Tuple[np.ndarray, np.ndarray]:
    k = np.full((len(layers), n_kv), np.nan)
    used = np.full((len(layers), n_kv), np.nan)
    for i, l in enumerate(layers):
        for h in range(n_kv):
            try:
                cb = a.codebook(l, h)
            except KeyError:
                continue
            k[i, h] = cb.shape[-2]
            n = f"diag.layer.{l}.head.{h}.cluster_size"
            if n in names:
                cs = np.asarray(a.tensor(n)).reshape(-1, cb.shape[-2])
                used[i, h] = float(np.mean(np.count_nonzero(cs > 0, axis=1)))
    return k, used


# ---- eval results --------------------------------------------------------------------------

@dataclass
class EvalRow:
    """One row of a `kvq eval --json` result, kept whole (unknown fields included);
    `units` is the result's score_units ("percent" for the RULER suite's scores)."""
    fields: Dict[str, Any]
    units: str = ""

    @property
    def selector(self) -> str:
        return str(self.fields.get("selector", "?"))

    @property
    def budget(self) -> str:
        return str(self.fields.get("budget", ""))

    @property
    def task(self) -> str:
        return str(self.fields.get("task") or "")

    @property
    def length(self) -> str:
        v = self.fields.get("length")
        return "" if v is None else str(v)

    def num(self, key: str) -> float:
        return _num(self.fields.get(key))

    def task_scores(self) -> Dict[str, Tuple[float, float]]:
        """The row's task scores {name: (correct, n)} (see task_scores)."""
        return task_scores(self.fields, self.units)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def task_scores(d: Dict[str, Any], units: str = "") -> Dict[str, Tuple[float, float]]:
    """{name: (correct, n)} of a row or a reference object, n > 0: every field that is a
    pair of integers [correct, n] (passkey, kv_recall), named by the field; on a row that
    names a task (a suite's row: task, length), its 'score' (a fraction, or a percentage
    when the result's score_units is "percent" or the score is above 1), of 'n' prompts,
    named "TASK @LENGTH"."""
    out: Dict[str, Tuple[float, float]] = {}
    task = str(d.get("task") or "")
    length = d.get("length")
    base = f"{task} @{length}" if task and length is not None else task
    for k, v in d.items():
        if (isinstance(v, list) and len(v) == 2 and _is_int(v[0]) and _is_int(v[1]) and
                0 <= v[0] <= v[1] and v[1] > 0):
            out[f"{base} {k}" if base else k] = (float(v[0]), float(v[1]))
    if base:
        sc = d.get("score", d.get("accuracy"))
        if isinstance(sc, (int, float)) and not isinstance(sc, bool) and math.isfinite(sc):
            frac = sc / 100 if units == "percent" or sc > 1 else float(sc)
            nv = d.get("n")
            n = float(nv) if isinstance(nv, int) and not isinstance(nv, bool) and nv > 0 else 1.0
            if 0 <= frac <= 1:
                out[base] = (frac * n, n)
    return out


@dataclass
class EvalFile:
    """A `kvq eval --json` result."""
    path: str
    label: str
    doc: Dict[str, Any]
    rows: List[EvalRow]

    @property
    def command(self) -> str:
        return str(self.doc.get("command") or "")

    @property
    def corpus(self) -> str:
        return str(self.doc.get("corpus") or "")

    @property
    def reference(self) -> Dict[str, Any]:
        r = self.doc.get("reference")
        return r if isinstance(r, dict) else {}


def read_eval(path: str, label: str = "") -> EvalFile:
    """Reads one `kvq eval --json` result (retrieval rows, or full attention's one line)."""
    doc = _read_json(path)
    if not isinstance(doc, dict):
        raise FormatError(f"{path}: not a kvq eval --json result (a JSON object is expected)")
    rows_raw = doc.get("rows", [])
    if "rows" not in doc and "perplexity" not in doc:
        raise FormatError(f"{path}: not a kvq eval --json result (neither 'rows' nor 'perplexity')")
    if not isinstance(rows_raw, list) or not all(isinstance(r, dict) for r in rows_raw):
        raise FormatError(f"{path}: 'rows' is not a list of objects")
    units = str(doc.get("score_units") or "")
    rows = [EvalRow(dict(r), units) for r in rows_raw]
    return EvalFile(path, label or os.path.basename(path), doc, rows)


def budget_fraction(b: str) -> Optional[float]:
    """A row's budget as a fraction of the visible tokens ('5%' -> 0.05, '0.05'), or None
    for 'all' and token counts."""
    s = b.strip()
    try:
        if s.endswith("%"):
            return float(s[:-1]) / 100
        if re.fullmatch(r"\d+", s):
            return None
        v = float(s)
        return v if 0 < v <= 1 else None
    except ValueError:
        return None


def check_inputs(evals: Sequence[EvalFile]) -> None:
    """Rejects results the report cannot place (no rows and no perplexity)."""
    for e in evals:
        if not e.rows and "perplexity" not in e.doc:
            raise KvqError(f"{e.path}: no rows to report")
