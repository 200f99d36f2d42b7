"""Metric formulas, upstream Spec-Bench definitions (speed.py) by default.

- tokens/s of a question = sum(new_tokens) / sum(wall_time) over its turns;
- speedup on a subtask = mean per-question tokens/s of the method / the baseline's;
- #mean accepted tokens = mean over all decoding steps of accept_lengths (bonus included,
  1.00 for autoregressive decoding).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from specbench.core.questions import SUBTASKS, subtask_of


def tokens_per_second(record: dict[str, Any]) -> float:
    choice = record["choices"][0]
    return sum(choice["new_tokens"]) / sum(choice["wall_time"])


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def by_subtask(records: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(subtask_of(record["category"]), []).append(record)
    return groups


def speedup_rows(
    method: Sequence[dict[str, Any]], baseline: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per-subtask (in Spec-Bench order) and overall speedup and #mean accepted tokens.

    Only questions answered by both are compared, so a partial run is still a fair one.
    """
    shared = {r["question_id"] for r in method} & {r["question_id"] for r in baseline}
    ours = by_subtask(r for r in method if r["question_id"] in shared)
    base = by_subtask(r for r in baseline if r["question_id"] in shared)
    rows = []
    for name in [s for s in SUBTASKS if s in ours] + ["overall"]:
        mine = [r for group in ours.values() for r in group] if name == "overall" else ours[name]
        ref = [r for group in base.values() for r in group] if name == "overall" else base[name]
        tps = mean([tokens_per_second(r) for r in mine])
        base_tps = mean([tokens_per_second(r) for r in ref])
        steps = [a for r in mine for a in r["choices"][0]["accept_lengths"]]
        rows.append(
            {
                "subtask": name,
                "questions": len(mine),
                "tokens_per_s": tps,
                "baseline_tokens_per_s": base_tps,
                "speedup": tps / base_tps,
                "mean_accepted": mean(steps),
            }
        )
    return rows


def std(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof=1, as upstream); 0 for a single value."""
    if len(values) < 2:
        return 0.0
    m = mean(values)
    return (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def average_runs(per_run: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Mean of each subtask row over runs, with the run-to-run std of the speedup."""
    rows = []
    for i, first in enumerate(per_run[0]):
        same = [run[i] for run in per_run if i < len(run) and run[i]["subtask"] == first["subtask"]]
        row = {k: (mean([r[k] for r in same]) if isinstance(v, float) else v) for k, v in first.items()}
        row["speedup_std"] = std([r["speedup"] for r in same])
        row["runs"] = len(same)
        rows.append(row)
    return rows
