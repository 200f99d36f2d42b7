"""Figures in the style of the Spec-Bench paper: Figure 5 (speedup per subtask), Figure 6
(speedup against temperature) and acceptance plots. PNG and SVG, one colour per method."""

from __future__ import annotations

import functools
import hashlib
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from specbench.analysis.audit import NOISE  # noqa: E402
from specbench.analysis.batching import BatchPoint, crossovers  # noqa: E402
from specbench.analysis.lengths import LengthPoint  # noqa: E402
from specbench.analysis.report import BASELINE, Group, MethodResult  # noqa: E402
from specbench.core.answers import FIXED_SUFFIX  # noqa: E402
from specbench.core.questions import SUBTASK_TITLES, SUBTASKS  # noqa: E402

# matplotlib's tab20, handed out in the registry's order: the built-ins (by name) first, then the
# user's methods, so a new user method never recolours a built-in; other names by hash.
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
           "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5", "#393b79", "#637939", "#8c6d31", "#843c39",
           "#7b4173", "#5254a3", "#8ca252", "#bd9e39"]


@functools.lru_cache(maxsize=1)
def known_methods() -> tuple[str, ...]:
    """Method names in registry order (built-ins, then the methods/ folder, then entry points),
    the baseline left out: it is drawn as a line, not a coloured bar."""
    from specbench.run.registry import discover

    return tuple(n for n in discover().names() if n != BASELINE)


def colour(method: str) -> str:
    """The same colour for a method in every figure (registry order first, others by hash); a
    `<method>-fixed` run (its preset) has its method's colour."""
    known = known_methods()
    name = method.removesuffix(FIXED_SUFFIX)
    if name in known[: len(PALETTE)]:
        return PALETTE[known.index(name)]
    return PALETTE[int(hashlib.sha256(name.encode()).hexdigest(), 16) % len(PALETTE)]


def _twinned(method: str, names: set[str]) -> bool:
    """A preset run drawn beside its `budget=auto` twin: the two share a colour, so the preset is
    hatched (bars) or dashed (lines)."""
    return method.endswith(FIXED_SUFFIX) and method.removesuffix(FIXED_SUFFIX) in names


def bar_style(method: str, names: set[str]) -> dict:
    return {"color": colour(method), **({"hatch": "//", "edgecolor": "white"} if _twinned(method, names) else {})}


def line_style(method: str, names: set[str]) -> dict:
    return {"color": colour(method), "linestyle": "--" if _twinned(method, names) else "-",
            "marker": "s" if _twinned(method, names) else "o"}


def _error(row: dict[str, float], runs: int) -> tuple[float, float]:
    """Error bar: std over runs when there are several, else the bootstrap interval."""
    if runs > 1:
        return row["speedup_std"], row["speedup_std"]
    low, high = row.get("ci_low", float("nan")), row.get("ci_high", float("nan"))
    if low != low or high != high:
        return 0.0, 0.0
    return max(0.0, row["speedup"] - low), max(0.0, high - row["speedup"])


def _save(fig: plt.Figure, base: Path) -> list[Path]:
    paths = [base.parent / f"{base.name}.png", base.parent / f"{base.name}.svg"]
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def _methods(group: Group) -> list[MethodResult]:
    """The methods drawn: all but the baseline and the audit's noise-floor control."""
    return [r for r in group.results if r.method not in (BASELINE, NOISE)]


def figure5(group: Group, base: Path) -> list[Path]:
    """Grouped bars: speedup of each method on each subtask and overall."""
    results = _methods(group)
    names = {r.method for r in results}
    keys = [s for s in SUBTASKS if any(s in r.rows for r in results)] + ["overall"]
    width = 0.8 / max(1, len(results))
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(keys) + 0.4 * len(results)), 4))
    for i, r in enumerate(results):
        xs = [k + (i - (len(results) - 1) / 2) * width for k in range(len(keys))]
        ys = [r.rows[s]["speedup"] if s in r.rows else 0 for s in keys]
        errs = list(zip(*[_error(r.rows[s], r.runs) if s in r.rows else (0, 0) for s in keys]))
        ax.bar(xs, ys, width, yerr=errs, capsize=2, label=r.method, **bar_style(r.method, names))
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="baseline (1.00x)")
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([SUBTASK_TITLES.get(k, "Overall").replace(" ", "\n", 1) for k in keys], fontsize=8)
    ax.set_ylabel("Speedup over autoregressive decoding (x)")
    ax.set_title(f"Speedup per subtask: {group.title}", fontsize=10)
    ax.legend(fontsize=8, ncol=min(4, len(results) + 1), loc="upper left", bbox_to_anchor=(0, -0.18))
    return _save(fig, base)


def figure6(groups: list[Group], base: Path) -> list[Path]:
    """Overall speedup against temperature, one line per method (groups of one dataset/model)."""
    series: dict[str, list[tuple[float, float, tuple[float, float]]]] = {}
    for group in sorted(groups, key=lambda g: g.temperature):
        for r in _methods(group):
            row = r.rows["overall"]
            series.setdefault(r.method, []).append((group.temperature, row["speedup"], _error(row, r.runs)))
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for method, points in sorted(series.items()):
        xs, ys, errs = zip(*points)
        ax.errorbar(xs, ys, yerr=list(zip(*errs)), capsize=3, label=method, **line_style(method, set(series)))
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlabel("Temperature")
    ax.set_ylabel("Overall speedup (x)")
    ax.set_title(f"Speedup against temperature: {groups[0].dataset} / {groups[0].model}", fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the lines, not on them
    return _save(fig, base)


def log2_axes(axes: tuple, ticks: list[int], label: str) -> None:
    """x on a log-2 scale with a tick at each measured value (batch sizes, input lengths)."""
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xlabel(label)


def batch_figure(points: list[BatchPoint], title: str, base: Path) -> list[Path]:
    """Left: speedup at each batch size (method throughput / baseline throughput at the same size),
    one line per method with its 95% interval as a band, a preset dashed beside its adaptive twin, each
    crossover circled; middle:
    throughput against batch size, the baseline included; right: median time per output token."""
    series: dict[str, list[BatchPoint]] = {}
    for p in points:
        series.setdefault(p.method, []).append(p)
    names = set(series)
    crossed = crossovers(points)
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.2))
    for method, pts in sorted(series.items()):
        pts = sorted(pts, key=lambda p: p.batch)
        xs = [p.batch for p in pts]
        style = ({"color": "black", "linestyle": "--", "marker": "o"} if method == BASELINE
                 else line_style(method, names))
        middle.plot(xs, [p.throughput for p in pts], label=method, **style)
        tpot = [(p.batch, p.tpot[0] * 1e3) for p in pts if p.tpot is not None]
        if tpot:
            right.plot(*zip(*tpot), label=method, **style)
        if method != BASELINE:
            speed = [(p.batch, p.speedup) for p in pts if p.speedup is not None]
            if speed:
                left.plot(*zip(*speed), label=method, **style)
            band = [(p.batch, p.ci_low, p.ci_high) for p in pts if not math.isnan(p.ci_low)]
            if len(band) > 1:
                left.fill_between(*zip(*band), color=colour(method), alpha=0.08)
            if method in crossed:
                at = next(p for p in pts if p.batch == crossed[method])
                left.plot([at.batch], [at.speedup], marker="o", markersize=13, markerfacecolor="none",
                          markeredgecolor=colour(method), linestyle="none")
    left.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="baseline (1.00x)")
    left.axhline(0.95, color="grey", linewidth=0.6, linestyle=":", label="0.95x")
    log2_axes((left, middle, right), sorted({p.batch for p in points}), "Batch size")
    left.set_ylabel("Speedup at the same batch size (x)")
    middle.set_ylabel("Throughput (generated tokens / s of the batch)")
    right.set_ylabel("Time per output token, p50 (ms)")
    left.set_title("Speedup (circled: crossover)", fontsize=10)
    middle.set_title("Throughput against batch size", fontsize=10)
    right.set_title("Time per output token", fontsize=10)
    fig.suptitle(title, fontsize=10)
    right.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, base)


def length_figure(points: list[LengthPoint], title: str, base: Path) -> list[Path]:
    """Left: speedup against input length (the first turns' tokens, log scale), one line per method, with
    its 95% interval as a band; right: mean accepted tokens per step against input length. The runs of
    the questions as they are (no `length`) are left out of the lines: their inputs have no one length."""
    series: dict[str, list[LengthPoint]] = {}
    for p in points:
        if p.length is not None:
            series.setdefault(p.method, []).append(p)
    names = set(series)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for method, pts in sorted(series.items()):
        pts = sorted(pts, key=lambda p: p.length)
        xs = [p.length for p in pts]
        style = line_style(method, names)
        right.plot(xs, [p.mean_accepted for p in pts], label=method, **style)
        if method == BASELINE:
            continue
        left.plot(xs, [p.speedup for p in pts], label=method, **style)
        left.fill_between(xs, [p.ci_low for p in pts], [p.ci_high for p in pts], color=colour(method), alpha=0.12)
    left.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="baseline (1.00x)")
    log2_axes((left, right), sorted({p.length for p in points if p.length is not None}),
              "Input length (tokens of the first turn)")
    left.set_ylabel("Speedup over the baseline at the same length (x)")
    right.set_ylabel("#Mean accepted tokens per step")
    left.set_title("Speedup against input length", fontsize=10)
    right.set_title("Acceptance against input length", fontsize=10)
    fig.suptitle(title, fontsize=10)
    right.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, base)


def acceptance(group: Group, base: Path) -> list[Path]:
    """Left: share of steps by accepted length. Right: per-depth acceptance rate."""
    results = _methods(group)
    names = {r.method for r in results}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(results))
    for i, r in enumerate(results):
        total = sum(r.accept_hist.values()) or 1
        lengths = sorted(r.accept_hist)
        left.bar([n + (i - (len(results) - 1) / 2) * width for n in lengths],
                 [r.accept_hist[n] / total for n in lengths], width, label=r.method, **bar_style(r.method, names))
        if r.depth_acceptance:
            depths = range(1, len(r.depth_acceptance) + 1)
            right.plot(depths, r.depth_acceptance, label=r.method, **line_style(r.method, names))
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel("Tokens accepted per target forward (bonus included)")
    left.set_ylabel("Share of decoding steps")
    left.legend(fontsize=8)
    right.set_xlabel("Draft depth d")
    right.set_ylabel("Acceptance rate at depth d")
    right.set_ylim(0, 1.02)
    if right.lines:
        right.legend(fontsize=8)
    fig.suptitle(f"Acceptance: {group.title}", fontsize=10)
    return _save(fig, base)
