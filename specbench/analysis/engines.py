"""Engines side by side: each method of an engine we did not write (`backend=vllm`, filed as model
`<model>-vllm`) beside the specbench method of the same algorithm (the preset's `ours`), on the same
model, questions and temperature, from the answers of both.

Each engine's speedup is against its own baseline (vLLM against vLLM, ours against ours), paired
question by question inside each job; the two jobs ran at different times, so the engines' absolute
tokens/s are shown but not compared as a ratio. Greedy answers of both engines are compared token by
token with our baseline's (analysis.audit.lossless_audit): equal, or diverging at a near-tie of our
baseline's top-2 logits (arithmetic: a kernel or a batch shape can flip it), or not a near-tie."""

from __future__ import annotations

import math
from typing import Any

from specbench.analysis import audit
from specbench.analysis.report import FIXED, Group, MethodResult
from specbench.analysis.runs import BASELINE
from specbench.core.record import turn_stats


def engine_of(group: Group) -> str | None:
    """The engine that answered a group (meta environment.engine), None for specbench's own."""
    for runs in group.methods.values():
        for run in runs:
            engine = ((run.meta or {}).get("environment") or {}).get("engine")
            if engine:
                return str(engine)
    return None


def _local_model(group: Group, engine: str) -> str:
    for runs in group.methods.values():
        for run in runs:
            suffix = (((run.meta or {}).get("config") or {}).get("backend") or {}).get("suffix")
            if suffix and group.model.endswith(f"-{suffix}"):
                return group.model[: -len(suffix) - 1]
    return group.model.removesuffix(f"-{engine}")


def pairs(groups: list[Group]) -> list[tuple[Group, Group | None]]:
    """(engine group, our group on the same dataset, model, temperature and batch size, or None)."""
    by_key = {g.key: g for g in groups}
    out = []
    for group in groups:
        if (engine := engine_of(group)) is None or not group.results:
            continue
        local = by_key.get((group.dataset, _local_model(group, engine), group.temperature, group.batch, group.length))
        out.append((group, local if local is not None and local.results else None))
    return out


def counter_acceptance_length(runs: list[Any]) -> float:
    """vLLM's own mean acceptance length from its counters over the runs' answers: 1 + accepted / drafts
    (steps with a draft only; nan without drafts)."""
    drafts = accepted = 0
    for run in runs:
        for record in run.records:
            for stats in turn_stats(record):
                drafts += int(stats.drafts or 0)
                accepted += int(stats.accepted_tokens or 0)
    return 1 + accepted / drafts if drafts else math.nan


def _numbers(result: MethodResult | None) -> dict[str, float]:
    overall = result.rows.get("overall", {}) if result is not None else {}
    return {k: overall.get(k, math.nan) for k in ("speedup", "ci_low", "ci_high", "mean_accepted", "acceptance_rate",
                                                  "tokens_per_s", "questions")}


def _ours(local: Group | None, name: str) -> MethodResult | None:
    if local is None or not name:
        return None
    found = {r.method: r for r in local.results}
    return found.get(name) or found.get(f"{name}{FIXED}")


def rows(engine: Group, local: Group | None, tie_margin: float = 0.05) -> list[dict[str, Any]]:
    """One row per engine method: its numbers, ours beside them, and how its greedy answers compare with
    our baseline's."""
    name = engine_of(engine)
    out = []
    base = [r for r in local.methods.get(BASELINE, []) if r.records] if local is not None else []
    for result in sorted(engine.results, key=lambda r: r.method != BASELINE):  # the baselines first
        ours_name = BASELINE if result.method == BASELINE else str(result.facts.get("ours") or "")
        ours = _ours(local, ours_name)
        row = {"engine": name, "method": result.method, **_numbers(result), "ours": ours.method if ours else
               (ours_name or None), "ours_numbers": _numbers(ours), "greedy": None,
               "counter_length": counter_acceptance_length(engine.methods[result.method])}
        if engine.temperature == 0 and base:
            row["greedy"] = audit.lossless_audit(engine.methods[result.method], base, tie_margin)
        out.append(row)
    return out


def greedy_cell(check: dict[str, Any] | None) -> str:
    if not check or not check.get("compared"):
        return "-"
    near = sum(1 for m in check["mismatches"] if m["near_tie"])
    far = len(check["mismatches"]) - near
    text = f"{check['equal']}/{check['compared']} equal"
    if check["mismatches"]:
        text += f"; {near} at a near-tie, {far} not"
        positions = sorted(m["position"] for m in check["mismatches"])
        text += f" (first divergence at token {positions[len(positions) // 2]}, median)"
    return text
