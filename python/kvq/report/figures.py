"""The report's figures: matplotlib (Agg-free: a Figure with the SVG canvas, no pyplot
state) rendered to inline SVG text.

Text stays text in the SVG (``svg.fonttype = none``), so axis labels are searchable and
copyable and no font is embedded or fetched. Every drawn data series carries an SVG id
starting with ``data-`` (its artist's gid), which the browser test looks for."""
from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
          "#e377c2", "#7f7f7f", "#bcbd22")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<")
_RC: Dict[str, Any] = {"svg.fonttype": "none", "svg.hashsalt": "kvq-report", "font.family": "sans-serif",
       "font.size": 9.0, "axes.titlesize": 10.0, "axes.labelsize": 9.0, "legend.fontsize": 8.0,
       "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
       "grid.alpha": 0.3, "path.simplify": False}


@dataclass
class Plot:
    """A rendered figure: its SVG and the axis labels it must show."""
    svg: str
    xlabels: List[str]
    ylabels: List[str]


@dataclass
class Series:
    """One line of a line plot."""
    label: str
    x: Sequence[float]
    y: Sequence[float]
    notes: Sequence[str] = ()          # a short label at each point (may be empty)


def _new(w: float, h: float, ncols: int = 1, nrows: int = 1):
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure
    ctx = matplotlib.rc_context(_RC)  # type: ignore[arg-type]
    ctx.__enter__()
    fig = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasSVG(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return ctx, fig, axes


def _finish(ctx, fig, xlabels: List[str], ylabels: List[str]) -> Plot:
    buf = io.StringIO()
    try:
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    finally:
        ctx.__exit__(None, None, None)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    # Width/height in pt -> scale with the page (viewBox kept).
    svg = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1 class="plot-svg"', svg, count=1)
    return Plot(svg, xlabels, ylabels)


def line_plot(series: Sequence[Series], xlabel: str, ylabel: str, title: str, logx: bool = True,
              hlines: Sequence[Tuple[float, str]] = (), size: Tuple[float, float] = (6.0, 3.7)) -> Plot:
    """Lines with markers, one per series, log x axis by default; hlines: (y, label) drawn
    dashed, then dotted (the dense reference, the full selector's row)."""
    ctx, fig, axes = _new(*size)
    ax = axes[0][0]
    drawn = 0
    for i, s in enumerate(series):
        ok = [(x, y, n) for x, y, n in zip(s.x, s.y, list(s.notes) + [""] * len(s.x))
              if math.isfinite(x) and math.isfinite(y) and (x > 0 or not logx)]
        if not ok:
            continue
        ok.sort()
        xs, ys, ns = zip(*ok)
        (ln,) = ax.plot(xs, ys, marker=MARKERS[i % len(MARKERS)], color=COLORS[i % len(COLORS)],
                        label=s.label, linewidth=1.6, markersize=5)
        ln.set_gid(f"data-{i}")
        drawn += 1
        for x, y, n in zip(xs, ys, ns):
            if n:
                ax.annotate(n, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                            color=COLORS[i % len(COLORS)])
    for j, (y, label) in enumerate(hlines):
        if math.isfinite(y):
            ax.axhline(y, color="#444444", linestyle="--" if j == 0 else ":", linewidth=1.0, label=label)
    if not drawn:
        ax.text(0.5, 0.5, "no data to plot", transform=ax.transAxes, ha="center", va="center")
    elif logx:
        ax.set_xscale("log")
        _plain_log_ticks(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if drawn:
        ax.legend(loc="best", frameon=False)
    return _finish(ctx, fig, [xlabel], [ylabel])


def _plain_log_ticks(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _p: ""))


def small_multiples(panels: Sequence[Tuple[str, Sequence[Series], Optional[float]]], xlabel: str,
                    ylabel: str, title: str) -> Plot:
    """One panel per (title, series, dense value) on a shared y range, log x axis."""
    n = len(panels)
    ncols = min(3, n)
    nrows = (n + ncols - 1) // ncols
    ctx, fig, axes = _new(3.3 * ncols + 0.6, 2.7 * nrows + 0.4, ncols, nrows)
    k = 0
    for p, (ptitle, series, dense) in enumerate(panels):
        ax = axes[p // ncols][p % ncols]
        for i, s in enumerate(series):
            pts = sorted((x, y) for x, y in zip(s.x, s.y) if math.isfinite(x) and x > 0 and math.isfinite(y))
            if not pts:
                continue
            xs, ys = zip(*pts)
            (ln,) = ax.plot(xs, ys, marker=MARKERS[i % len(MARKERS)], color=COLORS[i % len(COLORS)],
                            label=s.label, linewidth=1.4, markersize=4)
            ln.set_gid(f"data-{k}")
            k += 1
        if dense is not None and math.isfinite(dense):
            ax.axhline(dense, color="#444444", linestyle="--", linewidth=1.0, label="dense")
        if ax.lines and any(len(ln.get_xdata()) for ln in ax.lines if ln.get_gid()):
            ax.set_xscale("log")
            _plain_log_ticks(ax)
        ax.set_ylim(-5, 105)
        ax.set_title(ptitle)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
    for p in range(n, nrows * ncols):
        axes[p // ncols][p % ncols].set_visible(False)
    handles: Dict[str, Any] = {}
    for row in axes:
        for ax in row:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
    if handles:  # one legend for every panel (a selector has one colour in all)
        fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center",
                   ncols=min(6, len(handles)), frameon=False)
    fig.suptitle(title)
    return _finish(ctx, fig, [xlabel], [ylabel])


def tradeoff(x: np.ndarray, y: np.ndarray, groups: np.ndarray, group_names: Dict[float, str],
             chosen: int, tolerance: float, xlabel: str, ylabel: str, title: str,
             legend_title: str) -> Plot:
    """A profile sweep: one marker/colour per group, the chosen setting ringed and
    labelled, the tolerance drawn."""
    ctx, fig, axes = _new(6.0, 3.7)
    ax = axes[0][0]
    for i, g in enumerate(sorted(set(groups.tolist()))):
        m = (groups == g) & np.isfinite(x) & np.isfinite(y)
        if not m.any():
            continue
        order = np.argsort(x[m])
        (ln,) = ax.plot(x[m][order], y[m][order], marker=MARKERS[i % len(MARKERS)], linestyle=":",
                        linewidth=0.8, color=COLORS[i % len(COLORS)], markersize=5,
                        label=group_names.get(g, f"{g:g}"))
        ln.set_gid(f"data-{i}")
    if math.isfinite(tolerance):
        ax.axhline(tolerance, color="#b00000", linestyle="--", linewidth=1.0, label=f"tolerance {tolerance:g}")
    if 0 <= chosen < len(x):
        ax.plot([x[chosen]], [y[chosen]], marker="o", markersize=14, markerfacecolor="none",
                markeredgecolor="black", markeredgewidth=1.6, linestyle="none", label="chosen",
                gid="chosen")
        ax.annotate("chosen", (x[chosen], y[chosen]), textcoords="offset points", xytext=(9, -12),
                    fontsize=8, fontweight="bold")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="best", frameon=False, title=legend_title, ncols=2)
    return _finish(ctx, fig, [xlabel], [ylabel])


def heatmaps(panels: Sequence[Tuple[str, np.ndarray, str, bool]], layers: Sequence[int], title: str) -> Plot:
    """Per layer x KV head grids side by side: (title, grid [n_layers, n_kv], colour map,
    log colour scale). NaN cells are left blank."""
    from matplotlib.colors import LogNorm, Normalize
    n = len(panels)
    n_layers = len(layers)
    ctx, fig, axes = _new(2.6 * n + 0.4, max(3.0, 0.16 * n_layers + 1.6), n, 1)
    for p, (ptitle, grid, cmap, log) in enumerate(panels):
        ax = axes[0][p]
        g = np.asarray(grid, dtype=np.float64)
        finite = g[np.isfinite(g)]
        norm: Normalize
        uniform = bool(finite.size) and float(finite.max()) == float(finite.min())
        if log and finite.size and (finite > 0).all() and finite.max() > 10 * finite.min():
            norm = LogNorm(vmin=finite.min(), vmax=finite.max())
        else:
            lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
            half = abs(lo) or 1.0  # one value: the middle colour of the map
            norm = Normalize(vmin=lo, vmax=hi) if hi > lo else Normalize(vmin=lo - half, vmax=lo + half)
        mesh = ax.pcolormesh(np.arange(g.shape[1] + 1) - 0.5, np.arange(n_layers + 1) - 0.5,
                             np.ma.masked_invalid(g), cmap=cmap, norm=norm, edgecolors="white",
                             linewidth=0.3)
        mesh.set_gid(f"data-{p}")
        ax.set_ylim(n_layers - 0.5, -0.5)
        ax.set_xticks(range(g.shape[1]))
        step = max(1, n_layers // 15)
        ax.set_yticks(range(0, n_layers, step))
        ax.set_yticklabels([str(layers[i]) for i in range(0, n_layers, step)])
        ax.grid(False)
        ax.set_xlabel("KV head")
        ax.set_ylabel("layer")
        if uniform:  # one value: said in the title, no colour scale
            ax.set_title(f"{ptitle}\n{float(finite[0]):g} for every head")
        else:
            ax.set_title(ptitle)
            fig.colorbar(mesh, ax=ax, shrink=0.85, format="%.3g")
    fig.suptitle(title)
    return _finish(ctx, fig, ["KV head"], ["layer"])


def bars(labels: Sequence[str], values: Sequence[float], xlabel: str, title: str,
         notes: Optional[Sequence[str]] = None) -> Plot:
    """Horizontal bars, one per label, each with its value written beside it."""
    ctx, fig, axes = _new(6.4, 0.38 * len(labels) + 1.3)
    ax = axes[0][0]
    y = np.arange(len(labels))
    cont = ax.barh(y, values, color=[COLORS[i % len(COLORS)] for i in range(len(labels))])
    for i, b in enumerate(cont.patches):
        b.set_gid(f"data-{i}")
    for i, v in enumerate(values):
        ax.annotate(notes[i] if notes else f"{v:g}", (v, i), textcoords="offset points",
                    xytext=(4, -3), fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    ax.set_xlim(0, max(values) * 1.25 if len(values) and max(values) > 0 else 1)
    return _finish(ctx, fig, [xlabel], [])
