"""The report's calibration sections: the calibrate summary (what the text summary of
`kvq calibrate` says, from the artifact), the LeanKV / PATS / budget / mass profiles with
their chosen settings and the tolerance, the per layer x KV head heatmaps, the stage
timings and the artifact's size breakdown."""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np

from . import figures as F
from . import html as H
from .data import PATS_SCHEDULES, ArtifactInfo, Knob, WorkDir


def _percent_change(a: float, b: float) -> float:
    return 100 * (a / b - 1) if math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan


def summary_rows(a: ArtifactInfo) -> List[List[H.Cell]]:
    """(quantity, value) rows of the calibration summary, keyed as the text check reads them."""
    m = a.meta_num
    heads = int(np.isfinite(a.k).sum())
    mse, ref = m("diag.fit.score_mse"), m("diag.fit.score_mse_ref")
    rows: List[List[H.Cell]] = [
        ["artifact file size (bytes)", H.Num(a.file_size, "{:.0f}", "artifact/file_size")],
        ["payload size (bytes, before zstd)", H.Num(a.payload_size, "{:.0f}", "artifact/payload_size")],
        ["calibration tokens", H.Num(m("provenance.n_tokens"), "{:.0f}", "calib/n_tokens")],
        ["calibration sequences", H.Num(m("provenance.n_sequences"), "{:.0f}", "calib/n_sequences")],
        ["method", a.method],
        ["codebook size K", H.Num(m("codebook_size"), "{:.0f}", "fit/K")],
        ["groups G", H.Num(m("groups"), "{:.0f}", "fit/G")],
        ["codebooks (layer x KV head)", H.Num(heads, "{:.0f}", "fit/heads")],
        ["held-out score MSE (mean over heads)", H.Num(mse, "{:.6g}", "fit/score_mse")],
        [f"the same for plain {a.metadata.get('fit.reference', 'vq')}", H.Num(ref, "{:.6g}", "fit/score_mse_ref")],
        ["ratio", H.Num(mse / ref if ref > 0 else math.nan, "{:.4f}", "fit/ratio")],
    ]
    mode = a.metadata.get("positions.mode")
    if mode:
        exact = m("positions.ppl_exact")
        cb = m(f"positions.ppl.codebook-{mode}-{a.metadata.get('positions.score', '')}")
        rows += [["positions: mode, score", f"{mode}, {a.metadata.get('positions.score', '')}"],
                 ["positions: exact perplexity", H.Num(exact, "{:.4f}", "positions/ppl_exact")],
                 ["positions: codebook at the default budget (% over exact)",
                  H.Num(_percent_change(cb, exact), "{:+.2f}", "positions/codebook_rel")],
                 ["positions: full attention under wrope (% over exact)",
                  H.Num(_percent_change(m("positions.ppl.full-wrope"), exact), "{:+.2f}", "positions/full_wrope_rel")]]
    if a.metric:
        rows += [["profile metric", a.metric], ["tolerance", H.Num(a.tolerance, "{:g}", "profile/tolerance")]]
    return rows


def _knob_table(k: Knob, fmt: dict, scale: dict) -> str:
    body = []
    for i, row in enumerate(k.rows):
        cells: List[H.Cell] = []
        for j, c in enumerate(k.columns):
            key = f"{k.name}/{i}/{c}"
            if k.name == "pats" and c == "schedule":
                v = int(row[j]) if math.isfinite(row[j]) else -1
                cells.append(PATS_SCHEDULES[v] if 0 <= v < len(PATS_SCHEDULES) else f"{row[j]:g}")
                continue
            cells.append(H.Num(float(row[j]), fmt.get(c, "{:.6g}"), key, scale.get(c, 1.0)))
        body.append(cells)
    heads = [c + (" %" if scale.get(c) == 100.0 else "") for c in k.columns]
    cap = f"profile.{k.name}: {len(k.rows)} settings; the chosen one highlighted" + (
        "" if k.chosen >= 0 else " (none chosen" + (f": {k.skipped}" if k.skipped else "") + ")")
    return H.table(heads, body, cap, tid=f"profile-{k.name}", chosen=[i == k.chosen for i in range(len(k.rows))])


def chosen_rows(a: ArtifactInfo) -> List[List[H.Cell]]:
    """The chosen setting of every knob, keyed KNOB/chosen/COLUMN."""
    out: List[List[H.Cell]] = []
    for k in a.knobs.values():
        for c, v in k.chosen_values.items():
            shown = PATS_SCHEDULES[int(v)] if k.name == "pats" and c == "schedule" and 0 <= v < 3 else None
            out.append([k.name, c, H.Num(v, "{:.6g}", f"{k.name}/chosen/{c}", text=shown),
                        {1: "within tolerance", 0: "NOT within tolerance: best found"}.get(k.met, "")])
    return out


def profile_section(a: ArtifactInfo) -> str:
    """LeanKV memory vs error, PATS bits vs error, the budget and mass sweeps."""
    figs: List[str] = []
    tabs: List[str] = []
    if not a.knobs:
        return H.section("profile", "Cache compression and budget profiles", [H.note(
            f"{a.path} holds no profile tables (calibrate --no-profile?).")])
    tol = a.tolerance
    metric = a.metric or "error"
    k = a.knobs.get("leankv")
    if k is not None and len(k.rows):
        plot = F.tradeoff(100 * k.col("memory"), k.col("err"), k.col("alpha_h"),
                          {g: f"{g:g}" for g in set(k.col("alpha_h").tolist())}, k.chosen, tol,
                          "memory (% of the f16 cache)", f"attention output error ({metric})",
                          "LeanKV over the alpha grid", "alpha_h")
        figs.append(H.figure(plot, "LeanKV: memory against error for every (alpha_h, alpha_l) of the grid "
                             "(one colour per alpha_h); the chosen setting ringed, the tolerance dashed.", "fig-leankv"))
        tabs.append(H.numbers(_knob_table(k, {"memory": "{:.2f}", "high": "{:.2f}", "low": "{:.2f}", "pruned": "{:.2f}",
                                              "err": "{:.4f}"},
                                          {"memory": 100.0, "high": 100.0, "low": 100.0, "pruned": 100.0}),
                              "The numbers: LeanKV", open_=False))
    k = a.knobs.get("pats")
    if k is not None and len(k.rows):
        plot = F.tradeoff(100 * k.col("bits"), k.col("err"), k.col("schedule"),
                          {float(i): n for i, n in enumerate(PATS_SCHEDULES)}, k.chosen, tol,
                          "mantissa bits kept (% of the f16 bits)", f"attention output error ({metric})",
                          "PATS schedules", "schedule")
        figs.append(H.figure(plot, "PATS: bits against error for each schedule and [b_min, b_max]; the chosen "
                             "schedule ringed, the tolerance dashed." + ("" if k.chosen >= 0 else
                                                                         " No schedule was chosen" + (f" ({k.skipped})" if k.skipped else "") + "."),
                             "fig-pats"))
        tabs.append(H.numbers(_knob_table(k, {"memory": "{:.2f}", "bits": "{:.2f}", "err": "{:.4f}"},
                                          {"memory": 100.0, "bits": 100.0}), "The numbers: PATS", open_=False))
    for name, xcol, xl, title, xscale in (("budget", "fraction", "budget (% of the visible tokens)", "Budget profile", 100.0),
                                          ("mass", "tau", "tau (attention mass kept)", "Mass rule profile", 1.0)):
        k = a.knobs.get(name)
        if k is None or not len(k.rows):
            continue
        plot = F.tradeoff(xscale * k.col(xcol), k.col("err"), np.zeros(len(k.rows)), {0.0: "codebook"},
                          k.chosen, tol, xl, f"attention output error ({metric})", title, "selector")
        figs.append(H.figure(plot, f"{title}: error against {xcol} on the held-out capture; the chosen "
                             "setting ringed, the tolerance dashed.", f"fig-{name}"))
        tabs.append(H.numbers(_knob_table(k, {"fraction": "{:.2f}", "attended": "{:.2f}", "mass": "{:.4f}",
                                              "err": "{:.4f}"}, {"fraction": 100.0, "attended": 100.0}),
                              f"The numbers: {name}", open_=False))
    body = [H.row(figs[i:i + 2]) for i in range(0, len(figs), 2)] + tabs
    body.append(H.table(["knob", "setting", "chosen value", ""], chosen_rows(a), "The chosen settings", tid="chosen-table"))
    return H.section("profile", "Cache compression and budget profiles (kvq profile)", body)


def heatmap_section(a: ArtifactInfo, w: Optional[WorkDir]) -> str:
    """Per layer x KV head: score MSE relative to plain VQ, the Cholesky ridge, K."""
    g = a.grids
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(g["score_mse_ref"] > 0, g["score_mse"] / g["score_mse_ref"], np.nan)
    lam = eps = None
    notes: List[str] = []
    if w is not None and w.lambdas is not None:
        idx = {l: i for i, l in enumerate(w.moment_layers)}
        lam = np.full_like(ratio, np.nan)
        eps = np.full_like(ratio, np.nan)
        for i, l in enumerate(a.layers):
            if l in idx and w.lambdas.shape[1] == ratio.shape[1]:
                lam[i] = w.lambdas[idx[l]]
                eps[i] = w.eps[idx[l]] if w.eps is not None else np.nan
    else:
        notes.append("The Cholesky regularization is read from the work directory's moments.safetensors: "
                     "give --work to show it.")
    panels: List[Tuple[str, np.ndarray, str, bool]] = [("score MSE / plain VQ", ratio, "viridis", True)]
    if eps is not None:
        panels.append(("ridge λ / (tr H / d)", eps, "magma", False))
    panels.append(("codebook size K", a.k, "cividis", False))
    plot = F.heatmaps(panels, a.layers, "Codebooks per layer and KV head")
    body = [H.figure(plot, "Per layer x KV head: the held-out score MSE of the codebook relative to plain VQ "
                     "(lower is better; a log colour scale when it spans a decade), the Cholesky ridge added to the query moments H "
                     "(relative to its mean eigenvalue; 0: H was positive definite), and the codebook's K.",
                     "fig-heads", wide=True)] + [H.note(n) for n in notes]
    rows: List[List[H.Cell]] = []
    for i, l in enumerate(a.layers):
        for h in range(ratio.shape[1]):
            key = f"head/{l}/{h}"
            rows.append([str(l), str(h), H.Num(g["score_mse"][i, h], "{:.6g}", f"{key}/score_mse"),
                         H.Num(g["score_mse_ref"][i, h], "{:.6g}", f"{key}/score_mse_ref"),
                         H.Num(ratio[i, h], "{:.4f}", f"{key}/ratio"),
                         H.Num(g["score_power"][i, h], "{:.6g}", f"{key}/score_power"),
                         H.Num(lam[i, h] if lam is not None else math.nan, "{:.4g}", f"{key}/lambda"),
                         H.Num(eps[i, h] if eps is not None else math.nan, "{:.3g}", f"{key}/eps"),
                         H.Num(a.k[i, h], "{:.0f}", f"{key}/K"), H.Num(a.k_used[i, h], "{:.1f}", f"{key}/K_used")])
    body.append(H.numbers(H.table(["layer", "KV head", "score MSE", "plain VQ MSE", "ratio", "E[score²]", "ridge λ",
                                   "λ / (tr H / d)", "K", "clusters used"], rows,
                                  "Held-out figures of the fit per codebook (diag.fit.*, diag.layer.L.head.H.cluster_size) "
                                  "and the moments' ridge", tid="heads-table"), "The numbers", open_=False))
    return H.section("heads", "Where the codebooks are weak", body)


def stages_and_size_section(a: Optional[ArtifactInfo], w: Optional[WorkDir]) -> str:
    figs: List[str] = []
    tabs: List[str] = []
    if w is not None:
        timed = [s for s in w.stages if math.isfinite(s.seconds)]
        if timed:
            plot = F.bars([s.name for s in timed], [s.seconds for s in timed], "wall time (s)",
                          "kvq calibrate: stage timings", [f"{s.seconds:.1f} s" for s in timed])
            figs.append(H.figure(plot, "Wall time of each stage, from the run that made its current output "
                                 "(STAGE.run.json in the work directory).", "fig-stages"))
        else:
            figs.append(H.note(f"{w.path}: no stage timings recorded (STAGE.run.json is written by kvq calibrate "
                               "from this version on).", "missing"))
        rows: List[List[H.Cell]] = [[s.name, H.Num(s.seconds, "{:.2f}", f"stage/{s.name}/seconds"), s.finished or "–"] for s in w.stages]
        tabs.append(H.numbers(H.table(["stage", "seconds", "finished (UTC)"], rows, f"{w.path}", tid="stages-table"),
                              "The numbers"))
    if a is not None:
        labels = [c for c, _, _ in a.sizes] + ["whole payload", "file (zstd frames)"]
        vals = [b / 1024 for _, _, b in a.sizes] + [a.payload_size / 1024, a.file_size / 1024]
        plot = F.bars(labels, vals, "KiB", "Artifact size", [f"{v:,.1f} KiB" for v in vals])
        figs.append(H.figure(plot, "What the artifact holds: its tensors by kind (uncompressed), the whole "
                             "safetensors payload and the file as written (zstd).", "fig-size"))
        srows: List[List[H.Cell]] = [[c, str(n), H.Num(b, "{:.0f}", f"size/{c}"), H.Num(b / a.payload_size if a.payload_size else math.nan, "{:.2f}", "", 100.0)]
                for c, n, b in a.sizes]
        srows.append(["whole payload", "", H.Num(a.payload_size, "{:.0f}", "size/payload"), H.Num(1.0, "{:.2f}", "", 100.0)])
        srows.append(["file (zstd)", "", H.Num(a.file_size, "{:.0f}", "size/file"),
                     H.Num(a.file_size / a.payload_size if a.payload_size else math.nan, "{:.2f}", "", 100.0)])
        tabs.append(H.numbers(H.table(["kind", "tensors", "bytes", "% of payload"], srows, a.path, tid="size-table"),
                              "The numbers"))
    return H.section("calibrate", "Calibrate: stages and the artifact", [H.row(figs)] + tabs)
