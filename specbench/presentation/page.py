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

This module gathers that into plain dicts and lists; the markup is the Jinja2 template
`templates/page.html.j2` (autoescaped), with `page.css` and `page.js` included inline. The
definitions and footnotes are Markdown (as in the .md files), rendered by markdown-it with raw HTML
off, so any HTML in them shows as text.

`leaderboard` imports this module, so the table helpers come in as a `Tables` (no import cycle).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markdown_it import MarkdownIt
from markupsafe import Markup

from specbench.analysis.report import BASELINE, Group, MethodResult
from specbench.core.questions import SUBTASK_TITLES

PAGE = "index.html"
OVERALL_HEADER, ACCEPTED_HEADER = "Overall", "#Mean Accepted Tokens"
#: meta.json records shown per run when present, whatever their keys
RUN_RECORDS = ("memory", "contention")
MISMATCHES_SHOWN = 20
TEMPLATES = Path(__file__).with_name("templates")
TEMPLATE = "page.html.j2"
#: a cell's leading number (`1.23x ± 0.04`, `[0.9, 1.1]`): its sort key where no exact value is known
_NUMBER = re.compile(r"^\s*\[?\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)")
_MARKDOWN = MarkdownIt("commonmark", {"html": False})  # raw HTML in the text is escaped, not passed on


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


def markdown(text: str) -> Markup:
    """Markdown (CommonMark) as HTML; HTML written in the text comes out escaped."""
    return Markup(_MARKDOWN.render(str(text)))


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["markdown"] = markdown
    return env


_JINJA = _environment()


def write(groups: list[Group], out_dir: Path, tables: Tables, figures: Iterable[Path] = ()) -> Path:
    """Write `out_dir/index.html` for the groups with results; `figures`: the files written this
    time (their SVGs are inlined; none when the report ran with --no-figures)."""
    path = out_dir / PAGE
    path.write_text(render(groups, tables, figures), encoding="utf-8")
    return path


def render(groups: list[Group], tables: Tables, figures: Iterable[Path] = ()) -> str:
    """The page's HTML: `blocks` rendered by the template."""
    return _JINJA.get_template(TEMPLATE).render(blocks=blocks(groups, tables, figures),
                                                definitions=tables.definitions)


def blocks(groups: list[Group], tables: Tables, figures: Iterable[Path] = ()) -> list[dict[str, Any]]:
    """What the page shows, as plain data: one dict per (dataset, model) block, its sections inside."""
    svgs = {p.name: p for p in figures if p.suffix == ".svg"}
    same: dict[tuple[str, str], list[Group]] = {}
    for group in groups:
        if group.results:
            same.setdefault((group.dataset, group.model), []).append(group)
    ids = _Ids()
    out = []
    for (dataset, model), members in same.items():
        members.sort(key=lambda g: (g.temperature, _batch_size(g) or 0))
        block_id = ids.next("b")
        sections = [(ids.next("g"), g) for g in members]
        block_figures = []
        if (fig6 := svgs.get(f"{dataset}-{model}-fig6.svg")) is not None:
            block_figures.append(_figure(fig6, "Figure 6: overall speedup against temperature", ids))
        for name in sorted(n for n in svgs if n.startswith(f"{dataset}-{model}") and n.endswith("-batch.svg")):
            block_figures.append(_figure(svgs[name], "Speedup and throughput against batch size", ids))
        out.append({"id": block_id, "dataset": dataset, "model": model, "figures": block_figures,
                    "sections": [_section(sid, group, tables, svgs, ids) for sid, group in sections]})
    return out


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


def _section(sid: str, group: Group, tables: Tables, svgs: dict[str, Path], ids: _Ids) -> dict[str, Any]:
    stem = tables.stem(group)
    main = _main_table(group, tables, ids)
    return {
        "id": sid,
        "title": group.title,
        "label": _label(group),
        "batch": _batch_size(group),
        "questions": group.results[0].rows["overall"].get("questions", "-"),
        "runs": max(r.runs for r in group.results),
        "environment_line": tables.environment(group),
        "stem": stem,
        "environment": [(k, _value(v)) for k, v in sorted(group.environment().items())],
        "problems": list(group.problems),
        "subtasks": [{"col": h["col"], "header": h["text"]} for h in main["headers"] if h["col"]],
        "main": main,
        "main_notes": tables.main_notes(group),
        "figures": [_figure(svgs[name], caption, ids) for name, caption in (
            (f"{stem}-fig5.svg", "Figure 5: speedup per subtask"),
            (f"{stem}-acceptance.svg", "Accepted tokens per step and per-depth acceptance"),
        ) if name in svgs],
        "detail": _table(*tables.detail(group), ids, css="detail"),
        "detail_notes": tables.detail_notes(group),
        "methods": [_method(group, r) for r in group.results],
    }


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


def _main_table(group: Group, tables: Tables, ids: _Ids) -> dict[str, Any]:
    headers, rows = tables.main(group)
    titles = {title: key for key, title in SUBTASK_TITLES.items()}
    cols = [titles.get(h) for h in headers]
    exact = [_exact(group, h) for h in headers]
    values = [[(exact[j] or {}).get(row[0]) if exact[j] else None for j in range(len(headers))] for row in rows]
    return _table(headers, rows, ids, css="main", cols=cols, values=values)


def _table(headers: list[str], rows: list[list[str]], ids: _Ids, *, css: str, cols: list[str | None] | None = None,
           values: list[list[float | None]] | None = None) -> dict[str, Any]:
    """A sortable table; each cell with its number (`v`, the float's repr) when it has one, `missing` when empty."""
    table_id = ids.next("t")
    cols = cols or [None] * len(headers)
    body = []
    for i, row in enumerate(rows):
        cells = []
        for j, cell in enumerate(row):
            text = str(cell)
            exact = values[i][j] if values else None
            number = exact if exact is not None else _number(text)
            missing = text.strip() in ("", "-") or (number is not None and math.isnan(number))
            cells.append({"text": text, "col": cols[j], "missing": missing,
                          "v": None if missing or number is None else repr(number)})
        body.append(cells)
    return {"id": table_id, "css": css, "rows": body,
            "headers": [{"text": h, "col": c} for h, c in zip(headers, cols)]}


def _method(group: Group, r: MethodResult) -> dict[str, Any]:
    runs = group.methods.get(r.method, [])
    audit, mismatches = _audit(r)
    details = [
        ("Runs", _text(r.runs)),
        ("Time split", _value({k: f"{v:.1%}" for k, v in r.time_split.items()}) if r.time_split else _text("-")),
        ("Per-depth acceptance", _value([round(x, 3) for x in r.depth_acceptance]) if r.depth_acceptance
         else _text("-")),
        ("Tokens accepted per step (steps)", _value(dict(sorted(r.accept_hist.items()))) if r.accept_hist
         else _text("-")),
        ("Lossless audit", audit),
        ("Facts", _value(r.facts) if r.facts else _text("-")),
        ("Settings", _value(_settings(runs))),
    ]
    return {"name": r.method, "runs": _runs(group, runs), "details": [
        {"label": label, "value": value, "mismatches": mismatches if value is audit else None}
        for label, value in details]}


def _settings(runs: list[Any]) -> Any:
    for run in runs:
        identity = (run.meta or {}).get("identity")
        if isinstance(identity, dict) and identity:
            return identity
    return "-"


def _audit(r: MethodResult) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The audit's summary, and its first mismatches as a table (None when there are none)."""
    if r.audit is None:
        return _text("-" if r.method == BASELINE else r.audit_skipped), None
    summary = _value({k: v for k, v in r.audit.items() if k != "mismatches"})
    mismatches = r.audit.get("mismatches")
    if not mismatches:
        return summary, None
    head = list(dict.fromkeys(k for m in mismatches for k in m))
    rows = [[_value(m.get(k, "-")) for k in head] for m in mismatches[:MISMATCHES_SHOWN]]
    return summary, {"head": head, "rows": rows, "more": len(mismatches) - MISMATCHES_SHOWN}


def _runs(group: Group, runs: list[Any]) -> list[dict[str, Any]]:
    """Per run: where its answers are, when it started, its environment where it differs from the
    group's, and its memory / contention records."""
    env = group.environment()
    out = []
    for run in sorted(runs, key=lambda run: run.run):
        meta = run.meta or {}
        records = []
        own = meta.get("environment") or {}
        if isinstance(own, dict) and own != env:
            differs = {k: v for k, v in own.items() if env.get(k) != v}
            records.append({"css": None, "label": "environment differs", "value": _value(differs)})
        for key in RUN_RECORDS:
            if meta.get(key) is not None:
                records.append({"css": f"rec-{key}", "label": key, "value": _value(meta[key])})
        out.append({"run": run.run, "source": run.source or "-", "started": _time(meta.get("started")),
                    "records": records})
    return out


def _time(value: Any) -> str:
    """meta.json's `started` (seconds since the epoch) as UTC time."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return datetime.fromtimestamp(value, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "-" if value is None else str(value)


def _text(value: Any) -> dict[str, Any]:
    return {"kind": "text", "text": str(value)}


def _value(value: Any) -> dict[str, Any]:
    """Any JSON-like value as a node for the template's `value` macro: dicts as key/value lists (byte
    counts, keys ending in `bytes`, with their MiB), lists of values as ordered lists, floats to 4
    significant digits."""
    if isinstance(value, dict):
        if not value:
            return _text("{}")
        return {"kind": "dict", "entries": [{"key": str(k), "value": _value(v), "mib": _mib(k, v)}
                                            for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        if all(not isinstance(v, (dict, list, tuple)) for v in value):
            return _text("[" + ", ".join(_scalar(v) for v in value) + "]")
        return {"kind": "list", "elements": [_value(v) for v in value]}
    return _text(_scalar(value))


def _mib(key: Any, value: Any) -> str | None:
    if str(key).lower().endswith("bytes") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value / 2**20:.1f}"
    return None


def _scalar(value: Any) -> str:
    if isinstance(value, float) and not isinstance(value, bool):
        return "-" if math.isnan(value) else format(value, ".4g")
    return str(value)


def _figure(path: Path, caption: str, ids: _Ids) -> dict[str, Any]:
    """A figure the report wrote this time: its SVG inlined (trusted markup, after `_inline_svg`)."""
    return {"svg": Markup(_inline_svg(path.read_text(encoding="utf-8"), ids.next("f") + "-")), "caption": caption}


def _inline_svg(text: str, prefix: str) -> str:
    """A matplotlib SVG file as an inline <svg> element: prolog, comments and metadata (its date)
    dropped, its ids prefixed so that several figures on one page never share one."""
    text = re.sub(r"<\?xml.*?\?>|<!DOCTYPE.*?>|<!--.*?-->|<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}\1)", text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}\1"', text)
    return text.strip()
