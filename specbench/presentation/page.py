"""The leaderboard as one self-contained static page (`index.html`): nothing is fetched when it is
viewed. Inline CSS and vanilla JS, figures inlined as SVG, every string from the answers escaped.

One block per (dataset, model) with Figure 6 and a temperature selector; inside it one section per
temperature (and batch size, when the runs record one) with:
- the main table (the Markdown table's cells, `leaderboard.main_table`): click a header to sort by
  it (numbers numerically, ascending first; click again to reverse; missing values stay last);
- a subtask filter: one checkbox per subtask shows or hides that subtask's column;
- the group's figures (Figure 5, acceptance), the detail table (`leaderboard.detail_table`);
- per method: time split, per-depth acceptance, audit, facts, settings and, per run, the answer
  folder, its start time and any `memory` / `contention` record of its meta.json, rendered generically;
- the environment (git commit, device, versions ...) of the runs.

`leaderboard` imports this module, so the table helpers come in as a `Tables` (no import cycle).
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specbench.analysis.report import BASELINE, Group, MethodResult
from specbench.core.questions import SUBTASK_TITLES

PAGE = "index.html"
OVERALL_HEADER, ACCEPTED_HEADER = "Overall", "#Mean Accepted Tokens"
#: meta.json records shown per run when present, whatever their keys
RUN_RECORDS = ("memory", "contention")
MISMATCHES_SHOWN = 20
_NUMBER = re.compile(r"^\s*\[?\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)")


@dataclass(frozen=True)
class Tables:
    """What the Markdown leaderboard is made of, handed over by `leaderboard.build`."""

    main: Callable[[Group], tuple[list[str], list[list[str]]]]
    detail: Callable[[Group], tuple[list[str], list[list[str]]]]
    environment: Callable[[Group], str]
    stem: Callable[[Group], str]
    definitions: str
    main_notes: Callable[[Group], list[str]] = lambda group: []  # footnotes under the main table
    detail_notes: Callable[[Group], list[str]] = lambda group: []  # and under the detail table


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def write(groups: list[Group], out_dir: Path, tables: Tables, figures: Iterable[Path] = ()) -> Path:
    """Write `out_dir/index.html` for the groups with results; `figures`: the files written this
    time (their SVGs are inlined; none when the report ran with --no-figures)."""
    path = out_dir / PAGE
    path.write_text(render(groups, tables, figures), encoding="utf-8")
    return path


def render(groups: list[Group], tables: Tables, figures: Iterable[Path] = ()) -> str:
    svgs = {p.name: p for p in figures if p.suffix == ".svg"}
    blocks: dict[tuple[str, str], list[Group]] = {}
    for group in groups:
        if group.results:
            blocks.setdefault((group.dataset, group.model), []).append(group)
    ids = _Ids()
    toc, body = [], []
    for (dataset, model), same in blocks.items():
        same.sort(key=lambda g: (g.temperature, _batch_size(g) or 0))
        block_id = ids.next("b")
        sections = [(ids.next("g"), g) for g in same]
        toc.append(f'<li><a href="#{block_id}">{esc(dataset)} / {esc(model)}</a><ul>'
                   + "".join(f'<li><a href="#{sid}">{esc(_label(g))}</a></li>' for sid, g in sections) + "</ul></li>")
        body.append(_block(block_id, dataset, model, sections, tables, svgs, ids))
    return _TEMPLATE.format(
        css=_CSS, js=_JS, toc="".join(toc), body="\n".join(body), definitions=esc(tables.definitions),
    )


class _Ids:
    """Element ids made from counters (never from user text)."""

    def __init__(self) -> None:
        self.count = 0

    def next(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"


def _batch_size(group: Group) -> Any:
    """The group's batch size when it is batched, else None."""
    return group.batch if group.batch > 1 else None


def _label(group: Group) -> str:
    size = _batch_size(group)
    return f"temperature {group.temperature:g}" + (f", batch size {size}" if size is not None else "")


def _block(block_id: str, dataset: str, model: str, sections: list[tuple[str, Group]], tables: Tables,
           svgs: dict[str, Path], ids: _Ids) -> str:
    parts = [f'<section class="block" id="{block_id}"><h2>{esc(dataset)} / {esc(model)}</h2>']
    if len(sections) > 1:
        options = "".join(f'<option value="{sid}">{esc(_label(g))}</option>' for sid, g in sections)
        parts.append(f'<p class="controls"><label>Show <select class="pick-section" data-block="{block_id}">'
                     f'<option value="">every temperature</option>{options}</select></label></p>')
    fig6 = svgs.get(f"{dataset}-{model}-fig6.svg")
    if fig6 is not None:
        parts.append(_figure(fig6, "Figure 6: overall speedup against temperature", ids))
    for name in sorted(n for n in svgs if n.startswith(f"{dataset}-{model}") and n.endswith("-batch.svg")):
        parts.append(_figure(svgs[name], "Speedup and throughput against batch size", ids))
    parts += [_section(sid, group, tables, svgs, ids) for sid, group in sections]
    parts.append("</section>")
    return "\n".join(parts)


def _section(sid: str, group: Group, tables: Tables, svgs: dict[str, Path], ids: _Ids) -> str:
    runs = max(r.runs for r in group.results)
    questions = group.results[0].rows["overall"].get("questions", "-")
    stem = tables.stem(group)
    files = " ".join(f'<a href="{esc(stem)}.{ext}">{ext}</a>' for ext in ("md", "csv", "tex"))
    parts = [
        f'<section class="group" id="{sid}"><h3>{esc(group.title)}{_batch_note(group)}</h3>',
        f'<p class="prov">{esc(questions)} questions, {runs} run(s). {esc(tables.environment(group))}<br>'
        f'<span class="files">The same numbers as Markdown, CSV and LaTeX: {files}.</span></p>',
        _environment(group),
        _problems(group),
        _main_table(group, tables, ids),
        _notes(tables.main_notes(group)),
        '<div class="figures">',
        *[_figure(svgs[name], caption, ids) for name, caption in (
            (f"{stem}-fig5.svg", "Figure 5: speedup per subtask"),
            (f"{stem}-acceptance.svg", "Accepted tokens per step and per-depth acceptance"),
        ) if name in svgs],
        "</div>",
        "<h4>Details</h4>",
        _table(*tables.detail(group), ids, css="detail"),
        _notes(tables.detail_notes(group)),
        "<h4>Each method</h4>",
        *[_method(group, r) for r in group.results],
        "</section>",
    ]
    return "\n".join(p for p in parts if p)


def _batch_note(group: Group) -> str:
    size = _batch_size(group)
    return f" / batch size {esc(size)}" if size is not None else ""


def _environment(group: Group) -> str:
    env = group.environment()
    if not env:
        return ""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{_value(v)}</td></tr>" for k, v in sorted(env.items()))
    return (f'<details class="env"><summary>Environment (every recorded field)</summary><table class="kv">{rows}'
            "</table></details>")


def _problems(group: Group) -> str:
    if not group.problems:
        return ""
    items = "".join(f"<li>{esc(p)}</li>" for p in group.problems)
    return f'<div class="problems"><strong>Problems</strong><ul>{items}</ul></div>'


def _notes(lines: list[str]) -> str:
    return "".join(f'<p class="note">{esc(line)}</p>' for line in lines)


def _number(text: str) -> float | None:
    match = _NUMBER.match(text)
    return float(match.group(1)) if match else None


def _exact(group: Group, header: str) -> dict[str, float] | None:
    """The unrounded numbers behind a main-table column (to sort by), when the column is known."""
    titles = {title: key for key, title in SUBTASK_TITLES.items()}
    key, metric = (titles[header], "speedup") if header in titles else {
        OVERALL_HEADER: ("overall", "speedup"), ACCEPTED_HEADER: ("overall", "mean_accepted")}.get(header, (None, None))
    if key is None:
        return None
    return {r.method: r.rows.get(key, {}).get(metric, math.nan) for r in group.results}


def _main_table(group: Group, tables: Tables, ids: _Ids) -> str:
    headers, rows = tables.main(group)
    titles = {title: key for key, title in SUBTASK_TITLES.items()}
    cols = [titles.get(h) for h in headers]
    exact = [_exact(group, h) for h in headers]
    table_id = ids.next("t")
    boxes = "".join(f'<label><input type="checkbox" class="subtask" data-table="{table_id}" data-col="{esc(c)}" '
                    f'checked> {esc(h)}</label>' for h, c in zip(headers, cols) if c)
    filt = f'<fieldset class="filter"><legend>Subtasks shown</legend>{boxes}</fieldset>' if boxes else ""
    values = [[(exact[j] or {}).get(row[0]) if exact[j] else None for j in range(len(headers))] for row in rows]
    return filt + _table(headers, rows, ids, css="main", cols=cols, values=values, table_id=table_id)


def _table(headers: list[str], rows: list[list[str]], ids: _Ids, *, css: str, cols: list[str | None] | None = None,
           values: list[list[float | None]] | None = None, table_id: str | None = None) -> str:
    """A sortable table: each cell carries its number (`data-v`) when it has one, `data-missing` when empty."""
    cols = cols or [None] * len(headers)
    col_attr = [f' data-col="{esc(c)}"' if c else "" for c in cols]
    head = "".join(f'<th scope="col" tabindex="0"{a}>{esc(h)}</th>' for h, a in zip(headers, col_attr))
    body = []
    for i, row in enumerate(rows):
        cells = []
        for j, cell in enumerate(row):
            text = str(cell)
            exact = values[i][j] if values else None
            number = exact if exact is not None else _number(text)
            if text.strip() in ("", "-") or (number is not None and math.isnan(number)):
                attr = " data-missing"
            elif number is not None:
                attr = f' data-v="{number!r}"'
            else:
                attr = ""
            tag = "th" if j == 0 else "td"
            scope = ' scope="row"' if j == 0 else ""
            cells.append(f"<{tag}{scope}{col_attr[j]}{attr}>{esc(text)}</{tag}>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (f'<div class="scroll"><table class="sortable {css}" id="{table_id or ids.next("t")}"><thead><tr>{head}'
            f"</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def _method(group: Group, r: MethodResult) -> str:
    runs = group.methods.get(r.method, [])
    items = [
        ("Runs", f"{r.runs}"),
        ("Time split", _value({k: f"{v:.1%}" for k, v in r.time_split.items()}) if r.time_split else "-"),
        ("Per-depth acceptance", _value([round(x, 3) for x in r.depth_acceptance]) if r.depth_acceptance else "-"),
        ("Tokens accepted per step (steps)", _value(dict(sorted(r.accept_hist.items()))) if r.accept_hist else "-"),
        ("Lossless audit", _audit(group, r)),
        ("Facts", _value(r.facts) if r.facts else "-"),
        ("Settings", _value(_settings(runs))),
    ]
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in items)
    return (f'<details class="method"><summary>{esc(r.method)}</summary><table class="kv">{rows}</table>'
            f"{_runs(group, runs)}</details>")


def _settings(runs: list[Any]) -> Any:
    for run in runs:
        identity = (run.meta or {}).get("identity")
        if isinstance(identity, dict) and identity:
            return identity
    return "-"


def _audit(group: Group, r: MethodResult) -> str:
    if r.audit is None:
        return "-" if r.method == BASELINE else "n/a (sampled)"
    a = r.audit
    summary = {k: v for k, v in a.items() if k != "mismatches"}
    text = _value(summary)
    if mismatches := a.get("mismatches"):
        head = list(dict.fromkeys(k for m in mismatches for k in m))
        rows = "".join("<tr>" + "".join(f"<td>{_value(m.get(k, '-'))}</td>" for k in head) + "</tr>"
                       for m in mismatches[:MISMATCHES_SHOWN])
        more = len(mismatches) - MISMATCHES_SHOWN
        text += (f'<table class="mismatches"><thead><tr>{"".join(f"<th>{esc(k)}</th>" for k in head)}</tr></thead>'
                 f"<tbody>{rows}</tbody></table>" + (f"<p>and {more} more mismatch(es)</p>" if more > 0 else ""))
    return text


def _runs(group: Group, runs: list[Any]) -> str:
    """Per run: where its answers are, when it started, its environment where it differs from the
    group's, and its memory / contention records."""
    env = group.environment()
    rows = []
    for run in sorted(runs, key=lambda run: run.run):
        meta = run.meta or {}
        extra = []
        own = meta.get("environment") or {}
        if isinstance(own, dict) and own != env:
            differs = {k: v for k, v in own.items() if env.get(k) != v}
            extra.append(f"<div><em>environment differs:</em> {_value(differs)}</div>")
        for key in RUN_RECORDS:
            if meta.get(key) is not None:
                extra.append(f'<div class="rec-{esc(key)}"><em>{esc(key)}:</em> {_value(meta[key])}</div>')
        rows.append(f"<tr><td>{run.run}</td><td><code>{esc(run.source or '-')}</code></td>"
                    f"<td>{esc(_time(meta.get('started')))}</td><td>{''.join(extra) or '-'}</td></tr>")
    return ('<table class="runs"><thead><tr><th>Run</th><th>Answer folder</th><th>Started</th>'
            f'<th>Recorded</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def _time(value: Any) -> str:
    """meta.json's `started` (seconds since the epoch) as UTC time."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return datetime.fromtimestamp(value, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "-" if value is None else str(value)


def _value(value: Any) -> str:
    """Any JSON-like value as escaped HTML: dicts as key/value lists, floats to 4 significant digits,
    byte counts (keys ending in `bytes`) with their MiB."""
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = "".join(f"<li><span class=k>{esc(k)}</span>: {_entry(k, v)}</li>" for k, v in value.items())
        return f'<ul class="dict">{items}</ul>'
    if isinstance(value, (list, tuple)):
        if all(not isinstance(v, (dict, list, tuple)) for v in value):
            return esc("[" + ", ".join(_scalar(v) for v in value) + "]")
        return "<ol>" + "".join(f"<li>{_value(v)}</li>" for v in value) + "</ol>"
    return esc(_scalar(value))


def _entry(key: Any, value: Any) -> str:
    text = _value(value)
    if str(key).lower().endswith("bytes") and isinstance(value, (int, float)) and not isinstance(value, bool):
        text += f" ({value / 2**20:.1f} MiB)"
    return text


def _scalar(value: Any) -> str:
    if isinstance(value, float) and not isinstance(value, bool):
        return "-" if math.isnan(value) else format(value, ".4g")
    return str(value)


def _figure(path: Path, caption: str, ids: _Ids) -> str:
    return f'<figure>{_inline_svg(path.read_text(encoding="utf-8"), ids.next("f") + "-")}' \
           f"<figcaption>{esc(caption)}</figcaption></figure>"


def _inline_svg(text: str, prefix: str) -> str:
    """A matplotlib SVG file as an inline <svg> element: prolog, comments and metadata (its date)
    dropped, its ids prefixed so that several figures on one page never share one."""
    text = re.sub(r"<\?xml.*?\?>|<!DOCTYPE.*?>|<!--.*?-->|<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}\1)", text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}\1"', text)
    return text.strip()


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1200px;
padding:0 1.2em 3em;color:#1b1b1b;background:#fff}
h1{margin:.8em 0 .2em}h2{border-bottom:2px solid #333;padding-bottom:.2em;margin-top:1.6em}
h3{background:#f0f3f7;padding:.35em .6em;border-left:4px solid #3465a4}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}
th,td{border:1px solid #ccd;padding:.25em .55em;text-align:right;vertical-align:top}
th:first-child,td:first-child,.kv th,.kv td,.runs td,.dict,table.detail td:not([data-v]){text-align:left}
thead th{background:#e8ecf2}
table.sortable thead th{cursor:pointer;user-select:none;min-width:4.5em}
.scroll{overflow-x:auto}
table.sortable thead th::after{content:" \\2195";color:#999}
table.sortable thead th[aria-sort=ascending]::after{content:" \\25B2";color:#222}
table.sortable thead th[aria-sort=descending]::after{content:" \\25BC";color:#222}
table.sortable tbody tr:nth-child(even){background:#fafbfc}
.off{display:none}
fieldset.filter{border:1px solid #ccd;margin:.4em 0;padding:.2em .6em}
fieldset.filter label{margin-right:1em;white-space:nowrap}
.figures{display:flex;flex-wrap:wrap;gap:1em}
figure{margin:.5em 0;max-width:100%}figure svg{max-width:100%;height:auto}
figcaption{font-size:12px;color:#555;text-align:center}
.prov,.defs,.files,.note{color:#444;font-size:12.5px}
.problems{background:#fff4e5;border:1px solid #f0b86e;padding:.3em .8em;margin:.5em 0}
details{margin:.3em 0}details.method>summary{font-weight:600;cursor:pointer}
.kv th{background:#f4f6f9;width:14em;font-weight:600}
ul.dict{margin:0;padding-left:1.1em}.k{color:#555}
code{font-size:12px;word-break:break-all}
"""

_JS = """
(function () {
  "use strict";
  function numeric(rows, col) {
    var seen = false;
    for (var i = 0; i < rows.length; i++) {
      var c = rows[i].cells[col];
      if (!c || c.hasAttribute("data-missing")) continue;
      if (!c.hasAttribute("data-v")) return false;
      seen = true;
    }
    return seen;
  }
  function sortBy(th) {
    var table = th.closest("table"), body = table.tBodies[0];
    var col = Array.prototype.indexOf.call(th.parentNode.cells, th);
    var up = th.getAttribute("aria-sort") !== "ascending";
    var rows = Array.prototype.slice.call(body.rows);
    var isNum = numeric(rows, col);
    rows.sort(function (a, b) {
      var ca = a.cells[col], cb = b.cells[col];
      var ma = !ca || ca.hasAttribute("data-missing"), mb = !cb || cb.hasAttribute("data-missing");
      if (ma || mb) return ma === mb ? 0 : (ma ? 1 : -1);
      var d = isNum ? parseFloat(ca.getAttribute("data-v")) - parseFloat(cb.getAttribute("data-v"))
                    : ca.textContent.localeCompare(cb.textContent);
      return up ? d : -d;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    Array.prototype.forEach.call(th.parentNode.cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", up ? "ascending" : "descending");
  }
  document.querySelectorAll("table.sortable thead th").forEach(function (th) {
    th.addEventListener("click", function () { sortBy(th); });
    th.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(th); }
    });
  });
  document.querySelectorAll("input.subtask").forEach(function (box) {
    box.addEventListener("change", function () {
      var table = document.getElementById(box.getAttribute("data-table"));
      table.querySelectorAll("[data-col]").forEach(function (cell) {
        if (cell.getAttribute("data-col") === box.getAttribute("data-col")) cell.classList.toggle("off", !box.checked);
      });
    });
  });
  document.querySelectorAll("select.pick-section").forEach(function (sel) {
    sel.addEventListener("change", function () {
      var block = document.getElementById(sel.getAttribute("data-block"));
      block.querySelectorAll("section.group").forEach(function (s) {
        s.classList.toggle("off", sel.value !== "" && s.id !== sel.value);
      });
    });
  });
})();
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>Spec-Bench leaderboard (specbench)</title>
<style>{css}</style>
</head>
<body>
<h1>Leaderboard</h1>
<p class="defs">Written by <code>specbench report</code> from the answer files named under each method; it needs
no network. Click a column header to sort (again to reverse); untick a subtask to hide its column.</p>
<nav><ul>{toc}</ul></nav>
<p class="defs">{definitions}</p>
{body}
<script>{js}</script>
</body>
</html>
"""
