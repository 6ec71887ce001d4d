"""Do a text report and the HTML report agree? The text is what `kvq calibrate` prints
(its summary), `kvq eval`'s table, or the demo's report.txt that quotes both; the HTML's
numbers are its table cells' ``data-key`` / ``data-value``.

Every number the text shows that the HTML also has is compared at the text's precision
(half a unit of its last digit; %g figures to 6 significant digits)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Dict, List, Optional, Tuple

from .data import PATS_SCHEDULES

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


@dataclass
class Agreement:
    """The comparisons made: (key, text as shown, HTML value in the text's unit, agrees)."""
    compared: List[Tuple[str, str, float, bool]] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)   # text numbers the HTML lacks

    @property
    def mismatches(self) -> List[Tuple[str, str, float, bool]]:
        return [c for c in self.compared if not c[3]]

    @property
    def ok(self) -> bool:
        return bool(self.compared) and not self.mismatches


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.values: Dict[str, float] = {}
        self.corpus: Dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        a = dict(attrs)
        if tag == "td" and a.get("data-key") and a.get("data-value") is not None:
            self.values[a["data-key"] or ""] = float(a["data-value"] or "nan")
        tid = a.get("id") or ""
        if tag == "table" and a.get("data-corpus") is not None and tid.startswith("eval-table-"):
            self.corpus[tid[len("eval-table-"):]] = a["data-corpus"] or ""


def html_values(page: str) -> Tuple[Dict[str, float], Dict[str, str]]:
    """({data-key: exact value}, {eval file index: its corpus}) of a report page."""
    p = _Cells()
    p.feed(page)
    return p.values, p.corpus


def _tol(text: str, kind: str, ref: float) -> float:
    if kind == "g":
        return 5e-6 * abs(ref) + 1e-12
    m = re.fullmatch(r"[-+]?(\d*)\.?(\d*)(?:[eE]([-+]?\d+))?", text)
    dec = len(m.group(2)) if m else 0
    exp = int(m.group(3)) if m and m.group(3) else 0
    return 0.5 * 10.0 ** (exp - dec) * (1 + 1e-9) + 1e-12


class _Checker:
    def __init__(self, values: Dict[str, float]) -> None:
        self.values = values
        self.out = Agreement()

    def num(self, key: str, text: str, unit: float = 1.0, kind: str = "f") -> None:
        """Compares the text number `text` (in `unit`s of the JSON value) with key."""
        if key not in self.values:
            self.out.missing.append(key)
            return
        v = self.values[key]
        if not math.isfinite(v):
            return
        shown = float(text.rstrip("%"))
        ref = v * unit
        self.out.compared.append((key, text, ref, abs(ref - shown) <= _tol(text.rstrip("%"), kind, ref)))


def _calibrate_lines(c: _Checker, text: str) -> None:
    n = _NUM
    for line in text.splitlines():
        s = line.strip()
        if m := re.match(r"stages\s+(.*)$", s):
            for name, sec in re.findall(r"([a-z]+) (" + n + r") s", m.group(1)):
                c.num(f"stage/{name}/seconds", sec)
        elif m := re.match(r"tokens\s+(\d+) calibration in (\d+) sequences", s):
            c.num("calib/n_tokens", m.group(1))
            c.num("calib/n_sequences", m.group(2))
        elif m := re.match(r"codebooks\s+\S+, K (\d+), G (\d+), (\d+) heads", s):
            c.num("fit/K", m.group(1))
            c.num("fit/G", m.group(2))
            c.num("fit/heads", m.group(3))
        elif m := re.match(rf"score MSE\s+({n}) held out vs ({n}) for plain \w+: ratio ({n})", s):
            c.num("fit/score_mse", m.group(1))
            c.num("fit/score_mse_ref", m.group(2))
            c.num("fit/ratio", m.group(3))
        elif m := re.match(rf"positions\s+\w+, score \w+: codebook ({n})% at the default budget; full under "
                           rf"wrope ({n})% \(exact perplexity ({n})\)", s):
            c.num("positions/codebook_rel", m.group(1))
            c.num("positions/full_wrope_rel", m.group(2))
            c.num("positions/ppl_exact", m.group(3))
        elif m := re.match(rf"profile\s+metric \S+, tolerance ({n})", s):
            c.num("profile/tolerance", m.group(1), kind="g")
        else:
            _knob_line(c, s)


def _knob_line(c: _Checker, s: str) -> None:
    n = _NUM
    if m := re.match(rf"leankv\s+alpha_h ({n}), alpha_l ({n}): memory ({n})% of f16, err ({n})", s):
        c.num("leankv/chosen/alpha_h", m.group(1), kind="g")
        c.num("leankv/chosen/alpha_l", m.group(2), kind="g")
        c.num("leankv/chosen/memory", m.group(3), 100)
        c.num("leankv/chosen/err", m.group(4))
    elif m := re.match(rf"pats\s+([a-z-]+), b (\d+)\.\.(\d+): ({n})% of the bits, ({n})% of f16 in \d+-byte "
                       rf"blocks, err ({n})", s):
        if m.group(1) in PATS_SCHEDULES:
            c.num("pats/chosen/schedule", str(PATS_SCHEDULES.index(m.group(1))))
        c.num("pats/chosen/b_min", m.group(2))
        c.num("pats/chosen/b_max", m.group(3))
        c.num("pats/chosen/bits", m.group(4), 100)
        c.num("pats/chosen/memory", m.group(5), 100)
        c.num("pats/chosen/err", m.group(6))
    elif m := re.match(rf"budget\s+({n})% of tokens: ({n})% attended with sinks and window, err ({n})", s):
        c.num("budget/chosen/fraction", m.group(1), 100, kind="g")
        c.num("budget/chosen/attended", m.group(2), 100)
        c.num("budget/chosen/err", m.group(3))
    elif m := re.match(rf"mass\s+tau ({n}): ({n})% attended, err ({n})", s):
        c.num("mass/chosen/tau", m.group(1), kind="g")
        c.num("mass/chosen/attended", m.group(2), 100)
        c.num("mass/chosen/err", m.group(3))
    elif m := re.match(r"(?:artifact\s+\S+|calibrate: (?:wrote|up to date:) \S+) \((\d+) bytes", s):
        c.num("artifact/file_size", m.group(1))


# kvq eval's text columns -> (JSON key, unit of the text)
_EVAL_COLS = {"bits": ("bits_per_key", 1.0), "ppl": ("perplexity", 1.0), "d_ppl": ("perplexity_delta", 1.0),
              "d_ppl%": ("perplexity_rel", 100.0), "recall": ("recall_topk", 1.0), "mass": ("recall_mass", 1.0),
              "out_err": ("out_rel_err", 1.0), "kv_read": ("kv_read_fraction", 100.0)}
_TASK_COLS = {"passkey": "passkey", "kv-recall": "kv_recall"}


def _eval_file(values: Dict[str, float], corpora: Dict[str, str], corpus: Optional[str], sel: str,
               budget: str) -> Optional[str]:
    have = sorted({k.split("/")[1] for k in values if k.startswith("eval/") and k.split("/")[2:4] == [sel, budget]})
    if corpus is not None:
        match = [i for i in have if corpora.get(i) == corpus]
        if match:
            return match[0]
    return have[0] if have else None


def _eval_tables(c: _Checker, text: str, corpora: Dict[str, str]) -> None:
    lines = text.splitlines()
    corpus: Optional[str] = None
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if m := re.match(r"corpus\s+(\S+)$", s):
            corpus = m.group(1)
        elif m := re.match(r"retrieval vs full attention \(.*, (\S+)\):$", s):
            corpus = m.group(1)
        if not s.startswith("selector "):
            i += 1
            continue
        cols = s.split()
        i += 1
        while i < len(lines) and lines[i].strip():
            cells = lines[i].split()
            i += 1
            if len(cells) != len(cols):
                break
            row = dict(zip(cols, cells))
            sel, budget = row["selector"], row["budget"]
            f = _eval_file(c.values, corpora, corpus, sel, budget)
            if f is None:
                c.out.missing.append(f"eval/?/{sel}/{budget}")
                continue
            key = f"eval/{f}/{sel}/{budget}"
            for col, (jk, unit) in _EVAL_COLS.items():
                if col in row and row[col] != "-":
                    c.num(f"{key}/{jk}", row[col], unit)
            for col, tk in _TASK_COLS.items():
                if col in row and (m := re.fullmatch(r"(\d+)/(\d+)", row[col])) and int(m.group(2)) > 0:
                    c.num(f"{key}/task/{tk}", f"{int(m.group(1)) / int(m.group(2)):.6f}")


def compare_text(text: str, page: str) -> Agreement:
    """Compares every number of a text report that the HTML report `page` also holds."""
    values, corpora = html_values(page)
    c = _Checker(values)
    _calibrate_lines(c, text)
    _eval_tables(c, text, corpora)
    return c.out
