#!/usr/bin/env python3
"""test_report.py - `python -m kvq report` (python/kvq/report) on a real calibration,
checked in a real browser (headless Chromium over the DevTools protocol, tests/report/cdp.py).

The fixture is real and small: `kvq calibrate` on the tiny model (stories260K, or the
committed stand-in tests/data/tiny_spm.gguf without ../shared) and `kvq eval` (--json and
text) with every selector at three budgets on passkey and kv-recall prompts. Expected
values come from outside the report package: the eval JSON as kvq wrote it, `kvq inspect
--json` (C) for the profile tables and the fit, the work directory's run records, the
moments file read here with a few lines of numpy, and the file's size.

    python3 tests/report/test_report.py                 the tests (exit 0 pass, 77 skip)
    python3 tests/report/test_report.py --shot HTML PNG a screenshot of a report's top
"""
import glob
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
BUILD = os.environ.get("KVQ_BUILD", os.path.join(ROOT, "build"))
os.environ.setdefault("KVQ_BUILD", BUILD)
KVQ = os.environ.get("KVQ", os.path.join(BUILD, "kvq"))
PY_ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), KVQ_BUILD=BUILD)

import cdp  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what)
    return cond


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def model():
    m = os.environ.get("KVQ_TEST_MODEL", os.path.join(ROOT, "..", "shared", "models", "stories260K.gguf"))
    return m if os.path.isfile(m) else os.path.join(ROOT, "tests", "data", "tiny_spm.gguf")


# ---- the fixture: a real calibration and evaluation -------------------------------------------

EVAL_ARGS = ["--corpus", "kv-recall:2,passkey:2", "--passkey-filler", "8", "--kv-pairs", "8", "--seq-len", "512",
             "--score", "last:16", "--selectors", "full,oracle,codebook,fier,quest", "--budgets", "5%,10%,25%",
             "--threads", "2"]


def make_fixture(d):
    """Calibrates and evaluates into d; returns the paths and the texts kvq printed."""
    # The model under a name a shell must quote: the recorded commands must give it back.
    m = os.path.join(d, "tiny model's.gguf")
    os.symlink(os.path.abspath(model()), m)
    art = os.path.join(d, "a.kvq")
    cal_args = [KVQ, "calibrate", "--model", m, "--corpus", "uuid:64", "--seq-len", "128", "--max-tokens", "2048",
                "--heldout-tokens", "256", "--codebook", "16", "--threads", "2", "--no-positions", "-q", "-o", art]
    r = run(cal_args)
    if not check(r.returncode == 0, f"fixture: kvq calibrate failed: {r.stderr[-800:]}"):
        return None
    cal_txt = r.stdout
    ev = os.path.join(d, "eval.json")
    eval_args = [KVQ, "eval", "--model", m, "--artifact", art, *EVAL_ARGS, "--json", "-q"]
    r = run(eval_args)
    if not check(r.returncode == 0, f"fixture: kvq eval --json failed: {r.stderr[-800:]}"):
        return None
    with open(ev, "w") as f:
        f.write(r.stdout)
    r = run([KVQ, "eval", "--model", m, "--artifact", art, *EVAL_ARGS, "-q"])
    if not check(r.returncode == 0, f"fixture: kvq eval failed: {r.stderr[-800:]}"):
        return None
    txt = os.path.join(d, "report.txt")
    with open(txt, "w") as f:  # as the demo's report.txt: calibrate's summary, then eval's table
        f.write(cal_txt + "\n" + r.stdout)
    return {"artifact": art, "work": art + ".work", "eval": ev, "text": txt, "dir": d, "cal_args": cal_args,
            "eval_args": eval_args, "cal_txt": cal_txt}


def test_records(fx):
    """What kvq now records for the report: STAGE.run.json per stage that ran (its time
    as calibrate's summary prints it, its command line as run) and eval --json's command."""
    import shlex
    printed = dict(re.findall(r"([a-z]+) (\d+\.\d) s", re.search(r"stages\s+(.*)", fx["cal_txt"]).group(1)))
    check(set(printed) == {"capture", "moments", "fit", "heldout", "profile"}, f"calibrate's stages: {printed}")
    for stage, sec in printed.items():
        p = os.path.join(fx["work"], f"{stage}.run.json")
        if not check(os.path.isfile(p), f"{p} missing"):
            continue
        with open(p) as f:
            rr = json.load(f)
        check(rr["stage"] == stage and f"{rr['seconds']:.1f}" == sec, f"{p}: {rr} against calibrate's {sec} s")
        check(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rr["finished"]), f"{p}: finished {rr['finished']!r}")
        check(shlex.split(rr["command"]) == fx["cal_args"], f"{p}: command {rr['command']!r}")
    with open(fx["eval"]) as f:
        cmd = json.load(f).get("command", "")
    check(shlex.split(cmd) == fx["eval_args"], f"eval --json command {cmd!r}")


def report_cli(*args):
    return run([sys.executable, "-m", "kvq", "report", *args], env=PY_ENV, cwd=ROOT)


# ---- independent readers ----------------------------------------------------------------------

def read_safetensors(path):
    """{name: numpy array} of a plain safetensors file (F64/F32 only), read here."""
    import numpy as np
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == "__metadata__" or t["dtype"] not in ("F64", "F32"):
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f8" if t["dtype"] == "F64" else "<f4").reshape(t["shape"])
    return out


def shown_ok(text, value, scale=1.0):
    """A table cell's text against the value it came from, at the cell's precision."""
    s = text.replace(",", "").replace("%", "").strip()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return s in ("–", "")
    try:
        x = float(s)
    except ValueError:
        return False
    m = re.fullmatch(r"[-+]?\d*\.?(\d*)(?:e([-+]?\d+))?", s)
    tol = 0.5 * 10.0 ** ((int(m.group(2)) if m and m.group(2) else 0) - (len(m.group(1)) if m else 0))
    return abs(x - value * scale) <= tol * (1 + 1e-9) + 1e-12


# ---- the browser checks ---------------------------------------------------------------------

JS_FIGURES = r"""
[...document.querySelectorAll('figure.plot')].map(f => {
  const svg = f.querySelector('svg');
  const groups = [...f.querySelectorAll('svg [id^="data-"]')];
  return {id: f.id, xl: f.dataset.xlabel, yl: f.dataset.ylabel,
          texts: [...f.querySelectorAll('svg text')].map(t => t.textContent),
          width: svg ? svg.getBoundingClientRect().width : 0,
          height: svg ? svg.getBoundingClientRect().height : 0,
          data: groups.map(g => {
            const paths = g.tagName.toLowerCase() === 'path' ? [g] : [...g.querySelectorAll('path')];
            return {id: g.id, d: paths.map(p => (p.getAttribute('d') || '').trim().length)
                                      .reduce((a, b) => a + b, 0),
                    uses: g.querySelectorAll('use').length};
          })};
})
"""
JS_CELLS = r"""
Object.fromEntries([...document.querySelectorAll('td[data-key]')].map(td =>
  [td.dataset.key, [td.textContent, td.dataset.value, td.dataset.scale || '1']]))
"""
JS_CHOSEN = r"""
Object.fromEntries([...document.querySelectorAll('table[id^="profile-"]')].map(t =>
  [t.id, [...t.querySelectorAll('tbody tr')].findIndex(r => r.classList.contains('chosen'))]))
"""

EXPECTED_FIGURES = ("fig-ppl-budget", "fig-ppl-kv", "fig-tasks", "fig-leankv", "fig-pats", "fig-budget",
                    "fig-mass", "fig-heads", "fig-stages", "fig-size")


def browser_checks(html_path, shot_path, fx):
    with cdp.Browser(cdp.find_chromium()) as b:
        b.load("file://" + os.path.abspath(html_path))
        figs = b.evaluate(JS_FIGURES)
        cells = b.evaluate(JS_CELLS)
        chosen = b.evaluate(JS_CHOSEN)
        png = b.screenshot(max_height=2400)
        problems = b.problems()
        requests = b.requests()
    with open(shot_path, "wb") as f:
        f.write(png)
    check(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000, f"screenshot: not a PNG of a drawn page ({len(png)} bytes)")
    w, h = struct.unpack(">II", png[16:24])
    check(w >= 1000 and h >= 1500, f"screenshot: {w}x{h}")
    check(not problems, f"browser console: {problems[:5]}")
    bad = [u for u in requests if not u.startswith(("file://", "data:"))]
    check(not bad, f"the page fetched from the network: {bad[:5]}")
    ids = [f["id"] for f in figs]
    for e in EXPECTED_FIGURES:
        check(e in ids, f"figure {e} missing (have {ids})")
    for f in figs:
        check(f["width"] > 200 and f["height"] > 100, f"{f['id']}: drawn {f['width']}x{f['height']}")
        check(f["data"] and all(g["d"] > 10 or g["uses"] > 0 for g in f["data"]),
              f"{f['id']}: a data series without drawn paths: {f['data']}")
        joined = "\n".join(f["texts"])
        for label in (f["xl"] or "").split("|") + (f["yl"] or "").split("|"):
            check(not label or label in joined, f"{f['id']}: axis label {label!r} not in the SVG's text")
    return cells, chosen


def table_checks(cells, chosen, fx):
    """The tables' numbers against the JSON and files they came from."""
    def cell(key, value, what, scale=None):
        if not check(key in cells, f"{what}: no cell {key}"):
            return
        text, exact, sc = cells[key]
        v = float("nan") if value is None else float(value)
        same = (math.isnan(v) and exact == "nan") or (exact != "nan" and float(exact) == v)
        check(same, f"{what}: {key} holds {exact}, the source says {value}")
        check(shown_ok(text, None if math.isnan(v) else v, float(sc) if scale is None else scale),
              f"{what}: {key} shows {text!r} for {value}")

    with open(fx["eval"]) as f:
        ev = json.load(f)
    n = 0
    for r in ev["rows"]:
        key = f"eval/0/{r['selector']}/{r['budget']}"
        for k in ("bits_per_key", "perplexity", "perplexity_delta", "perplexity_rel", "recall_topk",
                  "recall_mass", "out_rel_err", "kv_read_fraction", "attended_fraction"):
            cell(f"{key}/{k}", r[k], "eval table")
            n += 1
        for t in ("passkey", "kv_recall"):
            c, m = r[t]
            if m:
                cell(f"{key}/task/{t}", c / m, "eval table")
    check(n >= 13 * 9, f"eval table: {n} numbers compared")
    insp = json.loads(run([KVQ, "inspect", "--json", fx["artifact"]]).stdout)
    for name in ("leankv", "pats", "budget", "mass"):
        t = insp["thresholds"][name]
        for i, row in enumerate(t["rows"]):
            for j, col in enumerate(t["columns"]):
                if name == "pats" and col == "schedule":
                    continue
                cell(f"{name}/{i}/{col}", row[j], f"profile.{name} table")
        want = t.get("chosen")
        check(chosen.get(f"profile-{name}") == (want if want is not None else -1),
              f"profile.{name}: highlighted row {chosen.get(f'profile-{name}')}, kvq inspect's chosen {want}")
    for pl in insp["fit"]["per_layer"]:
        for h, v in enumerate(pl["heads"]["score_mse"]):
            cell(f"head/{pl['layer']}/{h}/score_mse", v, "per-head table")
            cell(f"head/{pl['layer']}/{h}/score_mse_ref", pl["heads"]["score_mse_ref"][h], "per-head table")
    cell("fit/score_mse", insp["fit"]["score_mse"], "summary")
    cell("artifact/file_size", os.path.getsize(fx["artifact"]), "summary")
    mom = read_safetensors(os.path.join(fx["work"], "moments.safetensors"))
    for name, lam in mom.items():
        m = re.fullmatch(r"layer\.(\d+)\.lambda", name)
        if m:
            for h, v in enumerate(lam.reshape(-1)):
                cell(f"head/{m.group(1)}/{h}/lambda", float(v), "per-head table")
    for p in sorted(glob.glob(os.path.join(fx["work"], "*.run.json"))):
        with open(p) as f:
            rr = json.load(f)
        cell(f"stage/{rr['stage']}/seconds", rr["seconds"], "stage table")


# ---- the tests --------------------------------------------------------------------------------

def test_report(fx, out):
    html = os.path.join(out, "report.html")
    r = report_cli("--work", fx["work"], "--eval", fx["eval"], "-o", html, "--check-text", fx["text"])
    if not check(r.returncode == 0 and os.path.isfile(html), f"report: exit {r.returncode}: {r.stderr[-1500:]}"):
        return None
    check(re.search(r"\d+ numbers of .* agree", r.stderr), f"report --check-text: {r.stderr}")
    page = open(html, encoding="utf-8").read()
    check("<script" not in page.lower(), "the page has a script")
    check(not re.search(r"""(src|href)=["']?(https?:)?//""", page), "the page links to the network")
    cells, chosen = browser_checks(html, os.path.join(out, "report.png"), fx)
    table_checks(cells, chosen, fx)
    return page


def test_text_agreement(fx, page):
    from kvq.report import compare_text
    text = open(fx["text"]).read()
    ag = compare_text(text, page)
    check(ag.ok, f"text vs HTML: {ag.mismatches[:5]}")
    keys = {k for k, *_ in ag.compared}
    check(len(ag.compared) >= 13 * 8 + 15, f"text vs HTML: only {len(ag.compared)} numbers compared")
    for k in ("stage/fit/seconds", "fit/score_mse", "fit/ratio", "leankv/chosen/memory", "budget/chosen/err",
              "eval/0/qavq/10%/perplexity", "eval/0/quest/25%/kv_read_fraction"):
        check(k in keys, f"text vs HTML: {k} not compared")
    # One digit changed in the eval table and one in calibrate's summary: both caught.
    rows = [l for l in text.splitlines() if l.startswith("qavq ") and " 10% " in l]
    if check(rows, "text: no qavq 10% row"):
        cells = rows[0].split()
        bad = text.replace(rows[0], rows[0].replace(cells[3], f"{float(cells[3]) + 0.0003:.4f}", 1))
        ag = compare_text(bad, page)
        check([m[0] for m in ag.mismatches] == ["eval/0/qavq/10%/perplexity"], f"altered ppl: {ag.mismatches}")
    m = re.search(r"err (\d\.\d{4}) \(", text)
    if check(m, "text: no err figure"):
        bad = text.replace(m.group(0), f"err {float(m.group(1)) + 0.001:.4f} (", 1)
        check(len(compare_text(bad, page).mismatches) == 1, "altered profile err not caught")


def test_errors(fx, out):
    html = os.path.join(out, "e.html")
    cases = [
        (["--work", os.path.join(out, "nowhere.work")], r"nowhere\.work: No such file or directory"),
        (["--work", fx["dir"]], r"not a kvq calibrate work directory"),
        (["--artifact", fx["eval"]], r"eval\.json"),
    ]
    bad = os.path.join(out, "bad.json")
    with open(bad, "w") as f:
        f.write('{"rows": [')
    cases.append((["--work", fx["work"], "--eval", bad], r"bad\.json: not valid JSON"))
    lst = os.path.join(out, "list.json")
    with open(lst, "w") as f:
        f.write("[1, 2]")
    cases.append((["--work", fx["work"], "--eval", lst], r"list\.json: not a kvq eval --json result"))
    trunc = os.path.join(out, "trunc.kvq")
    with open(fx["artifact"], "rb") as f, open(trunc, "wb") as g:
        g.write(f.read()[:5000])
    cases.append((["--work", fx["work"], "--artifact", trunc], r"trunc\.kvq"))
    cases.append((["--work", fx["work"], "--eval", os.path.join(out, "gone.json")], r"gone\.json: No such file"))
    for args, msg in cases:
        r = report_cli(*args, "-o", html)
        check(r.returncode != 0 and re.search(msg, r.stderr) and r.stderr.startswith("kvq: "),
              f"error {args}: exit {r.returncode}, stderr {r.stderr.strip()!r}, expected /{msg}/")
        check(not os.path.exists(html), f"error {args}: left {html}")
    # A text report that disagrees with the page: the command fails and writes nothing.
    text = open(fx["text"]).read()
    m = re.search(r"ratio (\d\.\d{3})", text)
    if check(m, "text: no score MSE ratio"):
        bad_txt = os.path.join(out, "bad.txt")
        with open(bad_txt, "w") as f:
            f.write(text.replace(m.group(0), f"ratio {float(m.group(1)) + 0.01:.3f}"))
        r = report_cli("--work", fx["work"], "--eval", fx["eval"], "--check-text", bad_txt, "-o", html)
        check(r.returncode != 0 and re.search(r"bad\.txt: disagrees with the report on 1 of \d+ numbers \(fit/ratio",
                                              r.stderr) and not os.path.exists(html),
              f"--check-text with a wrong number: exit {r.returncode}, {r.stderr.strip()!r}")
    # An existing output: refused without --force (untouched), replaced with it.
    with open(html, "w") as f:
        f.write("keep me")
    r = report_cli("--work", fx["work"], "-o", html)
    check(r.returncode != 0 and "exists; pass --force" in r.stderr and open(html).read() == "keep me",
          f"existing output: exit {r.returncode}, {r.stderr.strip()!r}")
    r = report_cli("--work", fx["work"], "-o", html, "--force", "-q")
    check(r.returncode == 0 and open(html).read().startswith("<!DOCTYPE html>") and r.stderr == "",
          f"--force: exit {r.returncode}, {r.stderr.strip()!r}")
    r = report_cli("--work", fx["work"], "--eval", fx["eval"], "-o", fx["eval"], "--force")
    check(r.returncode != 0 and "is one of the report's inputs" in r.stderr, f"output = input: {r.stderr!r}")
    r = report_cli("--work", fx["work"], "-o", os.path.join(fx["work"], "r.html"))
    check(r.returncode != 0 and "inside the input directory" in r.stderr, f"output in the work dir: {r.stderr!r}")
    left = glob.glob(os.path.join(out, "*.tmp.*")) + glob.glob(os.path.join(fx["dir"], "*.tmp.*"))
    check(not left, f"temporaries left: {left}")


def test_unknown_fields(fx, out):
    """Rows the report has not seen before (a task suite's: task, length, extra fields)
    are shown, and their task scores plotted, without error."""
    with open(fx["eval"]) as f:
        ev = json.load(f)
    # The shape of kvq eval --suite ruler's rows (score in percent of n prompts, per-sample
    # scores: a list of two floats that is not a [correct, n] pair), and fields never seen.
    rows = []
    for sel, budget, c in (("full", "all", 4), ("qavq", "5%", 2), ("qavq", "10%", 3), ("quest", "5%", 1)):
        rows.append({"selector": sel, "budget": budget, "bits_per_key": 1.0, "suite": "ruler",
                     "task": "niah_single_1", "length": 4096, "n": 4, "score": 25.0 * c, "stderr": 1.0,
                     "dense": 100.0, "gap": 25.0 * c - 100, "scores": [100.0, 0.0], "predictions": ["1", "2"],
                     "new_metric": 0.5 + c, "label": "x"})
    ev2 = {"model": ev["model"], "corpus": "file:x", "suite": "ruler:niah_single_1", "score_units": "percent",
           "samples": 4, "rows": rows, "new_top_level": {"a": 1}}
    p = os.path.join(out, "ruler.json")
    with open(p, "w") as f:
        json.dump(ev2, f)
    # A second seed's run of the same task: its counts pool with the first's (3 + 1 of 8).
    p2 = os.path.join(out, "ruler_s1.json")
    with open(p2, "w") as f:
        json.dump(dict(ev2, rows=[dict(r, score=25.0) for r in rows]), f)
    html = os.path.join(out, "u.html")
    r = report_cli("--work", fx["work"], "--eval", fx["eval"], p, "--eval", p2, "-o", html, "-q")
    if not check(r.returncode == 0, f"unknown fields: exit {r.returncode}: {r.stderr[-800:]}"):
        return
    from kvq.report import html_values
    vals, _ = html_values(open(html).read())
    check(vals.get("eval/1/qavq/10%/niah_single_1@4096/task/niah_single_1 @4096") == 0.75,
          f"task row score: {[k for k in vals if 'niah' in k][:6]}")
    check(vals.get("eval/1/qavq/5%/niah_single_1@4096/new_metric") == 2.5, "an unknown numeric field is not in the table")
    check(not [k for k in vals if "/task/" in k and "scores" in k], "per-sample scores taken for a [correct, n] pair")
    check(vals.get("task/niah_single_1 @4096/qavq/10%/accuracy") == 50.0, "two seeds' counts are not pooled")
    check(vals.get("task/niah_single_1 @4096/dense/accuracy") == 62.5, "dense counts are not pooled")
    page = open(html).read()
    check("niah_single_1 @4096" in page and 'id="fig-tasks"' in page, "the task panel is missing")


def screenshot(html, png, height=1800):
    """A PNG of the top of a report (for docs/img/report.png)."""
    with cdp.Browser(cdp.find_chromium(), width=1200, height=900) as b:
        b.load("file://" + os.path.abspath(html))
        data = b.screenshot(max_height=height)
        problems = b.problems()
    if problems:
        raise SystemExit(f"browser console: {problems}")
    try:  # 256 colours: a third of the bytes, the same look (Pillow comes with matplotlib)
        import io

        from PIL import Image
        img = Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
        buf = io.BytesIO()
        img.save(buf, format="PNG", optimize=True)
        data = buf.getvalue()
    except (ImportError, AttributeError):  # no Pillow, or one without Image.Quantize
        pass
    with open(png, "wb") as f:
        f.write(data)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--shot":
        screenshot(sys.argv[2], sys.argv[3])
        return 0
    if not cdp.find_chromium():
        print("needs Chromium (Debian package chromium; scripts/install-deps.sh installs it)")
        return 77
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("needs matplotlib (scripts/install-deps.sh installs it)")
        return 77
    out = os.environ.get("KVQ_REPORT_TEST_OUT") or tempfile.mkdtemp(prefix="kvq-report-test-")
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    fd = tempfile.mkdtemp(prefix="kvq-report-fx-")
    try:
        fx = make_fixture(fd)
        if fx is None:
            return 1
        test_records(fx)
        page = test_report(fx, out)
        if page is not None:
            test_text_agreement(fx, page)
        test_errors(fx, out)
        test_unknown_fields(fx, out)
    finally:
        shutil.rmtree(fd, ignore_errors=True)
    print(f"test_report: {len(failures)} failures, {time.time() - t0:.0f} s; screenshot {os.path.join(out, 'report.png')}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
