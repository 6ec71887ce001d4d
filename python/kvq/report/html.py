"""HTML pieces of the report: numbers that carry their exact value and a stable key,
tables, figures and the page (one file, CSS inline, no script, nothing fetched)."""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Union

from .figures import Plot

CSS = """
:root { --fg: #1b1f24; --muted: #57606a; --line: #d0d7de; --bg2: #f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
       color: var(--fg); margin: 0 auto; max-width: 1180px; padding: 18px 28px 60px; }
h1 { font-size: 24px; margin: 4px 0 2px; }
h2 { font-size: 19px; margin: 34px 0 6px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 20px 0 4px; }
p.lead, p.note, figcaption { color: var(--muted); }
nav { margin: 10px 0 6px; font-size: 13px; }
nav a { margin-right: 12px; color: #0550ae; text-decoration: none; }
figure { margin: 10px 0 6px; }
figure.plot svg.plot-svg { width: 100%; max-width: 820px; height: auto; display: block; }
div.figrow { display: grid; grid-template-columns: repeat(auto-fit, minmax(440px, 1fr)); gap: 8px 22px; }
figure.wide svg.plot-svg { max-width: 1100px; }
table { border-collapse: collapse; margin: 8px 0 14px; font-size: 12.5px; }
caption { text-align: left; color: var(--muted); padding: 2px 0 4px; font-size: 12.5px; }
th, td { border: 1px solid var(--line); padding: 3px 8px; }
th { background: var(--bg2); text-align: left; font-weight: 600; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.chosen td { background: #fff4cc; font-weight: 600; }
details { margin: 4px 0 10px; }
summary { cursor: pointer; color: #0550ae; font-size: 13px; }
pre.cmd { background: var(--bg2); border: 1px solid var(--line); padding: 8px 10px;
          white-space: pre-wrap; word-break: break-all; font-size: 12px; margin: 4px 0 10px; }
dl.kv { display: grid; grid-template-columns: max-content auto; gap: 2px 14px; margin: 6px 0; }
dl.kv dt { color: var(--muted); }
dl.kv dd { margin: 0; }
.missing { color: #9a6700; }
"""


@dataclass
class Num:
    """A number in a table: shown with ``fmt``, its exact value in data-value and a
    stable data-key that the tests and the text cross-check read."""
    value: float
    fmt: str = "{:.6g}"
    key: str = ""
    scale: float = 1.0      # shown value = value * scale (percentages)
    text: Optional[str] = None  # shown instead of the formatted value (a name for a code)

    def render(self) -> str:
        v = self.value
        attrs = f' data-value="{_exact(v)}"'
        if self.key:
            attrs += f' data-key="{html.escape(self.key)}"'
        if self.scale != 1.0:
            attrs += f' data-scale="{self.scale:g}"'
        shown = self.text if self.text is not None else "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else self.fmt.format(v * self.scale)
        return f'<td class="n"{attrs}>{html.escape(shown)}</td>'


Cell = Union[str, Num, int, float, None]


def _exact(v: Optional[float]) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "nan"
    return repr(float(v))


def cell(c: Cell) -> str:
    if isinstance(c, Num):
        return c.render()
    if isinstance(c, bool) or c is None:
        return f"<td>{'' if c is None else html.escape(str(c))}</td>"
    if isinstance(c, (int, float)):
        return Num(float(c)).render()
    return f"<td>{html.escape(str(c))}</td>"


def table(headers: Sequence[str], rows: Sequence[Sequence[Cell]], caption: str = "", tid: str = "",
          chosen: Sequence[bool] = (), attrs: Optional[Dict[str, str]] = None) -> str:
    """An HTML table; rows flagged in `chosen` are highlighted (class chosen); attrs are
    extra attributes of the table element."""
    at = dict(attrs or {})
    if tid:
        at = {"id": tid, **at}
    out = ["<table" + "".join(f' {k}="{html.escape(v)}"' for k, v in at.items()) + ">"]
    if caption:
        out.append(f"<caption>{html.escape(caption)}</caption>")
    out.append("<thead><tr>" + "".join(f'<th scope="col">{html.escape(h)}</th>' for h in headers) + "</tr></thead><tbody>")
    for i, r in enumerate(rows):
        cls = ' class="chosen"' if i < len(chosen) and chosen[i] else ""
        out.append(f"<tr{cls}>" + "".join(cell(c) for c in r) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def figure(plot: Plot, caption: str, fid: str, wide: bool = False) -> str:
    """A figure element with its inline SVG; data-xlabel / data-ylabel name the axis labels
    the SVG must show ('|'-separated)."""
    cls = "plot wide" if wide else "plot"
    return (f'<figure class="{cls}" id="{html.escape(fid)}" data-xlabel="{html.escape("|".join(plot.xlabels))}" '
            f'data-ylabel="{html.escape("|".join(plot.ylabels))}" role="img" aria-label="{html.escape(caption)}">\n'
            f"{plot.svg}\n<figcaption>{html.escape(caption)}</figcaption></figure>")


def row(items: Sequence[str]) -> str:
    """Figures side by side (they wrap on a narrow page)."""
    return '<div class="figrow">' + "\n".join(items) + "</div>"


def numbers(table_html: str, label: str = "The numbers", open_: bool = True) -> str:
    return f"<details{' open' if open_ else ''}><summary>{html.escape(label)}</summary>\n{table_html}\n</details>"


def note(text: str, cls: str = "note") -> str:
    return f'<p class="{cls}">{html.escape(text)}</p>'


def code(text: str) -> str:
    return f'<pre class="cmd">{html.escape(text)}</pre>'


def definitions(pairs: Sequence[tuple]) -> str:
    return '<dl class="kv">' + "".join(f"<dt>{html.escape(str(a))}</dt><dd>{html.escape(str(b))}</dd>" for a, b in pairs) + "</dl>"


def page(title: str, lead: str, nav: Sequence[tuple], sections: Sequence[str]) -> str:
    links = "".join(f'<a href="#{html.escape(i)}">{html.escape(t)}</a>' for i, t in nav)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            f"<header><h1>{html.escape(title)}</h1><p class=\"lead\">{html.escape(lead)}</p>"
            f"<nav>{links}</nav></header>\n" + "\n".join(sections) + "\n</body>\n</html>\n")


def section(sid: str, title: str, body: List[str]) -> str:
    return f'<section id="{html.escape(sid)}">\n<h2>{html.escape(title)}</h2>\n' + "\n".join(body) + "\n</section>"
