"""Numbers across input lengths (`length=N` runs: first turns of about N tokens, specbench.core.longinput).

Per method and length bucket, from the group's own analysis (specbench.analysis.report), so every
number is the one its group's table shows: the overall speedup over the baseline at the same length
(paired, as at any length), its confidence interval, the mean accepted tokens per step and the
method's tokens per second. A bucket is one (dataset, model, temperature, batch size, length) group;
the runs of the same questions without `length` are the "as is" point (no bucket) where they exist.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specbench.analysis.runs import BASELINE, Group


@dataclass
class LengthPoint:
    """One method at one input length (None: the questions as they are)."""

    method: str
    length: int | None
    questions: int
    speedup: float  # nan for the baseline or where it could not be paired
    ci_low: float
    ci_high: float
    mean_accepted: float
    tokens_per_s: float


def _value(row: dict, key: str) -> float:
    value = row.get(key)
    return math.nan if value is None else float(value)


def _points(group: Group) -> list[LengthPoint]:
    out = []
    for result in group.results:
        row = result.rows.get("overall", {})
        speedup = math.nan if result.method == BASELINE else _value(row, "speedup")
        out.append(LengthPoint(result.method, group.length, int(row.get("questions") or 0), speedup,
                               _value(row, "ci_low"), _value(row, "ci_high"), _value(row, "mean_accepted"),
                               _value(row, "tokens_per_s")))
    return out


def length_points(groups: list[Group]) -> dict[tuple[str, str, float, int], list[LengthPoint]]:
    """For each (dataset, model, temperature, batch size) with runs at two or more input lengths: a point
    per method and length (the "as is" runs included where they exist), by method then length."""
    by_key: dict[tuple[str, str, float, int], list[Group]] = {}
    for group in groups:
        if group.results:
            by_key.setdefault((group.dataset, group.model, group.temperature, group.batch), []).append(group)
    out = {}
    for key, same in by_key.items():
        if len({g.length for g in same if g.length is not None}) < 2:
            continue
        points = [p for g in same for p in _points(g)]
        out[key] = sorted(points, key=lambda p: (p.method != BASELINE, p.method, -1 if p.length is None else p.length))
    return out
