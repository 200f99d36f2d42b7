"""Numbers across batch sizes: throughput, speedup at the same batch size, latency, memory.

Definitions (per method and batch size B, over every answer of its runs):
- throughput = all new tokens / all wall time. A batched answer's wall_time is its share of its
  batch's time (in proportion to its tokens, see run.local.LocalBackend.answer_batch), so the sum over
  answers is the time of the batches: this is tokens per second of the whole batch;
- speedup at B = the method's throughput / the baseline's throughput at the same B; its 95% interval
  a paired bootstrap over timing units: the baseline's batches (a batch's answers share one clock, so
  the batch is one measurement), each run's apart, the method's answers to a batch's questions against
  the baseline's (at B = 1 each question is a unit);
- latency of a question = the time from its admission into a row of the batch (its prefill)
  until its row stopped (`extra.batch` `latency`; time waiting in the queue before is not in it),
  summed over its turns; at B = 1 simply its wall time;
- #mean accepted tokens per row-step = tokens emitted in decoding / target steps of that row
  (as at batch size 1: the batch's forward counts once per live row);
- peak memory: the run's measured peak (meta `memory`, largest over runs);
- time to first token (TTFT) of a turn: from its arrival (queued; every first turn arrives at the
  start, so queueing counts, as a server's clients see it) to its first token (its prefill done);
  at batch size 1 its prefill time;
- time per output token (TPOT) of a turn: from its first token to its last, per token after the
  first; p50/p90/p99 over the turns (nearest rank);
- crossover of a method: the smallest batch size at which it is slower than the baseline at that
  size (speedup below 1), where it was faster at a smaller one; None where it never was faster
  or never fell below.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from specbench.analysis.frame import batch_id, bootstrap_sums, timing_unit
from specbench.analysis.runs import BASELINE, Group, Run, method_memory
from specbench.core.answers import EXTRA_KEY


@dataclass
class BatchPoint:
    """One method at one batch size."""

    method: str
    batch: int
    questions: int
    throughput: float  # tokens / s of the whole batch
    speedup: float | None  # throughput / the baseline's at the same batch size
    latency: float  # mean per-question latency, s
    latency_p90: float
    mean_accepted: float  # tokens per row-step
    peak_bytes: int | None
    ttft: tuple[float, float, float] | None = None  # p50, p90, p99 (s)
    tpot: tuple[float, float, float] | None = None  # p50, p90, p99 (s per token)
    ci_low: float = math.nan  # the speedup's 95% paired bootstrap interval over timing units
    ci_high: float = math.nan


def percentiles(values: list[float], at: tuple[float, ...] = (0.5, 0.9, 0.99)) -> tuple[float, ...] | None:
    """Nearest-rank percentiles (None without values)."""
    if not values:
        return None
    ordered = sorted(values)
    return tuple(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] for q in at)


def turn_latencies(record: dict[str, Any]) -> Iterator[tuple[float, float | None]]:
    """Per turn: (time to first token, time per output token after the first or None)."""
    choice, extra = record["choices"][0], record.get(EXTRA_KEY) or {}
    batches = extra.get("batch") or []
    prefills = extra.get("prefill_time") or []
    for t, (tokens, wall) in enumerate(zip(choice["new_tokens"], choice["wall_time"], strict=False)):
        batch = batches[t] if t < len(batches) and isinstance(batches[t], dict) else None
        if batch is not None and "first" in batch:
            first, decode = batch["first"] - batch.get("queued", 0.0), batch["finished"] - batch["first"]
        elif t < len(prefills) and prefills[t] is not None:
            first, decode = float(prefills[t]), float(wall) - float(prefills[t])
        else:
            continue
        yield first, decode / (tokens - 1) if tokens > 1 else None


def _latency(record: dict[str, Any]) -> float:
    batches = (record.get(EXTRA_KEY) or {}).get("batch")
    if isinstance(batches, list) and batches:
        return float(sum(b.get("latency", 0.0) for b in batches if isinstance(b, dict)))
    return float(sum(record["choices"][0]["wall_time"]))


def _point(method: str, batch: int, runs: list[Run]) -> BatchPoint:
    records = [r for run in runs for r in run.records]
    tokens = sum(sum(r["choices"][0]["new_tokens"]) for r in records)
    seconds = sum(sum(r["choices"][0]["wall_time"]) for r in records)
    accepts = [a for r in records for a in r["choices"][0].get("accept_lengths", [])]
    latencies = sorted(_latency(r) for r in records)
    memory = method_memory(runs) or {}
    turns = [t for r in records for t in turn_latencies(r)]
    return BatchPoint(
        method, batch, len({r["question_id"] for r in records}), tokens / seconds if seconds else 0.0, None,
        sum(latencies) / len(latencies) if latencies else 0.0,
        latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))] if latencies else 0.0,
        sum(accepts) / len(accepts) if accepts else 0.0, memory.get("peak_bytes"),
        percentiles([first for first, _ in turns]), percentiles([each for _, each in turns if each is not None]),
    )


def _unit(record: dict[str, Any]) -> str:
    """What timed a record's first turn: its batch (a batch of several), else the question alone."""
    batches = (record.get(EXTRA_KEY) or {}).get("batch") or []
    return timing_unit(batch_id(batches[0] if batches else None), record["question_id"])


def _sums(record: dict[str, Any]) -> tuple[float, float]:
    choice = record["choices"][0]
    return float(sum(choice["new_tokens"])), float(sum(choice["wall_time"]))


def throughput_ci(runs: list[Run], base_runs: list[Run], seed: int = 0) -> tuple[float, float]:
    """95% paired bootstrap interval of (the method's tokens / seconds) / (the baseline's) over timing
    units: each (run, baseline batch) resampled whole, the method's answers to its questions (run r
    against the baseline's run r, else its first) against the baseline's answers to the same ones."""
    base = {run.run: {r["question_id"]: r for r in run.records} for run in base_runs if run.records}
    if not base:
        return math.nan, math.nan
    units: dict[tuple[int, str], np.ndarray] = {}
    for run in runs:
        partner = run.run if run.run in base else min(base)
        for record in run.records:
            theirs = base[partner].get(record["question_id"])
            if theirs is None:
                continue
            sums = units.setdefault((partner, _unit(theirs)), np.zeros(4))
            sums += (*_sums(record), *_sums(theirs))
    table = np.array(list(units.values()))  # tokens, seconds (the method's), tokens, seconds (the baseline's)
    return bootstrap_sums(table, lambda s: (s[:, 0] / s[:, 1]) / (s[:, 2] / s[:, 3]), seed)


def crossovers(points: list[BatchPoint]) -> dict[str, int]:
    """Per method: the smallest batch size where it falls below the baseline after being above it."""
    out: dict[str, int] = {}
    series: dict[str, list[BatchPoint]] = {}
    for p in points:
        if p.method != BASELINE and p.speedup is not None:
            series.setdefault(p.method, []).append(p)
    for method, pts in series.items():
        faster = False
        for p in sorted(pts, key=lambda p: p.batch):
            if p.speedup >= 1.0:
                faster = True
            elif faster:
                out[method] = p.batch
                break
    return out


def batch_points(groups: list[Group]) -> dict[tuple[str, str, float], list[BatchPoint]]:
    """For each (dataset, model, temperature) with more than one batch size: a point per method
    and batch size (methods with answers at that size), sorted by method then batch size."""
    by_key: dict[tuple[str, str, float], list[Group]] = {}
    for group in groups:
        if group.length is None:  # long inputs have their own table (analysis.lengths)
            by_key.setdefault((group.dataset, group.model, group.temperature), []).append(group)
    out: dict[tuple[str, str, float], list[BatchPoint]] = {}
    for key, same in by_key.items():
        if len({g.batch for g in same}) < 2:
            continue
        points = []
        for group in same:
            here = {name: _point(name, group.batch, [r for r in runs if r.records])
                    for name, runs in group.methods.items() if any(r.records for r in runs)}
            base = here.get(BASELINE)
            for point in here.values():
                point.speedup = point.throughput / base.throughput if base and base.throughput else None
                if base is not None and point.method != BASELINE:
                    point.ci_low, point.ci_high = throughput_ci(group.methods[point.method],
                                                                group.methods[BASELINE])
            points += here.values()
        out[key] = sorted(points, key=lambda p: (p.method != BASELINE, p.method, p.batch))
    return out
