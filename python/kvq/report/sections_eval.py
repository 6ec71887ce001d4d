"""The report's `kvq eval` sections: perplexity increase over dense attention against
the budget and against the KV bytes read, one line per selector; task accuracy against
the budget with the dense score and the gap to it; every row as a table."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence, Tuple

from . import figures as F
from . import html as H
from .data import EvalFile, EvalRow, budget_fraction

# The columns every retrieval row has today, in the order shown: (JSON key, header, format, scale).
KNOWN = (
    ("bits_per_key", "bits/key", "{:.1f}", 1.0),
    ("perplexity", "perplexity", "{:.4f}", 1.0),
    ("perplexity_delta", "Δ ppl", "{:+.4f}", 1.0),
    ("perplexity_rel", "Δ ppl %", "{:+.2f}", 100.0),
    ("recall_topk", "recall", "{:.3f}", 1.0),
    ("recall_mass", "mass", "{:.3f}", 1.0),
    ("out_rel_err", "out err", "{:.4f}", 1.0),
    ("kv_read_fraction", "KV read %", "{:.2f}", 100.0),
    ("attended_fraction", "attended %", "{:.2f}", 100.0),
)
_SKIP = {"selector", "budget", "answers", "task", "length", "nll", "steps"} | {k for k, *_ in KNOWN}
DENSE = ("full", "dense")


def _is_dense(r: EvalRow) -> bool:
    return r.selector in DENSE or budget_fraction(r.budget) is None and r.budget in ("all", "")


def _label(ev: EvalFile, many: bool, name: str) -> str:
    return f"{name} · {ev.label}" if many else name


def _row_key(i: int, r: EvalRow) -> str:
    k = f"eval/{i}/{r.selector}/{r.budget}"
    if r.task:
        k += f"/{r.task}@{r.length}"
    return k


def _ppl_rel(ev: EvalFile, r: EvalRow) -> float:
    v = r.num("perplexity_rel")
    if math.isfinite(v):
        return v
    ref = ev.reference.get("perplexity")
    ppl = r.num("perplexity")
    return ppl / ref - 1 if isinstance(ref, (int, float)) and ref > 0 and math.isfinite(ppl) else math.nan


def _ppl_series(evals: Sequence[EvalFile], xkey: str) -> List[F.Series]:
    many = sum(1 for e in evals if any(not r.task for r in e.rows)) > 1
    out: List[F.Series] = []
    for ev in evals:
        by: Dict[str, List[Tuple[float, float, str]]] = {}
        for r in ev.rows:
            if r.task or _is_dense(r):
                continue
            frac = budget_fraction(r.budget)
            y = 100 * _ppl_rel(ev, r)
            if xkey == "budget":
                x = 100 * frac if frac is not None else math.nan
            else:
                x = 100 * r.num("kv_read_fraction")
            by.setdefault(r.selector, []).append((x, y, r.budget))
        for sel, pts in by.items():
            out.append(F.Series(_label(ev, many, sel), [p[0] for p in pts], [p[1] for p in pts],
                                [p[2] for p in pts] if xkey == "kv" else ()))
    return out


def _row_table(i: int, ev: EvalFile) -> str:
    rows = ev.rows
    extra: List[str] = []
    for r in rows:
        for k, v in r.fields.items():
            if k not in _SKIP and k not in extra and (isinstance(v, (int, float, str)) and not isinstance(v, bool)):
                extra.append(k)
    tasks: List[str] = []
    for r in rows:
        for t in r.task_scores():
            if t not in tasks:
                tasks.append(t)
    known = [k for k in KNOWN if any(k[0] in r.fields for r in rows)]
    has_task = any(r.task for r in rows)
    head = ["selector", "budget"] + (["task", "length"] if has_task else []) + [h for _, h, _, _ in known] + extra + tasks
    body = []
    for r in rows:
        key = _row_key(i, r)
        cells: List[H.Cell] = [r.selector, r.budget]
        if has_task:
            cells += [r.task, r.length]
        for k, _h, fmt, scale in known:
            cells.append(H.Num(r.num(k), fmt, f"{key}/{k}", scale))
        for k in extra:
            v = r.fields.get(k)
            cells.append(H.Num(float(v), "{:.6g}", f"{key}/{k}") if isinstance(v, (int, float)) else ("" if v is None else str(v)))
        sc = r.task_scores()
        for t in tasks:
            if t in sc:
                c, n = sc[t]
                cells.append(H.Num(c / n, "{:.1%}", f"{key}/task/{t}"))
            else:
                cells.append("")
        body.append(cells)
    ref = ev.reference
    cap = (f"{ev.path}: {len(rows)} rows; corpus {ev.corpus or '?'}; dense attention perplexity "
           f"{ref.get('perplexity', '?')}")
    return H.table(head, body, cap, tid=f"eval-table-{i}", attrs={"data-corpus": ev.corpus})


def _task_panels(evals: Sequence[EvalFile]) -> Tuple[list, List[List[H.Cell]]]:
    """Panels (task, series, dense %) and the accuracy table's rows. Counts of the same
    task, selector and budget in several results (seeds run apart) are pooled; dense
    attention's from each result's reference (else its full row) likewise."""
    pooled: Dict[Tuple[str, str, str], List[float]] = {}
    dense: Dict[str, List[float]] = {}
    order: List[str] = []
    for ev in evals:
        fd: Dict[str, Tuple[float, float]] = dict(_ref_scores(ev))
        for r in ev.rows:
            if _is_dense(r):
                for t, cn in r.task_scores().items():
                    fd.setdefault(t, cn)
        for t, (c, n) in fd.items():
            d = dense.setdefault(t, [0.0, 0.0])
            d[0] += c
            d[1] += n
        for r in ev.rows:
            if _is_dense(r):
                continue
            for t, (c, n) in r.task_scores().items():
                a = pooled.setdefault((t, r.selector, r.budget), [0.0, 0.0])
                a[0] += c
                a[1] += n
                if r.selector not in order:
                    order.append(r.selector)
    tasks = list(dict.fromkeys([t for t, _, _ in pooled] + list(dense)))
    table: List[List[H.Cell]] = []
    panels = []
    for t in tasks:
        dc = dense.get(t)
        dv = 100 * dc[0] / dc[1] if dc and dc[1] else math.nan
        if dc:
            table.append([t, "dense (full)", "all", f"{dc[0]:g}/{dc[1]:g}", H.Num(dv, "{:.1f}", f"task/{t}/dense/accuracy"),
                          H.Num(dv, "{:.1f}"), H.Num(0.0, "{:+.1f}")])
        series = []
        for sel in order:
            keys = sorted((k for k in pooled if k[0] == t and k[1] == sel),
                          key=lambda k: budget_fraction(k[2]) or math.inf)
            xs, ys = [], []
            for k in keys:
                c, n = pooled[k]
                acc = 100 * c / n
                table.append([t, sel, k[2], f"{c:g}/{n:g}", H.Num(acc, "{:.1f}", f"task/{t}/{sel}/{k[2]}/accuracy"),
                              H.Num(dv, "{:.1f}"), H.Num(acc - dv, "{:+.1f}")])
                frac = budget_fraction(k[2])
                if frac is not None:
                    xs.append(100 * frac)
                    ys.append(acc)
            series.append(F.Series(sel, xs, ys))
        if any(s.x for s in series):
            panels.append((t, series, dv if math.isfinite(dv) else None))
    return panels, table


def _ref_scores(ev: EvalFile) -> Dict[str, Tuple[float, float]]:
    from .data import task_scores
    return task_scores(ev.reference)


def eval_sections(evals: Sequence[EvalFile]) -> List[str]:
    """The retrieval sections' HTML (an explanatory note when there is no eval input)."""
    with_rows = [e for e in evals if e.rows]
    if not with_rows:
        return [H.section("eval", "Retrieval against dense attention (kvq eval)", [H.note(
            "No kvq eval --json result with retrieval rows was given (--eval FILE): run "
            "kvq eval --artifact A --selectors full,oracle,codebook,fier,quest --budgets 2%,5%,12% --json > e.json.")])]
    body: List[str] = []
    s_budget = _ppl_series(evals, "budget")
    s_kv = _ppl_series(evals, "kv")
    if any(len(s.x) for s in s_budget):
        lines = [(0.0, "dense attention")]
        full = [100 * _ppl_rel(e, r) for e in evals for r in e.rows if r.selector == "full" and not r.task]
        if len(full) == 1 and abs(full[0]) >= 0.005:
            lines.append((full[0], "selector full (same path as the rows)"))
        plot = F.line_plot(s_budget, "budget (% of the visible tokens, log scale)",
                           "perplexity increase over dense (%)", "Perplexity against budget", hlines=lines)
        figs = [H.figure(plot, "Perplexity increase over dense attention (kvq eval's reference) "
                         "against the retrieval budget, one line per selector.", "fig-ppl-budget")]
        plot = F.line_plot(s_kv, "KV cache bytes read (% of dense, log scale)",
                           "perplexity increase over dense (%)", "Perplexity against KV bytes read", hlines=lines)
        figs.append(H.figure(plot, "The same rows against the KV cache bytes each step reads "
                             "(keys and values attended plus the selector's metadata); each point is labelled "
                             "with its budget.", "fig-ppl-kv"))
        body.append(H.row(figs))
    else:
        body.append(H.note("No retrieval rows with a fractional budget and a perplexity: nothing to plot against the budget."))
    for i, ev in enumerate(evals):
        if ev.rows:
            body.append(H.numbers(_row_table(i, ev), f"The numbers: {ev.label} ({len(ev.rows)} rows)",
                                  open_=len(ev.rows) <= 40))
    panels, table = _task_panels(evals)
    tbody: List[str] = []
    if panels:
        plot = F.small_multiples(panels, "budget (% of tokens, log)", "accuracy (%)", "Task accuracy against budget")
        tbody.append(H.figure(plot, "Task accuracy against the budget, one panel per task (and length); the "
                              "dashed line is dense attention's score on the same prompts.", "fig-tasks",
                              wide=len(panels) > 2))
    else:
        tbody.append(H.note("No task scores in the inputs (rows with [correct, n] fields and n > 0, "
                            "for example kvq eval --corpus passkey:N or kv-recall:N)."))
    if table:
        tbody.append(H.numbers(H.table(["task", "selector", "budget", "correct/n", "accuracy %", "dense %",
                                        "gap to dense (points)"], table, "Per task, selector and budget",
                                       tid="task-table"), f"The numbers ({len(table)} rows)", open_=len(table) <= 20))
    return [H.section("eval", "Retrieval against dense attention (kvq eval)", body),
            H.section("tasks", "Task accuracy", tbody)]


def eval_commands(evals: Sequence[EvalFile]) -> List[Tuple[str, str]]:
    """(file, command or a note) per eval input."""
    out = []
    for ev in evals:
        out.append((ev.path, ev.command or f"(not recorded in {ev.path}: written by a kvq before eval --json "
                    f"carried its command; model {ev.doc.get('model', '?')}, corpus {ev.corpus or '?'})"))
    return out


def describe(evals: Sequence[EvalFile]) -> List[Any]:
    return [(e.label, e.corpus) for e in evals]
